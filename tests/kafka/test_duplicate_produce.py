"""A broker that answers a retried produce oddly must not make the Kafka log show an
event twice (a broker restart under load once made a read return 52,243 events, 50,425
distinct).

A proxy in front of a Tansu broker (``DupProxy``) sends one produce request twice and
passes on only the answer to the second copy, as a broker does that lost its answer to
the first and got the producer's retry."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pydblog.changelog.kafka.reader import KafkaChangeLogReader
from pydblog.changelog.kafka.topics import HEADER_WRITER, data_topic, notifications_topic
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.config import LogConfig
from pydblog.errors import ChangeLogUnavailable
from tests.kafka.dupproxy import DupProxy
from tests.kafka.test_kafka_log import batches, cp, records

pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[LogConfig, DupProxy]]:
    from pydblog.devtools.tansu import TansuBroker

    broker = TansuBroker()
    proxy = DupProxy(broker.port)
    broker.advertised = f"127.0.0.1:{proxy.port}"
    with broker:
        try:
            yield LogConfig(type="kafka", path=str(tmp_path / "data"),
                            bootstrap_servers=broker.advertised,
                            topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=2), proxy
        finally:
            proxy.close()


@pytest.mark.tansu  # Apache Kafka's idempotent producer state drops the second copy
def test_a_produce_answered_twice_fails_the_commit_and_the_retry_logs_it_once(
        proxied: tuple[LogConfig, DupProxy]) -> None:
    cfg, proxy = proxied
    bs = batches()
    w = KafkaChangeLog(cfg)
    w.append(bs[0], cp(0))
    proxy.arm()
    with pytest.raises(ChangeLogUnavailable) as failed:  # not a crash (it was: a TypeError)
        w.append(bs[2], cp(1))
    assert "without their offsets" in failed.value.message
    assert proxy.duplicated == 1
    w.close()
    w = KafkaChangeLog(cfg)  # the capture retries from the checkpoint in Kafka
    assert w.next_offset == len(bs[0]) and w.last_checkpoint() == cp(0)
    w.append(bs[2], cp(1))
    w.append(bs[4], cp(2))
    w.close()
    reader = KafkaChangeLogReader(cfg)
    got = records(reader)
    reader.close()
    assert [r.offset for r in got] == list(range(len(bs[0]) + len(bs[2]) + len(bs[4])))


@pytest.mark.tansu  # Apache Kafka's idempotent producer state drops the second copy
def test_a_checkpoint_message_answered_without_its_offset_fails_the_commit(
        proxied: tuple[LogConfig, DupProxy], monkeypatch: pytest.MonkeyPatch) -> None:
    """Tansu on S3, restarted with a commit's checkpoint message in flight, answered the
    producer's retry as a duplicate and had not stored it: the commit went through, its
    records were in Kafka and its checkpoint message not, and readers skipped the
    records (a kept run of the broker restart test: 1,529 events missing). Such an
    answer now fails the commit; the retry resumes after the message if the broker has
    it after all (as here: Tansu in memory stored the first copy) and before it if not."""
    from pydblog.changelog.kafka.topics import checkpoint_topic

    cfg, proxy = proxied
    bs = batches()
    w = KafkaChangeLog(cfg)
    w.append(bs[0], cp(0))
    send = w._send

    def armed(topic: str, *args: Any, **kwargs: Any) -> None:
        if topic == checkpoint_topic(cfg.topic_prefix or ""):
            proxy.arm()
        send(topic, *args, **kwargs)

    monkeypatch.setattr(w, "_send", armed)
    with pytest.raises(ChangeLogUnavailable, match="checkpoint message without its offset"):
        w.append(bs[4], cp(1))
    assert proxy.duplicated == 1
    w.close()
    w = KafkaChangeLog(cfg)
    if w.next_offset == len(bs[0]):  # (a broker that hides aborted transactions)
        w.append(bs[4], cp(1))
    assert w.last_checkpoint() == cp(1)
    w.close()
    _read_all(cfg, len(bs[0]) + len(bs[4]))


def _copy_last(cfg: LogConfig, topic: str, part: int, tag: bytes | None = None,
               to: int | None = None) -> None:
    """Append a copy of the last record of ``topic`` ``part`` (value, key, headers), as a
    broker does that appends a produce twice; ``tag``: with that writer header instead;
    ``to``: into that partition."""
    from confluent_kafka import Producer

    from tests.kafka.test_kafka_log import partition_messages

    last = partition_messages(cfg, topic, part + 1)[part][-1]
    headers = [(k, tag if k == HEADER_WRITER and tag is not None else v)
               for k, v in last.headers() or ()]
    p = Producer({"bootstrap.servers": cfg.bootstrap_servers})
    p.produce(topic, last.value(), last.key(), partition=part if to is None else to,
              headers=headers)
    assert p.flush(10) == 0


def _read_all(cfg: LogConfig, want: int) -> None:
    reader = KafkaChangeLogReader(cfg)
    got = records(reader)
    reader.close()
    assert [r.offset for r in got] == list(range(want)), "every event once"


def test_a_copy_of_a_record_before_a_commit_fails_it(kafka_log: LogConfig) -> None:
    """A copy of this session's last record appended between two of its commits (in
    the span readers check the next commit's records in) fails that commit; another
    writer's record there does not (readers skip it: a fenced zombie's)."""
    kafka_log = kafka_log.model_copy(update={"partitions": 1})
    topic = data_topic(kafka_log.topic_prefix or "", "public.a")
    bs = batches()
    w = KafkaChangeLog(kafka_log)
    w.append(bs[0], cp(0))
    _copy_last(kafka_log, topic, 0, b"0:zombie")
    w.append(bs[4], cp(1))  # another writer's record: fine
    _copy_last(kafka_log, topic, 0)
    with pytest.raises(ChangeLogUnavailable, match="below the commit's first offset"):
        w.append(bs[0][:5], cp(2))
    w.close()
    w = KafkaChangeLog(kafka_log)
    assert w.next_offset == len(bs[0]) + len(bs[4])
    w.append(bs[0][:5], cp(2))
    w.close()
    _read_all(kafka_log, len(bs[0]) + len(bs[4]) + 5)


def test_a_copy_below_a_partition_without_a_run_fails_the_commit(kafka_log: LogConfig) -> None:
    """The notification topic's partition has no run (readers check its records'
    headers, where they also find the envelope): a record with this session's header
    below the commit's first offset there, in a partition this session has not written
    yet, fails the commit."""
    topic = notifications_topic(kafka_log.topic_prefix or "")
    bs = batches()
    w = KafkaChangeLog(kafka_log)
    w.append(bs[0], cp(0))
    w.append(bs[2], cp(1))  # two notifications
    w.close()
    w = KafkaChangeLog(kafka_log)
    _copy_last(kafka_log, topic, 0, w._tag)
    with pytest.raises(ChangeLogUnavailable, match="below the commit's first offset"):
        w.append(bs[2], cp(2))
    w.close()
    w = KafkaChangeLog(kafka_log)
    w.append(bs[2], cp(2))
    w.close()
    _read_all(kafka_log, len(bs[0]) + 2 * len(bs[2]))


def test_a_copy_between_a_commits_records_fails_it(
        kafka_log: LogConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of a produce appended while the transaction is still being written lies
    between the commit's first and last offsets: the commit fails (and a record of
    another writer there does not fail it)."""
    kafka_log = kafka_log.model_copy(update={"partitions": 1})
    topic = data_topic(kafka_log.topic_prefix or "", "public.a")
    bs = batches()
    w = KafkaChangeLog(kafka_log)
    w.append(bs[0], cp(0))
    produce = w._produce
    copy_tag: list[bytes | None] = [b"0:zombie"]

    def halves(events: Any, seq: int, topics: dict[str, str]) -> None:
        produce(events[:10], seq, topics)
        assert w._producer.flush(10) == 0
        _copy_last(kafka_log, topic, 0, copy_tag[0])
        produce(events[10:], seq + 10, topics)

    monkeypatch.setattr(w, "_produce", halves)
    w.append(bs[4], cp(1))  # another writer's record in between: fine
    copy_tag[0] = None
    with pytest.raises(ChangeLogUnavailable, match="records of this session at offsets"):
        w.append(bs[4], cp(2))
    w.close()
    w = KafkaChangeLog(kafka_log)
    w.append(bs[4], cp(2))
    w.close()
    _read_all(kafka_log, len(bs[0]) + 2 * len(bs[4]))


