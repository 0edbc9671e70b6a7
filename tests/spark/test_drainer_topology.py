"""The Drainer's whole topology under ``kill -9``: three MariaDB shards (three databases
of the session's MariaDB server, each captured by its own `dblog run`), one MySQL 5.7
database and two PostgreSQL databases, all written at once, merged by routes into one
``orders`` and one ``items`` of a Delta lake, a PostgreSQL database and a MariaDB
database (``type = "mysql"``) by one streaming `dblog sync`, while captures and the sync
are killed with SIGKILL at random moments and started again (``tests/chaos.py``).

The oracles:

- after a clean drain each merged target equals the union of its sources' tables,
  every column, the source-identity columns included;
- ``T`` and each source's progress time, sampled from the PostgreSQL and MySQL sinks'
  ``_dblog_watermarks`` and ``sync-watermarks.json`` while the sync runs, never move
  back, ``T`` is at most every progress time, and no source's progress time passes its
  applied position: every event of its change log at or below it lies below the
  applied end recorded with it (checked against the whole logs at the end);
- with ``consistent = true``: each sample of the PostgreSQL and MySQL targets is, per
  source, its table at a prefix of its log between the last complete cut and the
  round's time (exactly the cut when the round was settled); each Delta version that
  precedes the first commit of a new cut ``T_k`` is exactly the cut of every source at
  ``T_k``; and the targets end exactly at the last cut.

The cut's oracle is the change log itself (the events in log order with their commit
times, the longest prefix at or below ``T``): that each log equals its source table is
the capture's own contract, and the final comparison with the sources checks it here
too."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from pydblog.config import load_config
from pydblog.core.drainer import Rounds
from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.devtools.pgcluster import PgCluster
from pydblog.spark.job import run_sync
from pydblog.spark.rounds import ROUNDS_FILE, read_state
from tests.chaos import Kills, Load, kill_and_restart, kill_group, kill_seed, reporting, writing
from tests.contract.capture import Capture, Event
from tests.mysql.harness import MariaHarness
from tests.spark.helpers import merged_rows
from tests.spark.test_crash import start_job
from tests.spark.test_drainer_sync import SlotHarness, _drop_slots

Row = tuple[Any, ...]
TABLES = {"orders": ("amount", "note"), "items": ("qty", "label")}
"""The routed tables (key ``id``) and their two other columns, alike in every source."""
IDENT = ("_dblog_source", "_dblog_db", "_dblog_schema")


class ShardHarness(MariaHarness):
    """A MySQL/MariaDB source with its own replica ``server_id`` (captures of one server
    with the same id would take each other's binlog connection)."""

    def __init__(self, server: TestServer, database: str, server_id: int) -> None:
        super().__init__(server, database)
        self.server_id = server_id

    def config(self, directory: Path, extra: str = "") -> Path:
        path = super().config(directory, extra)
        path.write_text(path.read_text().replace(
            "[source]\n", f"[source]\nserver_id = {self.server_id}\n", 1))
        return path


@dataclass
class Source:
    """One captured database: its capture, its identity in the merged targets and a
    way to open a connection to it (``pg``: psycopg, else pymysql)."""

    name: str
    cap: Capture
    db: str
    schema: str
    connect: Callable[[], Any]
    pg: bool
    events: list[Event] = field(default_factory=list)  # its whole log, read at the end

    def tx(self, conn: Any, statements: Sequence[str]) -> None:
        """``statements`` in one transaction."""
        if self.pg:
            for st in statements:
                conn.execute(st)
        else:
            with conn.cursor() as cur:
                for st in statements:
                    cur.execute(st)
        conn.commit()

    def rows(self, table: str) -> set[Row]:
        """The source table as merged rows (identity columns first)."""
        a, b = TABLES[table]
        conn = self.connect()
        try:
            if self.pg:
                got = conn.execute(f"SELECT id, {a}, {b} FROM {table}").fetchall()
            else:
                with conn.cursor() as cur:
                    cur.execute(f"SELECT id, {a}, {b} FROM {table}")
                    got = cur.fetchall()
        finally:
            conn.close()
        return {(self.name, self.db, self.schema, *r) for r in got}


def _load(src: Source, n: int, seed: int, per_s: float) -> Load:
    """``n`` transactions of 1-2 changes of ``orders`` or ``items`` (keys 1..40, so the
    shards' keys overlap): a key deleted and inserted again (key reuse), an update (a
    NULL now and then), a delete; ``per_s`` transactions a second on average, at
    random intervals (0.2-1.8 times the mean: a commit falls anywhere in a second, also
    right after what the sync just applied). Runs to its end (the ``writing`` block
    waits for it)."""

    def run(stop: threading.Event) -> None:
        rng = random.Random(seed)
        conn = src.connect()
        at = time.monotonic()
        try:
            for j in range(n):
                statements = []
                for _ in range(rng.randrange(1, 3)):
                    table = rng.choice(tuple(TABLES))
                    a, b = TABLES[table]
                    i, r = rng.randrange(1, 41), rng.random()
                    if r < 0.45:
                        statements += [f"DELETE FROM {table} WHERE id = {i}",
                                       f"INSERT INTO {table} (id, {a}, {b}) "
                                       f"VALUES ({i}, {j}, '{src.name}{j}')"]
                    elif r < 0.85:
                        value = "NULL" if r < 0.5 else str(-j)
                        statements.append(f"UPDATE {table} SET {a} = {value}, "
                                          f"{b} = '{src.name}u{j}' WHERE id = {i}")
                    else:
                        statements.append(f"DELETE FROM {table} WHERE id = {i}")
                src.tx(conn, statements)
                at += rng.uniform(0.2, 1.8) / per_s
                ahead = at - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        finally:
            conn.close()

    return run


@dataclass
class Topology:
    sources: dict[str, Source]
    lake: Path
    replica: str
    mysql: tuple[MariaDB, str]
    config: Path
    status: Path  # the sync's [log] path: sync-watermarks.json, sync-rounds.json


def _sync_config(tmp: Path, sources: dict[str, Source], lake: Path, replica: str,
                 mysql_dsn: str, consistent: bool) -> Path:
    text = (f'[source]\ndsn = "postgresql://unused@127.0.0.1/x"\n'
            f'[log]\npath = "{tmp / "sync"}"\n'
            f'[sync]\ncheckpoint = "{tmp / "cp"}"\ntrigger = "300 ms"\nmaster = "local[1]"\n'
            f'max_events_per_trigger = 300\nsink_retries = 0\n'
            f'consistent = {str(consistent).lower()}\n')
    for name, src in sources.items():
        text += f'[[sync.sources]]\nname = "{name}"\nlog = {{ path = "{src.cap.log_dir}" }}\n'
    for table in TABLES:
        text += f'[[sync.routes]]\ntables = "[^.]+\\\\.{table}"\ntarget = "public.{table}"\n'
    text += ('[[sync.routes]]\ntables = "[^.]+\\\\.(dblog_test_marker|dblog_signal)"\n'
             'target = "public.dblog_test_marker"\n'
             f'[[sync.sinks]]\ntype = "delta"\npath = "{lake}"\n'
             f'[[sync.sinks]]\ntype = "postgres"\ndsn = "{replica}"\nschema = "merged"\n'
             'parallelism = 1\n'
             f'[[sync.sinks]]\ntype = "mysql"\ndsn = "{mysql_dsn}"\nparallelism = 1\n')
    path = tmp / "sync.toml"
    path.write_text(text)
    return path


def _my_connect(server: TestServer, db: str) -> Any:
    conn = server.connect(db)
    conn.autocommit(False)
    return conn


@contextlib.contextmanager
def _topology(pg_cluster: PgCluster, mariadb: MariaDB, mysql57: MySQL57, tmp: Path,
              consistent: bool) -> Iterator[Topology]:
    """The six sources (tables created, captures not started), the three targets and
    the sync's config; at the end the captures still running are stopped and the
    sources' slots and databases dropped."""
    from tests.conftest import drop_database

    stamp = f"{tmp.name[-6:].lower()}_{int(time.time())}"
    sources: dict[str, Source] = {}
    ddl = [f"CREATE TABLE {t} (id int PRIMARY KEY, {a} int, {b} varchar(40))"
           for t, (a, b) in TABLES.items()]
    pg_dbs: dict[str, str] = {}
    for name in ("pg_a", "pg_b"):
        db = f"{name}_{stamp}"
        dsn = pg_cluster.create_database(db)
        pg_dbs[db] = dsn
        h = SlotHarness(dsn, f"dblog_{name}_{stamp}")
        h.execute(*ddl)
        sources[name] = Source(name, Capture(h, tmp / name), db, "public",
                               partial(psycopg.connect, dsn), True)
    my_dbs: list[tuple[TestServer, str]] = []
    shards: list[tuple[TestServer, str]] = [(mariadb, "maria_1"), (mariadb, "maria_2"),
                                            (mariadb, "maria_3"), (mysql57, "mysql57")]
    for n, (server, name) in enumerate(shards):
        db = f"{name}_{stamp}"
        server.execute("FLUSH BINARY LOGS")
        server.execute(f"CREATE DATABASE `{db}`")
        my_dbs.append((server, db))
        mh = ShardHarness(server, db, 5401 + n)
        mh.execute(*ddl)
        sources[name] = Source(name, Capture(mh, tmp / name), db, db,
                               partial(_my_connect, server, db), False)
    replica_db = f"replica_{stamp}"
    replica = pg_cluster.create_database(replica_db)
    target_db = f"target_{stamp}"
    mariadb.execute(f"CREATE DATABASE `{target_db}`")
    lake = tmp / "lake"
    config = _sync_config(tmp, sources, lake, replica, mariadb.dsn(target_db), consistent)
    try:
        yield Topology(sources, lake, replica, (mariadb, target_db), config, tmp / "sync")
    finally:
        for src in sources.values():
            if src.cap.proc is not None:
                src.cap.kill()
        for db, dsn in pg_dbs.items():
            _drop_slots(dsn, f"dblog_{db.split('_' + stamp)[0]}_{stamp}")
            drop_database(pg_cluster, db)
        drop_database(pg_cluster, replica_db)
        for server, db in [*my_dbs, (mariadb, target_db)]:
            server.execute(f"DROP DATABASE IF EXISTS `{db}`")


# -- samples taken while the sync runs ----------------------------------------------------

Marks = dict[str, tuple[int | None, int | None, int | None]]
"""A sink's ``_dblog_watermarks``: source -> (progress_ms, low_ms, applied_end)."""


@dataclass
class Sample:
    """What one read of a sink (or of ``sync-watermarks.json``) saw; with ``consistent
    = true`` the rounds' state read just before and just after it and the targets' rows
    (read in the same transaction as the watermarks)."""

    where: str
    marks: Marks
    before: Rounds | None = None
    after: Rounds | None = None
    rows: dict[str, set[Row]] | None = None


COLS = {t: [*IDENT, "id", a, b] for t, (a, b) in TABLES.items()}


def _read_pg(dsn: str, with_rows: bool) -> tuple[Marks, dict[str, set[Row]]] | None:
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ  # one snapshot
        if conn.execute("SELECT to_regclass('merged._dblog_watermarks')").fetchone() == (None,):
            return None
        marks: Marks = {r[0]: (r[1], r[2], r[3]) for r in conn.execute(
            "SELECT source, progress_ms, low_ms, applied_end FROM merged._dblog_watermarks")}
        rows: dict[str, set[Row]] = {}
        for t, cols in COLS.items() if with_rows else ():
            if conn.execute("SELECT to_regclass(%s)", (f"merged.{t}",)).fetchone() == (None,):
                rows[t] = set()
                continue
            rows[t] = {tuple(r) for r in conn.execute(
                f"SELECT {', '.join(cols)} FROM merged.{t}")}
        return marks, rows


def _read_mysql(server: MariaDB, db: str, with_rows: bool
                ) -> tuple[Marks, dict[str, set[Row]]] | None:
    conn = server.connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT table_name FROM information_schema.tables "
                        f"WHERE table_schema = '{db}'")
            present = {r[0] for r in cur.fetchall()}
            if "_dblog_watermarks" not in present:
                return None
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SELECT source, progress_ms, low_ms, applied_end FROM _dblog_watermarks")
            marks: Marks = {r[0]: (r[1], r[2], r[3]) for r in cur.fetchall()}
            rows: dict[str, set[Row]] = {}
            for t, cols in COLS.items() if with_rows else ():
                if t not in present:
                    rows[t] = set()
                    continue
                cur.execute(f"SELECT {', '.join(cols)} FROM {t}")
                rows[t] = {tuple(r) for r in cur.fetchall()}
            cur.execute("COMMIT")
        return marks, rows
    finally:
        conn.close()


