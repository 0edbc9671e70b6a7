"""The contract every `dblog sync` mirror sink keeps (docs/sync.md, "Sinks" and "Exactly
once"), one parametrized suite run against each of them: Delta (delta-spark),
PostgreSQL and MySQL/MariaDB, with the history sink where a case applies.

Batches are applied as the job applies them (``BatchApplier.apply`` over events read
from an embedded change log, schemas recorded in it), and the target is compared, every
row and every column, with the change log materialized (the oracle) or, where the oracle
does not model the case (repair markers, a row changed behind the sink's back), with
the expected table spelled out. Rows are read as a list, not by key, so a duplicate row
shows. Cases:

- the last event of a key wins within and across batches (snapshot rows, updates,
  deletes of keys never seen, delete then insert);
- key-changing updates (a delete of the old key and a create of the new one), keys
  swapped within a batch;
- truncate: what precedes it in its batch is dropped, what follows applies; a truncate
  of a table the log has no schema or row of changes nothing;
- unchanged TOAST columns take the key's earlier value in the batch, else the target's;
- a column added to the source is added to the target (older rows null);
- exactly once: a batch applied again changes nothing, and a batch straddling what the
  sink holds (a reset checkpoint) applies only its newer events; the history holds
  every offset once;
- repair markers delete the keys of their ranges outside ``keep``; later events apply;
- routed tables of two sources merge into one target, rows told apart by
  ``_dblog_source``; each source's progress is its own.

``delta-rewrite`` is the Delta sink with every batch that would take a MERGE applied as
a whole-table rewrite instead (``sinks.delta.rewrites``, which large batches into small
tables take): the same contract.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from psycopg import sql

from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.changelog.sqlite_spark import OffsetRange
from pydblog.config import LogConfig, parse_config
from pydblog.deltaread import read_table
from pydblog.devtools.synth import append_events, materialize
from pydblog.events import UNCHANGED_TOAST, ChangeEvent, Op
from pydblog.ports import ColumnSchema, TableSchema
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.decode import read_range
from pydblog.spark.job import BatchApplier, run_sync
from pydblog.spark.sinks import build_sink
from tests.spark.helpers import history_offsets

SINKS = ["delta", "postgres", "mysql"]

T = TableSchema(
    "public", "t",
    (ColumnSchema("id", "integer", "int32", False), ColumnSchema("v", "text", "string"),
     ColumnSchema("big", "text", "string")),
    ("id",),
)
T2 = TableSchema("public", "t", (*T.columns, ColumnSchema("extra", "integer", "int32")), ("id",))
COLS = ["id", "v", "big"]
Rows = list[tuple[Any, ...]]


# -- the targets ------------------------------------------------------------------------
@dataclass
class Target:
    """One sink under test: its ``[[sync.sinks]]`` entry, its rows read back (sorted, as
    a list: a duplicate shows) and a way to change a row behind the sink's back."""

    kind: str
    entry: dict[str, Any]
    rows: Callable[[str, Sequence[str]], Rows]
    set_v: Callable[[str, int, str], None]
    """``set_v(table, id, value)``: ``UPDATE table SET v = value WHERE id = id``."""
    written: Callable[[str], Any]
    """What changes with every write to ``table`` (Delta: its version; PostgreSQL and
    MySQL: the progress rows, which every step that writes moves)."""


