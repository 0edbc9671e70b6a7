"""Delta Lake mirror tables through delta-rs: ``<root>/<schema>/<table>``, one per
source table, holding the source table's current content.

Exactly once: every data commit to a table carries the application transaction
``(APP_ID, end)`` where ``end`` is one past the batch's last offset, in the same atomic
Delta commit as the rows. Before applying, the sink reads the table's transaction
version ``w``: events below ``w`` are already in the table, so a batch with
``end <= w`` is skipped and only events ``>= w`` are reduced and applied (a batch that
straddles ``w`` only happens after the Spark checkpoint was reset). A crash before the
commit leaves nothing behind; a crash after it makes the replay a no-op.

One commit per table and batch: a MERGE (upserts and deletes of the reduced batch), or,
when the batch truncates the table, an overwrite with the rows after the truncate.
Table creation and added columns are separate, idempotent commits before it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field, Transaction, write_deltalake
from deltalake.exceptions import DeltaError

from pydblog.errors import SinkError
from pydblog.ports import TableSchema
from pydblog.spark.batch import Batch
from pydblog.spark.reduce import DELETE, TableChanges
from pydblog.spark.repairs import with_target_deletes
from pydblog.spark.typemap import arrow_schema, texts_to_arrow

APP_ID = "pydblog-sync"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def open_table(path: str) -> DeltaTable | None:
    if not DeltaTable.is_deltatable(path):
        return None
    return DeltaTable(path)


def ensure_table(path: str, schema: pa.Schema) -> DeltaTable:
    """The table at ``path``, created with ``schema`` or evolved to hold its columns."""
    dt = open_table(path)
    if dt is None:
        Path(path).mkdir(parents=True, exist_ok=True)
        return DeltaTable.create(path, schema, mode="ignore")
    have = set(dt.schema().to_arrow().names)
    missing = [f for f in schema if f.name not in have]
    if missing:
        dt.alter.add_columns([Field(f.name, _delta_type(f.type), nullable=True) for f in missing])
        dt = DeltaTable(path)
    return dt


def _delta_type(typ: pa.DataType) -> Any:
    from deltalake import Schema

    return Schema.from_arrow(pa.schema([pa.field("x", typ)])).fields[0].type


def _source(changes: TableChanges, schema: TableSchema, target: pa.Schema) -> pa.Table:
    """The MERGE source: the table's columns (typed as in the target) plus ``_dblog_op``
    and, when some row keeps target values, ``_dblog_unchanged``."""
    typed = arrow_schema(schema)
    fields = [target.field(n) if n in target.names else typed.field(n) for n in typed.names]
    any_json = [
        c.name
        for c in schema.columns
        if c.logical.lower() == "json" or c.logical.lower().startswith("array")
    ]
    data = texts_to_arrow(
        changes.qualified, changes.texts, pa.schema(fields), lambda: changes.rows, any_json
    )
    data = data.append_column("_dblog_op", pa.array(changes.ops, type=pa.string()))
    if changes.has_unchanged():
        data = data.append_column(
            "_dblog_unchanged", pa.array(changes.unchanged, type=pa.list_(pa.string()))
        )
    return data


class DeltaSink:
    """Mirror tables under ``root``. The tables of a batch are applied by up to
    ``parallelism`` threads (each table is its own Delta table with its own application
    transaction, so their commits are independent; delta-rs runs a MERGE without the
    GIL). ``apply`` returns or raises only after every table's apply ended, so a retry
    never overlaps a running commit."""

    def __init__(self, root: str, parallelism: int = 2) -> None:
        self.root = root
        self.name = f"delta:{root}"
        self._pool = (
            ThreadPoolExecutor(parallelism, thread_name_prefix="dblog-delta")
            if parallelism > 1
            else None
        )

    def table_path(self, schema: str, table: str) -> str:
        return os.path.join(self.root, schema, table)

    def apply(self, batch: Batch) -> None:
        tables = sorted(set(batch.changes()) | set(batch.purges()))
        if self._pool is None or len(tables) < 2:
            for q in tables:
                self._apply_table(batch, q)
            return
        futures = [self._pool.submit(self._apply_table, batch, q) for q in tables]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            raise errors[0]

    def _apply_table(self, batch: Batch, qualified: str) -> None:
        schema_name, _, table = qualified.partition(".")
        path = self.table_path(schema_name, table)
        try:
            dt = open_table(path)
            done = dt.transaction_version(APP_ID) if dt is not None else None
            if done is not None and done >= batch.end:
                return
            changes = batch.changes(done).get(qualified)
            purge = batch.purges(done).get(qualified)  # repairs: spark/repairs.py
            if changes is None and (purge is None or dt is None):
                return
            if changes is None:
                changes = TableChanges(schema_name, table)
            schema = batch.schema_for(changes)
            if purge is not None and dt is not None:
                present = dt.to_pyarrow_table(columns=purge.key).to_pylist()
                changes = with_target_deletes(changes, purge, schema, present, batch.end - 1)
            if dt is None and not changes.ops and not schema.columns:
                # Only a truncate of a table with no schema and no target (dropped before
                # any row was logged): nothing to empty, nothing to create.
                return
            dt = ensure_table(path, arrow_schema(schema))
            txn = CommitProperties(app_transactions=[Transaction(APP_ID, batch.end)])
            target = dt.schema().to_arrow()
            if not isinstance(target, pa.Schema):
                target = pa.schema(target)
            source = _source(changes, schema, target)
            if source.num_rows == 0 and not changes.truncated:
                # A repair's marker with nothing to delete: record the batch (an empty
                # MERGE would commit nothing, and the table's version would not say it).
                write_deltalake(dt, target.empty_table(), mode="append", commit_properties=txn)
                return
            if changes.truncated:
                self._overwrite(dt, source, target, txn)
            else:
                self._merge(dt, source, schema, txn)
        except SinkError as exc:
            raise SinkError(f"table {qualified}: {exc.message}", hint=exc.hint) from exc
        except (DeltaError, OSError, pa.ArrowException, ValueError) as exc:
            raise SinkError(f"table {qualified} ({path}): {exc}") from exc

    @staticmethod
    def _overwrite(
        dt: DeltaTable, source: pa.Table, target: pa.Schema, txn: CommitProperties
    ) -> None:
        rows = source.filter(pa.compute.not_equal(source["_dblog_op"], DELETE))
        cols = []
        for f in target:
            if f.name in rows.column_names:
                cols.append(rows[f.name].cast(f.type))
            else:
                cols.append(pa.nulls(rows.num_rows, type=f.type))
        data = pa.Table.from_arrays(cols, schema=target)
        write_deltalake(dt, data, mode="overwrite", commit_properties=txn)

    @staticmethod
    def _merge(
        dt: DeltaTable, source: pa.Table, schema: TableSchema, txn: CommitProperties
    ) -> None:
        key = schema.key or tuple(c.name for c in schema.columns)
        nullable = {c.name for c in schema.columns if c.nullable}
        # A key column that may hold NULL (a whole-row identity) matches null-safely.
        predicate = " AND ".join(
            f"(t.{quote(k)} IS NOT DISTINCT FROM s.{quote(k)})" if k in nullable or not schema.key
            else f"t.{quote(k)} = s.{quote(k)}"
            for k in key
        )
        names = [c.name for c in schema.columns]
        keep: set[str] = set()
        if "_dblog_unchanged" in source.column_names:
            for cols in source["_dblog_unchanged"].to_pylist():
                keep.update(cols or ())
        updates = {}
        for n in names:
            if n in keep:
                lit = "'" + n.replace("'", "''") + "'"
                updates[quote(n)] = (
                    f"CASE WHEN array_has(s._dblog_unchanged, {lit}) "
                    f"THEN t.{quote(n)} ELSE s.{quote(n)} END"
                )
            else:
                updates[quote(n)] = f"s.{quote(n)}"
        inserts = {quote(n): f"s.{quote(n)}" for n in names}
        (
            dt.merge(
                source,
                predicate,
                source_alias="s",
                target_alias="t",
                commit_properties=txn,
            )
            .when_matched_delete(predicate="s._dblog_op = 'd'")
            .when_matched_update(updates, predicate="s._dblog_op = 'u'")
            .when_not_matched_insert(inserts, predicate="s._dblog_op = 'u'")
            .execute()
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