def _read_json(status: Path) -> Marks | None:
    try:
        st = json.loads((status / "sync-watermarks.json").read_text())
    except (OSError, ValueError):
        return None
    return {s: (p, st.get("low_ms"), None) for s, p in st["sources"].items()}


def _sampler(topo: Topology, consistent: bool, samples: list[Sample]) -> Load:
    """Samples of every sink's watermarks (and, consistent, of the PostgreSQL and MySQL
    targets between two reads of the rounds' state) every 0.3 s until stopped."""
    state_path = topo.status / ROUNDS_FILE

    def state() -> Rounds:
        return read_state(state_path)

    def run(stop: threading.Event) -> None:
        reads: list[tuple[str, Callable[[], tuple[Marks, dict[str, set[Row]]] | None]]] = [
            ("postgres", lambda: _read_pg(topo.replica, consistent)),
            ("mysql", lambda: _read_mysql(*topo.mysql, consistent))]
        while not stop.is_set():
            for where, read in reads:
                before = state()
                try:
                    got = read()
                except Exception:  # a table the sync is creating: the next sample
                    continue
                if got is not None:
                    samples.append(Sample(where, got[0], before, state(), got[1]))
            marks = _read_json(topo.status)
            if marks is not None:
                samples.append(Sample("json", marks))
            stop.wait(0.3)

    return run