def _delta(lake: Path, spark: Any = None) -> Target:
    """Delta mirrors; with ``spark``, tables with deletion vectors (which delta-rs reads
    through ``pydblog.deltaread`` but does not update: Spark changes the row)."""

    def path(table: str) -> str:
        return str(lake / "public" / table)

    def rows(table: str, cols: Sequence[str]) -> Rows:
        if not DeltaTable.is_deltatable(path(table)):
            return []
        got = read_table(DeltaTable(path(table)), cols).to_pylist()
        return sorted(tuple(r[c] for c in cols) for r in got)

    def set_v(table: str, key: int, value: str) -> None:  # (delta-rs: no Spark job)
        if spark is None:
            DeltaTable(path(table)).update(new_values={"v": value}, predicate=f"id = {key}")
            return
        from delta.tables import DeltaTable as SparkDeltaTable
        from pyspark.sql import functions as F

        SparkDeltaTable.forPath(spark, path(table)).update(f"id = {key}", {"v": F.lit(value)})

    entry: dict[str, Any] = {"type": "delta", "path": str(lake)}
    if spark is not None:
        entry["deletion_vectors"] = True
    return Target("delta", entry, rows, set_v, lambda table: DeltaTable(path(table)).version())


def _postgres(dsn: str) -> Target:
    schema = "mirror"

    def rows(table: str, cols: Sequence[str]) -> Rows:
        with psycopg.connect(dsn) as conn:
            if conn.execute("SELECT to_regclass(%s)", (f"{schema}.{table}",)).fetchone() == (None,):
                return []
            cur = conn.execute(sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(map(sql.Identifier, cols)), sql.Identifier(schema, table)))
            return sorted(tuple(r) for r in cur.fetchall())

    def set_v(table: str, key: int, value: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("UPDATE {} SET v = %s WHERE id = %s").format(
                sql.Identifier(schema, table)), (value, key))

    def written(table: str) -> Any:
        with psycopg.connect(dsn) as conn:
            return conn.execute(sql.SQL("SELECT * FROM {} ORDER BY 1, 2, 3").format(
                sql.Identifier(schema, "dblog_sync_progress"))).fetchall()

    return Target("postgres", {"type": "postgres", "dsn": dsn, "schema": schema, "parallelism": 2},
                  rows, set_v, written)


def _mysql(server: Any, database: str) -> Target:
    def rows(table: str, cols: Sequence[str]) -> Rows:
        if not server.execute(f"SHOW TABLES LIKE '{table}'", database):
            return []
        names = ", ".join(f"`{c}`" for c in cols)
        return sorted(tuple(r) for r in server.execute(f"SELECT {names} FROM `{table}`", database))

    def set_v(table: str, key: int, value: str) -> None:
        server.execute(f"UPDATE `{table}` SET v = '{value}' WHERE id = {key}", database)

    def written(table: str) -> Any:
        return server.execute("SELECT * FROM dblog_sync_progress ORDER BY 1, 2, 3", database)

    return Target("mysql", {"type": "mysql", "dsn": server.dsn(database), "parallelism": 2},
                  rows, set_v, written)


EVERY_SINK = pytest.mark.parametrize(
    "target", [*SINKS, "delta-rewrite", pytest.param("delta-dv", marks=pytest.mark.slow)],
    indirect=True)
DELTA_SLOW = pytest.mark.parametrize(
    "target", [pytest.param("delta", marks=pytest.mark.slow),
               pytest.param("delta-dv", marks=pytest.mark.slow), "postgres", "mysql"],
    indirect=True)
"""Cases whose Delta variant the default suite covers elsewhere (truncates, unchanged
TOAST columns and an added column: ``test_sync.py``'s oracle test; repair markers:
``test_repair_batch.py``; merged sources: ``test_drainer_sync.py``): Delta's part here
runs with ``-m slow`` (a Delta commit costs seconds; the default suite has a budget)."""


