"""The Delta sink's insert-only writes (``sinks.delta.table_shapes``): a table whose
every key of a batch starts with an insert is appended to (a dense log, or a table the
batch creates) or written by an insert-only MERGE (a log that may have gaps); anything
else takes the full MERGE.
Each batch's commits are checked for the path they took, and the mirror is compared
with the log materialized, every column and the row count (a key appended twice would
vanish in a comparison by key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.changelog.sqlite_spark import OffsetRange
from pydblog.config import LogConfig
from pydblog.deltaread import read_table
from pydblog.devtools.synth import ACCOUNTS, LINES, ORDERS, SyntheticLoad, append_events, key_json
from pydblog.events import UNCHANGED_TOAST, ChangeEvent, Op
from pydblog.spark.decode import read_range
from pydblog.spark.job import BatchApplier
from pydblog.spark.sinks.delta import DeltaSink
from tests.spark.helpers import assert_tables_equal, delta_table, latest_schemas, oracle


class Script:
    """Events by hand, through the synthetic load's rows (so the tables' types are
    the synthetic ones)."""

    def __init__(self) -> None:
        self.load = SyntheticLoad(seed=71)

    def row(self, q: str, n: int) -> dict[str, Any]:
        return self.load._row(self.load.schemas[q], n)

    def ev(self, op: Op, q: str, n: int, *, toast: bool = False) -> ChangeEvent:
        s = self.load.schemas[q]
        row = self.row(q, n)
        key = {c: row[c] for c in s.key}
        if op is Op.DELETE:
            return self.load._event(op, q, key, dict(key), None)
        unchanged: tuple[str, ...] = ()
        if toast:
            row["note"], unchanged = UNCHANGED_TOAST, ("note",)
        return self.load._event(op, q, key, None, row, unchanged)


def build(log_dir: Path) -> list[int]:
    """Three batches; returns their ends."""
    s = Script()
    o, li, a = ORDERS.qualified, LINES.qualified, ACCOUNTS.qualified
    b0 = [
        *(s.ev(Op.CREATE, o, n) for n in range(1, 21)),
        s.ev(Op.UPDATE, o, 1, toast=True),  # the insert of this batch has the column
        s.ev(Op.DELETE, o, 2), s.ev(Op.CREATE, o, 2),  # deleted and inserted again
        s.ev(Op.DELETE, o, 3),  # inserted and deleted: nothing
        *(s.ev(Op.CREATE, li, n) for n in range(40, 52)),
        *(s.ev(Op.READ, a, n) for n in range(1, 6)),  # snapshot rows: the MERGE
    ]
    b1 = [
        *(s.ev(Op.CREATE, o, n) for n in range(21, 31)),  # new keys into a table with rows
        s.ev(Op.UPDATE, o, 25), s.ev(Op.DELETE, o, 26),
        s.ev(Op.DELETE, li, 41), s.ev(Op.CREATE, li, 41),  # a held key deleted, inserted
        *(s.ev(Op.CREATE, li, n) for n in range(60, 64)),
        s.ev(Op.CREATE, a, 6), s.ev(Op.UPDATE, a, 1),
    ]
    b2 = [
        s.ev(Op.READ, o, 1), s.ev(Op.READ, o, 4),  # a snapshot re-reads held rows
        s.ev(Op.CREATE, o, 31),
        s.ev(Op.CREATE, li, 70),
    ]
    log = SqliteChangeLog(log_dir)
    try:
        ends = [append_events(log, b0, [ORDERS, LINES, ACCOUNTS])]
        ends += [append_events(log, b) for b in (b1, b2)]
        return ends
    finally:
        log.close()


def commits(lake: Path, q: str, after: int) -> list[str]:
    """The commits of table ``q`` after version ``after``: WRITE (an append),
    INSERT-MERGE (no matched clause) or MERGE."""
    schema, _, table = q.partition(".")
    out = []
    for h in sorted(DeltaTable(str(lake / schema / table)).history(), key=lambda h: h["version"]):
        if h["version"] <= after or h["operation"] in ("CREATE TABLE", "ADD COLUMNS"):
            continue
        op = h["operation"]
        if op == "MERGE":
            params = h.get("operationParameters") or {}
            matched = orjson.loads(params.get("matchedPredicates") or "[]")
            op = "MERGE" if matched else "INSERT-MERGE"
        out.append(op)
    return out


def version(lake: Path, q: str) -> int:
    schema, _, table = q.partition(".")
    return DeltaTable(str(lake / schema / table)).version()


def assert_exact(log_dir: Path, lake: Path) -> None:
    """Every column equal and every row once (counted from the Delta table itself)."""
    schemas = latest_schemas(log_dir)
    expected = oracle(log_dir)
    for q, table in expected.items():
        s = schemas[q]
        assert_tables_equal(table, delta_table(lake, s), f"delta {q}", [c.name for c in s.columns])
        schema, _, name = q.partition(".")
        assert read_table(DeltaTable(str(lake / schema / name))).num_rows == len(table), q


@pytest.mark.parametrize("dense", [
    True, pytest.param(False, marks=pytest.mark.slow)], ids=["append", "insert-merge"])
def test_insert_only_batches(spark: Any, tmp_path: Path, dense: bool) -> None:
    log_dir, lake = tmp_path / "log", tmp_path / "lake"
    e0, e1, e2 = build(log_dir)
    applier = BatchApplier(LogConfig(path=str(log_dir)), [DeltaSink(str(lake))],
                           retries=0, backoff_s=0)

    def events(a: int, b: int) -> pa.Table:
        return pa.Table.from_batches(list(read_range(OffsetRange(str(log_dir), a, b))))

    o, li, a = ORDERS.qualified, LINES.qualified, ACCOUNTS.qualified
    fresh = "WRITE" if dense else "INSERT-MERGE"
    try:
        applier.apply(events(0, e0), 0, dense=dense)
        # Tables the batch creates hold no row: appended to from any log.
        assert {q: commits(lake, q, -1) for q in (o, li, a)} == \
            {o: ["WRITE"], li: ["WRITE"], a: ["MERGE"]}
        # A table made by its first append is one commit: no reader sees it empty.
        assert {q: version(lake, q) for q in (o, li)} == {o: 0, li: 0}
        v = {q: version(lake, q) for q in (o, li, a)}
        # The first two batches again as one (a reset checkpoint re-batches the log):
        # only the second one's events are applied, orders' still insert-only.
        applier.apply(events(0, e1), 1, dense=dense)
        assert {q: commits(lake, q, v[q]) for q in (o, li, a)} == \
            {o: [fresh], li: ["MERGE"], a: ["MERGE"]}
        v = {q: version(lake, q) for q in (o, li, a)}
        applier.apply(events(0, e1), 1, dense=dense)  # a replay: nothing
        assert {q: version(lake, q) for q in (o, li, a)} == v
        applier.apply(events(e1, e2), 2, dense=dense)
        assert {q: commits(lake, q, v[q]) for q in (o, li, a)} == \
            {o: ["MERGE"], li: [fresh], a: []}
        assert DeltaTable(str(lake / "public" / "orders")).transaction_version(
            "pydblog-sync") == e2
        assert_exact(log_dir, lake)
        held = oracle(log_dir)[o]
        assert key_json({"id": 2}) in held and key_json({"id": 3}) not in held
    finally:
        applier.close()


def test_a_table_made_by_its_append_holds_the_schema_a_created_one_does(
        spark: Any, tmp_path: Path) -> None:
    """``created_schema``: what the sink casts a table's first append to is what a table
    made by ``ensure_table`` holds, for every logical type."""
    from pydblog.ports import ColumnSchema, TableSchema
    from pydblog.spark.plan import spark_schema
    from pydblog.spark.sinks.delta import created_schema, ensure_table, target_arrow_schema
    from pydblog.spark.typemap import arrow_schema

    types = [("int2", "int16"), ("int4", "int32"), ("int8", "int64"),
             ("bigint unsigned", "int64"), ("numeric(12,2)", "decimal"), ("real", "float32"),
             ("float8", "float64"), ("bool", "bool"), ("text", "text"), ("date", "date"),
             ("timestamp", "timestamp"), ("timestamptz", "timestamptz"), ("bytea", "bytes"),
             ("jsonb", "json"), ("text[]", "array<string>"), ("time", "time"),
             ("point", "unknown")]
    cols = [ColumnSchema(f"c{i}", t, lg, nullable=i != 0) for i, (t, lg) in enumerate(types)]
    typed = arrow_schema(TableSchema("public", "t", tuple(cols), ("c0",)))
    made = ensure_table(spark, str(tmp_path / "made"), typed)
    assert created_schema(typed) == made
    appended = str(tmp_path / "appended")
    spark.createDataFrame([], spark_schema(created_schema(typed))).write.format("delta") \
        .mode("append").save(appended)
    assert target_arrow_schema(spark, appended) == made