# -- the oracles ----------------------------------------------------------------------------

def _ts(e: Event) -> int:
    return int(e["source"]["ts_ms"])


def _check_watermarks(samples: Sequence[Sample], sources: dict[str, Source]) -> int:
    """Per sink, in sample order: ``T`` (the newest ``low_ms``) and each source's
    progress never move back, ``T`` is at most every source's progress, and every event
    of a source's log at or after the applied end recorded with its progress is later
    than that progress (and than ``T``). Returns how many samples had a ``T``."""
    # the least commit time at or after each offset, per source
    suffix: dict[str, list[int]] = {}
    for name, src in sources.items():
        times = [_ts(e) for e in src.events]
        assert [e["offset"] for e in src.events] == list(range(len(times))), name
        low = [2**62] * (len(times) + 1)
        for i in range(len(times) - 1, -1, -1):
            low[i] = min(times[i], low[i + 1])
        suffix[name] = low
    with_t = 0
    for where in ("postgres", "mysql", "json"):
        last_t: int | None = None
        last_p: dict[str, int] = {}
        for n, s in enumerate(x for x in samples if x.where == where):
            lows = [m[1] for m in s.marks.values() if m[1] is not None]
            t = max(lows) if lows else None
            progress = {src: m[0] for src, m in s.marks.items() if m[0] is not None}
            what = f"{where} sample {n}: T {t}, marks {s.marks}"
            if t is not None:
                with_t += 1
                assert last_t is None or t >= last_t, f"T moved back from {last_t}: {what}"
                last_t = t
                assert set(progress) == set(sources), what
                assert t <= min(progress.values()), f"T passed a source's progress: {what}"
            for name, p in progress.items():
                assert p >= last_p.get(name, p), f"{name}'s progress moved back: {what}"
                last_p[name] = p
                end = s.marks[name][2]
                if end is None:
                    continue
                first = suffix[name][min(end, len(suffix[name]) - 1)]
                assert first > p, (f"{name}'s progress {p} passed its applied end {end} "
                                   f"(an event at {first} is not applied): {what}")
                assert t is None or first > t, f"T passed {name}'s applied end {end}: {what}"
    return with_t