@pytest.fixture
def target(request: pytest.FixtureRequest, spark: Any, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Target]:
    if request.param == "delta-rewrite":
        from pydblog.spark.sinks import delta

        taken: list[bool] = []
        real = delta.rewrites

        def rewrites(*args: Any) -> bool:
            taken.append(real(*args))
            return taken[-1]

        monkeypatch.setattr(delta, "REWRITE_MIN_ROWS", 0)
        monkeypatch.setattr(delta, "REWRITE_TARGET_RATIO", float("inf"))
        monkeypatch.setattr(delta, "rewrites", rewrites)
        yield _delta(tmp_path / "lake")
        assert any(taken), "no batch was applied by a whole-table rewrite"
        return
    if request.param == "delta":
        yield _delta(tmp_path / "lake")
        return
    if request.param == "delta-dv":
        from pydblog.deltaread import has_deletion_vectors

        lake = tmp_path / "lake"
        yield _delta(lake, spark)
        tables = [p for p in (lake / "public").glob("*") if DeltaTable.is_deltatable(str(p))]
        assert all(has_deletion_vectors(DeltaTable(str(p))) for p in tables), tables
        return
    if request.param == "postgres":
        yield _postgres(request.getfixturevalue("pg_db"))
        return
    yield _mysql(request.getfixturevalue("mariadb"), request.getfixturevalue("my_db"))


# -- the change log and the applier -----------------------------------------------------
_lsn = itertools.count(10**6)


def ev(op: Op, key: int | None, v: str | None = None, *, big: str | None = None,
       table: TableSchema = T, unchanged: tuple[str, ...] = (), **extra: Any) -> ChangeEvent:
    """An event of ``table`` (key ``id``); ``unchanged``'s columns carry the placeholder."""
    after = None
    if op in (Op.CREATE, Op.UPDATE, Op.READ):
        after = {"id": key, "v": v, "big": big, **extra}
        for c in unchanged:
            after[c] = UNCHANGED_TOAST
    return ChangeEvent(op, table.schema, table.table, PgPosition(Lsn(next(_lsn))), 0,
                       key=None if key is None else {"id": key}, after=after,
                       before={"id": key} if op is Op.DELETE else None, unchanged=unchanged)


def repair(lo: int | None, hi: int | None, keep: Sequence[int]) -> ChangeEvent:
    """A repair's range-end marker of ``public.t``: keys in ``(lo, hi]`` outside ``keep``
    leave the mirror (docs/verify.md)."""
    return ChangeEvent(
        Op.NOTIFICATION, "public", "t", PgPosition(Lsn(next(_lsn))), 0,
        after={"repair": {"key": ["id"], "ranges": [{"lo": None if lo is None else [lo],
                                                     "hi": None if hi is None else [hi]}],
                          "keep": [[k] for k in keep]}},
        notification={"repair": True},
    )


