"""Row events to change events, for one binlog stream.

Invariants:
- a rows event of a table outside the source's database, or not captured and not one of
  pydblog's own tables, yields nothing;
- a captured table's ``SchemaChanged`` (its columns as the TABLE_MAP describes them) is
  yielded before its first row after each change of them;
- each row gets the open transaction's next index (``OpenTx.count``); an update that
  changes the row's key is a delete of the old key then a create of the new one (two
  indexes); the key of a table without a primary key is the whole row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pymysqlreplication.row_event import DeleteRowsEvent, WriteRowsEvent

from pydblog.config import TableMatcher
from pydblog.events import ChangeEvent, Op, RowRun
from pydblog.ports import ColumnSchema, SchemaChanged, TableSchema
from pydblog.sources.mysql import native
from pydblog.sources.mysql import schema as schema_mod
from pydblog.sources.mysql.position import OpenTx
from pydblog.sources.mysql.rawrows import RawRows
from pydblog.sources.mysql.setup import OwnTables
from pydblog.sources.mysql.types import BinlogRowMapper, binlog_column_type

_KIND_OPS = (Op.CREATE, Op.UPDATE, Op.DELETE)
"""The op of a ``RawRows.kind``."""


@dataclass(slots=True)
class _Mapper:
    table: Any  # the library's Table of the TABLE_MAP this mapper was built for
    rows: BinlogRowMapper
    key: tuple[str, ...]
    kind: str  # "captured" | "own" | "skip"
    label: tuple[str, str]  # (schema, table) put on the events
    table_schema: TableSchema | None
    native: Any  # the table's compiled native plan, or None (decoded in Python)
    key_at: tuple[int, ...]  # the key columns' indexes in the TABLE_MAP


class RowEvents:
    """Decodes the rows events of one stream (module docstring). ``cursor`` gives a
    cursor on the control connection, held alone (for JSON columns on MariaDB)."""

    def __init__(
        self,
        db: str,
        own: OwnTables,
        matcher: TableMatcher,
        mariadb: bool,
        cursor: Callable[[], AbstractContextManager[Any]],
    ) -> None:
        self.db = db
        self.own = own
        self.matcher = matcher
        self.mariadb = mariadb
        self.cursor = cursor
        self.mappers: dict[int, _Mapper] = {}
        self.json_cols: dict[tuple[str, str], frozenset[str]] = {}
        self.nullable: dict[int, bytes] = {}
        self.map_bodies: dict[int, bytes] = {}  # the last TABLE_MAP body the library read
        self.schemas: dict[tuple[str, str], TableSchema] = {}  # as last yielded
        # At most this many rows per ``RowRun`` (0: no runs, one event per row; the
        # capture's runner sets it, ``ports.RunBatching``).
        self.run_rows = 0

    def captured(self, db: str, table: str) -> bool:
        qualified = f"{db}.{table}"
        return db == self.db and qualified not in self.own.qualified and self.matcher(qualified)

    def tracked(self, db: str, table: str) -> bool:
        """Tables whose rows this source decodes: the captured ones and its own."""
        return self.captured(db, table) or (db, table) in (self.own.signal, self.own.watermark)

    def table_map(self, event: Any) -> None:
        nulls = bytes(event.null_bitmask)
        if self.nullable.get(event.table_id) != nulls:
            self.mappers.pop(event.table_id, None)
        self.nullable[event.table_id] = nulls

    def adopt(self, table_id: int, table: Any) -> None:
        """A TABLE_MAP's ``table`` (columns named): the mapper of the last TABLE_MAP of
        ``table_id`` is kept for it where that one describes the same table (names,
        types, metadata, key and nullability: every input of ``_mapper``), as each
        transaction's TABLE_MAP of an unchanged table does."""
        mapper = self.mappers.get(table_id)
        if mapper is not None and mapper.table is not table and mapper.table == table:
            mapper.table = table

    def map_read(self, table_id: int, body: bytes | None) -> None:
        """The library read a TABLE_MAP of ``table_id`` whose body is ``body`` (None:
        not known)."""
        if body is None:
            self.map_bodies.pop(table_id, None)
        else:
            self.map_bodies[table_id] = body

    def same_map(self, table_id: int, body: bytes, table_map: dict[int, Any]) -> bool:
        """Whether a TABLE_MAP of ``table_id`` with ``body`` can go unread: the library
        read one with the same body last (``map_read``), built the Table it still holds
        from it, and the table's mapper is for that Table."""
        mapper = self.mappers.get(table_id)
        return (mapper is not None and self.map_bodies.get(table_id) == body
                and mapper.table is table_map.get(table_id))

    def forget(self, db: str, table: str) -> None:
        """A DDL on ``db.table``: its columns are read again."""
        self.json_cols.pop((db, table), None)
        for table_id, mapper in list(self.mappers.items()):
            if (mapper.table.schema, mapper.table.table) == (db, table):
                del self.mappers[table_id]

    def rows(self, event: Any, begin: Callable[[int], OpenTx]) -> Iterator[Any]:
        """The items of one rows event; ``begin(ts_ms)``: the open transaction (opened
        if none is)."""
        if event.table_id not in event.table_map:
            return
        mapper = self._mapper(event)
        if mapper.kind == "skip":
            return
        found = None
        if self.run_rows and mapper.kind == "captured" and mapper.native is not None:
            found = native.tails(event, mapper.native, mapper.rows, mapper.key_at)
        if found is None:
            found = self._images(event, mapper)
        op = (Op.CREATE if isinstance(event, WriteRowsEvent)
              else Op.DELETE if isinstance(event, DeleteRowsEvent) else Op.UPDATE)
        yield from self._items(mapper, op, event.timestamp * 1000, begin, found)

    def known(self, table_id: int, table_map: dict[int, Any]) -> bool:
        """Whether ``raw`` can take a rows event of ``table_id`` (``table_map``: the
        library's): a table seen since its last TABLE_MAP, skipped or encoded natively
        into runs."""
        mapper = self.mappers.get(table_id)
        if mapper is None or mapper.table is not table_map.get(table_id):
            return False
        return mapper.kind == "skip" or (
            mapper.kind == "captured" and mapper.native is not None and self.run_rows > 0)

    def raw(self, event: RawRows, begin: Callable[[int], OpenTx]) -> Iterator[Any]:
        """``rows`` for a rows event ``rawrows.parse`` read, of a table ``known`` takes."""
        mapper = self.mappers[event.table_id]
        if mapper.kind == "skip":
            return
        found = native.raw_tails(event, mapper.native, mapper.rows, mapper.key_at, mapper.table)
        yield from self._items(mapper, _KIND_OPS[event.kind], event.timestamp * 1000, begin,
                               found)

    def _items(self, mapper: _Mapper, op: Op, ts_ms: int, begin: Callable[[int], OpenTx],
               found: tuple[int, str] | list[Any]) -> Iterator[Any]:
        """A rows event's items from its decoded rows: ``found``, change-log tails
        ``(count, text)`` or row images (one per row, a (before, after) pair per row of
        an update)."""
        ts = mapper.table_schema
        if ts is not None and self.schemas.get(mapper.label) != ts:
            self.schemas[mapper.label] = ts
            yield SchemaChanged(ts)
        tx = begin(ts_ms)
        (db, name), key = mapper.label, mapper.key
        if isinstance(found, tuple):
            yield from self._runs(db, name, tx, ts_ms, found[0], found[1], op)
            return
        if op is Op.CREATE:
            for after in found:
                yield ChangeEvent(
                    Op.CREATE, db, name, tx.position(tx.count), ts_ms,
                    {k: after[k] for k in key} if key else None, None, after,
                )
                tx.count += 1
        elif op is Op.DELETE:
            for before in found:
                yield ChangeEvent(
                    Op.DELETE, db, name, tx.position(tx.count), ts_ms,
                    {k: before[k] for k in key} if key else None, before, None,
                )
                tx.count += 1
        else:
            for before, after in found:
                new_key = {k: after[k] for k in key} if key else None
                old_key = {k: before[k] for k in key} if key else None
                if old_key != new_key:
                    # A key change is a delete of the old key and a create of the new one.
                    yield ChangeEvent(
                        Op.DELETE, db, name, tx.position(tx.count), ts_ms, old_key, before, None
                    )
                    tx.count += 1
                    yield ChangeEvent(
                        Op.CREATE, db, name, tx.position(tx.count), ts_ms, new_key, None, after
                    )
                else:
                    yield ChangeEvent(
                        Op.UPDATE, db, name, tx.position(tx.count), ts_ms, new_key, before, after
                    )
                tx.count += 1

    def _runs(self, db: str, name: str, tx: OpenTx, ts_ms: int, count: int,
              text: str, op: Op) -> Iterator[RowRun]:
        """``count`` encoded ``op`` events as runs of at most ``run_rows``, at the open
        transaction's next indexes."""
        size = self.run_rows
        if count <= size:
            if count:
                yield RowRun(db, name, tx.position(tx.count), ts_ms, count, text, op)
                tx.count += count
            return
        lines = text.split("\n")
        for i in range(0, count, size):
            part = lines[i:i + size]
            yield RowRun(db, name, tx.position(tx.count), ts_ms, len(part), "\n".join(part), op)
            tx.count += len(part)

    @staticmethod
    def _images(event: Any, mapper: _Mapper) -> list[Any]:
        """The event's row images mapped to pydblog's values: one per row, a (before,
        after) pair per row of an update; natively where the table has a plan."""
        if mapper.native is not None:
            found = native.rows(event, mapper.native, mapper.rows)
            if found is not None:
                return found
        return mapper.rows.map_rows(event.rows,
                                    not isinstance(event, WriteRowsEvent | DeleteRowsEvent))

    def _mapper(self, event: Any) -> _Mapper:
        table = event.table_map[event.table_id]
        cached = self.mappers.get(event.table_id)
        if cached is not None and cached.table is table:
            return cached
        db, name = event.schema, event.table
        label = (db, name)
        if db != self.db:
            kind = "skip"
        elif (db, name) == self.own.signal:
            kind, label = "own", self.own.signal_label
        elif (db, name) == self.own.watermark:
            kind, label = "own", self.own.watermark_label
        else:
            kind = "captured" if self.matcher(f"{db}.{name}") else "skip"
        json_cols: frozenset[str] = frozenset()
        if kind != "skip" and self.mariadb:
            json_cols = self._json_columns(db, name)
        pk = table.primary_key
        key = (pk,) if isinstance(pk, str) and pk else tuple(pk or ())
        if not key:  # the row identity without a primary key: every column (TableInfo)
            key = tuple(c.name for c in table.columns if c.name is not None)
        ts = None
        if kind == "captured":
            ts = self._binlog_schema(event.table_id, db, name, table.columns, json_cols, key)
        compiled = native.plan(table.columns, json_cols) if kind != "skip" else None
        names = [c.name for c in table.columns]
        key_at = tuple(names.index(k) for k in key) if all(k in names for k in key) else ()
        if compiled is not None and len(key_at) != len(key):
            compiled = None  # (a key the TABLE_MAP does not name: decoded in Python)
        mapper = _Mapper(
            table, BinlogRowMapper.build(table.columns, json_cols), key, kind, label, ts,
            compiled, key_at,
        )
        self.mappers[event.table_id] = mapper
        return mapper

    def _binlog_schema(
        self, table_id: int, db: str, name: str, columns: list[Any],
        json_cols: frozenset[str], key: tuple[str, ...],
    ) -> TableSchema:
        nulls = self.nullable.get(table_id, b"")
        cols = []
        for i, col in enumerate(columns):
            sql_type, logical = binlog_column_type(col, col.name in json_cols)
            nullable = bool(nulls[i // 8] & (1 << (i % 8))) if i // 8 < len(nulls) else True
            cols.append(ColumnSchema(col.name, sql_type, logical, nullable))
        return TableSchema(db, name, tuple(cols), key)

    def _json_columns(self, db: str, table: str) -> frozenset[str]:
        found = self.json_cols.get((db, table))
        if found is None:
            with self.cursor() as cur:
                found = schema_mod.json_columns(cur, db, table, self.mariadb)
            self.json_cols[(db, table)] = found
        return found