def _prefix(events: Sequence[Event], t: int | None) -> int:
    """The length of the longest prefix of ``events`` whose commit times are at or below
    ``t`` (what ``consistent = true`` applies of a source up to ``t``)."""
    if t is None:
        return 0
    for i, e in enumerate(events):
        if _ts(e) > t:
            return i
    return len(events)


def _apply(state: dict[str, dict[int, tuple[Any, Any]]], e: Event) -> None:
    table = e["source"]["table"]
    if table not in TABLES or e["op"] not in ("c", "u", "d", "r"):
        return
    rows = state.setdefault(table, {})
    if e["op"] == "d":
        rows.pop(e["key"]["id"], None)
    else:
        a, b = TABLES[table]
        rows[e["key"]["id"]] = (e["after"][a], e["after"][b])


def _parts(rows: dict[str, set[Row]], sources: dict[str, Source]
           ) -> dict[str, dict[str, dict[int, tuple[Any, Any]]]]:
    """Merged rows per source: source -> table -> id -> (the two columns); every row's
    identity columns are its source's."""
    out: dict[str, dict[str, dict[int, tuple[Any, Any]]]] = {s: {} for s in sources}
    for table, got in rows.items():
        for name, db, schema, id_, a, b in got:
            src = sources[name]
            assert (db, schema) == (src.db, src.schema), (table, name, db, schema)
            out[name].setdefault(table, {})[id_] = (a, b)
    return out