class Log:
    """An embedded change log in ``path``, appended to batch by batch."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.end = 0

    def append(self, events: list[ChangeEvent], schemas: Sequence[TableSchema] = ()) -> tuple[int, int]:
        """Append ``events``; their offsets ``[start, end)``."""
        log = SqliteChangeLog(self.path)
        try:
            start, self.end = self.end, append_events(log, events, list(schemas))
        finally:
            log.close()
        return start, self.end

    def oracle(self, table: str = "public.t", cols: Sequence[str] = COLS) -> Rows:
        rows = materialize(self.path).get(table, {})
        return sorted(tuple(r.get(c) for c in cols) for r in rows.values())


@contextlib.contextmanager
def applying(log: Log, *entries: dict[str, Any]) -> Iterator[Callable[[int, int, int], None]]:
    """``apply(start, end, batch_id)``: the job's batch ``[start, end)`` of ``log`` through
    the sinks of ``entries``, as ``foreachBatch`` applies it."""
    cfg = parse_config({"source": {"dsn": "postgresql://unused@127.0.0.1/x"},
                        "log": {"path": str(log.path)},
                        "sync": {"sinks": list(entries)}})
    applier = BatchApplier(LogConfig(path=str(log.path)), [build_sink(s) for s in cfg.sync.sinks],
                           retries=0, backoff_s=0)

    def apply(start: int, end: int, batch_id: int) -> None:
        events = pa.Table.from_batches(list(read_range(OffsetRange(str(log.path), start, end))))
        applier.apply(events.select(applier.columns), batch_id)

    try:
        yield apply
    finally:
        applier.close()


def assert_rows(target: Target, want: Rows, table: str = "t", cols: Sequence[str] = COLS) -> None:
    got = target.rows(table, cols)
    missing = [r for r in want if r not in got]
    extra = [r for r in got if r not in want]
    assert got == want, f"{target.kind} {table}: missing {missing[:5]}, unexpected {extra[:5]}"


# -- the cases --------------------------------------------------------------------------
@EVERY_SINK
def test_last_event_per_key_wins_and_keys_change(target: Target, tmp_path: Path) -> None:
    """The last event of a key wins, within a batch and across batches; a key change is
    logged as a delete of the old key and a create of the new one, and two keys swapped
    through a third within one batch land swapped."""
    log = Log(tmp_path / "log")
    b0 = log.append([*(ev(Op.READ, k, f"r{k}", big=f"B{k}") for k in range(1, 7)),
                     ev(Op.CREATE, 7, "c7")], [T])
    b1 = log.append([
        ev(Op.UPDATE, 1, "u1"), ev(Op.UPDATE, 1, "u1b", big="B1b"),  # the last one wins
        ev(Op.DELETE, 2),
        ev(Op.CREATE, 8, "c8"), ev(Op.DELETE, 8),  # created and gone within the batch
        ev(Op.DELETE, 99),  # a key the target never had
        ev(Op.DELETE, 3), ev(Op.CREATE, 3, "again"),  # deleted and inserted again
        ev(Op.READ, 4, "re-read", big="B4r"),  # a snapshot row is an upsert
        ev(Op.CREATE, 9, "c9"), ev(Op.UPDATE, 9, "u9"),
        ev(Op.DELETE, 7), ev(Op.CREATE, 70, "c7"),  # 7 -> 70
        ev(Op.DELETE, 5), ev(Op.CREATE, 1000, "r5", big="B5"),  # 5 and 6 swapped
        ev(Op.DELETE, 6), ev(Op.CREATE, 5, "r6", big="B6"),
        ev(Op.DELETE, 1000), ev(Op.CREATE, 6, "r5", big="B5"),
    ])
    with applying(log, target.entry) as apply:
        apply(*b0, 0)
        assert_rows(target, sorted(
            [(k, f"r{k}", f"B{k}") for k in range(1, 7)] + [(7, "c7", None)]))
        apply(*b1, 1)
    want = [(1, "u1b", "B1b"), (3, "again", None), (4, "re-read", "B4r"), (5, "r6", "B6"),
            (6, "r5", "B5"), (9, "u9", None), (70, "c7", None)]
    assert log.oracle() == want
    assert_rows(target, want)


@DELTA_SLOW
def test_truncate(target: Target, tmp_path: Path) -> None:
    """Events before a truncate in its batch are dropped, those after it apply; a later
    batch's truncate empties the target."""
    log = Log(tmp_path / "log")
    b0 = log.append([ev(Op.READ, k, f"v{k}") for k in range(1, 6)], [T])
    b1 = log.append([ev(Op.UPDATE, 1, "lost"), ev(Op.CREATE, 6, "lost"),
                     ChangeEvent(Op.TRUNCATE, "public", "t", PgPosition(Lsn(next(_lsn))), 0),
                     ev(Op.CREATE, 7, "kept"), ev(Op.CREATE, 1, "back")])
    b2 = log.append([ev(Op.UPDATE, 7, "gone too"),
                     ChangeEvent(Op.TRUNCATE, "public", "t", PgPosition(Lsn(next(_lsn))), 0)])
    with applying(log, target.entry) as apply:
        apply(*b0, 0)
        apply(*b1, 1)
        assert_rows(target, [(1, "back", None), (7, "kept", None)])
        apply(*b2, 2)
    assert log.oracle() == []
    assert_rows(target, [])


@pytest.mark.parametrize(
    "target", [pytest.param("delta", marks=pytest.mark.slow), "delta-rewrite", "postgres", "mysql"],
    indirect=True)
