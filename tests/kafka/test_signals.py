"""The Kafka signal channel (``[snapshot] signal_topic``) on a real broker: the same
answers as the signal table. Every kind of bad message gets one REJECTED notification
whose reason names the problem (for a bad signal, the very text ``parse_signal`` gives a
bad signal row); execute / pause / stop / resume work through the topic with their
notifications; a message with another key is ignored; no good signal is lost or applied
twice (the listener's offsets: a first start, a close in the middle of a batch)."""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from pydblog.config import Config, load_config
from pydblog.core.signals import parse_signal
from pydblog.errors import SignalError
from tests.contract.capture import Capture
from tests.contract.harness import Harness, PgHarness
from tests.helpers import wait_for, write_config
from tests.kafka.conftest import kafka_log_toml

W = "public\\.w"
PROGRESS = ("TABLE_SCAN_STARTED", "IN_PROGRESS", "TABLE_SCAN_COMPLETED")


class Topic:
    """A fresh one-partition signal topic, and a producer that returns offsets."""

    def __init__(self, bootstrap: str, name: str) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        self.name = name
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic(name, 1, 1)]).values():
            f.result()
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})

    def send(self, key: bytes | None, value: Any) -> int:
        """One message (``value``: bytes as is, None a tombstone, else JSON); its offset."""
        raw = value if isinstance(value, bytes) or value is None else orjson.dumps(value)
        box: list[int] = []
        self.producer.produce(self.name, raw, key,
                              on_delivery=lambda err, msg: box.append(-1 if err else msg.offset() or 0))
        self.producer.flush(10)
        assert box and box[0] >= 0, "not delivered"
        return box[0]


def _committed(bootstrap: str, group: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return int(c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset)
    finally:
        c.close()


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def _by_offset(events: list[dict[str, Any]], offset: int) -> list[dict[str, Any]]:
    """The notifications of the signal sent at ``offset`` (ids ``kafka-0-<offset>-<ts>``),
    but a table scan's progress ones."""
    return [e["notification"] for e in events
            if e["op"] == "n" and e["notification"]["type"] not in PROGRESS
            and e["notification"].get("signal_id", "").startswith(f"kafka-0-{offset}-")]


def _table_reason(kind: str, data: str | None) -> str:
    """What a signal row with these columns is rejected with (id replaced by ``ID``)."""
    try:
        parse_signal("ID", kind, data)
    except SignalError as exc:
        return str(exc)
    raise AssertionError(f"{kind} {data} is a valid signal")


# (value sent, what its REJECTED reason must hold: the table's reason for these
# columns, or words naming the problem and the fix)
BAD: list[tuple[Any, str | tuple[str, ...]]] = [
    (b"{not json", ("value is not JSON", "hint:", "execute-snapshot")),
    (b"[1, 2]", ("must be a JSON object", "hint:")),
    ({"data": {"data-collections": [W]}}, ('needs "type"', "execute-snapshot")),
    ({"type": 7, "data": {}}, ('needs "type"', "got 7")),
    ({"id": "x", "type": "execute-snapshot", "data": {"data-collections": [W]}},
     ("unknown field(s) id", "hint:")),
    ({"type": "explode", "data": {}}, _table_reason("explode", "{}")),
    ({"type": "execute-snapshot", "data": "{not json"}, _table_reason("execute-snapshot", "{not json")),
    ({"type": "execute-snapshot", "data": [W]}, _table_reason("execute-snapshot", orjson.dumps([W]).decode())),
    ({"type": "execute-snapshot", "data": {"data-collection": [W]}},
     _table_reason("execute-snapshot", orjson.dumps({"data-collection": [W]}).decode())),
    ({"type": "execute-snapshot", "data": {"data-collections": ["("]}},
     _table_reason("execute-snapshot", '{"data-collections": ["("]}')),
    ({"type": "execute-snapshot"}, _table_reason("execute-snapshot", None)),
    ({"type": "pause-snapshot", "data": {"data-collections": [W]}},
     _table_reason("pause-snapshot", orjson.dumps({"data-collections": [W]}).decode())),
]


def _harness(source: str, request: pytest.FixtureRequest) -> Harness:
    """The source with a table ``w`` of 2,000 rows."""
    if source == "postgres":
        h: Harness = PgHarness(request.getfixturevalue("pg_db"))
        rows = "SELECT g, 'v' || g, g FROM generate_series(1, 2000) g"
    else:
        from tests.mysql.harness import MariaHarness

        h = MariaHarness(request.getfixturevalue("mariadb"), request.getfixturevalue("my_db"))
        rows = "SELECT seq, CONCAT('v', seq), seq FROM seq_1_to_2000"
    h.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)", f"INSERT INTO w {rows}")
    return h


