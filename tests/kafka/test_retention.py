"""Retention and compaction of a Kafka change log: the topics a reader needs back to
their start (the checkpoint topic, from which a capture on another host recovers its
position, and the schemas) are created with no time retention, the data and
notification topics keep the broker's; tombstones (``tombstones = true``, for compacted
topics) are not events to any reader."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson

from pydblog.changelog.kafka.reader import KafkaChangeLogReader
from pydblog.changelog.kafka.topics import (
    checkpoint_topic,
    data_topic,
    notifications_topic,
    schemas_topic,
    truncates_topic,
)
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.sqlite import SqliteChangeLog, SqliteChangeLogReader
from pydblog.config import LogConfig
from pydblog.events import Op
from tests.kafka.test_kafka_log import SCHEMA, batches, cp, records, row_event


def test_topics_read_back_to_their_start_have_no_time_retention(kafka_log: LogConfig) -> None:
    from confluent_kafka import admin

    resource = admin.ConfigResource  # type: ignore[attr-defined]

    kf = KafkaChangeLog(kafka_log)
    for i, b in enumerate(batches()):
        kf.append(b, cp(i), [SCHEMA] if i == 1 else [])
    kf.close()
    prefix = kafka_log.topic_prefix or ""
    client = admin.AdminClient({"bootstrap.servers": kafka_log.bootstrap_servers or ""})
    topics = {
        checkpoint_topic(prefix): True, schemas_topic(prefix): True,
        notifications_topic(prefix): False, truncates_topic(prefix): False,
        data_topic(prefix, "public.a"): False,
        data_topic(prefix, "public.b"): False,
    }
    assert set(topics) <= set(client.list_topics(timeout=10).topics)
    futures = client.describe_configs([resource("topic", t) for t in topics])
    for res, fut in futures.items():
        entry = fut.result().get("retention.ms")
        forever = entry is not None and entry.value == "-1"
        assert forever == topics[res.name], (res.name, entry)


def test_tombstones_are_not_events(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A delete's tombstone (same key, null value, same partition) is skipped by the
    reader: the log reads back as the embedded one does, offsets dense."""
    cfg = LogConfig(type="kafka", path=str(tmp_path / "k"), bootstrap_servers=kafka_bootstrap,
                    topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3, tombstones=True)
    kf = KafkaChangeLog(cfg)
    sq = SqliteChangeLog(tmp_path / "sq")
    deletes = [row_event(Op.DELETE, "a", 60 + i, {"id": 1000 + i}, None) for i in range(5)]
    for i, b in enumerate([*batches(), deletes]):
        kf.append(b, cp(i))
        sq.append(b, cp(i))
    kf.close()
    sq.close()
    want = records(SqliteChangeLogReader(tmp_path / "sq"))
    reader = KafkaChangeLogReader(cfg)
    got = records(reader)
    reader.close()
    assert [r.offset for r in got] == list(range(len(want)))
    assert [(r.table, r.op, orjson.loads(r.body)) for r in got] == [
        (r.table, r.op, orjson.loads(r.body)) for r in want]
