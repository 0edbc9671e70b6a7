"""A PostgreSQL table read for verification: the source table or a mirror table.

Both sides are read the same way, with the capture's session settings (UTC, ISO dates,
hex bytea, shortest exact floats) and no locks (plain reads, each statement its own
snapshot):

- ``checksum(lo, hi)``: ``count(*)`` and the sum of a 64-bit hash of each row's
  canonical text, computed in the database. The canonical text of a row is the text
  array of its columns (``ARRAY[c1::text, ...]::text``: a NULL prints unquoted, the
  string 'NULL' quoted), json as ``jsonb`` text so that a json source and a jsonb
  mirror agree. It is only compared between two tables whose columns have the same
  types (``same_types``); others are compared row by row.
- ``rows(lo, hi)``: the rows of a range through the capture's own text converters
  (``TypeRegistry``), normalized by logical type: what the change log would say.

Key order: text-like key columns compare ``COLLATE "C"`` (code point order, the same
in every database and in Python), other types by their own order. A range read with
an index on the key is an index range scan; a text key's ``COLLATE "C"`` order cannot
use a default-collation index (the table is read per range: slower, still no lock).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from pydblog.ports import TableSchema
from pydblog.sources.postgres.connect import connect
from pydblog.sources.postgres.types import Converter, TypeRegistry
from pydblog.verifier.ranges import Key, Row, key_columns, normalizer, value


@dataclass(frozen=True)
class Column:
    name: str
    oid: int
    sql_type: str  # format_type(atttypid, atttypmod)
    collatable: bool


def open_conn(dsn: str, setting: str) -> psycopg.Connection[Any]:
    return connect(dsn, setting=setting)


class PgTable:
    """One table of one PostgreSQL database, read with the columns of ``schema`` (the
    change log's schema of the source table; a column the table lacks reads NULL)."""

    def __init__(self, conn: psycopg.Connection[Any], schema_name: str, table: str,
                 schema: TableSchema) -> None:
        self.conn = conn
        self.schema = schema
        self.ident = sql.Identifier(schema_name, table)
        self.name = f"{schema_name}.{table}"
        self.types = TypeRegistry.load(conn)
        rows = conn.execute(
            "SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod), "
            "t.typcollation <> 0 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped",
            (schema_name, table),
        ).fetchall()
        self.columns = {r[0]: Column(r[0], int(r[1]), str(r[2]), bool(r[3])) for r in rows}
        self.exists = bool(self.columns)
        self.keys = key_columns(schema)

    # -- SQL pieces --------------------------------------------------------------------
    def _col(self, name: str) -> sql.Composable:
        if name in self.columns:
            return sql.Identifier(name)
        return sql.SQL("NULL::text")

    def _key_expr(self, name: str) -> sql.Composable:
        col = self.columns.get(name)
        if col is not None and col.collatable:
            return sql.SQL('{} COLLATE "C"').format(sql.Identifier(name))
        return self._col(name)

    def _bound(self, name: str) -> sql.Composable:
        col = self.columns.get(name)
        typ = sql.SQL(col.sql_type if col is not None else "text")
        if col is not None and col.collatable:
            return sql.SQL('CAST(%s AS {}) COLLATE "C"').format(typ)
        return sql.SQL("CAST(%s AS {})").format(typ)

    def _order(self, desc: bool = False) -> sql.Composable:
        return sql.SQL(", ").join(
            sql.SQL("{} DESC" if desc else "{}").format(self._key_expr(k)) for k in self.keys
        )

    def _cond(self, lo: Sequence[str] | None, hi: Sequence[str] | None) -> tuple[sql.Composable, list[Any]]:
        keys = sql.SQL(", ").join(self._key_expr(k) for k in self.keys)
        bounds = sql.SQL(", ").join(self._bound(k) for k in self.keys)
        parts: list[sql.Composable] = []
        params: list[Any] = []
        if lo is not None:
            parts.append(sql.SQL("ROW({}) > ROW({})").format(keys, bounds))
            params.extend(lo)
        if hi is not None:
            parts.append(sql.SQL("ROW({}) <= ROW({})").format(keys, bounds))
            params.extend(hi)
        if not parts:
            return sql.SQL("TRUE"), params
        return sql.SQL(" AND ").join(parts), params

    def cond_text(self, lo: Sequence[str] | None, hi: Sequence[str] | None) -> str:
        """``_cond`` with the bounds as SQL literals (a filter for a snapshot signal)."""
        keys = sql.SQL(", ").join(self._key_expr(k) for k in self.keys)

        def bounds(texts: Sequence[str]) -> sql.Composable:
            out = []
            for k, t in zip(self.keys, texts, strict=True):
                col = self.columns.get(k)
                cast = sql.SQL("CAST({} AS {})").format(
                    sql.Literal(t), sql.SQL(col.sql_type if col is not None else "text"))
                out.append(sql.SQL('{} COLLATE "C"').format(cast) if col is not None and col.collatable
                           else cast)
            return sql.SQL(", ").join(out)

        parts: list[sql.Composable] = []
        if lo is not None:
            parts.append(sql.SQL("ROW({}) > ROW({})").format(keys, bounds(lo)))
        if hi is not None:
            parts.append(sql.SQL("ROW({}) <= ROW({})").format(keys, bounds(hi)))
        return sql.SQL(" AND ").join(parts).as_string(self.conn) if parts else "TRUE"

    def _canon(self, name: str) -> sql.Composable:
        col = self.columns.get(name)
        if col is None:
            return sql.SQL("NULL::text")
        ident = sql.Identifier(name)
        if col.sql_type in ("json", "jsonb"):
            return sql.SQL("{}::jsonb::text").format(ident)
        return sql.SQL("{}::text").format(ident)

    def hash_expr(self) -> sql.Composable:
        text = sql.SQL("ARRAY[{}]::text").format(
            sql.SQL(", ").join(self._canon(c.name) for c in self.schema.columns)
        )
        return sql.SQL("('x' || left(md5({}), 16))::bit(64)::bigint").format(text)

    def same_types(self, other: PgTable) -> bool:
        """Whether in-database checksums of the two tables are comparable: every column
        present on both sides with the same type (json and jsonb count as one)."""
        if not other.exists:
            return True  # (its checksums are those of an empty range)
        for c in self.schema.columns:
            a, b = self.columns.get(c.name), other.columns.get(c.name)
            if a is None or b is None:
                return False
            if a.sql_type != b.sql_type and {a.sql_type, b.sql_type} != {"json", "jsonb"}:
                return False
            if a.collatable != b.collatable:
                return False
        return True

    # -- reads -------------------------------------------------------------------------
    def estimate(self) -> int:
        if not self.exists:
            return 0
        row = self.conn.execute(
            "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            (self.ident.as_string(self.conn),),
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def next_chunk(self, lo: Sequence[str] | None, limit: int,
                   h: sql.Composable | None = None) -> tuple[int, int, tuple[str, ...] | None]:
        """The source's next range after ``lo``: (rows, hash sum, text of its last key),
        at most ``limit`` rows in key order, aggregated in the database (``h``: the row
        hash, default ``hash_expr``)."""
        cond, params = self._cond(lo, None)
        last = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k in self.keys)
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.keys)
        query = sql.SQL(
            "WITH r AS MATERIALIZED (SELECT {keys}, {h} AS _h FROM {t} WHERE {cond} "
            "ORDER BY {order} LIMIT {n}) "
            "SELECT count(*), coalesce(sum(_h), 0)::text, "
            "(SELECT ARRAY[{last}] FROM r ORDER BY {desc} LIMIT 1) FROM r"
        ).format(keys=keys, h=h if h is not None else self.hash_expr(), t=self.ident, cond=cond, order=self._order(),
                 n=sql.Literal(limit), last=last, desc=self._order(desc=True))
        row = self.conn.execute(query, params).fetchone()
        assert row is not None
        count, total, last_key = int(row[0]), int(row[1]), row[2]
        return count, total, (tuple(last_key) if last_key is not None else None)

    def checksum(self, lo: Sequence[str] | None, hi: Sequence[str] | None) -> tuple[int, int]:
        """(rows, hash sum) of the range ``(lo, hi]``, in the database."""
        if not self.exists:
            return 0, 0
        cond, params = self._cond(lo, hi)
        row = self.conn.execute(
            sql.SQL("SELECT count(*), coalesce(sum({}), 0)::text FROM {} WHERE {}").format(
                self.hash_expr(), self.ident, cond
            ),
            params,
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def rows_by_keys(self, keys: Collection[Key]) -> list[tuple[Key, Row]]:
        """The rows with these (normalized) keys, normalized."""
        if not keys or not self.exists or any(k not in self.columns for k in self.keys):
            return []
        names = [sql.Identifier(f"_dblog_a{i}") for i in range(len(self.keys))]
        casts = sql.SQL(", ").join(
            sql.SQL("CAST(u.{} AS {})").format(n, sql.SQL(self.columns[k].sql_type))
            for n, k in zip(names, self.keys, strict=True)
        )
        cond = sql.SQL("ROW({}) IN (SELECT {} FROM unnest({}) AS u({}))").format(
            sql.SQL(", ").join(sql.Identifier(k) for k in self.keys),
            casts,
            sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in self.keys),
            sql.SQL(", ").join(names),
        )
        ordered = list(keys)
        params = [[_sql_text(k[i]) for k in ordered] for i in range(len(self.keys))]
        rows, _ = self._select(cond, list(params), None)
        return rows

    def rows(
        self, lo: Sequence[str] | None, hi: Sequence[str] | None, limit: int | None = None
    ) -> tuple[list[tuple[Key, Row]], tuple[str, ...] | None]:
        """The rows of ``(lo, hi]`` in key order (at most ``limit``), normalized, and the
        text of the last key read."""
        if not self.exists:
            return [], None
        cond, params = self._cond(lo, hi)
        return self._select(cond, params, limit)

    def _select(self, cond: sql.Composable, params: list[Any],
                limit: int | None) -> tuple[list[tuple[Key, Row]], tuple[str, ...] | None]:
        cols = self.schema.columns
        exprs: list[str] = []
        convs: list[Converter | None] = []
        for c in cols:
            col = self.columns.get(c.name)
            if col is None:
                exprs.append("NULL::text")
                convs.append(None)
            else:
                exprs.append(self.types.text_expr(sql.Identifier(c.name).as_string(self.conn), col.oid))
                convs.append(self.types.converter(col.oid))
        # (output columns renamed: ORDER BY a bare name would sort by a text output)
        key_text = [
            sql.SQL("{}::text AS {}").format(self._col(k), sql.Identifier(f"_dblog_k{i}"))
            for i, k in enumerate(self.keys)
        ]
        query = sql.SQL("SELECT {}, {} FROM {} WHERE {} ORDER BY {}{}").format(
            sql.SQL(", ").join(
                sql.SQL("{} AS {}").format(sql.SQL(e), sql.Identifier(f"_dblog_c{i}"))
                for i, e in enumerate(exprs)
            ),
            sql.SQL(", ").join(key_text),
            self.ident,
            cond,
            self._order(),
            sql.SQL(" LIMIT {}").format(sql.Literal(limit)) if limit is not None else sql.SQL(""),
        )
        pos = {c.name: i for i, c in enumerate(cols)}
        key_idx = [pos[k] for k in self.keys]
        out: list[tuple[Key, Row]] = []
        last: tuple[str, ...] | None = None
        n = len(cols)
        norms = [normalizer(c.logical) for c in cols]
        steps = list(zip(norms, convs, strict=True))
        for rec in self.conn.execute(query, params):
            row = tuple(
                None if v is None else (g(f(v)) if f is not None else None)
                for (g, f), v in zip(steps, rec[:n], strict=True)
            )
            out.append((tuple(row[i] for i in key_idx), row))
            last = tuple(rec[n:])
        return out, last

    def bound_text(self, key: Key | None) -> tuple[str | None, ...] | None:
        """A normalized range bound as this table's key text (for a bound read from a
        source of another kind, whose text would not cast here: MySQL's ``0x..`` bytes)."""
        return None if key is None else tuple(_sql_text(v) for v in key)

    def key_of_text(self, texts: Sequence[str]) -> Key:
        """The normalized key of a key's text (as ``rows`` and ``next_chunk`` give it)."""
        logical = {c.name: c.logical for c in self.schema.columns}
        out = []
        for k, t in zip(self.keys, texts, strict=True):
            col = self.columns.get(k)
            conv = self.types.converter(col.oid) if col is not None else str
            out.append(value(logical[k], conv(t)))
        return tuple(out)

    def wal_lsn(self) -> int:
        row = self.conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])


