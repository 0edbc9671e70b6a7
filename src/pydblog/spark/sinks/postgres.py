"""A downstream PostgreSQL database: one table per source table, same name, in the
configured schema (or, when none is configured, the source table's own schema), created
on first sight (columns with the source SQL types, the
source key as primary key); added source columns are added with ALTER TABLE.

Exactly once, through the progress table ``<schema>.dblog_sync_progress`` in the
target: one row per step ``(part, nparts)`` holding ``applied_end``, one past the last
change-log offset that step has applied (and the Spark batch id that did it). A batch
``[start, end)`` (see ``batch.Batch``) is applied in steps, each in one transaction that
also moves its progress row to ``end``:

1. ``part = -1``: create/alter tables, TRUNCATE the tables the batch truncates, delete
   the target ranges of the batch's repair markers (``spark.repairs``);
2. ``part = 0..n-1`` (``n`` = parallelism; one Spark task each, in parallel): the
   upserts and deletes of the keys whose hash falls in the partition (a key a marker
   drops is deleted); a partition with no event in the batch just moves its row.

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
from contextlib import contextmanager
from typing import Any

import orjson
import psycopg
from psycopg import sql

from pydblog.config import redact_dsn
from pydblog.errors import SinkError
from pydblog.ports import ColumnSchema, TableSchema
from pydblog.spark.batch import Batch
from pydblog.spark.plan import SparkBatch
from pydblog.spark.reduce import DELETE, TableChanges
from pydblog.spark.repairs import TablePurge, pg_purge, spark_purges
from pydblog.spark.sinks.widen import widens
from pydblog.spark.typemap import null_safe_key

PROGRESS_TABLE = "dblog_sync_progress"
WATERMARKS_TABLE = "_dblog_watermarks"
DEFAULT_SOURCE = "default"


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
    def __init__(self, dsn: str, schema: str | None = None, parallelism: int = 2,
                 source: str = DEFAULT_SOURCE) -> None:
        self.dsn = dsn
        # the source whose batch is being applied: the progress rows' ``source``
        self.source = source
        self._migrated = False
        self.target_schema = schema
        self.schema = schema or "public"  # where the progress table lives
        self.parts = parallelism
        self.name = f"postgres:{redact_dsn(dsn)}" + (f" schema {schema}" if schema else "")
        self._targets: dict[tuple[str, str], str] = {}
        self._conns: dict[int, psycopg.Connection[Any]] = {}
        self._columns: dict[str, dict[str, str]] = {}  # table -> column -> type ensured
        # target -> True when it has no primary key: rows are matched null-safely
        self._keyless: dict[str, bool] = {}
        self._lock = threading.Lock()

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
            sql.SQL("SELECT applied_end FROM {} WHERE source = %s AND part = %s AND nparts = %s "
                    "FOR UPDATE").format(sql.Identifier(self.schema, PROGRESS_TABLE)),
            (self.source, part, self.parts),
        ).fetchone()
        return None if row is None else int(row[0])

    def _record(self, conn: psycopg.Connection[Any], batch: Batch | SparkBatch, part: int) -> None:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (source, part, nparts, applied_end, batch_id) "
                "VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (source, part, nparts) DO UPDATE SET applied_end = "
                "EXCLUDED.applied_end, batch_id = EXCLUDED.batch_id, applied_at = now()"
            ).format(sql.Identifier(self.schema, PROGRESS_TABLE)),
            (self.source, part, self.parts, batch.end, batch.batch_id),
        )

    # -- apply -------------------------------------------------------------------------
    def apply(self, batch: SparkBatch) -> None:
        """The DDL/truncate step here in the driver; the key partitions in Spark tasks
        (``pg_parts_fn``), each part in one transaction with its progress row."""
        self.source = batch.source
        if not batch.tables and not batch.markers:
            self.write_watermarks(batch.watermarks, batch.source, batch.end, batch.cut_ms)
            return
        schemas = {q: batch.schema_for(q) for q in batch.tables}
        try:
            self._prepare(batch, schemas)
        except psycopg.Error as exc:
            raise SinkError(str(exc)) from exc
        events = batch.row_events({}, self.parts)
        fn = pg_parts_fn(self.dsn, self.target_schema, self.parts, batch.batch_id, batch.start,
                         batch.end, schemas, dict(self._keyless), batch.markers, batch.source)
        rows = (events.repartition(self.parts, "part").mapInArrow(fn, "part int, error string")
                .collect())
        errors = [r["error"] for r in rows if r["error"]]
        if errors:
            raise SinkError(errors[0])
        # A partition without an event in the batch has nothing to apply: its progress
        # row moves to the batch's end here (the least applied_end is where the mirror
        # stands, e.g. for verify waiting on a repair's marker).
        seen = {int(r["part"]) for r in rows}
        try:
            for part in range(self.parts):
                if part in seen:
                    continue
                with self._tx(0) as conn:
                    done = self._applied(conn, part)
                    if done is None or done < batch.end:
                        self._record(conn, batch, part)
        except psycopg.Error as exc:
            raise SinkError(str(exc)) from exc
        self.write_watermarks(batch.watermarks, batch.source, batch.end, batch.cut_ms)

    def _ensure_progress(self, conn: psycopg.Connection[Any]) -> None:
        """The progress table, keyed by ``(source, part, nparts)``; a table of the
        single-source form (no ``source``) gets the column, its rows ``DEFAULT_SOURCE``'s."""
        table = sql.Identifier(self.schema, PROGRESS_TABLE)
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (source text NOT NULL DEFAULT {}, "
                "part int NOT NULL, nparts int NOT NULL, "
                "applied_end bigint NOT NULL, batch_id bigint NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now(), "
                "PRIMARY KEY (source, part, nparts))"
            ).format(table, sql.Literal(DEFAULT_SOURCE))
        )
        if self._migrated:
            return
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS source text NOT NULL "
                             "DEFAULT {}").format(table, sql.Literal(DEFAULT_SOURCE)))
        pk = conn.execute(
            "SELECT c.conname, array_agg(a.attname::text ORDER BY a.attname) "
            "FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid "
            "AND a.attnum = ANY(c.conkey) WHERE c.conrelid = to_regclass(%s) AND c.contype = 'p' "
            "GROUP BY c.conname",
            (table.as_string(conn),)).fetchone()
        if pk is not None and "source" not in pk[1]:
            conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}, ADD PRIMARY KEY "
                                 "(source, part, nparts)").format(table, sql.Identifier(pk[0])))
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (source text PRIMARY KEY, progress_ms bigint, "
            "low_ms bigint, applied_end bigint, updated_at timestamptz NOT NULL DEFAULT now(), "
            "cut_ms bigint)"
        ).format(sql.Identifier(self.schema, WATERMARKS_TABLE)))
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS cut_ms bigint").format(
            sql.Identifier(self.schema, WATERMARKS_TABLE)))
        self._migrated = True

    def write_watermarks(self, marks: dict[str, int | None], source: str, end: int | None,
                         cut: int | None = None) -> None:
        """Each source's progress time, the merge's low watermark and (``consistent =
        true``) the last complete cut into ``_dblog_watermarks`` (one row per source),
        after the batch's data committed: the table never claims more than the targets
        hold. Times never move back."""
        if not marks:
            return
        low = None if any(v is None for v in marks.values()) else min(
            v for v in marks.values() if v is not None)
        try:
            with self._tx(0) as conn:
                self._ensure_progress(conn)
                t = sql.Identifier(self.schema, WATERMARKS_TABLE)
                conn.execute(sql.SQL("DELETE FROM {} WHERE NOT (source = ANY(%s))").format(t),
                             (list(marks),))
                for name, ms in sorted(marks.items()):
                    conn.execute(sql.SQL(
                        "INSERT INTO {t} (source, progress_ms, low_ms, applied_end, cut_ms) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (source) DO UPDATE SET "
                        "progress_ms = GREATEST({t}.progress_ms, EXCLUDED.progress_ms), "
                        "low_ms = GREATEST({t}.low_ms, EXCLUDED.low_ms), "
                        "cut_ms = GREATEST({t}.cut_ms, EXCLUDED.cut_ms), "
                        "applied_end = COALESCE(EXCLUDED.applied_end, {t}.applied_end), "
                        "updated_at = now()").format(t=t),
                        (name, ms, low, end if name == source else None, cut))
        except psycopg.Error as exc:
            raise SinkError(f"{WATERMARKS_TABLE}: {exc}") from exc

    def _prepare(self, batch: SparkBatch, schemas: dict[str, TableSchema]) -> None:
        with self._tx(0) as conn:
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            )
            self._ensure_progress(conn)
            done = self._applied(conn, -1)
            for q, ts in sorted(batch.tables.items()):
                label = self._label_of(ts.schema, ts.table)
                try:
                    # Tables are ensured whatever the step did (the column knowledge the
                    # partitions need); only the truncates are the step's own work.
                    if schemas[q].columns:
                        self._ensure_table(conn, schemas[q])
                    if done is not None and done >= batch.end:
                        continue
                    if ts.truncate is not None and ts.truncate >= (done or -1):
                        target = sql.Identifier(*self.target(ts.schema, ts.table))
                        if _exists(conn, target):  # (a table never created: nothing to empty)
                            conn.execute(sql.SQL("TRUNCATE {}").format(target))
                except psycopg.Error as exc:
                    raise SinkError(f"table {label}: {exc}") from exc
            if done is None or done < batch.end:
                # a merged target's truncate of one part: only that part's rows
                for q, cuts in sorted(batch.scoped_truncates({}).items()):
                    schema_name, _, table = q.partition(".")
                    ident = sql.Identifier(*self.target(schema_name, table))
                    if not _exists(conn, ident):
                        continue  # no target yet: nothing of the part to delete
                    for offset, scope in cuts:
                        if offset < (done or -1):
                            continue
                        try:
                            conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(
                                ident, sql.SQL(" AND ").join(
                                    sql.SQL("{} = %s").format(sql.Identifier(c)) for c in scope)),
                                list(scope.values()))
                        except psycopg.Error as exc:
                            raise SinkError(f"truncate of a part of table {q}: {exc}") from exc
            if done is None or done < batch.end:
                # repairs (spark/repairs.py): the target deletes of the batch's markers, here
                # before the partitions, which turn the net change of the keys a marker
                # drops into deletes (pg_parts_fn gives each partition the markers)
                for q, purge in sorted(spark_purges(batch, {}, done or -1).items()):
                    schema_name, _, table = q.partition(".")
                    try:
                        pg_purge(conn, *self.target(schema_name, table),
                                 TablePurge(purge.key, purge.deletes), _copy_value)
                    except psycopg.Error as exc:
                        raise SinkError(f"repair of table {q}: {exc}") from exc
                self._record(conn, batch, -1)

    def _label_of(self, schema: str, table: str) -> str:
        tschema, tname = self.target(schema, table)
        target = f"{tschema}.{tname}"
        return target if target == f"{schema}.{table}" else f"{target} (from {schema}.{table})"

    def _ensure_table(self, conn: psycopg.Connection[Any], schema: TableSchema) -> None:
        tschema, tname = self.target(schema.schema, schema.table)
        ident = sql.Identifier(tschema, tname)
        have = self._columns.get(f"{tschema}.{tname}")
        if have is not None and all(have.get(c.name) == target_type(c) for c in schema.columns):
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
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            (ident.as_string(conn),),
        ).fetchall()
        have = {str(r[0]): str(r[1]) for r in rows}
        pk = conn.execute(
            "SELECT 1 FROM pg_index WHERE indrelid = to_regclass(%s) AND indisprimary",
            (sql.Identifier(tschema, tname).as_string(conn),),
        ).fetchone()
        self._keyless[f"{tschema}.{tname}"] = pk is None
        for c in schema.columns:
            want = target_type(c)
            if c.name not in have:
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                        ident, sql.Identifier(c.name), sql.SQL(want)
                    )
                )
            elif widens(have[c.name], want):
                conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(
                    ident, sql.Identifier(c.name), sql.SQL(want)))
            have[c.name] = want
        self._columns[f"{tschema}.{tname}"] = have

    def _apply_part(
        self,
        batch: Batch | SparkBatch,
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
                assert isinstance(batch, Batch)
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
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def pg_parts_fn(
    dsn: str,
    target_schema: str | None,
    parts: int,
    batch_id: int,
    start: int,
    end: int,
    schemas: dict[str, TableSchema],
    keyless: dict[str, bool],
    markers: list[tuple[int, str, str, str]] | None = None,
    source: str = DEFAULT_SOURCE,
) -> Any:
    """``mapInArrow`` over row events shuffled by their ``part`` column: each key
    partition present in the task applied in one transaction with its progress row
    (``PostgresSink._apply_part``); one ``(part, error)`` row per part. Every part also
    reads the batch's repair ``markers`` (offset, schema, table, after): the net change
    of a key a marker drops is a delete (``batch.Batch.changes``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not tables:
            return
        ev = pa.concat_tables(tables)
        sink = PostgresSink(dsn, target_schema, parts, source)
        sink._keyless = dict(keyless)
        out_parts: list[int] = []
        out_errors: list[str | None] = []
        try:
            for part in sorted(pc.unique(ev["part"]).to_pylist()):
                mine = ev.filter(pc.equal(ev["part"], part)).drop_columns(["part"])
                if markers:
                    notes = pa.Table.from_pylist(
                        [{"offset": o, "op": "n", "schema": s, "table": t, "after": a}
                         for o, s, t, a in markers], schema=mine.schema)
                    mine = pa.concat_tables([mine, notes])
                batch = Batch(batch_id, start, end, mine, dict(schemas))
                err: str | None = None
                try:
                    changes = batch.changes()
                    sink._apply_part(batch, part, changes,
                                     {q: batch.schema_for(c) for q, c in changes.items()})
                except SinkError as exc:
                    err = exc.message
                except psycopg.Error as exc:
                    err = f"partition {part}: {exc}"
                out_parts.append(part)
                out_errors.append(err)
        finally:
            sink.close()
        yield pa.RecordBatch.from_pydict(
            {"part": out_parts, "error": out_errors},
            schema=pa.schema([("part", pa.int32()), ("error", pa.string())]))

    return run


def _exists(conn: psycopg.Connection[Any], table: sql.Identifier) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table.as_string(conn),)).fetchone()
    return bool(row and row[0])


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
