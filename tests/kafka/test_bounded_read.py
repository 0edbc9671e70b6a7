"""A bounded read ``[lo, hi)`` of a partition ends at ``hi``, never at an end of partition
below it (review13 K2 rest). Its ``hi`` is one past a record of a committed transaction
(``commit_ends``), so the broker holds every offset below it; an end-of-partition event
below ``hi`` only says the broker did not show them yet (Tansu on S3 reports a partition's
end behind; a real Kafka's read_committed end stops at the first offset of another
producer's open transaction). Trusting it ended the read early: a ``dblog sync`` with
mirror sinks only took the missing records for a compacted topic's gaps (a warning, the
events lost), the embedded reader's windows missed them. The lag is made real here: the
records below ``hi`` are committed only once the read has seen the end of partition."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from pydblog.changelog import kafka, kafka_native
from pydblog.changelog.kafka import KafkaChangeLog, data_topic
from pydblog.config import LogConfig
from pydblog.events import Op
from tests.kafka.test_kafka_log import cp, row_event

EOF = confluent_kafka.KafkaError._PARTITION_EOF


def _commit(kf: KafkaChangeLog, i: int) -> None:
    kf.append([row_event(Op.CREATE, "a", 1000 + 10 * i + j, {"id": 10 * i + j},
                         {"id": 10 * i + j}) for j in range(10)], cp(i))


@pytest.mark.parametrize("native", [False, True], ids=["messages", "native"])
def test_an_end_of_partition_below_hi_does_not_end_the_read(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    if native and not kafka_native.available():
        pytest.skip("the native Kafka read (pydblog.changelog._kafkaread) is not built")
    cfg = LogConfig(type="kafka", path=str(tmp_path / "data"), bootstrap_servers=kafka_bootstrap,
                    topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=1)
    kf = KafkaChangeLog(cfg)
    _commit(kf, 0)  # records 0..9, a transaction marker at 10
    tp = (data_topic(cfg.topic_prefix or "", "public.a"), 0)
    eof = threading.Event()
    if native:
        real_native = kafka_native.consume

        def consume_native(c: Any, client_id: str, n: int, timeout: float) -> kafka_native.RawBatch:
            b = real_native(c, client_id, n, timeout)
            if any(code == EOF for _, code, *_ in b.errors):
                eof.set()
            return b

        monkeypatch.setattr(kafka_native, "consume", consume_native)
    else:
        real_consumer = kafka._Client.consumer

        class Watched:
            def __init__(self, real: Any) -> None:
                self.real = real

            def consume(self, n: int, timeout: float) -> list[Any]:
                msgs = list(self.real.consume(n, timeout))
                if any(m.error() is not None and m.error().code() == EOF
                       for m in msgs):
                    eof.set()
                return msgs

            def __getattr__(self, name: str) -> Any:
                return getattr(self.real, name)

        def consumer(self: Any) -> Any:
            if self._consumer is None:
                self._consumer = Watched(real_consumer(self))
            return self._consumer

        monkeypatch.setattr(kafka._Client, "consumer", consumer)

    def second_commit() -> None:
        if eof.wait(20):
            _commit(kf, 1)  # records 11..20: what the read's hi said is there

    writer = threading.Thread(target=second_commit)
    writer.start()
    client = kafka._Client(cfg, native=native)
    try:
        got: Iterator[int]
        if native:
            got = (int(o) for b in client.read_values(tp, 0, 21) for o in b.offsets)
        else:
            got = (m.offset() for m in client.read_range({tp: (0, 21)}))
        offsets = list(got)
    finally:
        eof.set()
        writer.join()
        client.close()
        kf.close()
    assert offsets == [*range(10), *range(11, 21)]