def test_unchanged_toast_columns_and_an_added_column(target: Target, tmp_path: Path) -> None:
    """An unchanged column takes the key's earlier value in the batch; with none in the
    batch, the target keeps the value it holds. A column the source added is added to
    the target; rows written before stay null in it."""
    log = Log(tmp_path / "log")
    b0 = log.append([ev(Op.READ, k, f"v{k}", big=f"B{k}") for k in (1, 2, 4)], [T])
    b1 = log.append([
        ev(Op.UPDATE, 1, "u1", unchanged=("big",)),  # from the target
        ev(Op.CREATE, 3, "c3", big="B3"), ev(Op.UPDATE, 3, "u3", unchanged=("big",)),  # the batch
        ev(Op.UPDATE, 2, "u2", big="B2x"), ev(Op.UPDATE, 2, "u2b", unchanged=("big",)),
    ])
    b2 = log.append([ev(Op.UPDATE, 3, "u3b", unchanged=("big",), extra=30),
                     ev(Op.UPDATE, 1, "u1b", unchanged=("big",), extra=10),
                     ev(Op.CREATE, 5, "c5", big="B5", extra=50)], [T2])
    cols = [*COLS, "extra"]
    with applying(log, target.entry) as apply:
        apply(*b0, 0)
        apply(*b1, 1)
        apply(*b2, 2)
    want = [(1, "u1b", "B1", 10), (2, "u2b", "B2x", None), (3, "u3b", "B3", 30),
            (4, "v4", "B4", None), (5, "c5", "B5", 50)]
    assert log.oracle(cols=cols) == want
    assert_rows(target, want, cols=cols)


@EVERY_SINK
def test_a_batch_applied_again_changes_nothing(target: Target, tmp_path: Path) -> None:
    """Exactly once: what a sink applied is recorded in the same commit as its rows, so
    a batch replayed (Spark after a crash before its commit) changes nothing, and a batch
    straddling what the sink holds (a reset checkpoint re-batches the log) applies only
    its newer events. Rows changed behind the sink's back show a re-application. The
    history beside the Delta mirror holds every offset once."""
    log = Log(tmp_path / "log")
    b0 = log.append([ev(Op.READ, k, f"v{k}") for k in range(1, 6)], [T])
    b1 = log.append([ev(Op.UPDATE, 1, "u1"), ev(Op.DELETE, 2), ev(Op.CREATE, 6, "c6")])
    b2 = log.append([ev(Op.UPDATE, 3, "u3"), ev(Op.CREATE, 7, "c7"), ev(Op.UPDATE, 6, "u6")])
    history = str(tmp_path / "history")
    entries = [target.entry]
    if target.kind == "delta":  # (a Delta table too: its Spark jobs cost seconds a batch)
        entries.append({"type": "history", "path": history})
    with applying(log, *entries) as apply:
        apply(*b0, 0)
        apply(*b1, 1)
        target.set_v("t", 4, "behind")  # untouched by b1/b2: a re-applied b0 shows
        target.set_v("t", 1, "behind")  # b1's row: a re-applied b1 shows
        written = target.written("t")
        apply(*b1, 1)  # Spark replays batch 1
        assert target.written("t") == written, "a replayed batch wrote"
        apply(b0[0], b2[1], 7)  # [0, end): only b2's events are new
    want = [(1, "behind", None), (3, "u3", None), (4, "behind", None), (5, "v5", None),
            (6, "u6", None), (7, "c7", None)]
    assert_rows(target, want)
    if target.kind == "delta":
        assert history_offsets(history) == list(range(b2[1]))


