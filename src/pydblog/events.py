"""Change events and their Debezium-style envelope.

An event is immutable and carries values already mapped to JSON types (see
``docs/types.md``): the change log stores exactly what ``dblog tail`` prints.

Envelope (one JSON object; ``offset`` is added by the change log at append)::

    {"offset": 17, "op": "u", "ts_ms": ...,
     "source": {"connector", "db", "schema", "table", "lsn", "txId", "ts_ms", "snapshot"},
     "key": {...}, "before": {...} | null, "after": {...} | null}

Optional fields: ``unchanged`` (columns whose value was not sent by the source, an
unchanged TOAST value; their ``after`` value is the placeholder ``UNCHANGED_TOAST``
and consumers keep the value they have) and ``notification`` (``op: "n"`` events).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, NamedTuple

import orjson

from pydblog.positions import Position

Row = dict[str, Any]

UNCHANGED_TOAST = "__dblog_unchanged_toast__"
"""Placeholder value of a column the source did not send (see ``ChangeEvent.unchanged``)."""


class Op(StrEnum):
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"
    TRUNCATE = "t"
    NOTIFICATION = "n"


class SnapshotKind(StrEnum):
    NONE = "false"
    INCREMENTAL = "incremental"
    BLOCKING = "blocking"


class ChangeEvent(NamedTuple):
    """One change of one row (or one table, for truncate and notifications).

    ``position`` orders events within a source; ``ts_ms`` is the source commit time.
    Immutable. A ``NamedTuple`` rather than a frozen dataclass: one is built per
    captured row, and a frozen dataclass costs four times as much to construct.
    """

    op: Op
    schema: str
    table: str
    position: Position
    ts_ms: int
    key: Row | None = None
    before: Row | None = None
    after: Row | None = None
    snapshot: SnapshotKind = SnapshotKind.NONE
    unchanged: tuple[str, ...] = ()
    notification: Row | None = None

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}"

    def envelope(self, connector: str, db: str, now_ms: int | None = None) -> Row:
        """The envelope as a dict (enums are ``str`` subclasses, serialized as their
        values)."""
        source: Row = {
            "connector": connector,
            "db": db,
            "schema": self.schema,
            "table": self.table,
        }
        source.update(self.position.source_fields())
        source["ts_ms"] = self.ts_ms
        source["snapshot"] = self.snapshot
        env: Row = {
            "op": self.op,
            "ts_ms": now_ms if now_ms is not None else int(time.time() * 1000),
            "source": source,
            "key": self.key,
            "before": self.before,
            "after": self.after,
        }
        if self.unchanged:
            env["unchanged"] = list(self.unchanged)
        if self.notification is not None:
            env["notification"] = self.notification
        return env


class EncodedEvent(NamedTuple):
    """An event ready for the change log: the columns it is indexed by and its body
    (the JSON envelope; ``str`` from the encoder: orjson's ``bytes`` results keep a
    4 KiB allocation each, a ``str`` copy is right-sized)."""

    table: str
    op: str
    ts_ms: int
    body: str | bytes


def encode_event(event: ChangeEvent, connector: str, db: str, now_ms: int) -> EncodedEvent:
    return EncodedEvent(
        f"{event.schema}.{event.table}",
        event.op,
        event.ts_ms,
        orjson.dumps(event.envelope(connector, db, now_ms)).decode(),
    )


def with_offset(offset: int, body: bytes) -> bytes:
    """The envelope with ``offset`` as its first field (bodies are stored without it)."""
    return b'{"offset":%d,%s' % (offset, body[1:])


def decode_envelope(offset: int, body: bytes) -> Row:
    env: Row = orjson.loads(body)
    return {"offset": offset, **env}


# -- snapshot rows in bulk ---------------------------------------------------------------


class EncodedRow(NamedTuple):
    """A chunk row as a fast chunk reader delivers it, already encoded.

    ``chunk_key``: the raw values of the chunk's key columns, mapped exactly as the
    stream maps them (the window compares them with stream events' keys);
    ``key_json``: the event key (the table's identity columns) as a JSON object text;
    ``after_json``: the whole row as a JSON object text, byte for byte what
    ``orjson.dumps`` of the mapped row would give.
    """

    chunk_key: tuple[Any, ...]
    key_json: str
    after_json: str


ChunkRow = Row | EncodedRow
"""A chunk row: a dict of JSON values (generic readers) or an ``EncodedRow``."""


class SnapshotRows(NamedTuple):
    """Consecutive ``op: r`` events of one chunk, in key order.

    Row ``i`` is at ``base.with_index(first + i)``; every one shares ``ts_ms`` and
    ``kind``. The event key of a dict row is its ``identity`` columns (the chunk's
    ``key_columns`` when empty); an ``EncodedRow`` carries its own. Expanding with
    ``events()`` and encoding with ``encode_snapshot_rows`` give the same bodies.
    """

    schema: str
    table: str
    kind: SnapshotKind
    base: Position
    first: int
    ts_ms: int
    rows: Sequence[ChunkRow]
    key_columns: tuple[str, ...]
    identity: tuple[str, ...] = ()

    @property
    def last_position(self) -> Position:
        return self.base.with_index(self.first + len(self.rows) - 1)

    def events(self) -> list[ChangeEvent]:
        """One ``ChangeEvent`` per row (encoded rows are parsed back)."""
        ident = self.identity or self.key_columns
        out = []
        for i, row in enumerate(self.rows):
            if type(row) is EncodedRow:
                key, after = orjson.loads(row.key_json), orjson.loads(row.after_json)
            else:
                assert isinstance(row, dict)
                key, after = {c: row.get(c) for c in ident}, row
            out.append(
                ChangeEvent(Op.READ, self.schema, self.table, self.base.with_index(self.first + i),
                            self.ts_ms, key, None, after, self.kind)
            )
        return out


Emitted = ChangeEvent | SnapshotRows
"""What the snapshot core emits: single events, or a chunk's rows in bulk."""


def expand(items: Sequence[Emitted]) -> list[ChangeEvent]:
    """Emitted items as single events (tests, slow paths)."""
    out: list[ChangeEvent] = []
    for item in items:
        if type(item) is SnapshotRows:
            out.extend(item.events())
        else:
            assert isinstance(item, ChangeEvent)
            out.append(item)
    return out


def last_position(item: Emitted) -> Position:
    if isinstance(item, SnapshotRows):
        return item.last_position
    return item.position


_INDEX_SENTINEL = -7_306_185_142_913
_TAIL = ',"key":null,"before":null,"after":null}'


def encode_snapshot_rows(
    rows: SnapshotRows, connector: str, db: str, now_ms: int
) -> list[EncodedEvent]:
    """The change-log form of every row, as ``encode_event`` would give it for each of
    ``rows.events()``, built from one envelope template per chunk: the per-row work is
    a few string concatenations around the pre-encoded key and row."""
    if not rows.rows:
        return []
    probe = ChangeEvent(Op.READ, rows.schema, rows.table, rows.base.with_index(_INDEX_SENTINEL),
                        rows.ts_ms, None, None, None, rows.kind)
    text = orjson.dumps(probe.envelope(connector, db, now_ms)).decode()
    marker = f'"index":{_INDEX_SENTINEL}'
    if not text.endswith(_TAIL) or text.count(marker) != 1:  # a position without "index"
        return [encode_event(e, connector, db, now_ms) for e in rows.events()]
    head, _, mid = text[: -len(_TAIL)].partition(marker)
    head += '"index":'
    mid += ',"key":'
    sep = ',"before":null,"after":'
    qualified = f"{rows.schema}.{rows.table}"
    op = Op.READ.value
    ts = rows.ts_ms
    ident = rows.identity or rows.key_columns
    new = tuple.__new__  # a NamedTuple's own __new__ is a Python function: 4x slower
    chunk = rows.rows
    if all(type(r) is EncodedRow for r in chunk):
        return [
            new(EncodedEvent, (qualified, op, ts, f"{head}{i}{mid}{key_json}{sep}{after_json}}}"))
            for i, (_, key_json, after_json) in enumerate(chunk, rows.first)
        ]
    dumps = orjson.dumps
    out = []
    for i, row in enumerate(chunk, rows.first):
        if type(row) is EncodedRow:
            key_json, after_json = row.key_json, row.after_json
        else:
            assert isinstance(row, dict)
            key_json = dumps({c: row.get(c) for c in ident}).decode()
            after_json = dumps(row).decode()
        out.append(new(EncodedEvent, (qualified, op, ts, f"{head}{i}{mid}{key_json}{sep}{after_json}}}")))
    return out