def test_acknowledged_offsets_below_the_sessions_records_fail_the_commit(
        kafka_log: LogConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tansu answered a retried produce with offsets -1, 0, 1, ... (its base offset -1:
    the first test); without the -1 they would pass for a commit's offsets (a run far
    below the partition's end, the checkpoint's ends wrong). Offsets that go back below
    the last valid commit's end there fail the commit, retriable while the partition
    holds records above them (a partition that ends with them lost records, a re-created
    topic: not retriable, ``test_kafka_log.py::test_a_recreated_topic_is_refused``)."""
    kafka_log = kafka_log.model_copy(update={"partitions": 1})
    tp = (data_topic(kafka_log.topic_prefix or "", "public.a"), 0)
    bs = batches()
    w = KafkaChangeLog(kafka_log)
    w.append(bs[0], cp(0))
    take = w._take_acks
    n = len(bs[4])

    def acknowledged_from_zero() -> None:  # the data's reports (then the checkpoint's)
        take()
        if tp in w._delivered:
            w._delivered[tp] = [0, n - 1, n]

    monkeypatch.setattr(w, "_take_acks", acknowledged_from_zero)
    with pytest.raises(ChangeLogUnavailable, match="the end of the last valid commit there, but "
                       "the partition holds records up to offset"):
        w.append(bs[4], cp(1))
    w.close()
    w = KafkaChangeLog(kafka_log)
    w.append(bs[4], cp(1))
    w.close()
    _read_all(kafka_log, len(bs[0]) + len(bs[4]))