@pytest.mark.parametrize(("source", "watermark"), [
    ("postgres", "table"), ("postgres", "read-only"),
    pytest.param("mariadb", "table", marks=pytest.mark.slow),
])
def test_signal_topic_answers_like_the_signal_table(
    tmp_path: Path, kafka_bootstrap: str, source: str, watermark: str,
    request: pytest.FixtureRequest,
) -> None:
    h = _harness(source, request)
    W = f"{h.schema}\\.w"  # (the module's W, in this source's schema)
    prefix = f"g{uuid.uuid4().hex[:8]}"
    topic = Topic(kafka_bootstrap, f"{prefix}-signals")
    extra = kafka_log_toml(kafka_bootstrap, prefix, "partitions = 2\n"
                           f'[snapshot]\nsignal_topic = "{topic.name}"\nchunk_size = 10\n'
                           f'watermark = "{watermark}"\n')
    group = f"dblog-signals.{prefix}"
    with Capture(h, tmp_path, extra) as cap:
        # The listener's first start commits the topic's end: from then on nothing is missed.
        wait_for(lambda: _committed(kafka_bootstrap, group, topic.name) >= 0, 60,
                 "the listener's first committed offset")
        ours = prefix.encode()
        bad = [(topic.send(ours, value), want) for value, want in BAD]
        other = topic.send(b"other", {"type": "execute-snapshot", "data": {"data-collections": [W]}})
        topic.send(ours, None)  # a tombstone: nothing
        unknown = topic.send(ours, {"type": "execute-snapshot",
                                    "data": {"data-collections": ["public\\.nope"]}})
        bad_filter = topic.send(ours, {"type": "execute-snapshot", "data": {
            "data-collections": [W],
            "additional-conditions": [{"data-collection": W, "filter": "n = (((("}]}})
        events = cap.wait_until(lambda ev: all(_by_offset(ev, o) for o, _ in bad)
                                and bool(_by_offset(ev, unknown)) and any(
                                    n["type"] == "COMPLETED" for n in _by_offset(ev, bad_filter)),
                                120, "an answer to every bad signal")
        for offset, want in bad:
            notes = _by_offset(events, offset)
            assert [n["type"] for n in notes] == ["REJECTED"], (offset, notes)
            reason = notes[0]["additional_data"]["reason"]
            if isinstance(want, str):  # the signal table's own reason, word for word
                assert reason == want.replace("'ID'", repr(notes[0]["signal_id"])), (reason, want)
            else:
                assert all(w in reason for w in want), (reason, want)
        skipped = _by_offset(events, unknown)
        assert [n["type"] for n in skipped] == ["SKIPPED"] and skipped[0]["additional_data"]["unknown"] == ["public\\.nope"]
        filtered = [n["type"] for n in _by_offset(events, bad_filter)]
        assert filtered == ["STARTED", "REJECTED", "COMPLETED"], filtered
        assert "filter" in _by_offset(events, bad_filter)[1]["additional_data"]["reason"]

        # execute + pause in one go: the 200-chunk snapshot is paused while it runs
        execute = topic.send(ours, {"type": "execute-snapshot",
                                    "data": {"data-collections": [W], "type": "INCREMENTAL"}})
        pause = topic.send(ours, {"type": "pause-snapshot", "data": {}})
        events = cap.wait_until(lambda ev: bool(_by_offset(ev, pause)), 60, "PAUSED")
        assert [n["type"] for n in _by_offset(events, execute)] == ["STARTED"]
        assert [n["type"] for n in _by_offset(events, pause)] == ["PAUSED"]
        # resume + pause in one go: running again, then paused again (deterministic below)
        resume = topic.send(ours, {"type": "resume-snapshot"})
        pause2 = topic.send(ours, {"type": "pause-snapshot"})
        events = cap.wait_until(lambda ev: bool(_by_offset(ev, pause2)), 60, "PAUSED again")
        assert [n["type"] for n in _by_offset(events, resume)] == ["RESUMED"]
        assert [n["type"] for n in _by_offset(events, pause2)] == ["PAUSED"]
        stop = topic.send(ours, {"type": "stop-snapshot", "data": {"data-collections": [W]}})
        events = cap.wait_until(lambda ev: bool(_by_offset(ev, stop)), 60, "ABORTED")
        assert [n["type"] for n in _by_offset(events, stop)] == ["ABORTED"]
        assert _by_offset(events, stop)[0]["additional_data"]["data_collections"] == [f"{h.schema}.w"]
        resume2 = topic.send(ours, {"type": "resume-snapshot"})  # nothing paused any more
        again = topic.send(ours, {"type": "execute-snapshot", "data": {"data-collections": [W]}})
        events = cap.wait_until(lambda ev: any(n["type"] == "COMPLETED" for n in _by_offset(ev, again)),
                                120, "the second snapshot's COMPLETED")
        assert [n["type"] for n in _by_offset(events, resume2)] == ["SKIPPED"]
        assert [n["type"] for n in _by_offset(events, again)] == ["STARTED", "COMPLETED"]
        # W was the snapshot's only table: the stop ended it, ABORTED under its own id
        assert [n["type"] for n in _by_offset(events, execute)] == ["STARTED", "ABORTED"]
        assert not _by_offset(events, other), "a message with another key was applied"
        cap.assert_oracle({"w": ["id"]})
        assert _committed(kafka_bootstrap, group, topic.name) == again + 1