@DELTA_SLOW
def test_repair_markers_delete_their_ranges(target: Target, tmp_path: Path) -> None:
    """A repair's marker deletes the mirror's keys in its ranges ``(lo, hi]`` outside
    ``keep``; events after the marker apply; a replay deletes nothing more."""
    log = Log(tmp_path / "log")
    b0 = log.append([ev(Op.READ, k, f"v{k}") for k in range(10)], [T])
    b1 = log.append([ev(Op.UPDATE, 3, "u3"), repair(2, 6, [4]), ev(Op.CREATE, 5, "after"),
                     repair(8, None, [])])
    with applying(log, target.entry) as apply:
        apply(*b0, 0)
        apply(*b1, 1)
        target.set_v("t", 4, "behind")
        apply(*b1, 1)
    want = [(0, "v0", None), (1, "v1", None), (2, "v2", None), (4, "behind", None),
            (5, "after", None), (7, "v7", None), (8, "v8", None)]
    assert_rows(target, want)


@DELTA_SLOW
def test_routed_tables_of_two_sources_merge(spark: Any, target: Target, tmp_path: Path) -> None:
    """Two sources' ``public.t`` routed into ``public.m``: one target whose rows carry
    ``_dblog_source``; equal keys of the two sources are two rows; each source's
    progress is its own (more events of one source apply, nothing of the other again)."""
    logs = {name: Log(tmp_path / name) for name in ("a", "b")}
    logs["a"].append([ev(Op.READ, k, f"a{k}") for k in (1, 2, 3)], [T])
    logs["b"].append([ev(Op.READ, k, f"b{k}") for k in (2, 3, 4)], [T])
    logs["b"].append([ev(Op.UPDATE, 3, "b3u"), ev(Op.DELETE, 4)])
    cfg = parse_config({"sync": {
        "checkpoint": str(tmp_path / "cp"), "trigger": "available-now", "master": "local[2]",
        "sink_retries": 0, "sink_retry_backoff_s": 0.0,
        "sources": [{"name": n, "log": {"path": str(log.path)}} for n, log in logs.items()],
        "routes": [{"tables": r"public\.t", "target": "public.m"}],
        "sinks": [target.entry]}})
    cols = ["_dblog_source", "id", "v"]

    def want() -> Rows:
        return sorted((n, *r) for n, log in logs.items() for r in log.oracle(cols=["id", "v"]))

    assert run_sync(cfg, available_now=True) == 0
    assert_rows(target, want(), "m", cols)
    target.set_v("m", 2, "behind")  # both sources' key 2: neither source re-applies it
    logs["a"].append([ev(Op.UPDATE, 1, "a1u"), ev(Op.CREATE, 5, "a5")])
    assert run_sync(cfg, available_now=True) == 0
    expected = [(s, k, "behind" if k == 2 else v) for s, k, v in want()]
    assert_rows(target, expected, "m", cols)
    assert target.rows("t", ["id"]) == []


@pytest.mark.parametrize("target", [
    pytest.param("delta", marks=pytest.mark.slow),
    "postgres",
    "mysql",
], indirect=True)
def test_truncate_of_a_table_never_seen(target: Target, tmp_path: Path) -> None:
    """A truncate of a table the log has no schema and no row of (a table dropped before
    any row of it was logged) changes nothing: no table is created, nothing fails."""
    log = Log(tmp_path / "log")
    b0 = log.append([ev(Op.CREATE, 1, "v1"),
                     ChangeEvent(Op.TRUNCATE, "public", "gone", PgPosition(Lsn(next(_lsn))), 0)],
                    [T])
    with applying(log, target.entry) as apply:
        apply(*b0, 0)
        apply(*b0, 0)  # a replay: still fine
    assert_rows(target, [(1, "v1", None)])
    assert target.rows("gone", ["id"]) == []


def test_parametrized_over_every_sink() -> None:
    """The suite covers each mirror sink type the config accepts."""
    from typing import get_args

    from pydblog.config import SinkConfig

    kinds = set(get_args(SinkConfig.model_fields["type"].annotation))
    assert kinds - {"history"} == set(SINKS), kinds
