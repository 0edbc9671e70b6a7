"""A downstream PostgreSQL database: one table per source table, same name, in the
configured schema (or, when none is configured, the source table's own schema), created
on first sight (columns with the source SQL types, the
source key as primary key); added source columns are added with ALTER TABLE.

Exactly once, through the progress table ``<schema>.dblog_sync_progress`` in the
target: one row per step ``(part, nparts)`` holding ``applied_end``, one past the last
change-log offset that step has applied (and the Spark batch id that did it). A batch
``[start, end)`` (see ``batch.Batch``) is applied in steps, each in one transaction that
also moves its progress row to ``end``:

1. ``part = -1``: create/alter tables, TRUNCATE the tables the batch truncates;
2. ``part = 0..n-1`` (``n`` = parallelism; one thread and connection each, in
   parallel): the upserts and deletes of the keys whose hash falls in the partition.

A step reads its row first (``FOR UPDATE``): with ``applied_end >= end`` it does nothing,
otherwise it reduces only the events ``>= applied_end``. So a replayed batch (a crash
before Spark's commit) redoes only the steps that did not commit, and nothing is applied
twice, even when a reset Spark checkpoint re-batches the log differently. Keys of a
reduced batch are distinct, so partitions never touch the same row and cannot conflict.
Changing ``parallelism`` starts new rows: the next batch is then applied whole, which is
still exact because a batch's net change is idempotent.
"""

from __future__ import annotations

import base64
import re
import threading
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import orjson
import psycopg
from psycopg import sql

from pydblog.config import redact_dsn
from pydblog.errors import SinkError
from pydblog.ports import ColumnSchema, TableSchema
from pydblog.spark.batch import Batch
from pydblog.spark.reduce import DELETE, TableChanges
from pydblog.spark.repairs import pg_purge
from pydblog.spark.typemap import null_safe_key

PROGRESS_TABLE = "dblog_sync_progress"


def _is_json(sql_type: str) -> bool:
    return sql_type.lower() in ("json", "jsonb")


# PostgreSQL's own names (as format_type prints them) kept as they are downstream; any
# other type (a MySQL type, an enum or domain the target lacks) maps by logical type.
_PG_BUILTIN = re.compile(
    r"(smallint|integer|bigint|real|double precision|boolean|text|bytea|date|uuid|json|jsonb"
    r"|interval|numeric(\(\d+,-?\d+\))?|character varying(\(\d+\))?|character\(\d+\)"
    r"|time(stamp)?( ?\(\d\))? with(out)? time zone)(\[\])*"
)
_BY_LOGICAL = {
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "float32": "real",
    "float64": "double precision",
    "bool": "boolean",
    "string": "text",
    "bytes": "bytea",
    "date": "date",
    "time": "time",
    "timetz": "time with time zone",
    "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone",
    "interval": "interval",
    "json": "jsonb",
    "uuid": "uuid",
    "enum": "text",
}
_WIDER = {"int16": "integer", "int32": "bigint", "int64": "numeric(20,0)"}
_DECIMAL = re.compile(r"(?:numeric|decimal)\s*\((\d+)\s*,\s*(\d+)\)", re.IGNORECASE)


def target_type(col: ColumnSchema) -> str:
    """The column's type in the downstream PostgreSQL: the source's own type when it is
    a PostgreSQL built-in, else one derived from the logical type (docs/types.md), so a
    MySQL source (``int(11)``, ``datetime(6)``) or a source enum lands on valid types."""
    if _PG_BUILTIN.fullmatch(col.type):
        return col.type
    if "unsigned" in col.type.lower() and col.logical in _WIDER:
        return _WIDER[col.logical]  # MySQL unsigned integers need the next wider type
    return _logical_pg(col.logical, col.type)


def _logical_pg(logical: str, source_type: str) -> str:
    if logical.startswith("array<") and logical.endswith(">"):
        return _logical_pg(logical[6:-1], "") + "[]"
    if logical == "decimal":
        m = _DECIMAL.search(source_type)
        return f"numeric({m.group(1)},{m.group(2)})" if m else "numeric"
    return _BY_LOGICAL.get(logical, "text")


def _copy_value(value: Any, sql_type: str) -> Any:
    if sql_type == "bytea" and isinstance(value, str):
        return base64.b64decode(value)  # the log carries bytes as base64 (docs/types.md)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list) and sql_type.endswith("[]") and not _is_json(sql_type):
        return value
    return orjson.dumps(value).decode()


