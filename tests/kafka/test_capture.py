"""`dblog run` into Kafka: kill -9 under load (at random moments and at each step of a
Kafka commit), `dblog tail` and `dblog status` on Kafka.
The oracle: the topics, read back, materialize to the source table, and no source
position is logged twice."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.chaos import kill_and_restart, kill_seed, pg_writer, writing
from tests.helpers import (
    LogFollower,
    assert_materializes_to_source,
    assert_oracle,
    dblog,
    kill9,
    start_run,
    stop_run,
    tail,
    wait_for,
    write_config,
)
from tests.kafka.conftest import kafka_log_toml


def _table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)")


def _check(config: Path, dsn: str, read: Any = None) -> list[dict[str, Any]]:
    events = assert_oracle(config, dsn, {"public.w": ["id"]}, read)
    _check_events(events)
    return events


def _check_events(events: list[dict[str, Any]]) -> None:
    positions = [(e["source"]["lsn"], e["source"]["index"]) for e in events]
    assert len(positions) == len(set(positions)), "a source position was logged twice"
    assert positions == sorted(positions), "offsets do not follow source positions"
    assert [e["offset"] for e in events] == list(range(len(events))), "offsets are not dense"


def test_kill9_during_load(pg_db: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    _table(pg_db)
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(
        kafka_bootstrap, extra="partitions = 3\nbatch_max_events = 200"))
    procs = [start_run(config)]
    with writing(pg_writer(pg_db, 5)):
        done = kill_and_restart(lambda: kill9(procs[-1]), lambda: procs.append(start_run(config)),
                                5, kill_seed(13), delay=(0.5, 2.0), restart_last=False)
    proc = start_run(config)
    try:
        try:
            _check(config, pg_db)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{done}") from exc
    finally:
        code, out = stop_run(proc)
    assert code == 0, out


@pytest.mark.parametrize("step", ["kafka-after-data", "kafka-before-commit"])
def test_crash_at_each_step_of_a_kafka_commit(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str, step: str
) -> None:
    _table(pg_db)
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(kafka_bootstrap, extra="partitions = 2"))
    for n in (1, 2, 1):
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for i in range(30):
                conn.execute("INSERT INTO w VALUES (%s, 'a', 0) ON CONFLICT (id) DO UPDATE SET n = w.n + 1", (i,))
        proc = start_run(config, env={"DBLOG_CRASH_AT": f"{step}:{n}"}, wait=False)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 137, err.decode()[-2000:]
    proc = start_run(config)
    try:
        _check(config, pg_db)
        status = orjson.loads(dblog("status", "--config", str(config), "--json").stdout)
        log = status["changelog"]
        assert log["type"] == "kafka" and log["last_offset"] >= 59  # rounds 2 and 3 (the slot is created after round 1)
        assert any(t.endswith(".public.w") for t in log["topics"])
    finally:
        code, out = stop_run(proc)
    assert code == 0, out


def test_signal_topic(pg_db: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    """Debezium's Kafka signal channel: execute-snapshot sent to [snapshot] signal_topic
    (key = topic prefix) snapshots the table; a message with another key is ignored, a
    malformed one is REJECTED; each signal is handled once (every kind of bad message,
    stop / pause / resume: tests/kafka/test_signals.py)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    _table(pg_db)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO w SELECT g, 'v', 0 FROM generate_series(1, 300) g")
    prefix = f"s{uuid.uuid4().hex[:8]}"
    signals = f"{prefix}-signals"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.create_topics([NewTopic(signals, 1, 1)]).values():
        f.result()
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(
        kafka_bootstrap, prefix, f'[snapshot]\nsignal_topic = "{signals}"\nchunk_size = 64\n'))
    proc = start_run(config)
    try:
        # Signals sent from the moment the capture's checkpoint names the signal topic
        # are handled (docs/kafka.md); the first checkpoint holds it already.
        wait_for(lambda: _signal_entry(config) is not None, 60, "the signal topic in the checkpoint")
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        p.produce(signals, b"not json", prefix.encode())
        p.produce(signals, orjson.dumps({"type": "execute-snapshot",
                                         "data": {"data-collections": ["public\\.w"]}}), b"other")
        p.produce(signals, orjson.dumps({"type": "execute-snapshot",
                                         "data": {"data-collections": ["public\\.w"]}}), prefix.encode())
        p.flush(10)

        follow = LogFollower(config)  # in-process: a `dblog tail` per poll cost ~1 s of CPU

        def done() -> bool:
            return any(e["op"] == "n" and e["notification"]["type"] == "COMPLETED"
                       for e in follow())

        try:
            wait_for(done, 120, "the snapshot's COMPLETED notification")
        finally:
            follow.close()
        events = _check(config, pg_db)
        assert tail(config)[:len(events)] == events  # `dblog tail` on Kafka prints the same
        reads = [e for e in events if e["op"] == "r"]
        assert len(reads) == 300
        started = [e for e in events if e["op"] == "n" and e["notification"]["type"] == "STARTED"]
        assert len(started) == 1 and started[0]["notification"]["signal_id"].startswith("kafka-0-")
        rejected = [e["notification"] for e in events
                    if e["op"] == "n" and e["notification"]["type"] == "REJECTED"]
        assert len(rejected) == 1 and "not JSON" in rejected[0]["additional_data"]["reason"]
        assert rejected[0]["signal_id"].startswith("kafka-0-0-")  # the first message
    finally:
        code, out = stop_run(proc)
    assert code == 0, out


