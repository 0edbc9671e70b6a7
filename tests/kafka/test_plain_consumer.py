"""What a plain ``read_committed`` consumer of the data topics sees on Apache Kafka (no
pydblog code, no checkpoint topic): after a writer killed inside a commit (its records
acknowledged, its transaction left open, then aborted by the next session's producer)
and the next session's retry, every event once, at its global offset, per partition in
offset order (the tables' topics, the truncates topic, and the notifications topic, whose
records carry the event in their ``dblog.event`` header) (docs/kafka.md, "Reading a Kafka
log from elsewhere")."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import orjson
import pytest

from pydblog.changelog.kafka.topics import (
    HEADER_EVENT,
    data_topic,
    notifications_topic,
    truncates_topic,
)
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.sqlite import SqliteChangeLog, SqliteChangeLogReader
from pydblog.config import LogConfig
from tests.kafka.test_kafka_log import _crashing_writer, batches, cp, records


@pytest.mark.parametrize("point", ["kafka-after-data:2", "kafka-before-commit:2"])
def test_a_read_committed_consumer_sees_every_event_once(kafka_log: LogConfig, tmp_path: Path,
                                                         point: str) -> None:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("Apache Kafka's transactions (any Kafka-protocol broker may be given)")
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    proc = multiprocessing.get_context("spawn").Process(
        target=_crashing_writer, args=(kafka_log.model_dump_json(), point))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 137
    kf = KafkaChangeLog(kafka_log)  # its producer aborts the killed session's transaction
    last = kf.last_checkpoint()
    done = 0 if last is None else int(last.snapshot["tables"]["public.a"]) + 1  # type: ignore[index]
    assert done == 1, "Apache Kafka hides the open transaction's checkpoint message"
    for i, b in enumerate(batches()[done:], done):
        kf.append(b, cp(i))
    kf.close()
    sq = SqliteChangeLog(tmp_path / "sq")
    for i, b in enumerate(batches()):
        sq.append(b, cp(i))
    want = {r.offset: orjson.loads(r.body) for r in records(SqliteChangeLogReader(tmp_path / "sq"))}

    prefix = kafka_log.topic_prefix or ""
    consumer = Consumer({"bootstrap.servers": kafka_log.bootstrap_servers, "group.id": "plain",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    parts = [TopicPartition(data_topic(prefix, t), p, 0) for t in ("public.a", "public.b")
             for p in range(kafka_log.partitions)]
    parts.append(TopicPartition(notifications_topic(prefix), 0, 0))
    parts.append(TopicPartition(truncates_topic(prefix), 0, 0))
    consumer.assign(parts)
    seen: list[int] = []
    per_partition: dict[tuple[str, int], list[int]] = {}
    eof: set[tuple[str, int]] = set()
    try:
        while len(eof) < len(parts):
            for m in consumer.consume(1000, 1.0):
                err, tp = m.error(), (str(m.topic()), int(m.partition() or 0))
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    eof.add(tp)
                    continue
                event = dict(m.headers() or ()).get(HEADER_EVENT)  # a notification's
                value = orjson.loads(event or m.value() or b"null")
                per_partition.setdefault(tp, []).append(value["offset"])
                seen.append(value["offset"])
                expected = want.get(value["offset"])
                assert expected is not None, f"offset {value['offset']} is no event"
                assert {k: v for k, v in value.items() if k not in ("offset", "ts_ms")} == \
                    {k: v for k, v in expected.items() if k not in ("offset", "ts_ms")}
    finally:
        consumer.close()
    assert sorted(seen) == sorted(want), "every event once, nothing of the aborted commit"
    for offsets in per_partition.values():
        assert offsets == sorted(offsets), "per partition in offset order"
