"""A bounded read ``[lo, hi)`` of a partition ends at ``hi``, never at an end of partition
below it. Its ``hi`` is one past a record of a committed transaction
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

from pydblog.changelog import kafka_native
from pydblog.changelog.kafka import client as kafka_client
from pydblog.changelog.kafka.topics import checkpoint_topic, data_topic
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.kafka_spark import KafkaStream, plan
from pydblog.config import LogConfig
from pydblog.events import Op
from tests.kafka.opentxn import HeldCommit, watch_eof
from tests.kafka.test_kafka_log import cp, row_event
from tests.kafka.test_planner import append, offsets

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
        watch_eof(monkeypatch, eof)

    def second_commit() -> None:
        if eof.wait(20):
            _commit(kf, 1)  # records 11..20: what the read's hi said is there

    writer = threading.Thread(target=second_commit)
    writer.start()
    client = kafka_client.Client(cfg, native=native)
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


def test_a_commit_landing_while_the_planner_reads_is_planned(
        kafka_log: LogConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync's planner reads the checkpoint topic up to an end it was given (the
    availableNow target, a batch's end): one past the checkpoint message of a commit
    whose transaction may still be open (the capture between its checkpoint message
    and ``commit_transaction``). The read_committed end of partition then lies below
    that message until the commit lands. Trusted (before 15120a9), it ended the plan
    there and the plan's end still said ``cp`` = the given end: the next batch started
    above the commit's checkpoint message and never applied the commit (its events
    lost to the sync)."""
    writer = KafkaChangeLog(kafka_log)
    stream = KafkaStream(kafka_log.model_dump_json())
    checker = kafka_client.Client(kafka_log)
    try:
        append(writer, 0, 20)
        held = HeldCommit(monkeypatch, writer, lambda: append(writer, 20, 10))
        topic = checkpoint_topic(kafka_log.topic_prefix or "")
        # the end the planner is given: past the held commit's checkpoint message
        # (a high watermark counts records of open transactions)
        stop = checker.watermarks([(topic, 0)])[(topic, 0)][1]
        start = stream.initial_offset("earliest")
        eof = threading.Event()
        watch_eof(monkeypatch, eof)

        def land() -> None:
            eof.wait(20)  # the planner's read is at the open transaction
            held.finish()

        lander = threading.Thread(target=land)
        lander.start()
        try:
            end, _ = plan(stream.log, start, stop, None, stream._planning())
        finally:
            eof.set()
            lander.join()
        assert (end["seq"], end["cp"]) == (30, stop)
        assert offsets(stream, start, end) == list(range(30))
    finally:
        checker.close()
        stream.close()
        writer.close()