class PostgresSink:
    def __init__(self, dsn: str, schema: str | None = None, parallelism: int = 2) -> None:
        self.dsn = dsn
        self.target_schema = schema
        self.schema = schema or "public"  # where the progress table lives
        self.parts = parallelism
        self.name = f"postgres:{redact_dsn(dsn)}" + (f" schema {schema}" if schema else "")
        self._targets: dict[tuple[str, str], str] = {}
        self._conns: dict[int, psycopg.Connection[Any]] = {}
        self._columns: dict[str, set[str]] = {}
        # target -> True when it has no primary key: rows are matched null-safely
        self._keyless: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="pg-sink")

    def target(self, schema: str, table: str) -> tuple[str, str]:
        """Where a source table goes: the configured schema (or the source's own), same
        table name. Two source tables landing on one target table is an error."""
        key = (self.target_schema or schema, table)
        source = f"{schema}.{table}"
        seen = self._targets.setdefault(key, source)
        if seen != source:
            raise SinkError(
                f"source tables {seen} and {source} would both be written to {key[0]}.{key[1]}",
                hint="leave [[sync.sinks]] schema unset to mirror each source schema",
            )
        return key

    def _label(self, ch: TableChanges) -> str:
        tschema, tname = self.target(ch.schema, ch.table)
        target = f"{tschema}.{tname}"
        return target if target == ch.qualified else f"{target} (from {ch.qualified})"

    # -- connections -------------------------------------------------------------------
    @contextmanager
    def _tx(self, slot: int) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on the connection of ``slot``; a broken connection is dropped
        and reopened on the next use."""
        conn = self._conns.get(slot)
        if conn is None or conn.closed:
            try:
                conn = psycopg.connect(self.dsn, connect_timeout=10)
            except psycopg.Error as exc:
                raise SinkError(f"cannot connect: {exc}") from exc
            self._conns[slot] = conn
        try:
            with conn.transaction():
                yield conn
        except BaseException:
            if conn.broken or conn.closed:
                self._conns.pop(slot, None)
            raise

    def _applied(self, conn: psycopg.Connection[Any], part: int) -> int | None:
        row = conn.execute(
            sql.SQL("SELECT applied_end FROM {} WHERE part = %s AND nparts = %s FOR UPDATE").format(
                sql.Identifier(self.schema, PROGRESS_TABLE)
            ),
            (part, self.parts),
        ).fetchone()
        return None if row is None else int(row[0])

    def _record(self, conn: psycopg.Connection[Any], batch: Batch, part: int) -> None:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (part, nparts, applied_end, batch_id) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (part, nparts) DO UPDATE SET applied_end = EXCLUDED.applied_end, "
                "batch_id = EXCLUDED.batch_id, applied_at = now()"
            ).format(sql.Identifier(self.schema, PROGRESS_TABLE)),
            (part, self.parts, batch.end, batch.batch_id),
        )

    # -- apply -------------------------------------------------------------------------
    def apply(self, batch: Batch) -> None:
        changes = batch.changes()
        if not changes and not batch.purges():
            return
        schemas = {q: batch.schema_for(c) for q, c in changes.items()}
        try:
            self._prepare(batch, changes, schemas)
            futures = [
                self._pool.submit(self._apply_part, batch, p, changes, schemas)
                for p in range(self.parts)
            ]
            errors = [f.exception() for f in futures]
        except psycopg.Error as exc:
            raise SinkError(str(exc)) from exc
        for err in errors:
            if err is not None:
                raise err

    def _prepare(
        self, batch: Batch, changes: dict[str, TableChanges], schemas: dict[str, TableSchema]
    ) -> None:
        with self._tx(0) as conn:
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            )
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (part int NOT NULL, nparts int NOT NULL, "
                    "applied_end bigint NOT NULL, batch_id bigint NOT NULL, "
                    "applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (part, nparts))"
                ).format(sql.Identifier(self.schema, PROGRESS_TABLE))
            )
            done = self._applied(conn, -1)
            if done is not None and done >= batch.end:
                return
            for q, ch in sorted(batch.changes(done).items()):
                try:
                    self._ensure_table(conn, schemas[q])
                    if ch.truncated:
                        conn.execute(
                            sql.SQL("TRUNCATE {}").format(
                                sql.Identifier(*self.target(ch.schema, ch.table))
                            )
                        )
                except psycopg.Error as exc:
                    raise SinkError(f"table {self._label(ch)}: {exc}") from exc
            for q, purge in sorted(batch.purges(done).items()):  # repairs: spark/repairs.py
                schema_name, _, table = q.partition(".")
                try:
                    pg_purge(conn, *self.target(schema_name, table), purge)
                except psycopg.Error as exc:
                    raise SinkError(f"repair of table {q}: {exc}") from exc
            self._record(conn, batch, -1)

    def _ensure_table(self, conn: psycopg.Connection[Any], schema: TableSchema) -> None:
        tschema, tname = self.target(schema.schema, schema.table)
        ident = sql.Identifier(tschema, tname)
        have = self._columns.get(f"{tschema}.{tname}")
        if have is not None and all(c.name in have for c in schema.columns):
            return
        cols = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(target_type(c)))
            for c in schema.columns
        )
        key = sql.SQL(", ").join(sql.Identifier(k) for k in schema.key)
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(tschema)))
        if null_safe_key(schema):
            # A whole-row identity (no primary key at the source) may hold NULLs: no
            # primary key here either (it would make them NOT NULL); rows are matched
            # null-safely (``_apply_null_safe``).
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(ident, cols))
        else:
            conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(ident, cols, key)
            )
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s",
            (tschema, tname),
        ).fetchall()
        have = {r[0] for r in rows}
        pk = conn.execute(
            "SELECT 1 FROM pg_index WHERE indrelid = to_regclass(%s) AND indisprimary",
            (sql.Identifier(tschema, tname).as_string(conn),),
        ).fetchone()
        self._keyless[f"{tschema}.{tname}"] = pk is None
        for c in schema.columns:
            if c.name not in have:
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                        ident, sql.Identifier(c.name), sql.SQL(target_type(c))
                    )
                )
                have.add(c.name)
        self._columns[f"{tschema}.{tname}"] = have

    def _apply_part(
        self,
        batch: Batch,
        part: int,
        changes: dict[str, TableChanges],
        schemas: dict[str, TableSchema],
    ) -> None:
        slot = part + 1
        with self._tx(slot) as conn:
            done = self._applied(conn, part)
            if done is not None and done >= batch.end:
                return
            if done is not None and done > batch.start:
                changes = batch.changes(done)
            for q, ch in sorted(changes.items()):
                idx = [i for i in range(len(ch)) if ch.partition_of(i, self.parts) == part]
                if not idx:
                    continue
                try:
                    self._apply_rows(conn, ch, schemas[q], idx)
                except psycopg.Error as exc:
                    raise SinkError(
                        f"table {self._label(ch)} (batch {batch.batch_id}, partition {part}): {exc}",
                        hint="a type mismatch or constraint on the target refused the rows",
                    ) from exc
            self._record(conn, batch, part)

    def _apply_rows(
        self,
        conn: psycopg.Connection[Any],
        ch: TableChanges,
        schema: TableSchema,
        idx: Sequence[int],
    ) -> None:
        target = sql.Identifier(*self.target(ch.schema, ch.table))
        stage = sql.Identifier(f"_dblog_stage_{zlib.crc32(ch.qualified.encode()):08x}")
        cols = [c.name for c in schema.columns]
        types = [target_type(c) for c in schema.columns]
        key = list(schema.key) or cols
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE {} ({}, _dblog_op text, _dblog_unchanged text[]) ON COMMIT DROP"
            ).format(
                stage,
                sql.SQL(", ").join(
                    sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t))
                    for n, t in zip(cols, types, strict=True)
                ),
            )
        )
        col_list = sql.SQL(", ").join(sql.Identifier(n) for n in cols)
        copy_sql = sql.SQL("COPY {} ({}, _dblog_op, _dblog_unchanged) FROM STDIN").format(
            stage, col_list
        )
        any_unchanged = False
        with conn.cursor().copy(copy_sql) as copy:
            for i in idx:
                row = ch.rows[i]
                unch = ch.unchanged[i] or None
                any_unchanged = any_unchanged or unch is not None
                copy.write_row(
                    [
                        *(_copy_value(row.get(n), t) for n, t in zip(cols, types, strict=True)),
                        ch.ops[i],
                        unch,
                    ]
                )
        tschema, tname = self.target(ch.schema, ch.table)
        if self._keyless.get(f"{tschema}.{tname}", null_safe_key(schema)):
            # The target has no primary key (created for a whole-row identity that may
            # hold NULLs): match null-safely, whatever a later schema says of the key.
            _apply_null_safe(conn, target, stage, cols, key)
            return
        match = sql.SQL(" AND ").join(
            sql.SQL("t.{k} = s.{k}").format(k=sql.Identifier(k)) for k in key
        )
        conn.execute(
            sql.SQL("DELETE FROM {} t USING {} s WHERE {} AND s._dblog_op = {}").format(
                target, stage, match, sql.Literal(DELETE)
            )
        )
        non_key = [n for n in cols if n not in key]
        set_excluded = sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(n)) for n in non_key
        )
        conflict = (
            sql.SQL("DO UPDATE SET {}").format(set_excluded) if non_key else sql.SQL("DO NOTHING")
        )
        key_list = sql.SQL(", ").join(sql.Identifier(k) for k in key)
        where_full = sql.SQL("s._dblog_op = 'u'")
        if any_unchanged and non_key:
            set_keep = sql.SQL(", ").join(
                sql.SQL(
                    "{c} = CASE WHEN {name} = ANY(s._dblog_unchanged) THEN t.{c} ELSE s.{c} END"
                ).format(c=sql.Identifier(n), name=sql.Literal(n))
                for n in non_key
            )
            conn.execute(
                sql.SQL(
                    "UPDATE {} t SET {} FROM {} s WHERE {} AND s._dblog_op = 'u' "
                    "AND s._dblog_unchanged IS NOT NULL"
                ).format(target, set_keep, stage, match)
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} ({}) SELECT {} FROM {} s WHERE s._dblog_op = 'u' "
                    "AND s._dblog_unchanged IS NOT NULL ON CONFLICT ({}) DO NOTHING"
                ).format(target, col_list, col_list, stage, key_list)
            )
            where_full = sql.SQL("s._dblog_op = 'u' AND s._dblog_unchanged IS NULL")
        conn.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} s WHERE {} ON CONFLICT ({}) {}").format(
                target, col_list, col_list, stage, where_full, key_list, conflict
            )
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def _apply_null_safe(
    conn: psycopg.Connection[Any],
    target: sql.Identifier,
    stage: sql.Identifier,
    cols: list[str],
    key: list[str],
) -> None:
    """Apply a staged batch to a table without primary key (its identity may hold NULLs):
    rows match when their identity columns' record texts are equal, ``ROW(t.k…)::text =
    ROW(s.k…)::text``: null-safe (a NULL field prints empty, an empty string as ``""``),
    defined for every type (json has no ``=``), and a plain text equality that PostgreSQL
    can hash-join (``IS NOT DISTINCT FROM`` would be a nested loop over the table).
    Deletes remove every matching row; upserts update the matching rows, else insert one,
    so a NULL never stops the sync and no stale duplicate is left. (Unchanged-TOAST
    columns do not occur: such a table has ``REPLICA IDENTITY FULL``, whose events carry
    every value.)"""

    def record(alias: str) -> sql.Composable:
        return sql.SQL("ROW({})::text").format(
            sql.SQL(", ").join(sql.SQL(alias + ".{}").format(sql.Identifier(k)) for k in key)
        )

    match = sql.SQL("{} = {}").format(record("t"), record("s"))
    conn.execute(
        sql.SQL("DELETE FROM {} t USING {} s WHERE {} AND s._dblog_op = {}").format(
            target, stage, match, sql.Literal(DELETE)
        )
    )
    non_key = [n for n in cols if n not in key]
    if non_key:
        conn.execute(
            sql.SQL("UPDATE {} t SET {} FROM {} s WHERE {} AND s._dblog_op = 'u'").format(
                target,
                sql.SQL(", ").join(
                    sql.SQL("{c} = s.{c}").format(c=sql.Identifier(n)) for n in non_key
                ),
                stage,
                match,
            )
        )
    col_list = sql.SQL(", ").join(sql.Identifier(n) for n in cols)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} ({}) SELECT {} FROM {} s WHERE s._dblog_op = 'u' "
            "AND NOT EXISTS (SELECT 1 FROM {} t WHERE {})"
        ).format(target, col_list, col_list, stage, target, match)
    )
