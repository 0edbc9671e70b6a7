"""Oracle comparisons for the sync tests: targets read back and normalized."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from deltalake import DeltaTable
from psycopg import sql

from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.ports import TableSchema
from pydblog.spark.synth import key_json, materialize
from pydblog.verify import norm

Table = dict[str, tuple[Any, ...]]


def latest_schemas(log_dir: str | Path) -> dict[str, TableSchema]:
    reader = SqliteChangeLogReader(log_dir)
    try:
        out: dict[str, TableSchema] = {}
        for _, s in reader.schemas():
            out[s.qualified] = s
        return out
    finally:
        reader.close()


def _row(schema: TableSchema, row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(norm(c.logical, row.get(c.name)) for c in schema.columns)


def _key(schema: TableSchema, row: dict[str, Any]) -> str:
    return key_json({k: row[k] for k in schema.key})


def oracle(log_dir: str | Path) -> dict[str, Table]:
    schemas = latest_schemas(log_dir)
    out: dict[str, Table] = {}
    for q, rows in materialize(log_dir).items():
        s = schemas[q]
        out[q] = {k: _row(s, r) for k, r in rows.items()}
    return out


def delta_table(root: str | Path, schema: TableSchema) -> Table:
    path = Path(root) / schema.schema / schema.table
    if not DeltaTable.is_deltatable(str(path)):
        return {}
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {_key(schema, r): _row(schema, r) for r in rows}


def spark_delta_table(spark: Any, root: str | Path, schema: TableSchema) -> Table:
    """The mirror read by Spark itself: the Delta table's live Parquet files."""
    path = Path(root) / schema.schema / schema.table
    files = DeltaTable(str(path)).file_uris()
    if not files:
        return {}
    df = spark.read.option("mergeSchema", "true").parquet(*files)
    rows = [r.asDict() for r in df.collect()]
    return {_key(schema, r): _row(schema, r) for r in rows}


def pg_table(dsn: str, target_schema: str, schema: TableSchema) -> Table:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute(
            "SELECT to_regclass(%s)", (f'"{target_schema}"."{schema.table}"',)
        ).fetchone()
        if exists is None or exists[0] is None:
            return {}
        cur = conn.execute(
            sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(c.name) for c in schema.columns),
                sql.Identifier(target_schema, schema.table),
            )
        )
        names = [c.name for c in schema.columns]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return {_key(schema, r): _row(schema, r) for r in rows}


def assert_tables_equal(expected: Table, got: Table, what: str) -> None:
    missing = expected.keys() - got.keys()
    extra = got.keys() - expected.keys()
    wrong = [k for k in expected.keys() & got.keys() if expected[k] != got[k]]
    assert not missing and not extra and not wrong, (
        f"{what}: {len(missing)} missing (e.g. {sorted(missing)[:3]}), "
        f"{len(extra)} extra (e.g. {sorted(extra)[:3]}), {len(wrong)} differ"
        + (
            f" (e.g. {wrong[0]}: expected {expected[wrong[0]]}, got {got[wrong[0]]})"
            if wrong
            else ""
        )
    )


def assert_mirrors(
    log_dir: str | Path,
    *,
    lake: str | Path | None = None,
    pg_dsn: str | None = None,
    pg_schema: str = "public",
    spark: Any = None,
) -> dict[str, Table]:
    expected = oracle(log_dir)
    schemas = latest_schemas(log_dir)
    for q, table in expected.items():
        s = schemas[q]
        if lake is not None:
            assert_tables_equal(table, delta_table(lake, s), f"delta {q}")
            if spark is not None:
                assert_tables_equal(table, spark_delta_table(spark, lake, s), f"spark delta {q}")
        if pg_dsn is not None:
            assert_tables_equal(table, pg_table(pg_dsn, pg_schema, s), f"postgres {q}")
    return expected


def history_offsets(path: str | Path) -> list[int]:
    t = DeltaTable(str(path)).to_pyarrow_table(columns=["offset"])
    return sorted(t["offset"].to_pylist())