def _same(state: dict[str, dict[int, tuple[Any, Any]]],
          part: dict[str, dict[int, tuple[Any, Any]]]) -> bool:
    return all(state.get(t, {}) == part.get(t, {}) for t in TABLES)


def _check_between(src: Source, part: dict[str, dict[int, tuple[Any, Any]]],
                   lo_t: int | None, hi_t: int | None) -> bool:
    """Whether ``part`` is ``src``'s tables at a prefix of its log holding everything
    up to ``lo_t`` and nothing past ``hi_t``."""
    lo, hi = _prefix(src.events, lo_t), _prefix(src.events, hi_t)
    state: dict[str, dict[int, tuple[Any, Any]]] = {}
    for n in range(hi + 1):
        if n >= lo and _same(state, part):
            return True
        if n < hi:
            _apply(state, src.events[n])
    return False


def _check_cut_samples(samples: Sequence[Sample], sources: dict[str, Source]) -> tuple[int, int]:
    """Each consistent sample of the PostgreSQL and MySQL targets: per source between
    the last complete cut read before it and the round's time read after it (exactly
    the cut when the two reads saw one settled round). Returns (samples, settled)."""
    checked = settled = 0
    for n, s in enumerate(samples):
        if s.rows is None or s.before is None or s.after is None or s.before.t is None:
            continue
        parts = _parts(s.rows, sources)
        exact = s.before == s.after and s.before.finished(sources)
        settled += exact
        checked += 1
        for name, src in sources.items():
            assert _check_between(src, parts[name], s.before.cut, s.after.t), (
                f"{s.where} sample {n}: {name}'s part is not its tables at a prefix of its "
                f"log between the cut {s.before.cut} and T {s.after.t} (rounds {s.before} "
                f"-> {s.after}, settled: {exact})")
    return checked, settled