def _signal_entry(config: Path) -> dict[str, Any] | None:
    """What the capture's checkpoint in the change log records of its signal topic."""
    from pydblog.changelog import describe
    from pydblog.config import load_config

    _, cp = describe(load_config(config).log)
    entry = cp.extra.get("kafka_signals") if cp is not None else None
    return entry if isinstance(entry, dict) else None


def _signal_notes(events: list[dict[str, Any]], at: tuple[int, int]) -> list[str]:
    """The notification types of the signal at ``at`` (partition, offset)."""
    return [e["notification"]["type"] for e in events
            if e["op"] == "n" and e["notification"].get("signal_id", "").startswith(f"kafka-{at[0]}-{at[1]}-")
            and e["notification"]["type"] in ("STARTED", "COMPLETED", "REJECTED", "SKIPPED")]


def test_signals_before_the_topic_exists_and_while_down(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """Every signal sent after the capture was first configured with its signal topic is
    handled once: the first one, which creates the topic while `dblog
    run` runs (the listener used to start at the end of the topic it found then: the
    signal was never forwarded and its offset committed as handled), and one sent while
    `dblog run` is down after the listener's consumer-group offsets are gone (expired
    after a quiet week; the next start used to be a "first start" again, at the end).
    The signal rows are deleted meanwhile: only the capture's checkpoint says that the
    first signal was handled."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    _table(pg_db)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO w SELECT g, 'v', 0 FROM generate_series(1, 30) g")
    prefix = f"f{uuid.uuid4().hex[:8]}"
    signals = f"{prefix}-signals"  # no such topic yet
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(
        kafka_bootstrap, prefix, f'[snapshot]\nsignal_topic = "{signals}"\n'))
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})

    def send() -> tuple[int, int]:
        box: list[tuple[int, int]] = []
        producer.produce(signals, orjson.dumps({"type": "execute-snapshot",
                                                "data": {"data-collections": ["public\\.w"]}}),
                         prefix.encode(), on_delivery=lambda err, m: box.append(
                             (-1, -1) if err else (m.partition() or 0, m.offset() or 0)))
        producer.flush(10)
        assert box and box[0][1] >= 0, "not delivered"
        return box[0]

    def completed(at: tuple[int, int]) -> None:
        follow = LogFollower(config)
        try:
            wait_for(lambda: "COMPLETED" in _signal_notes(follow(), at), 60,
                     f"the COMPLETED notification of the signal at {at} (partition, offset)")
        finally:
            follow.close()

    proc = start_run(config)
    try:
        first = send()  # (creates the topic, as Kafka's auto.create.topics.enable does)
        completed(first)
    finally:
        code, out = stop_run(proc)
    assert code == 0, out
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.delete_consumer_groups([f"dblog-signals.{prefix}"], request_timeout=10).values():
        f.result()  # as Kafka expires a memberless group's offsets (offsets.retention.minutes)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("DELETE FROM dblog_signal")
    second = send()
    proc = start_run(config)
    try:
        completed(second)
        events = tail(config)
    finally:
        code, out = stop_run(proc)
    assert code == 0, out
    assert _signal_notes(events, first) == ["STARTED", "COMPLETED"]
    assert _signal_notes(events, second) == ["STARTED", "COMPLETED"]


BROKER_KILLS = (True, False, True)


def _leave_raw(broker: Any, config: Path, tmp_path: Path) -> None:
    """A failed check leaves the topics' records behind (and the broker's log)."""
    from pydblog.config import load_config
    from tests.kafka.rawdump import dump_records

    prefix = load_config(config).log.topic_prefix
    assert prefix is not None
    try:
        dump_records(broker.bootstrap, prefix, tmp_path / "records.jsonl")
        for node in getattr(broker, "nodes", ()):
            (tmp_path / f"broker{node.node_id}.log").write_bytes(node.log_file.read_bytes())
    except Exception as exc:  # a diagnostic only
        (tmp_path / "rawdump-error.txt").write_text(repr(exc))


class _Follower:
    """The whole log as ``dblog tail`` prints it, read by one ``KafkaChangeLogReader``
    kept open: each call reads only what is new (a full ``dblog tail`` per poll of an
    broker that reads a few record batches a second, took minutes)."""

    def __init__(self, config: Path) -> None:
        from pydblog.changelog.kafka.reader import KafkaChangeLogReader
        from pydblog.config import load_config

        self.reader = KafkaChangeLogReader(load_config(config).log)
        self.events: list[dict[str, Any]] = []

    def __call__(self) -> list[dict[str, Any]]:
        from pydblog.errors import ChangeLogUnavailable

        try:
            while batch := self.reader.read(len(self.events), 100_000):
                offsets = [r.offset for r in batch]
                if offsets != list(range(len(self.events), len(self.events) + len(batch))):
                    # (not an AssertionError: a marker wait takes that for "not yet")
                    twice = sorted({o for o in offsets if offsets.count(o) > 1})
                    have = set(offsets)
                    gaps = [o for o in range(len(self.events), max(offsets) + 1) if o not in have]
                    raise RuntimeError(f"offsets are not dense from {len(self.events)}: "
                                       f"{len(twice)} read twice, e.g. {twice[:5]}; "
                                       f"{len(gaps)} missing, e.g. {gaps[:5]}")
                self.events.extend({"offset": r.offset, **orjson.loads(r.body)} for r in batch)
        except ChangeLogUnavailable:  # S3 (moto) under a loaded machine: read on next poll
            pass
        return self.events


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def _wait_caught_up(config: Path, dsn: str, stall: float) -> None:
    """Wait until the capture's saved position (``state.json``: saved only once Kafka
    committed everything up to it) passes the source's WAL position now (the next
    heartbeat's takes it there). The wait goes on while the position moves, and fails
    once it stood still for ``stall`` seconds."""
    from pydblog.config import load_config

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    target = _lsn(row[0])
    state = load_config(config).log_dir / "state.json"
    last, moved = -1, time.monotonic()
    while True:
        try:
            at = int(orjson.loads(state.read_bytes())["position"]["lsn"])
        except (OSError, ValueError, KeyError, TypeError):
            at = -1
        if at >= target:
            return
        if at != last:
            last, moved = at, time.monotonic()
        if time.monotonic() - moved > stall:
            raise AssertionError(f"the capture's saved position {at} did not reach the source's "
                                 f"{target}: it stood still for {stall:.0f} s")
        time.sleep(0.5)


def _read_whole(config: Path, stall: float) -> list[dict[str, Any]]:
    """The whole log (the capture stopped: it no longer grows), read through one
    ``_Follower``; the read goes on while it gets events, and fails once it got none
    for ``stall`` seconds."""
    from pydblog.errors import ChangeLogUnavailable

    follow = _Follower(config)
    try:
        got, moved = -1, time.monotonic()
        while True:
            events = follow()
            try:
                if len(events) == follow.reader.next_offset():
                    return events
            except ChangeLogUnavailable:
                pass
            if len(events) != got:
                got, moved = len(events), time.monotonic()
            if time.monotonic() - moved > stall:
                raise AssertionError(f"reading the log stood still at {len(events)} events "
                                     f"for {stall:.0f} s")
            time.sleep(0.5)
    finally:
        follow.reader.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_broker_restart_under_load(pg_db: str, tmp_path: Path) -> None:
    """The broker is killed or stopped and restarted three times while
    capture runs, and the topics stay exact: once the capture's saved position passed
    the source's (everything acknowledged by Kafka), it is stopped and the log read
    whole, materialized and compared with the source (every column), with no source
    position twice and dense offsets. A restart that catches a commit in flight makes
    the capture retry and resume from the checkpoint in Kafka (most runs; one that falls
    between commits is reconnected to by the client, which is fine too).

    Robust under load: commits are grouped (``batch_max_ms``); the writes are paced (at
    most 2,000 statements a second), so that a fast machine does not make a log a loaded
    one takes minutes to read; the waits go on while there is progress and fail after
    120 s without (``stall``); and the log is read once it no longer grows. Heartbeats are
    every 5 s here (fewer checkpoint messages for each recovery to read).

    A broker that, restarted, answers a retried produce as a duplicate without offsets,
    or appends it twice, is checked for as well (``tests/kafka/test_duplicate_produce.py``).
    A failure leaves the topics' records and the broker's log in ``tmp_path``
    (``_leave_raw``), and a capture that did not catch up its threads' stacks in
    ``capture.log``."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("restarts a broker of its own")
    from pydblog.devtools.kafka import KafkaBroker

    _table(pg_db)
    with KafkaBroker() as broker:
        config = write_config(tmp_path, pg_db, extra=kafka_log_toml(
            broker.bootstrap, extra="partitions = 2\nbatch_max_ms = 250"), heartbeat_s=5)
        proc = start_run(config, env={"PYTHONFAULTHANDLER": "1"}, drain=True)  # (SIGABRT: stacks)
        with writing(pg_writer(pg_db, 7, 2000.0)):
            for kill in BROKER_KILLS:
                time.sleep(2.0)
                broker.restart(kill=kill)
            time.sleep(2.0)
        try:
            _wait_caught_up(config, pg_db, stall=120)
        except BaseException:  # (pytest-timeout's too)
            _leave_raw(broker, config, tmp_path)
            proc.send_signal(signal.SIGABRT)  # every thread's stack into capture.log
            raise
        finally:
            code, out = stop_run(proc)
            (tmp_path / "capture.log").write_text(out)
        assert code == 0, out
        try:
            events = _read_whole(config, stall=120)
            assert_materializes_to_source(events, pg_db, {"public.w": ["id"]})
            _check_events(events)
        except BaseException:
            _leave_raw(broker, config, tmp_path)
            raise
        assert "Disconnected" in out, "capture never saw the broker go"
        assert "_PyErr_SetObject" not in out, "the client's garbled error reached the log"
