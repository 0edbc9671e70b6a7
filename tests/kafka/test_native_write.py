"""The Kafka writer's native path (``kafka_native``, C): byte for byte the records of the
Python path (value, key, partition, headers; tombstones, truncates and notifications,
template blocks, envelopes the C path leaves to Python), with the producer's queue full
again and again; and the commit's ends from the interceptor's acknowledgements."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from pydblog.changelog import kafka_native
from pydblog.changelog.kafka.reader import KafkaChangeLogReader
from pydblog.changelog.kafka.topics import (
    HEADER_SOURCE,
    HEADER_WRITER,
    notifications_topic,
    truncates_topic,
)
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.config import LogConfig
from pydblog.events import ChangeEvent, Encoded, EncodedEvent, Op, encode_event
from tests.kafka.test_kafka_log import batches, cp, pos, row_event

if not kafka_native.writer_available():
    pytest.skip("the native Kafka write (pydblog.changelog._kafkawrite) is not built",
                allow_module_level=True)


def run_blocks() -> list[Encoded]:
    """Template blocks of deletes and updates as the sources encode them: PostgreSQL's
    deletes by key, MySQL's updates and deletes with their before rows, one update in
    the middle of its block keyed by a column named ``before`` (its key is still the
    JSON value before the envelope's ``,"before":``)."""
    from pydblog.events import InsertRun, RowRun, encode_insert_run, encode_row_run
    from pydblog.positions import Lsn
    from pydblog.sources.mysql.position import BinlogPosition

    pg_del = InsertRun("public", "c", Lsn(900), 0, 901, 1_700_000_000_900, 25,
                       "\n".join(f'{{"id":{i}}},"before":{{"id":{i}}},"after":null}}'
                                  for i in range(25)), Op.DELETE)

    def rows(op: Op, n: int, odd: int = -1) -> str:
        out = []
        for i in range(n):
            key = f'{{"id":{i},"before":{i}}}' if i == odd else f'{{"id":{i}}}'
            row = orjson.dumps({"id": i, "v": f"é{i}"}).decode()
            after = "null" if op is Op.DELETE else orjson.dumps({"id": i, "v": f"n{i}"}).decode()
            out.append(f'{key},"before":{row},"after":{after}}}')
        return "\n".join(out)

    base = BinlogPosition("bin.000003", 4000, 0, "0-1-77")
    my_upd = RowRun("public", "d", base, 1_700_000_000_950, 30, rows(Op.UPDATE, 30, odd=12),
                    Op.UPDATE)
    my_del = RowRun("public", "d", base.with_index(30), 1_700_000_000_950, 20,
                    rows(Op.DELETE, 20), Op.DELETE)
    # a JSON value in the first before row holding TAIL_SEP's text
    json_row = orjson.dumps({"id": 1, "j": {"x": 1, "before": None, "after": 2}}).decode()
    my_json = RowRun("public", "d", base.with_index(50), 1_700_000_000_950, 2,
                     f'{{"id":1}},"before":{json_row},"after":{json_row}}}\n'
                     f'{{"id":2}},"before":{{"id":2}},"after":{{"id":2}}}}', Op.UPDATE)
    out: list[Encoded] = [*encode_insert_run(pg_del, "postgresql", "app", 1_700_000_000_990)]
    for run in (my_upd, my_del, my_json):
        out += encode_row_run(run, "mysql", "app", 1_700_000_000_990)
    assert len(out) == 4 and all(getattr(b, "head", "") for b in out)
    return out


def odd_batches() -> list[list[Encoded]]:
    """What the C path must leave to Python or cut with care: a key column named
    ``before`` (two ``,"before":`` in the envelope), a bytes body, a non-ASCII row, a
    notification between stream events, blocks of deletes and updates (``run_blocks``).
    (An event with a null key goes to a random partition, by either path: not here.)"""
    weird = row_event(Op.UPDATE, "a", 50, {"before": 7}, {"before": 7, "v": "é€"})
    as_bytes = row_event(Op.CREATE, "a", 51, {"id": 9000}, {"id": 9000, "v": "b"})
    assert isinstance(as_bytes, EncodedEvent)
    as_bytes = as_bytes._replace(body=as_bytes.body.encode() if isinstance(as_bytes.body, str)
                                 else as_bytes.body)
    note = encode_event(ChangeEvent(Op.NOTIFICATION, "public", "a", pos(53), 1,
                                    notification={"type": "STARTED"}), "postgresql", "app", 5)
    return [[weird, as_bytes, note,
             *[row_event(Op.DELETE, "a", 54 + i, {"id": 2000 + i}, None) for i in range(30)],
             *[row_event(Op.CREATE, "b", 90 + i, {"k": f"ü{i}"}, {"k": f"ü{i}"}) for i in range(40)]],
            run_blocks()]


def write(cfg: LogConfig) -> KafkaChangeLog:
    w = KafkaChangeLog(cfg)
    for i, b in enumerate(batches() + odd_batches()):
        w.append(b, cp(i))
    w.close()
    return w


def raw(cfg: LogConfig) -> list[tuple[Any, ...]]:
    """Every data record of the log's table, notification and truncate topics: (topic, partition, offset, key,
    value, headers without the session tag)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient

    prefix = cfg.topic_prefix or ""
    bootstrap = str(cfg.bootstrap_servers)
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    tps = [(name, p) for name, t in md.topics.items()
           if name.startswith(prefix + ".public.")
           or name in (notifications_topic(prefix), truncates_topic(prefix)) for p in t.partitions]
    assert tps
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "raw",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(t, p, 0) for t, p in tps])
    todo = set(tps)
    out = []
    deadline = time.monotonic() + 60
    while todo and time.monotonic() < deadline:
        m: Any
        for m in c.consume(1000, 0.5):
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard((m.topic(), m.partition()))
                continue
            headers = [(k, v) for k, v in m.headers() or () if k != HEADER_WRITER]
            out.append((m.topic()[len(prefix):], m.partition(), m.offset(), m.key(), m.value(),
                        headers))
    c.close()
    assert not todo
    return sorted(out)


@pytest.mark.parametrize(("queue", "source_header", "producer"),
                         [(1_000_000, False, "wire"), (1_000_000, True, "wire"),
                          (1_000_000, False, "librdkafka"), (7, False, "librdkafka"),
                          (1_000_000, True, "librdkafka")])
def test_native_records_are_the_python_records(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queue: int,
        source_header: bool, producer: str) -> None:
    """``queue``: librdkafka's ``queue.buffering.max.messages`` (7: its queue is full
    every few records, in runs of events, template blocks and tombstones).
    ``source_header``: the records carry ``dblog.source`` (the envelope's ``source``) or
    no header but the session tag and, for notifications, the envelope. ``producer``:
    the C path produces into the wire producer's accumulator or into librdkafka; the
    Python path's records (librdkafka's producer) are the oracle, partitions and offsets
    included."""
    def cfg(name: str) -> LogConfig:
        return LogConfig(type="kafka", path=str(tmp_path / name), bootstrap_servers=kafka_bootstrap,
                         topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3, tombstones=True,
                         source_header=source_header, producer=producer,  # type: ignore[arg-type]
                         kafka={"queue.buffering.max.messages": queue} if producer == "librdkafka"
                         else {})

    native_cfg, py_cfg = cfg("native"), cfg("py")
    calls: list[tuple[int, int]] = []  # (records produced, status) per call
    templates: list[tuple[bool, int, int]] = []  # (tombstones, rows, status) per call
    real, real_template = kafka_native.produce_events, kafka_native.produce_template

    def spy(*args: Any) -> tuple[int, int, int, int, str]:
        out = real(*args)
        calls.append((out[0] - args[3], out[2]))
        return out

    def spy_template(*args: Any) -> tuple[int, int, int, int, str]:
        out = real_template(*args)
        calls.append((out[0] - args[9], out[2]))
        templates.append((args[10], out[0] - args[9], out[2]))
        return out

    monkeypatch.setattr(kafka_native, "produce_events", spy)
    monkeypatch.setattr(kafka_native, "produce_template", spy_template)
    w = write(native_cfg)
    assert w._native and sum(n for n, _ in calls) > 400, "events and blocks went through C"
    assert (w._wire is not None) == (producer == "wire")
    assert any(status == 1 for _, status in calls)  # the envelopes left to Python
    assert any(status == 2 for _, status in calls) == (queue == 7)
    # blocks of deletes (with tombstones) and of updates with before rows cut in C, the
    # row keyed by a column named ``before`` too
    assert sum(n for tomb, n, _ in templates if tomb) == 25 + 20
    assert not any(status == 1 for *_, status in templates)
    assert any(status == 3 for *_, status in templates) == (queue == 7)
    monkeypatch.setattr(kafka_native, "writer_available", lambda: False)
    py = write(py_cfg)
    assert not py._native and py._wire is None
    got, want = raw(native_cfg), raw(py_cfg)
    assert len(want) > 400 and any(v is None for *_, v, _ in want)  # tombstones too
    assert got == want
    # every data record's key is its envelope's key (Debezium's: the key as JSON), its
    # headers the source block only if asked (a tombstone: its delete's)
    checked = 0
    for _topic, _part, _off, key, value, headers in want:
        env = orjson.loads(value) if value is not None else {}
        names = [k for k, _ in headers]
        if env.get("op") in ("c", "u", "d", "r"):
            assert key == (None if env["key"] is None else orjson.dumps(env["key"])), (key, value)
            if source_header:
                assert names == [HEADER_SOURCE], names
                assert orjson.loads(headers[0][1]) == env["source"]
            else:
                assert names == [], names
            checked += 1
        elif value is None:
            assert names == ([HEADER_SOURCE] if source_header else []), names
    assert checked > 400
    # Readers check the commits' ends (from the interceptor) against the records.
    a, b = KafkaChangeLogReader(native_cfg), KafkaChangeLogReader(py_cfg)
    ra, rb = a.read(0, 10**9), b.read(0, 10**9)
    assert [orjson.loads(r.body) for r in ra] == [orjson.loads(r.body) for r in rb]
    assert a.next_offset() == b.next_offset() == len(ra)
    a.close()
    b.close()


def test_a_producer_without_the_interceptor_is_refused(kafka_bootstrap: str) -> None:
    """``take_acks`` of a producer made without the plugin, or under another
    ``client.id``, is an error, never a read of another producer's counts."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": kafka_bootstrap, "client.id": "plain-producer"})
    with pytest.raises(RuntimeError, match="no pydblog acknowledgement interceptor"):
        kafka_native.take_acks(p, "plain-producer")
    with pytest.raises(RuntimeError, match=r"not a confluent-kafka producer with this client\.id"):
        kafka_native.take_acks(p, "someone-else")
    with pytest.raises(TypeError, match=r"needs a confluent_kafka\.Producer"):
        kafka_native.take_acks(object(), "plain-producer")
