"""Per-source progress and watermarks of `dblog sync` on embedded change logs: an upgrade
from the single-source form keeps what the sinks applied (nothing re-applied or
skipped), and ``consistent = true`` applies every source up to the same commit time T
(the targets are a cut of every source at T)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from pydblog.changelog.sqlite import SqliteChangeLog, log_path
from pydblog.config import Config, LogConfig, parse_config
from pydblog.core.drainer import SchemaConflict
from pydblog.devtools.synth import SyntheticLoad, write_load
from pydblog.events import ChangeEvent, Op
from pydblog.ports import ColumnSchema, TableSchema
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.job import run_sync
from tests.spark.helpers import assert_delta_batches_once, assert_mirrors, history_offsets


def _config(tmp: Path, dsn: str, sources: list[dict[str, Any]] | None, **sync: Any) -> Config:
    data: dict[str, Any] = {
        "source": {"dsn": "postgresql://unused@127.0.0.1/x"},
        "log": {"path": str(tmp / "log")},
        "sync": {
            "checkpoint": str(tmp / "cp"), "trigger": "available-now", "master": "local[2]",
            "max_events_per_trigger": 1_500, "sink_retries": 0,
            "sinks": [{"type": "delta", "path": str(tmp / "lake")},
                      {"type": "history", "path": str(tmp / "lake" / "_changes")},
                      {"type": "postgres", "dsn": dsn, "schema": "mirror"}],
            **sync,
        },
    }
    if sources is not None:
        data["sync"]["sources"] = sources
    return parse_config(data)


@pytest.mark.slow  # three syncs with three sinks: over the default suite's budget
def test_single_source_progress_survives_the_upgrade(spark: Any, pg_db: str,
                                                     tmp_path: Path) -> None:
    load = SyntheticLoad(seed=41)
    write_load(tmp_path / "log", load, 3_000)
    assert run_sync(_config(tmp_path, pg_db, None), available_now=True) == 0
    # the progress table as the single-source sync made it: no source column
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE mirror.dblog_sync_progress DROP CONSTRAINT "
                     "dblog_sync_progress_pkey")
        conn.execute("ALTER TABLE mirror.dblog_sync_progress DROP COLUMN source")
        conn.execute("ALTER TABLE mirror.dblog_sync_progress ADD PRIMARY KEY (part, nparts)")
        conn.execute("DROP TABLE mirror._dblog_watermarks")
        before = conn.execute("SELECT part, applied_end FROM mirror.dblog_sync_progress "
                              "ORDER BY part").fetchall()
    assert before and all(e == 3_000 for _, e in before)
    versions = {t: DeltaTable(str(tmp_path / "lake" / "public" / t)).version()
                for t in ("orders", "order_lines")}
    # the same log as an explicit [[sync.sources]] entry named "default": a replay of the
    # whole log (fresh checkpoint) applies nothing, then only the new events are applied
    cfg = _config(tmp_path, pg_db, [{"name": "default", "log": {"path": str(tmp_path / "log")}}],
                  checkpoint=str(tmp_path / "cp2"))
    assert run_sync(cfg, available_now=True) == 0
    assert versions == {t: DeltaTable(str(tmp_path / "lake" / "public" / t)).version()
                        for t in ("orders", "order_lines")}
    end = write_load(tmp_path / "log", load, 1_000, first=False)
    assert run_sync(cfg, available_now=True) == 0
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror")
    assert_delta_batches_once(tmp_path / "lake")
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT source, part, applied_end FROM mirror.dblog_sync_progress "
                            "ORDER BY part").fetchall()
        marks = conn.execute("SELECT source, progress_ms FROM mirror._dblog_watermarks").fetchall()
    assert rows == [("default", p, end) for p, _ in before]
    assert [m[0] for m in marks] == ["default"] and marks[0][1] is not None


ORDERS = TableSchema("public", "orders", (ColumnSchema("id", "integer", "int32", False),
                                          ColumnSchema("v", "text", "string", True)), ("id",))


def _write(directory: Path, events: Sequence[tuple[int, Op, int, str | None]],
           beat_ms: int = 0) -> None:
    """(commit time, op, id, v) events of public.orders, one transaction each, and a
    capture checkpoint written at ``beat_ms`` (its heartbeat; by default long ago: no
    heartbeat moves the log's time)."""
    from pydblog.events import encode_event
    from pydblog.ports import Checkpoint

    log = SqliteChangeLog(directory)
    try:
        enc = []
        for i, (ts, op, id_, v) in enumerate(events):
            row = None if op is Op.DELETE else {"id": id_, "v": v}
            ev = ChangeEvent(op, "public", "orders", PgPosition(Lsn(1_000 + i)), ts,
                             key={"id": id_}, before={"id": id_} if op is Op.DELETE else None,
                             after=row)
            enc.append(encode_event(ev, "postgresql", directory.name, 0))
        log.append(enc, Checkpoint(None), [ORDERS])
    finally:
        log.close()
    with sqlite3.connect(log_path(directory)) as conn:
        conn.execute("UPDATE checkpoint SET updated_ms = ?", (beat_ms,))


def test_consistent_applies_every_source_up_to_the_same_time(spark: Any, pg_db: str,
                                                             tmp_path: Path) -> None:
    a = [(1_000 + i, Op.CREATE, i, f"a{i}") for i in range(100)]
    a.append((1_080, Op.UPDATE, 3, "a-late"))  # after T: not applied
    b = [(1_000 + 2 * i, Op.CREATE, i, f"b{i}") for i in range(26)]  # newest: 1050
    b.append((1_050, Op.UPDATE, 7, "b-at-T"))
    _write(tmp_path / "a", sorted(a, key=lambda e: e[0]))  # complete up to 1098
    _write(tmp_path / "b", b, beat_ms=1_050)  # its heartbeat: complete up to 1050
    cfg = _config(tmp_path, pg_db, [{"name": "a", "log": {"path": str(tmp_path / "a")}},
                                    {"name": "b", "log": {"path": str(tmp_path / "b")}}],
                  consistent=True, max_events_per_trigger=40,
                  routes=[{"tables": r"public\.orders", "target": "public.orders"}])
    cfg = cfg.model_copy(update={"sync": cfg.sync.model_copy(update={
        "sinks": [s for s in cfg.sync.sinks if s.type != "history"]})})
    assert run_sync(cfg, available_now=True) == 0
    want = {("a", "a", "public", i, f"a{i}") for i in range(51)}
    want |= {("b", "b", "public", i, "b-at-T" if i == 7 else f"b{i}") for i in range(26)}
    cols = ["_dblog_source", "_dblog_db", "_dblog_schema", "id", "v"]
    got = {tuple(r[c] for c in cols) for r in
           DeltaTable(str(tmp_path / "lake" / "public" / "orders")).to_pyarrow_table().to_pylist()}
    assert got == want
    with psycopg.connect(pg_db) as conn:
        got_pg = {tuple(r) for r in conn.execute(
            f"SELECT {', '.join(cols)} FROM mirror.orders").fetchall()}
        marks: dict[str, int] = dict(conn.execute(
            "SELECT source, progress_ms FROM mirror._dblog_watermarks").fetchall())
        low = conn.execute("SELECT max(low_ms), min(cut_ms) FROM "
                           "mirror._dblog_watermarks").fetchone()
    assert got_pg == want
    # T is 1050: no source's progress passes what it applied, and T is their minimum;
    # the rounds' last complete cut is 1050 too
    assert marks == {"a": 1_050, "b": 1_050}
    assert low == (1_050, 1_050)
    delta_marks = DeltaTable(str(tmp_path / "lake" / "_dblog_watermarks")).to_pyarrow_table()
    assert set(delta_marks["cut_ms"].to_pylist()) == {1_050}


def test_incompatible_shards_stop_the_sync_before_anything_is_applied(
    spark: Any, pg_db: str, tmp_path: Path
) -> None:
    _write(tmp_path / "a", [(1_000, Op.CREATE, 1, "x")])
    log = SqliteChangeLog(tmp_path / "b")
    try:
        from pydblog.events import encode_event
        from pydblog.ports import Checkpoint

        other = TableSchema("public", "orders", (ColumnSchema("id", "integer", "int32", False),
                                                 ColumnSchema("v", "boolean", "bool", True)),
                            ("id",))
        ev = ChangeEvent(Op.CREATE, "public", "orders", PgPosition(Lsn(5)), 1_000,
                         key={"id": 1}, after={"id": 1, "v": True})
        log.append([encode_event(ev, "postgresql", "b", 0)], Checkpoint(None), [other])
    finally:
        log.close()
    cfg = _config(tmp_path, pg_db, [{"name": "a", "log": {"path": str(tmp_path / "a")}},
                                    {"name": "b", "log": {"path": str(tmp_path / "b")}}],
                  routes=[{"tables": r"public\.orders", "target": "public.orders"}])
    with pytest.raises(SchemaConflict) as err:
        run_sync(cfg, available_now=True)
    msg = str(err.value)
    assert "column 'v'" in msg and "a/a/public.orders" in msg and "b/b/public.orders" in msg
    assert not (tmp_path / "lake" / "public" / "orders").exists()


# -- consistent = true: lockstep rounds under concurrent writes ---------------------------

class _Shard:
    """A source's change log written by a thread: a transaction of 1-3 events of
    public.orders (ids 0..29) every ``period`` seconds while ``running`` is set, each
    stamped with the wall clock (later than the last append's checkpoint, the log's
    heartbeat: no event is ever at or below a time the log was complete up to). With
    ``kafka``, the log is that Kafka log, and each pause begins with an idle commit (the
    writer's heartbeat: the log is complete up to its clock)."""

    def __init__(self, directory: Path, period: float, seed: int,
                 kafka: LogConfig | None = None) -> None:
        import random
        import threading

        self.directory = directory
        self.kafka = kafka
        self.period = period
        self.rng = random.Random(seed)
        self.events: list[tuple[int, str, int, str | None]] = []  # (ts, op, id, v), log order
        self.lock = threading.Lock()
        self.running = threading.Event()
        self.paused = threading.Event()
        self.lsn = 1_000
        if kafka is None:
            _write(directory, [])
        else:
            from pydblog.changelog.kafka.writer import KafkaChangeLog
            from pydblog.ports import Checkpoint

            writer = KafkaChangeLog(kafka)
            try:
                writer.append([], Checkpoint(None), [ORDERS])
            finally:
                writer.close()

    def _open(self) -> Any:
        if self.kafka is None:
            return SqliteChangeLog(self.directory)
        from pydblog.changelog.kafka.writer import KafkaChangeLog

        return KafkaChangeLog(self.kafka)

    def run(self, stop: Any) -> None:
        import time

        from pydblog.events import encode_event
        from pydblog.ports import Checkpoint

        log = self._open()
        try:
            last = 0
            while not stop.is_set():
                if not self.running.is_set():
                    if self.kafka is not None and not self.paused.is_set():
                        log.append([], Checkpoint(None))  # a heartbeat
                    self.paused.set()
                    stop.wait(0.02)
                    continue
                self.paused.clear()
                ts = max(last + 1, int(time.time() * 1000) + 1)
                last = ts
                enc, rows = [], []
                for _ in range(self.rng.randrange(1, 4)):
                    id_ = self.rng.randrange(30)
                    op = Op.DELETE if self.rng.random() < 0.2 else Op.UPDATE
                    v = None if op is Op.DELETE else f"{self.directory.name}{self.rng.random():.6f}"
                    self.lsn += 1
                    ev = ChangeEvent(op, "public", "orders", PgPosition(Lsn(self.lsn)), ts,
                                     key={"id": id_},
                                     before={"id": id_} if op is Op.DELETE else None,
                                     after=None if v is None else {"id": id_, "v": v})
                    enc.append(encode_event(ev, "postgresql", self.directory.name, 0))
                    rows.append((ts, op.value, id_, v))
                log.append(enc, Checkpoint(None))
                with self.lock:
                    self.events.extend(rows)
                stop.wait(self.period)
        finally:
            log.close()

    def snapshot(self) -> list[tuple[int, str, int, str | None]]:
        with self.lock:
            return list(self.events)


def _states(events: Sequence[tuple[int, str, int, str | None]]) -> Any:
    """(count, ts, rows) after each prefix of ``events``: the source table's rows."""
    rows: dict[int, str] = {}
    yield 0, None, dict(rows)
    for n, (ts, _op, id_, v) in enumerate(events, 1):
        if v is None:
            rows.pop(id_, None)
        else:
            rows[id_] = v
        yield n, ts, dict(rows)


def _rows_at(events: Sequence[tuple[int, str, int, str | None]], t: int) -> dict[int, str]:
    """The source table's rows as of commit time ``t`` (every event at or below it)."""
    out: dict[int, str] = {}
    for _n, ts, rows in _states(events):
        if ts is not None and ts > t:
            break
        out = rows
    return out


def _target(dsn: str) -> tuple[dict[str, dict[int, str]], dict[str, int]]:
    """The merged target's rows per source, and each source's applied end."""
    parts: dict[str, dict[int, str]] = {}
    with psycopg.connect(dsn) as conn:
        try:
            for src, id_, v in conn.execute("SELECT _dblog_source, id, v FROM mirror.orders"):
                parts.setdefault(src, {})[id_] = v
            ends: dict[str, int] = dict(conn.execute("SELECT source, min(applied_end) FROM "
                                     "mirror.dblog_sync_progress GROUP BY source").fetchall())
        except psycopg.errors.UndefinedTable:  # nothing applied yet
            return {}, {}
    return parts, ends


def _check_sample(shards: dict[str, _Shard], before: Any, after: Any,
                  parts: dict[str, dict[int, str]]) -> bool:
    """Each source's part of the target is its table at some prefix of its log between
    the last complete cut (read ``before``) and the round's time (read ``after``): all of
    it up to the cut, nothing past the round; and when no round moved between the two
    reads and every source was done, exactly its table at the cut. True if exact."""
    exact = before.t is not None and before == after and before.finished(shards)
    for name, shard in shards.items():
        events = shard.snapshot()
        got = parts.get(name, {})
        if exact:
            assert got == _rows_at(events, before.cut), (name, before)
            continue
        lo = before.cut
        hi = after.t
        ok = False
        for _n, ts, rows in _states(events):
            if ts is not None and hi is not None and ts > hi:
                break
            if hi is None and ts is not None:
                break
            nxt = _next_ts(events, _n)
            if lo is not None and nxt is not None and nxt <= lo:
                continue  # an event at or below the cut is not yet applied: too early
            if rows == got:
                ok = True
                break
        assert ok, (name, before, after)
    return exact


def _next_ts(events: Sequence[tuple[int, str, int, str | None]], n: int) -> int | None:
    return events[n][0] if n < len(events) else None


def test_consistent_targets_are_a_cut_of_every_source_at_each_round(
        spark: Any, pg_db: str, tmp_path: Path) -> None:
    """Three sources written at different rates while a continuous consistent sync
    runs: sampled while it runs, each source's part of the merged target lies between
    the last complete cut and the current round's time; whenever every source is done
    with a round (sampled then, and at each pause of the writers once the rounds caught
    up with the logs) the target is exactly the cut of every source at that time."""
    import threading
    import time

    from pydblog.core.drainer import Rounds
    from pydblog.spark.rounds import ROUNDS_FILE, least_complete, read_state
    from tests.chaos import writing

    shards = {n: _Shard(tmp_path / n, period, seed)
              for n, period, seed in (("a", 0.03, 1), ("b", 0.08, 2), ("c", 0.25, 3))}
    cfg = _config(tmp_path, pg_db, [{"name": n, "log": {"path": str(tmp_path / n)}}
                                    for n in shards],
                  consistent=True, trigger="200 ms", max_events_per_trigger=150,
                  routes=[{"tables": r"public\.orders", "target": "public.orders"}])
    # one connection: a batch commits in one transaction, so a sample sees whole batches
    sink = next(s for s in cfg.sync.sinks if s.type == "postgres").model_copy(
        update={"parallelism": 1})
    cfg = cfg.model_copy(update={"sync": cfg.sync.model_copy(update={"sinks": [sink]})})
    logs = {n: s.log.model_dump_json() for n, s in
            ((s.name, s) for s in cfg.sync.sources)}
    state_path = cfg.log_dir / ROUNDS_FILE
    stop = threading.Event()
    errors: list[BaseException] = []

    def sync() -> None:
        try:
            run_sync(cfg, stop_event=stop)
        except BaseException as exc:
            errors.append(exc)

    def state() -> Rounds:
        return read_state(state_path) if state_path.exists() else Rounds()

    runner = threading.Thread(target=sync, daemon=True)
    runner.start()
    samples = exact = 0
    cuts: list[int] = []
    try:
        with writing(*(s.run for s in shards.values())):
            for phase in range(2):
                for s in shards.values():
                    s.running.set()
                until = time.monotonic() + 3
                while time.monotonic() < until:
                    assert not errors, errors
                    before = state()
                    parts, _ = _target(pg_db) if before.t is not None else ({}, {})
                    after = state()
                    if before.t is not None:
                        exact += _check_sample(shards, before, after, parts)
                        samples += 1
                    time.sleep(0.1)
                for s in shards.values():
                    s.running.clear()
                for s in shards.values():
                    assert s.paused.wait(10)
                low = least_complete(logs)
                deadline = time.monotonic() + 90
                while not (state().finished(shards) and state().cut == low):
                    assert not errors, errors
                    assert time.monotonic() < deadline, (state(), low)
                    time.sleep(0.1)
                st_ = state()
                parts, ends = _target(pg_db)
                assert _check_sample(shards, st_, st_, parts), phase
                cut = st_.cut
                assert cut is not None and (not cuts or cut > cuts[-1])
                for name, shard in shards.items():  # the applied positions: the cut's
                    events = shard.snapshot()
                    assert ends.get(name, 0) == sum(1 for e in events if e[0] <= cut)
                cuts.append(cut)
    finally:
        stop.set()
        runner.join(60)
    assert not errors, errors
    assert samples > 10 and len(cuts) == 2, (samples, exact, cuts)
    import json

    status = json.loads((cfg.log_dir / "sync-watermarks.json").read_text())
    assert status["cut_ms"] == cuts[-1]


@pytest.mark.slow  # a Spark job started five times: over the default suite's budget
@pytest.mark.parametrize("kind", ["embedded", "kafka"])
def test_consistent_sync_killed_mid_round_resumes_exactly(
        request: pytest.FixtureRequest, kind: str, pg_db: str, tmp_path: Path) -> None:
    """``kill -9`` of a continuous consistent sync (its whole process group: Spark's
    JVM and planners) at random moments while three sources are written (``kafka``:
    the busiest one's log is a Kafka log, the others embedded): after each restart the
    rounds go on from the state file (round numbers and the cut never move back),
    samples stay between the last complete cut and the round's time, and once the
    writes stop the target is exactly the cut of every source at the logs' time."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    from pydblog.core.drainer import Rounds
    from pydblog.devtools.proc import end_process
    from pydblog.spark.rounds import ROUNDS_FILE, least_complete, read_state
    from tests.chaos import kill_and_restart, kill_seed, writing

    logs_cfg = {n: LogConfig(path=str(tmp_path / n)) for n in ("a", "b", "c")}
    if kind == "kafka":
        pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")
        import uuid

        logs_cfg["a"] = LogConfig(type="kafka", path=str(tmp_path / "a"),
                                  bootstrap_servers=request.getfixturevalue("kafka_bootstrap"),
                                  topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3)
    shards = {n: _Shard(tmp_path / n, period, seed,
                        logs_cfg[n] if logs_cfg[n].type == "kafka" else None)
              for n, period, seed in (("a", 0.03, 11), ("b", 0.08, 12), ("c", 0.25, 13))}

    def inline(log: LogConfig) -> str:
        keys = ["type", "path", "bootstrap_servers", "topic_prefix", "partitions"]
        data = log.model_dump()
        return ", ".join(f"{k} = {json.dumps(data[k])}" for k in keys
                         if data.get(k) is not None and (k != "type" or log.type == "kafka"))

    config = tmp_path / "sync.toml"
    config.write_text(f"""
[source]
dsn = "postgresql://unused@127.0.0.1/x"
[log]
path = "{tmp_path / "log"}"
[sync]
checkpoint = "{tmp_path / "cp"}"
trigger = "200 ms"
master = "local[1]"
max_events_per_trigger = 400
sink_retries = 0
consistent = true
[[sync.sinks]]
type = "postgres"
dsn = "{pg_db}"
schema = "mirror"
parallelism = 1
""" + "".join(f"""
[[sync.sources]]
name = "{n}"
log = {{ {inline(logs_cfg[n])} }}
""" for n in shards) + """
[[sync.routes]]
tables = 'public\\.orders'
target = "public.orders"
""")
    logs = {n: c.model_dump_json() for n, c in logs_cfg.items()}
    state_path = tmp_path / "log" / ROUNDS_FILE
    procs: list[subprocess.Popen[bytes]] = []
    out = (tmp_path / "job.log").open("ab")

    def start() -> None:
        env = {**os.environ, "DBLOG_SPARK_DRIVER_MEMORY": "1g"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "pydblog.spark.job", "--config", str(config)], env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    at_kills: list[Rounds] = []

    def kill() -> None:
        at_kills.append(state())
        os.killpg(procs[-1].pid, signal.SIGKILL)
        procs[-1].wait()

    def state() -> Rounds:
        return read_state(state_path) if state_path.exists() else Rounds()

    seen: list[Rounds] = []
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.is_set():
            before = state()
            parts, _ = _target(pg_db) if before.t is not None else ({}, {})
            after = state()
            if before.t is not None:
                _check_sample(shards, before, after, parts)
            if seen:
                last = seen[-1]
                assert after.round >= last.round and (after.cut or 0) >= (last.cut or 0)
            seen.append(after)
            stop_sampling.wait(0.2)

    sampler_errors: list[BaseException] = []

    def sampler() -> None:
        try:
            sample()
        except BaseException as exc:
            sampler_errors.append(exc)

    try:
        for s in shards.values():
            s.running.set()
        with writing(*(s.run for s in shards.values())):
            start()
            t = threading.Thread(target=sampler, daemon=True)
            t.start()
            # the job takes ~10-20 s to start (three queries on a loaded machine)
            kills = kill_and_restart(kill, start, rounds=4, seed=kill_seed(30),
                                     delay=(15.0, 30.0))
            for s in shards.values():
                s.running.clear()
            for s in shards.values():
                assert s.paused.wait(10)
            low = least_complete(logs)
            deadline = time.monotonic() + 180
            while not (state().finished(shards) and state().cut == low):
                assert procs[-1].poll() is None, (tmp_path / "job.log").read_text()[-3000:]
                assert not sampler_errors, (sampler_errors, kills)
                assert time.monotonic() < deadline, (state(), low, kills)
                time.sleep(0.2)
            stop_sampling.set()
            t.join(30)
            assert not sampler_errors, (sampler_errors, kills)
            st_ = state()
            parts, ends = _target(pg_db)
            assert _check_sample(shards, st_, st_, parts), kills
            cut = st_.cut
            assert cut is not None
            for name, shard in shards.items():
                assert ends.get(name, 0) == sum(1 for e in shard.snapshot() if e[0] <= cut)
            # at least one kill fell inside a round (a source done, another not)
            assert any(r.t is not None and not r.finished(shards) for r in at_kills), \
                (kills, at_kills)
            assert st_.round > max(r.round for r in at_kills), (at_kills, st_)
    finally:
        stop_sampling.set()
        for p in procs:
            end_process(p, kill=True, group=True)
        out.close()


def test_a_kill_while_the_first_batch_was_logged_leaves_a_checkpoint_that_starts(
        spark: Any, pg_db: str, tmp_path: Path) -> None:
    """A ``kill -9`` while Spark wrote a fresh checkpoint's first offset-log entry
    leaves only its temporary file in ``offsets/``; Spark refuses such a directory
    ("should be empty on batch 0") unless the sync clears what no batch was logged by."""
    _write(tmp_path / "a", [(1_000 + i, Op.CREATE, i, f"a{i}") for i in range(5)], beat_ms=2_000)
    cfg = _config(tmp_path, pg_db, [{"name": "a", "log": {"path": str(tmp_path / "a")}}])
    cfg = cfg.model_copy(update={"sync": cfg.sync.model_copy(update={
        "sinks": [s for s in cfg.sync.sinks if s.type == "postgres"]})})
    offsets = tmp_path / "cp" / "by-source" / "a" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.tmp").write_text("v1\n{")
    (tmp_path / "cp" / "by-source" / "a" / "commits").mkdir()
    assert run_sync(cfg, available_now=True) == 0
    with psycopg.connect(pg_db) as conn:
        assert conn.execute("SELECT count(*) FROM mirror.orders").fetchone() == (5,)


def test_progress_stays_below_a_commit_time_a_later_commit_may_share(tmp_path: Path) -> None:
    """Once a source's whole log is applied, its progress time stays below the newest
    applied commit time (unless a heartbeat is later): a transaction logged after it
    may commit in the same millisecond (the same second on MySQL/MariaDB)."""
    from pydblog.config import SyncSourceConfig
    from pydblog.spark.drain import Drain

    _write(tmp_path / "a", [(1_000, Op.CREATE, 1, "x")])  # its checkpoint: long ago
    drain = Drain([SyncSourceConfig(name="a", log=LogConfig(path=str(tmp_path / "a")))], [])
    assert drain.progress_after("a", 1, 1_000) == 999