def _check_delta_rounds(lake: Path, sources: dict[str, Source], most: int = 40) -> int:
    """Each Delta version just before a commit that carries a new cut ``T_k`` (every
    batch of the rounds up to ``k`` committed before the cut was recorded, none planned
    after it) is exactly the cut of every source at ``T_k``: checked for up to ``most``
    such versions a table, spread over the run. Returns how many were checked."""
    checked = 0
    for table in TABLES:
        path = lake / "public" / table
        history = sorted(DeltaTable(str(path)).history(), key=lambda h: int(h["version"]))
        closing: list[tuple[int, int]] = []
        last: int | None = None
        for h in history:
            meta = h.get("userMetadata")
            cut = json.loads(meta)["dblog"].get("cut_ms") if meta else None
            if cut is None:
                continue
            if cut != last and int(h["version"]) > 0:
                closing.append((int(h["version"]) - 1, int(cut)))
            last = cut
        step = max(1, len(closing) // most)
        for version, cut in closing[::step]:
            got = {tuple(r[c] for c in COLS[table]) for r in DeltaTable(
                str(path), version=version).to_pyarrow_table(columns=COLS[table]).to_pylist()}
            parts = _parts({table: got}, sources)
            for name, src in sources.items():
                state: dict[str, dict[int, tuple[Any, Any]]] = {}
                for e in src.events[:_prefix(src.events, cut)]:
                    _apply(state, e)
                assert state.get(table, {}) == parts[name].get(table, {}), (
                    f"delta {table} version {version} (the cut {cut} recorded before "
                    f"version {version + 1}): {name}'s part is not its table at the cut")
            checked += 1
    return checked


def _check_union(topo: Topology) -> None:
    """Every merged target equals the union of its sources' tables, every column."""
    for table in TABLES:
        want: set[Row] = set()
        for src in topo.sources.values():
            want |= src.rows(table)
        for what, where in (("delta", topo.lake), ("postgres", topo.replica),
                            ("mysql", topo.mysql)):
            name = f"public.{table}" if what == "delta" else (
                f"merged.{table}" if what == "postgres" else table)
            got = merged_rows(where, name, COLS[table])
            missing, extra = sorted(want - got, key=str), sorted(got - want, key=str)
            assert not missing and not extra, (
                f"{what} {table}: {len(missing)} missing {missing[:4]}, "
                f"{len(extra)} extra {extra[:4]}")
        # and every source's log is its table (the capture's contract, the cut's oracle)
        for src in topo.sources.values():
            state: dict[str, dict[int, tuple[Any, Any]]] = {}
            for e in src.events:
                _apply(state, e)
            assert {(src.name, src.db, src.schema, i, *v) for i, v in
                    state.get(table, {}).items()} == src.rows(table), (src.name, table)


# -- the run -------------------------------------------------------------------------------

VICTIMS = ("maria_1", "sync", "mysql57", "pg_a", "sync", "maria_3")
"""What each kill round kills, in turn: captures of each kind and the sync."""


def _run(topo: Topology, tmp: Path, consistent: bool, seed: int) -> tuple[list[Sample], Kills]:
    """Start the captures and the streaming sync, write every source at once while the
    victims are killed and started again, wait for the captures and the sync to catch
    up, stop everything and drain with a clean ``--available-now`` run."""
    srcs = topo.sources
    for src in srcs.values():
        src.cap.start()
    jobs = [start_job(topo.config, None, tmp, 0)]
    victim = [""]

    def job_log() -> str:
        return (tmp / f"job-{len(jobs) - 1}.log").read_text(errors="replace")[-4000:]

    def pick(n: int, rng: random.Random) -> None:
        victim[0] = VICTIMS[n % len(VICTIMS)]
        deadline = time.monotonic() + 300
        while n == 0 and not any(s.marks and all(m[1] is not None for m in s.marks.values())
                                 for s in samples):  # the kills begin once a T is out
            assert jobs[-1].poll() is None, f"the sync ended by itself:\n{job_log()}"
            assert time.monotonic() < deadline, "no T published in 300 s"
            time.sleep(0.5)

    def kill() -> None:
        if victim[0] == "sync":
            assert jobs[-1].poll() is None, f"the sync ended by itself:\n{job_log()}"
            kill_group(jobs[-1])
        else:
            srcs[victim[0]].cap.kill()

    def start() -> None:
        if victim[0] == "sync":
            jobs.append(start_job(topo.config, None, tmp, len(jobs)))
        else:
            srcs[victim[0]].cap.start()

    def caught_up(timeout: float) -> None:
        """Until every capture logged a marker and the streaming sync applied it."""
        for src in srcs.values():
            src.cap.caught_up(timeout=180)
        ends = {name: src.cap.end() for name, src in srcs.items()}
        deadline = time.monotonic() + timeout
        while True:
            assert jobs[-1].poll() is None, f"the sync ended by itself:\n{job_log()}"
            got = _read_pg(topo.replica, False)
            applied = {} if got is None else {s: m[2] for s, m in got[0].items()}
            if all((applied.get(s) or 0) >= e for s, e in ends.items()):
                return
            assert time.monotonic() < deadline, (
                f"the sync did not catch up: applied {applied}, logs {ends}")
            time.sleep(1)

    samples: list[Sample] = []
    loads = [_load(src, 300, seed * 10 + i, 5.0) for i, src in enumerate(srcs.values())]
    try:
        with writing(_sampler(topo, consistent, samples)):
            with writing(*loads):
                kills = kill_and_restart(kill, start, len(VICTIMS), seed, delay=(3.0, 8.0),
                                         down=(0.0, 2.0), each_round=pick,
                                         note=lambda: victim[0])
            with reporting(kills):
                caught_up(420)
                # then a trickle, a transaction a source every 1.7 s on average, that the
                # caught-up sync follows: the progress times then come from the newest
                # commits and the heartbeats, right behind the commits, where a later
                # commit of the same second (or millisecond) as a time they claimed shows
                with writing(*(_load(src, 20, seed * 10 + 7 + i, 0.6)
                               for i, src in enumerate(srcs.values()))):
                    pass
                caught_up(240)
                time.sleep(2)  # samples of the caught-up sync (heartbeats move T)
        for src in srcs.values():
            src.cap.stop()
    finally:
        for job in jobs:
            kill_group(job)
    with reporting(kills):
        assert run_sync(load_config(topo.config), available_now=True) == 0
    for src in srcs.values():
        src.events = src.cap.events()
    return samples, kills


def _servers(request: pytest.FixtureRequest) -> tuple[PgCluster, MariaDB, MySQL57]:
    return (request.getfixturevalue("pg_cluster"), request.getfixturevalue("mariadb"),
            request.getfixturevalue("mysql57"))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_six_sources_written_concurrently_with_kill_9(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The whole topology into Delta, PostgreSQL and MySQL with ``kill -9`` of a MariaDB
    capture, the MySQL 5.7 capture, a PostgreSQL capture, another MariaDB capture and
    (twice) the sync: each merged table equals the union of its sources, and ``T``
    never moved back nor passed a source's applied position."""
    pg_cluster, mariadb, mysql57 = _servers(request)
    with _topology(pg_cluster, mariadb, mysql57, tmp_path, consistent=False) as topo:
        samples, kills = _run(topo, tmp_path, False, kill_seed(71))
        with reporting(kills):
            _check_union(topo)
            with_t = _check_watermarks(samples, topo.sources)
            print(f"{len(samples)} samples, {with_t} with a T")
            assert with_t > 60, f"{with_t} samples with a T"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_six_sources_consistent_with_kill_9_are_a_cut_at_each_round(
    spark: Any, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same with ``consistent = true``: every sample of the PostgreSQL and MySQL
    targets lies, per source, between the last complete cut and the round's time
    (exactly the cut when the round was settled), each Delta version closing a round is
    exactly the cut of every source at its ``T_k``, and the targets end exactly at the
    last cut, which is where the logs were complete up to."""
    from pydblog.spark.rounds import least_complete

    pg_cluster, mariadb, mysql57 = _servers(request)
    with _topology(pg_cluster, mariadb, mysql57, tmp_path, consistent=True) as topo:
        samples, kills = _run(topo, tmp_path, True, kill_seed(72))
        with reporting(kills):
            _check_union(topo)
            with_t = _check_watermarks(samples, topo.sources)
            checked, settled = _check_cut_samples(samples, topo.sources)
            rounds = _check_delta_rounds(topo.lake, topo.sources)
            state = read_state(topo.status / ROUNDS_FILE)
            logs = {n: s.cap.log_cfg.model_dump_json() for n, s in topo.sources.items()}
            assert state.finished(topo.sources) and state.cut == least_complete(logs), state
            assert all(_prefix(s.events, state.cut) == len(s.events)
                       for s in topo.sources.values()), state
            print(f"{len(samples)} samples, {with_t} with a T, {checked} of the targets "
                  f"({settled} settled), {rounds} Delta versions closing a round, "
                  f"{state.round} rounds")
            assert with_t > 60 and checked > 40 and rounds >= 3, (with_t, checked, settled,
                                                                  rounds, state)
