"""Compare a source database with its mirrors: row counts and per-table checksums.

Used by `dblog demo` (and usable on its own): the source tables are read with the
capture's own type mapping, the Delta mirrors with deltalake, the downstream
PostgreSQL tables with psycopg; every value is normalized by its logical type
(``docs/types.md``) so that ``"12.50"`` (JSON), ``Decimal('12.50')`` (Delta) and
``numeric`` (PostgreSQL) compare equal.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.ports import TableSchema
from pydblog.sources.postgres.connect import connect
from pydblog.sources.postgres.types import TypeRegistry

Rows = dict[str, tuple[Any, ...]]


def norm(logical: str, v: Any) -> Any:
    """One comparable value for a JSON value from the log and what a target returns."""
    if v is None:
        return None
    lg = logical.lower()
    if lg == "decimal":
        return Decimal(str(v))
    if lg in ("float32", "float64"):
        return float(v)
    if lg == "timestamptz":
        if isinstance(v, str):
            v = datetime.fromisoformat(v.replace("Z", "+00:00"))
        return v.astimezone(UTC) if v.tzinfo else v.replace(tzinfo=UTC)
    if lg == "timestamp":
        return datetime.fromisoformat(v) if isinstance(v, str) else v
    if lg == "date":
        return date.fromisoformat(v) if isinstance(v, str) else v
    if lg == "json" or lg.startswith("array"):
        return orjson.loads(v) if isinstance(v, str) else v
    if lg == "bytes":
        return base64.b64decode(v) if isinstance(v, str) else bytes(v)
    return str(v) if lg == "uuid" else v


def _rows(schema: TableSchema, rows: list[dict[str, Any]]) -> Rows:
    out: Rows = {}
    for r in rows:
        key = orjson.dumps([r.get(k) for k in schema.key], default=str).decode()
        out[key] = tuple(norm(c.logical, r.get(c.name)) for c in schema.columns)
    return out


def schemas(log_dir: Path) -> dict[str, TableSchema]:
    reader = SqliteChangeLogReader(log_dir)
    try:
        return {s.qualified: s for _, s in reader.schemas()}
    finally:
        reader.close()


def source_table(dsn: str, schema: TableSchema) -> Rows:
    conn = connect(dsn)
    try:
        types = TypeRegistry.load(conn)
        cols = conn.execute(
            "SELECT a.attname, a.atttypid FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
            "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (schema.schema, schema.table),
        ).fetchall()
        exprs = ", ".join(types.text_expr(sql.Identifier(c).as_string(conn), oid) for c, oid in cols)
        query = f"SELECT {exprs} FROM {sql.Identifier(schema.schema, schema.table).as_string(conn)}"
        convs = [types.converter(oid) for _, oid in cols]
        rows = [
            {c: (f(v) if v is not None else None) for (c, _), f, v in zip(cols, convs, r, strict=True)}
            for r in conn.execute(query)
        ]
    finally:
        conn.close()
    return _rows(schema, rows)


def delta_table(root: Path, schema: TableSchema) -> Rows:
    from deltalake import DeltaTable

    from pydblog.deltaread import read_table

    path = root / schema.schema / schema.table
    if not DeltaTable.is_deltatable(str(path)):
        return {}
    return _rows(schema, read_table(DeltaTable(str(path))).to_pylist())


def postgres_table(dsn: str, target_schema: str, schema: TableSchema) -> Rows:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(
            sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(c.name) for c in schema.columns),
                sql.Identifier(target_schema, schema.table),
            )
        )
        names = [c.name for c in schema.columns]
        return _rows(schema, [dict(zip(names, r, strict=True)) for r in cur.fetchall()])


def checksum(rows: Rows) -> str:
    digest = hashlib.sha256()
    for key in sorted(rows):
        digest.update(key.encode())
        digest.update(repr(rows[key]).encode())
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class Comparison:
    table: str
    target: str
    source_rows: int
    target_rows: int
    source_sum: str
    target_sum: str

    @property
    def ok(self) -> bool:
        return self.source_rows == self.target_rows and self.source_sum == self.target_sum

    def line(self) -> str:
        mark = "OK " if self.ok else "MISMATCH"
        return (f"  {mark} {self.table:<22} {self.target:<10} rows {self.source_rows:>7} / "
                f"{self.target_rows:<7} checksum {self.source_sum} / {self.target_sum}")


def compare(table: str, target: str, source: Rows, got: Rows) -> Comparison:
    return Comparison(table, target, len(source), len(got), checksum(source), checksum(got))