def _listener_config(tmp_path: Path, dsn: str, bootstrap: str, topic: str) -> Config:
    return load_config(write_config(tmp_path, dsn, extra=kafka_log_toml(
        bootstrap, f"l{uuid.uuid4().hex[:8]}", f'[snapshot]\nsignal_topic = "{topic}"\n')))


def _signal_ids(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM dblog_signal ORDER BY id")]


def test_first_start_commits_its_position(pg_db: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    """A signal sent while `dblog run` is down after its first start is forwarded at the
    next start (the listener used to start at the topic's end again: lost); forwarded
    again after a crash before its offset was committed, it is one signal row still."""
    from pydblog.capture.kafka_signals import KafkaSignalListener

    PgHarness(pg_db)  # the signal table
    topic = Topic(kafka_bootstrap, f"f{uuid.uuid4().hex[:8]}-signals")
    cfg = _listener_config(tmp_path, pg_db, kafka_bootstrap, topic.name)
    first = KafkaSignalListener(cfg)
    assert first.assigned.wait(30)
    first.close()
    offset = topic.send(cfg.log.topic_prefix.encode() if cfg.log.topic_prefix else b"",
                        {"type": "execute-snapshot", "data": {"data-collections": [W]}})
    group = f"dblog-signals.{cfg.log.topic_prefix}"
    second = KafkaSignalListener(cfg)
    try:
        wait_for(lambda: _committed(kafka_bootstrap, group, topic.name) == offset + 1, 30,
                 "the signal's offset committed")
    finally:
        second.close()
    [row] = _signal_ids(pg_db)
    assert row.startswith(f"kafka-0-{offset}-")
    _commit(kafka_bootstrap, group, topic.name, offset)  # as if it crashed before committing
    third = KafkaSignalListener(cfg)
    try:
        wait_for(lambda: _committed(kafka_bootstrap, group, topic.name) == offset + 1, 30,
                 "the signal's offset committed again")
    finally:
        third.close()
    assert _signal_ids(pg_db) == [row]


def test_close_commits_nothing_past_an_unforwarded_signal(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """The listener is closed while a signal cannot be forwarded (no signal table yet)
    and the same batch holds another capture's message after it: the group's offset
    stays before the signal (committing the later message's offset lost it), and the
    next listener forwards it."""
    from pydblog.capture.kafka_signals import GROUP, KafkaSignalListener

    topic = Topic(kafka_bootstrap, f"c{uuid.uuid4().hex[:8]}-signals")
    cfg = _listener_config(tmp_path, pg_db, kafka_bootstrap, topic.name)
    prefix = str(cfg.log.topic_prefix)
    group = GROUP.format(prefix=prefix)
    _commit(kafka_bootstrap, group, topic.name, 0)  # both messages in the first batch
    good = topic.send(prefix.encode(), {"type": "execute-snapshot", "data": {"data-collections": [W]}})
    topic.send(b"other", {"type": "execute-snapshot", "data": {"data-collections": [W]}})
    tried = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "cannot forward Kafka signal" in record.getMessage():
                tried.set()

    handler = Seen()
    logging.getLogger("pydblog.capture.kafka_signals").addHandler(handler)
    try:
        listener = KafkaSignalListener(cfg)
        try:
            assert tried.wait(30), "the listener never tried to forward the signal"
        finally:
            listener.close()
    finally:
        logging.getLogger("pydblog.capture.kafka_signals").removeHandler(handler)
    assert _committed(kafka_bootstrap, group, topic.name) == good == 0
    PgHarness(pg_db)  # the signal table, now
    listener = KafkaSignalListener(cfg)
    try:
        wait_for(lambda: bool(_signal_ids(pg_db)), 30, "the signal row")
        wait_for(lambda: _committed(kafka_bootstrap, group, topic.name) == 2, 30, "offset 2 committed")
    finally:
        listener.close()
    [row] = _signal_ids(pg_db)
    assert row.startswith(f"kafka-0-{good}-")



class _OnePartitionFirst:
    """The listener's consumer, whose metadata shows ``topic`` with its partition 0 only
    until ``grown`` is set: the topic as it was before a partition was added. (Tansu
    cannot add partitions, and librdkafka crashed when the topic was deleted and created
    again with two under the listener's assigned consumer.) Everything else is the real
    consumer's."""

    def __init__(self, real: Any, topic: str, grown: threading.Event) -> None:
        self.real, self.topic, self.grown = real, topic, grown
        self.assigned: list[int] = []  # (the test's thread must not call the consumer)

    def assign(self, tps: list[Any]) -> None:
        self.assigned = [tp.partition for tp in tps]
        self.real.assign(tps)

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        md = self.real.list_topics(*args, **kwargs)
        t = md.topics.get(self.topic)
        if t is not None and not self.grown.is_set():
            t.partitions = {p: v for p, v in t.partitions.items() if p == 0}
        return md

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_partition_added_while_running_is_read(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition added to the signal topic while the listener runs is found by its
    metadata refresh and read from its start (before: only from the capture's next
    start, so a signal sent there waited for a restart)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    from pydblog.capture import kafka_signals
    from pydblog.changelog.kafka import client as kafka_client

    monkeypatch.setattr(kafka_signals, "REFRESH_S", 0.5, raising=False)
    PgHarness(pg_db)  # the signal table
    name = f"g{uuid.uuid4().hex[:8]}-signals"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.create_topics([NewTopic(name, 2, 1)]).values():
        fut.result()
    grown = threading.Event()
    real_make = kafka_client.make_client
    monkeypatch.setattr(kafka_client, "make_client", lambda *a: _OnePartitionFirst(real_make(*a), name, grown))
    cfg = _listener_config(tmp_path, pg_db, kafka_bootstrap, name)
    listener = kafka_signals.KafkaSignalListener(cfg)
    try:
        assert listener.assigned.wait(30)
        assert listener.consumer.assigned == [0]
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
        value = orjson.dumps({"type": "execute-snapshot", "data": {"data-collections": [W]}})
        producer.produce(name, value, str(cfg.log.topic_prefix).encode(), partition=1)
        assert producer.flush(10) == 0
        grown.set()  # the partition "added"
        wait_for(lambda: any(i.startswith("kafka-1-0-") for i in _signal_ids(pg_db)), 30,
                 "the signal sent to the new partition forwarded")
    finally:
        listener.close()


class _Looks:
    """The listener's consumer, which sets ``missing`` once its metadata has shown no
    ``topic`` (the listener looked for it and retries). Everything else is the real
    consumer's."""

    def __init__(self, real: Any, topic: str) -> None:
        self.real, self.topic = real, topic
        self.missing = threading.Event()

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        md = self.real.list_topics(*args, **kwargs)
        if self.topic not in md.topics:
            self.missing.set()
        return md

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_signal_topic_created_after_the_start(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener starts before its signal topic exists (the first signal creates
    it): that signal, sent after the start, is forwarded (a listener that
    started at the end of the topic it found, and committed that offset as handled, lost it)."""
    from pydblog.capture import kafka_signals
    from pydblog.changelog.kafka import client as kafka_client

    PgHarness(pg_db)  # the signal table
    name = f"n{uuid.uuid4().hex[:8]}-signals"
    real_make = kafka_client.make_client
    monkeypatch.setattr(kafka_client, "make_client", lambda *a: _Looks(real_make(*a), name))
    cfg = _listener_config(tmp_path, pg_db, kafka_bootstrap, name)
    listener = kafka_signals.KafkaSignalListener(cfg)
    try:
        assert listener.consumer.missing.wait(30), "the listener never looked for its topic"
        topic = Topic(kafka_bootstrap, name)
        offset = topic.send(str(cfg.log.topic_prefix).encode(),
                            {"type": "execute-snapshot", "data": {"data-collections": [W]}})
        group = f"dblog-signals.{cfg.log.topic_prefix}"
        wait_for(lambda: _committed(kafka_bootstrap, group, name) == offset + 1, 30,
                 "the signal's offset committed")
    finally:
        listener.close()
    [row] = _signal_ids(pg_db)
    assert row.startswith(f"kafka-0-{offset}-")


def test_an_idle_listener_keeps_its_group_offsets(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener never joins its group, whose committed offsets Kafka expires
    ``offsets.retention.minutes`` (7 days) after the last commit: a listener idle that
    long commits its positions again at every metadata refresh."""
    from confluent_kafka.admin import AdminClient

    from pydblog.capture import kafka_signals

    monkeypatch.setattr(kafka_signals, "REFRESH_S", 0.5)
    PgHarness(pg_db)  # the signal table
    topic = Topic(kafka_bootstrap, f"i{uuid.uuid4().hex[:8]}-signals")
    cfg = _listener_config(tmp_path, pg_db, kafka_bootstrap, topic.name)
    group = f"dblog-signals.{cfg.log.topic_prefix}"
    listener = kafka_signals.KafkaSignalListener(cfg)
    try:
        offset = topic.send(str(cfg.log.topic_prefix).encode(),
                            {"type": "execute-snapshot", "data": {"data-collections": [W]}})
        wait_for(lambda: _committed(kafka_bootstrap, group, topic.name) == offset + 1, 30,
                 "the signal's offset committed")
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for f in admin.delete_consumer_groups([group], request_timeout=10).values():
            f.result()  # expired
        assert _committed(kafka_bootstrap, group, topic.name) < 0
        wait_for(lambda: _committed(kafka_bootstrap, group, topic.name) == offset + 1, 30,
                 "the position committed again")
    finally:
        listener.close()


class _Warnings(logging.Handler):
    """The listener's WARNING lines, while in a ``with``."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.lines.append(record.getMessage())

    def __enter__(self) -> list[str]:
        logging.getLogger("pydblog.capture.kafka_signals").addHandler(self)
        return self.lines

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("pydblog.capture.kafka_signals").removeHandler(self)


def _two_partitions(bootstrap: str, cfg_topic: str) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(cfg_topic, 2, 1)]).values():
        fut.result()


def test_a_first_start_reads_from_the_first_run_with_the_topic(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """No offset anywhere (the capture's checkpoint names the topic, nothing handled
    yet): signals sent before the capture was first run with the topic (less the clock
    skew margin, ``SKEW_MS``) are not replayed, each skip a WARNING naming its offset
    and timestamp; those sent after it are forwarded, in partition 1 one sent before the
    listener was assigned (a listener that started at the topic's end lost a
    signal sent between the start and its assignment) whose producer's clock
    is 30 s behind (skipped, logged at INFO only). Partition 0 has no newer
    message when the listener is assigned: Kafka then answers offsets_for_times with the
    partition's end, and the older message is never read (a broker that answers 0, as
    Tansu did, makes the listener read it and skip it by its timestamp, with a WARNING);
    the signal sent there after the
    assignment is forwarded though its timestamp is 10 min before the first run (a
    producer with a clock far behind: anything past the end at the assignment was sent
    after the start)."""
    import time

    from confluent_kafka import Producer

    from pydblog.capture.kafka_signals import Handled, KafkaSignalListener

    PgHarness(pg_db)  # the signal table
    name = f"t{uuid.uuid4().hex[:8]}-signals"
    _two_partitions(kafka_bootstrap, name)
    cfg = _listener_config(tmp_path, pg_db, kafka_bootstrap, name)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
    since = int(time.time() * 1000)

    def send(partition: int, ago_ms: int) -> None:
        producer.produce(name, orjson.dumps({"type": "execute-snapshot",
                                             "data": {"data-collections": [W]}}),
                         str(cfg.log.topic_prefix).encode(), partition=partition,
                         timestamp=since - ago_ms)
        assert producer.flush(10) == 0

    send(0, 600_000)
    send(1, 600_000)  # offset 0 of both: older than the first run
    handled = Handled(name, since)
    handled.load({"topic": name, "since_ms": since, "next": {}})  # the checkpoint's
    send(1, 30_000)  # offset 1: sent before the listener, by a clock 30 s behind
    with _Warnings() as warned:
        listener = KafkaSignalListener(cfg, handled)
        try:
            assert listener.assigned.wait(30)
            send(0, 600_000)  # offset 1: sent after its assignment, by a clock 10 min behind
            wait_for(lambda: len(_signal_ids(pg_db)) >= 2, 30, "the two newer signals forwarded")
        finally:
            listener.close()
    assert [i.rsplit("-", 1)[0] for i in _signal_ids(pg_db)] == ["kafka-0-1", "kafka-1-1"]
    assert warned == [], "nothing older than the first run was read"


def test_a_kill_before_the_first_checkpoint_keeps_since_ms(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """`dblog run` is killed before its listener read anything and before
    its first checkpoint; a signal was sent meanwhile. The restart (here 10 min later)
    keeps the first process's ``since_ms`` (noted in the log directory before the
    listener starts), so the signal is forwarded, not skipped as older than the restart."""
    import time
    from types import SimpleNamespace

    from confluent_kafka import Producer

    from pydblog.capture.service import _kafka_signals

    name = f"k{uuid.uuid4().hex[:8]}-signals"
    topic = Topic(kafka_bootstrap, name)
    cfg = _listener_config(tmp_path, pg_db, kafka_bootstrap, name)
    key = str(cfg.log.topic_prefix).encode()
    t0 = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
    producer.produce(name, orjson.dumps({"type": "execute-snapshot", "data": {"data-collections": [W]}}),
                     key, timestamp=t0 - 600_000)  # offset 0: older than the first run
    assert producer.flush(10) == 0
    first = SimpleNamespace(kafka_signals=None)
    listener = _kafka_signals(cfg, first, t0)  # type: ignore[arg-type]
    # (killed in its recovery: its positions never loaded, nothing read, no checkpoint)
    listener.close()
    offset = topic.send(key, {"type": "execute-snapshot", "data": {"data-collections": [W]}})
    PgHarness(pg_db)  # the signal table
    again = SimpleNamespace(kafka_signals=None)
    listener = _kafka_signals(cfg, again, t0 + 600_000)  # type: ignore[arg-type]
    again.kafka_signals.load(None)  # (no checkpoint)
    try:
        assert again.kafka_signals.since_ms == t0
        wait_for(lambda: _committed(kafka_bootstrap, f"dblog-signals.{cfg.log.topic_prefix}",
                                    name) == offset + 1, 30, "the signal's offset committed")
    finally:
        listener.close()
    assert [i.rsplit("-", 1)[0] for i in _signal_ids(pg_db)] == [f"kafka-0-{offset}"]


class _Retained:
    """The listener's consumer, whose partitions start at ``low``: as if retention had
    deleted the records below it (Tansu has no retention). Everything else is the real
    consumer's."""

    def __init__(self, real: Any, low: int) -> None:
        self.real, self.low = real, low

    def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        lo, hi = self.real.get_watermark_offsets(*args, **kwargs)
        return max(lo, self.low), hi

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_signals_deleted_before_they_were_read(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dblog run` was down longer than the signal topic's retention: the listener's
    offset is below the partition's start. It starts at the first signal kept, with a
    warning naming the deleted offsets, and handles every kept one (with
    auto.offset.reset = latest, librdkafka would skip the kept ones too)."""
    from pydblog.capture import kafka_signals
    from pydblog.changelog.kafka import client as kafka_client

    PgHarness(pg_db)  # the signal table
    topic = Topic(kafka_bootstrap, f"r{uuid.uuid4().hex[:8]}-signals")
    cfg = _listener_config(tmp_path, pg_db, kafka_bootstrap, topic.name)
    key = str(cfg.log.topic_prefix).encode()
    group = f"dblog-signals.{cfg.log.topic_prefix}"
    _commit(kafka_bootstrap, group, topic.name, 0)  # handled nothing yet
    sent = [topic.send(key, {"type": "execute-snapshot", "data": {"data-collections": [W]}})
            for _ in range(3)]
    real_make = kafka_client.make_client
    monkeypatch.setattr(kafka_client, "make_client", lambda *a: _Retained(real_make(*a), 2))
    warned: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warned.append(record.getMessage())

    handler = Seen()
    logging.getLogger("pydblog.capture.kafka_signals").addHandler(handler)
    try:
        listener = kafka_signals.KafkaSignalListener(cfg)
        try:
            wait_for(lambda: _committed(kafka_bootstrap, group, topic.name) == 3, 30,
                     "the kept signal's offset committed")
        finally:
            listener.close()
    finally:
        logging.getLogger("pydblog.capture.kafka_signals").removeHandler(handler)
    assert sent == [0, 1, 2]
    assert [i.rsplit("-", 1)[0] for i in _signal_ids(pg_db)] == ["kafka-0-2"]
    assert any("offsets 0 to 1" in w and "deleted" in w for w in warned), warned