def _sql_text(v: Any) -> str | None:
    """A normalized key value as text PostgreSQL casts back to the column's type."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes):
        return "\\x" + v.hex()
    if isinstance(v, datetime | date):
        return v.isoformat()
    if isinstance(v, Decimal | int | float):
        return str(v)
    return str(v)


PROGRESS_TABLE = "dblog_sync_progress"


def pg_applied(conn: psycopg.Connection[Any], schema: str, parts: int) -> int:
    """One past the last change-log offset a PostgreSQL sink has applied to every
    table: the least ``applied_end`` of its steps (``-1`` and ``0..parts-1``, see the
    sink's progress table); 0 when it has applied nothing."""
    table = sql.Identifier(schema, PROGRESS_TABLE)
    try:
        with conn.transaction():
            rows = conn.execute(
                sql.SQL("SELECT part, applied_end FROM {} WHERE nparts = %s "
                        "AND source = 'default'").format(table),
                (parts,),
            ).fetchall()
    except psycopg.errors.UndefinedColumn:  # the single-source form: no source column
        rows = conn.execute(
            sql.SQL("SELECT part, applied_end FROM {} WHERE nparts = %s").format(table),
            (parts,),
        ).fetchall()
    except psycopg.errors.UndefinedTable:
        return 0
    have = {int(p): int(e) for p, e in rows}
    if any(p not in have for p in range(-1, parts)):
        return 0
    return min(have.values())
