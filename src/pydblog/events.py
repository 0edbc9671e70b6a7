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
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from enum import StrEnum
from itertools import repeat
from typing import Any, NamedTuple, TypeVar, overload

import orjson

from pydblog.positions import Lsn, PgPosition, Position

Row = dict[str, Any]
_T = TypeVar("_T")

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
    """The change-log form of ``event``: its envelope as ``orjson.dumps`` of
    ``event.envelope(connector, db, now_ms)`` gives it, byte for byte.

    A ``PgPosition`` event (the stream's hot path) is written from a template cached per
    table, op and snapshot kind (``_template``): the integers go into it as text and only
    ``key``/``before``/``after`` (and the optional fields) pass through ``orjson``, in one
    call, instead of building the envelope's three dicts per event. Anything else (other
    positions, a value of an unexpected type) takes the envelope path."""
    pos = event.position
    ts = event.ts_ms
    if type(pos) is PgPosition and type(ts) is int and type(now_ms) is int:
        tx = pos.tx_id
        lsn = pos.commit_lsn.value
        index = pos.index
        if type(lsn) is int and type(index) is int and (tx is None or type(tx) is int):
            # The envelope around the index is the same for every event of a table's op in
            # a transaction (one commit: one lsn, txId and ts_ms; one now_ms per commit):
            # the last one is kept (one tuple: read and replaced atomically).
            key = (event.op, event.schema, event.table, event.snapshot, connector, db)
            last = _LAST_TX
            if last[0] == (key, now_ms, lsn, tx, ts):
                parts = last[1]
            else:
                t = _TEMPLATES.get(key)
                if t is None:
                    t = _template(event, connector, db)
                parts = None if t is None else (
                    t[0], f"{t[1]}{now_ms}{t[2]}{lsn}{t[3]}{'null' if tx is None else tx}{t[4]}",
                    f"{t[5]}{ts}{t[6]}")
                _remember_tx((key, now_ms, lsn, tx, ts), parts)
            if parts is not None:
                return _in_parts(event, parts, index)
    elif type(ts) is int and type(now_ms) is int:
        tx_key = getattr(pos, "tx_key", None)
        at: Any = getattr(pos, "index", None)
        if tx_key is not None and type(at) is int:
            # Positions that name their transaction (``tx_key``: what ``source_fields``
            # holds besides ``index``): the envelope around the index, cut once per
            # table, op and transaction out of a probe's own text.
            parts = _cached_tx_parts(event, tx_key, connector, db, now_ms)
            if parts is not None:
                return _in_parts(event, parts, at)
    return EncodedEvent(
        f"{event.schema}.{event.table}",
        event.op,
        ts,
        orjson.dumps(event.envelope(connector, db, now_ms)).decode(),
    )


_new_tuple = tuple.__new__  # a NamedTuple's own __new__ is a Python function: 4x slower
_LAST_TX: tuple[Any, tuple[str, str, str] | None] = (None, None)
"""``encode_event``'s last ``((template key, now_ms, lsn, txId, ts_ms), (qualified table,
envelope text before the index, text after it up to the key))``."""


def _remember_tx(key: tuple[Any, ...], parts: tuple[str, str, str] | None) -> None:
    global _LAST_TX
    _LAST_TX = (key, parts)


def _in_parts(event: ChangeEvent, parts: tuple[str, str, str], index: int) -> EncodedEvent:
    """``event`` encoded into its envelope's ``parts`` around ``index``: only ``key``,
    ``before``, ``after`` and the optional fields pass through ``orjson``."""
    tail: dict[str, Any] = {"key": event.key, "before": event.before, "after": event.after}
    if event.unchanged:
        tail["unchanged"] = list(event.unchanged)
    if event.notification is not None:
        tail["notification"] = event.notification
    rest = orjson.dumps(tail).decode()
    return _new_tuple(EncodedEvent, (parts[0], event.op, event.ts_ms,
                                     f"{parts[1]}{index}{parts[2]}{rest[1:]}"))


def _cached_tx_parts(event: ChangeEvent, tx_key: Any, connector: str, db: str,
                     now_ms: int) -> tuple[str, str, str] | None:
    """``_tx_parts`` of ``event``, kept for the next event of the same table, op,
    transaction (``tx_key``) and times."""
    key = (event.op, event.schema, event.table, event.snapshot, connector, db)
    last = _LAST_TX
    if last[0] == (key, now_ms, tx_key, event.ts_ms):
        return last[1]
    parts = _tx_parts(event, connector, db, now_ms)
    _remember_tx((key, now_ms, tx_key, event.ts_ms), parts)
    return parts
_TEMPLATES: dict[tuple[Any, ...], tuple[str, ...] | None] = {}
_TEMPLATES_MAX = 4096
_SENTINELS = (-7_306_185_142_901, -7_306_185_142_902, -7_306_185_142_903,
              -7_306_185_142_904, -7_306_185_142_905)
_ENVELOPE_END = '"key":null,"before":null,"after":null}'


def _template(event: ChangeEvent, connector: str, db: str) -> tuple[str, ...] | None:
    """``(qualified table, text before now_ms, before lsn, before txId, before index,
    before ts_ms, before key)`` of the envelope of ``event``'s table, op and snapshot
    kind, cut out of ``orjson``'s own text of a probe event carrying sentinel integers;
    None when the text does not have that form (the caller then encodes the envelope)."""
    now, lsn, tx, index, ts = _SENTINELS
    probe = ChangeEvent(event.op, event.schema, event.table, PgPosition(Lsn(lsn), index, None, tx),
                        ts, None, None, None, event.snapshot)
    text = orjson.dumps(probe.envelope(connector, db, now)).decode()
    parts: list[str] = [f"{event.schema}.{event.table}"]
    rest = text
    for sentinel in (now, lsn, tx, index, ts):
        marker = str(sentinel)
        if rest.count(marker) != 1:
            parts = []
            break
        head, _, rest = rest.partition(marker)
        parts.append(head)
    template: tuple[str, ...] | None = None
    if parts and rest.endswith("," + _ENVELOPE_END) and rest.count('"key":') == 1:
        parts.append(rest[: -len(_ENVELOPE_END)])
        template = tuple(parts)
    if len(_TEMPLATES) >= _TEMPLATES_MAX:
        _TEMPLATES.clear()
    _TEMPLATES[(event.op, event.schema, event.table, event.snapshot, connector, db)] = template
    return template


def _tx_parts(event: ChangeEvent, connector: str, db: str, now_ms: int) -> tuple[str, str, str] | None:
    """``(qualified table, envelope text before the index, text after it up to the key)``
    of ``event``'s envelope, cut out of the text of a probe at a sentinel index; None
    when the text does not have that form (the caller then encodes the envelope)."""
    index = _SENTINELS[3]
    probe = ChangeEvent(event.op, event.schema, event.table, event.position.with_index(index),
                        event.ts_ms, None, None, None, event.snapshot)
    text = orjson.dumps(probe.envelope(connector, db, now_ms)).decode()
    marker = str(index)
    if text.count(marker) != 1:
        return None
    head, _, rest = text.partition(marker)
    if not rest.endswith("," + _ENVELOPE_END) or rest.count('"key":') != 1:
        return None
    return (f"{event.schema}.{event.table}", head, rest[: -len(_ENVELOPE_END)])


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

TAIL_SEP = ',"before":null,"after":'
"""Between the key and the row in an ``EncodedChunk`` row tail (and in an envelope)."""


class TailBlocks(NamedTuple):
    """Row tails already cut into the change log's blocks (as the native encoder hands
    them over): ``texts[i]`` is ``sizes[i]`` (>= 1) tails joined by newlines, in order.
    Kept as they are, they become ``EncodedBlock``s with no split and no join."""

    sizes: list[int]
    texts: list[str]

    @classmethod
    def cut(cls, count: int, texts: list[str], block_rows: int) -> TailBlocks:
        """``count`` tails in ``texts`` of ``block_rows`` each but the last (the cut the
        native encoder makes)."""
        if not texts:
            return cls([], [])
        full = len(texts) - 1
        return cls([block_rows] * full + [count - block_rows * full], texts)


def join_tails(parts: Sequence[str | TailBlocks]) -> str | TailBlocks:
    """Consecutive parts' tails as one (the parts' blocks kept if all are cut; an empty
    text part stands for no rows)."""
    if all(type(p) is TailBlocks for p in parts):
        blocks = [p for p in parts if type(p) is TailBlocks]
        return TailBlocks([n for b in blocks for n in b.sizes], [t for b in blocks for t in b.texts])
    texts = [p if isinstance(p, str) else "\n".join(p.texts) for p in parts]
    return "\n".join(t for t in texts if t)


class EncodedChunk(Sequence[EncodedRow]):
    """A whole chunk as a bulk reader receives it from the database: the rows' texts
    joined into two strings, not one Python object per row.

    - ``tails``: ``size`` row tails joined by newlines (or cut into ``TailBlocks``:
      ``blocks`` then hands them to the change log as they are), in key order; a row's tail is
      ``key_json + TAIL_SEP + after_json + "}"`` (the end of its envelope; see
      ``EncodedRow`` for the two JSON texts). JSON text never holds a raw newline, and
      ``TAIL_SEP`` cannot occur inside ``key_json`` (its quotes would be escaped).
    - ``keys``: ``size`` JSON texts joined by newlines, row ``i``'s chunk key as
      ``decode_key(orjson.loads(line))`` gives it (mapped as the stream maps keys).
    - ``int_keys``: the key is one integer column, so Python's order of the decoded
      keys is the database's order (the window may test a key against the chunk's
      range before it decodes every key).

    As a ``Sequence`` it yields ``EncodedRow``s, built on demand: generic code works on
    it unchanged, and the hot paths (the window, ``encode_snapshot_rows``) never build
    one per row.
    """

    __slots__ = ("_key_list", "_key_text", "_key_values", "_tail_blocks", "_tail_list",
                 "_tail_text", "arity", "decode_key", "int_keys", "size")

    def __init__(
        self, size: int, tails: str | list[str] | TailBlocks, keys: str | list[Any],
        decode_key: Callable[[Any], tuple[Any, ...]], arity: int, *, int_keys: bool = False,
    ) -> None:
        """``tails`` and ``keys`` as the joined texts (tails possibly cut into blocks),
        or as lists (tails, and the keys' parsed JSON values) when a chunk is derived
        from another."""
        self.size = size
        self.decode_key = decode_key
        self.arity = arity
        self.int_keys = int_keys
        self._tail_blocks: TailBlocks | None = tails if type(tails) is TailBlocks else None
        self._tail_text: str | None = tails if isinstance(tails, str) else None
        self._tail_list: list[str] | None = tails if type(tails) is list else None
        self._key_text: str | None = keys if isinstance(keys, str) else None
        self._key_values: list[Any] | None = None if isinstance(keys, str) else keys
        self._key_list: list[tuple[Any, ...]] | None = None

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"EncodedChunk({self.size} rows)"

    @property
    def tails(self) -> str:
        if self._tail_text is None:
            blocks = self._tail_blocks
            self._tail_text = "\n".join(blocks.texts if blocks is not None else self.tail_list())
        return self._tail_text

    @property
    def keys(self) -> str:
        if self._key_text is None:
            self._key_text = "\n".join(orjson.dumps(v).decode() for v in self.key_values())
        return self._key_text

    def tail_list(self) -> list[str]:
        if self._tail_list is None:
            blocks = self._tail_blocks
            if blocks is not None and self._tail_text is None:
                self._tail_list = [t for text in blocks.texts for t in text.split("\n")]
            else:
                self._tail_list = self.tails.split("\n") if self.size else []
        return self._tail_list

    def blocks(self, max_rows: int) -> list[tuple[int, str]]:
        """The tails as ``(count, text)`` blocks of at most ``max_rows`` rows each, in
        order: the blocks it was cut into if they are that small (no copy), else cut
        here."""
        blocks = self._tail_blocks
        if blocks is not None and all(n <= max_rows for n in blocks.sizes):
            return list(zip(blocks.sizes, blocks.texts, strict=True))
        if self.size <= max_rows:
            return [(self.size, self.tails)] if self.size else []
        tails = self.tail_list()
        return [(len(tails[a : a + max_rows]), "\n".join(tails[a : a + max_rows]))
                for a in range(0, self.size, max_rows)]

    def key_values(self) -> list[Any]:
        """Every row's key line, parsed (once)."""
        if self._key_values is None:
            text = self.keys
            self._key_values = orjson.loads(f"[{text.replace(chr(10), ',')}]") if self.size else []
        return self._key_values

    def key_list(self) -> list[tuple[Any, ...]]:
        """Every row's chunk key, decoded (once)."""
        if self._key_list is None:
            decode = self.decode_key
            self._key_list = [decode(v) for v in self.key_values()]
        return self._key_list

    def key_at(self, i: int) -> tuple[Any, ...]:
        """Row ``i``'s chunk key; the first and the last without decoding the rest."""
        i = self._index(i)
        if self._key_list is not None:
            return self._key_list[i]
        if self._key_values is not None:
            return self.decode_key(self._key_values[i])
        if i == self.size - 1:
            return self.decode_key(orjson.loads(self.keys.rpartition("\n")[2]))
        if i == 0:
            return self.decode_key(orjson.loads(self.keys.partition("\n")[0]))
        return self.key_list()[i]

    def _index(self, i: int) -> int:
        if i < 0:
            i += self.size
        if not 0 <= i < self.size:
            raise IndexError("chunk row index out of range")
        return i

    def _tail(self, i: int) -> str:
        """Row ``i``'s tail; the first and the last without splitting the chunk (a
        flight measures every chunk by them, on the capture thread)."""
        if self._tail_list is None and i in (0, self.size - 1):
            blocks = self._tail_blocks
            if blocks is not None and self._tail_text is None:
                text = blocks.texts[0] if i == 0 else blocks.texts[-1]
            else:
                text = self.tails
            return text.partition("\n")[0] if i == 0 else text.rpartition("\n")[2]
        return self.tail_list()[i]

    @overload
    def __getitem__(self, i: int) -> EncodedRow: ...
    @overload
    def __getitem__(self, i: slice) -> list[EncodedRow]: ...
    def __getitem__(self, i: int | slice) -> EncodedRow | list[EncodedRow]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.size))]
        i = self._index(i)
        key_json, _, rest = self._tail(i).partition(TAIL_SEP)
        return EncodedRow(self.key_at(i), key_json, rest[:-1])

    def __iter__(self) -> Iterator[EncodedRow]:
        return (self[i] for i in range(self.size))

    def span(self, start: int, max_rows: int, max_bytes: int = 0) -> int:
        """Where a part starting at row ``start`` of at most ``max_rows`` rows (and, if
        ``max_bytes``, about that many bytes of tails, at least one block) ends: at a
        block boundary when the tails are cut into blocks (``part`` then copies no
        text), else at ``start + max_rows``. Always ``> start`` unless at the end."""
        stop = min(self.size, start + max(1, max_rows))
        blocks = self._tail_blocks
        if blocks is None or self._tail_list is not None or start >= self.size:
            return stop
        at, size = 0, 0
        for n, text in zip(blocks.sizes, blocks.texts, strict=True):
            if at >= start:
                if at > start and (at >= stop or (max_bytes and size >= max_bytes)):
                    return at
                size += len(text)
            at += n
        return self.size

    def part(self, start: int, stop: int) -> EncodedChunk:
        """Rows ``[start, stop)`` as a chunk of their own (keys parsed once for the
        whole chunk; whole blocks taken as they are when the part is block-aligned)."""
        start, stop = max(0, start), min(self.size, stop)
        if start == 0 and stop == self.size:
            return self
        stop = max(start, stop)
        tails: list[str] | TailBlocks
        blocks = self._tail_blocks
        aligned = None
        if blocks is not None and self._tail_list is None:
            aligned = _block_range(blocks, start, stop)
        if aligned is not None:
            a, b = aligned
            tails = TailBlocks(blocks.sizes[a:b], blocks.texts[a:b])  # type: ignore[union-attr]
        else:
            tails = self.tail_list()[start:stop]
        chunk = EncodedChunk(stop - start, tails, self.key_values()[start:stop], self.decode_key,
                             self.arity, int_keys=self.int_keys)
        if self._key_list is not None:
            chunk._key_list = self._key_list[start:stop]
        return chunk

    def without(self, drop: Collection[int]) -> EncodedChunk:
        """The chunk without the rows at these indexes (order kept). The kept rows are
        list slices between the dropped ones: a few drops cost a few slices."""
        cut = sorted(i for i in set(drop) if 0 <= i < self.size)
        if not cut:
            return self

        def keep(items: list[_T]) -> list[_T]:
            out: list[_T] = []
            lo = 0
            for i in cut:
                out += items[lo:i]
                lo = i + 1
            out += items[lo:]
            return out

        blocks = self._tail_blocks
        tails: list[str] | TailBlocks
        if blocks is not None and self._tail_list is None:
            tails = _without_in_blocks(blocks, cut)
            size = sum(tails.sizes)
        else:
            tails = keep(self.tail_list())
            size = len(tails)
        chunk = EncodedChunk(size, tails, keep(self.key_values()), self.decode_key,
                             self.arity, int_keys=self.int_keys)
        if self._key_list is not None:
            chunk._key_list = keep(self._key_list)
        return chunk


def _block_range(blocks: TailBlocks, start: int, stop: int) -> tuple[int, int] | None:
    """The blocks ``[a, b)`` holding exactly rows ``[start, stop)``, if both ends are
    block boundaries."""
    a = b = None
    at = 0
    for i, n in enumerate(blocks.sizes):
        if at == start:
            a = i
        if at == stop:
            b = i
            break
        at += n
    else:
        if at == stop:
            b = len(blocks.sizes)
        if at == start:
            a = len(blocks.sizes)
    return None if a is None or b is None else (a, b)


def _without_in_blocks(blocks: TailBlocks, cut: list[int]) -> TailBlocks:
    """``blocks`` without the rows at the (sorted, distinct, in range) indexes ``cut``:
    only the blocks holding one are split and joined again; a block left empty goes."""
    sizes: list[int] = []
    texts: list[str] = []
    at, c = 0, 0
    for n, text in zip(blocks.sizes, blocks.texts, strict=True):
        end = at + n
        if c < len(cut) and cut[c] < end:
            drop = set()
            while c < len(cut) and cut[c] < end:
                drop.add(cut[c] - at)
                c += 1
            kept = [t for i, t in enumerate(text.split("\n")) if i not in drop]
            if kept:
                sizes.append(len(kept))
                texts.append("\n".join(kept))
        else:
            sizes.append(n)
            texts.append(text)
        at = end
    return TailBlocks(sizes, texts)


class EncodedBlock(NamedTuple):
    """Consecutive change-log events of one table with the same op and ``ts_ms`` (a
    chunk's snapshot rows): the change log stores it as one block without touching the
    events one by one.

    Two forms:
    - plain (``head`` empty): ``body`` is the ``size`` envelopes joined by newlines;
    - template (``head`` set): ``body`` is ``size`` envelope *tails* joined by newlines,
      and event ``i``'s envelope is ``head + str(first_index + i) + mid + tail_i``. A
      snapshot chunk's envelopes differ only in the row index, the key and the row: the
      shared ~170 bytes are stored once per block instead of once per row (the change
      log keeps the template and readers expand it; see ``bodies``).
    """

    table: str
    op: str
    ts_ms: int
    size: int
    body: str
    head: str = ""
    mid: str = ""
    first_index: int = 0

    def bodies(self) -> list[str]:
        """Every event's envelope, in order."""
        if not self.size:
            return []
        lines = self.body.split("\n")
        if not self.head:
            return lines
        return expand_template(self.head, self.first_index, self.mid, lines)


def expand_template(head: str, first_index: int, mid: str, tails: Sequence[str]) -> list[str]:
    """The envelopes of a template block (see ``EncodedBlock``), by C-level joins."""
    parts = zip(repeat(head), _index_texts(first_index, len(tails)), repeat(mid), tails)
    return list(map("".join, parts))


Encoded = EncodedEvent | EncodedBlock
"""What the change log appends: single events, or blocks of them."""

BLOCK_EVENTS = 1024
"""At most this many events in one ``EncodedBlock`` (the embedded log's block size)."""



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


def _tail_events(op: Op, schema: str, table: str, ts_ms: int, tails: str,
                 positions: Iterable[Position]) -> list[ChangeEvent]:
    """The events of a run's tails (``InsertRun``, ``RowRun``), one per line at
    ``positions``: a ``c`` tail cut at ``TAIL_SEP``, any other parsed as the envelope's
    ``key``, ``before`` and ``after``."""
    loads = orjson.loads
    out = []
    for pos, tail in zip(positions, tails.split("\n"), strict=True):
        if op is Op.CREATE:
            key, _, after = tail.partition(TAIL_SEP)
            out.append(ChangeEvent(op, schema, table, pos, ts_ms, loads(key), None,
                                   loads(after[:-1])))
        else:
            parts = loads(f'{{"key":{tail}')
            out.append(ChangeEvent(op, schema, table, pos, ts_ms, parts["key"], parts["before"],
                                   parts["after"]))
    return out


class InsertRun(NamedTuple):
    """Consecutive inserts of one table in one PostgreSQL transaction, or consecutive
    updates that kept their row's key, or consecutive deletes (``op``), of one form,
    already encoded by the native decoder (``_pgrow.Tails``): no ``ChangeEvent`` per
    row.

    Event ``i`` (``0 <= i < size``) is an ``op`` event at ``PgPosition(lsn, first + i,
    None, tx_id)`` with ``ts_ms``. ``tails`` holds the ``size`` events' envelope tails
    joined by newlines: byte for byte what ``encode_event`` writes after the envelope's
    ``"key":`` for that event (so ``encode_insert_run`` gives the same bodies as
    ``encode_event`` of ``events()``). A ``c`` tail is ``key_json + TAIL_SEP +
    after_json + "}"``; a ``u`` or ``d`` tail ``key_json + ',"before":' + before_json +
    ',"after":' + after_json + "}"`` (``before`` null for updates without the old row,
    the key for deletes by key; ``after`` null for deletes)."""

    schema: str
    table: str
    lsn: Lsn
    first: int
    tx_id: int | None
    ts_ms: int
    size: int
    tails: str
    op: Op = Op.CREATE

    @property
    def first_position(self) -> PgPosition:
        return PgPosition(self.lsn, self.first, None, self.tx_id)

    @property
    def last_position(self) -> PgPosition:
        return PgPosition(self.lsn, self.first + self.size - 1, None, self.tx_id)

    def events(self) -> list[ChangeEvent]:
        """One ``ChangeEvent`` per row, its key and row parsed back from the tails (the
        JSON values the converters gave: orjson writes them back to the same text)."""
        positions = (PgPosition(self.lsn, self.first + i, None, self.tx_id)
                     for i in range(self.size))
        return _tail_events(self.op, self.schema, self.table, self.ts_ms, self.tails, positions)

    def past(self, position: Position) -> InsertRun | None:
        """The run without its events at or below ``position`` (None: nothing left)."""
        lines = self.tails.split("\n")
        drop = 0
        while drop < self.size and PgPosition(self.lsn, self.first + drop, None, self.tx_id) <= position:
            drop += 1
        if drop == self.size:
            return None
        return self._replace(first=self.first + drop, size=self.size - drop,
                             tails="\n".join(lines[drop:]))


class RowRun(NamedTuple):
    """Consecutive row events of one table with one ``op`` in one transaction (inserts,
    updates that keep their key, deletes), already encoded by a source's native decoder
    (MySQL/MariaDB: ``_myrow.tails``), at positions that name their transaction
    (``tx_key``, as ``encode_event``'s cached path needs).

    Event ``i`` (``0 <= i < size``) is an ``op`` event at ``first.with_index(
    first.index + i)`` with ``ts_ms``; ``tails`` holds, one per line, byte for byte what
    ``encode_event`` writes after the envelope's ``"key":`` for that event: for ``c``
    ``key_json + TAIL_SEP + after_json + "}"`` (as ``InsertRun``'s), for ``u`` and ``d``
    ``key_json + ',"before":' + before_json + ',"after":' + after_json + "}"`` (the
    before row in full, ``after_json`` null for ``d``)."""

    schema: str
    table: str
    first: Any  # the first event's position (a Position with ``index`` and ``tx_key``)
    ts_ms: int
    size: int
    tails: str
    op: Op = Op.CREATE

    @property
    def first_position(self) -> Position:
        pos: Position = self.first
        return pos

    @property
    def last_position(self) -> Position:
        pos: Position = self.first.with_index(self.first.index + self.size - 1)
        return pos

    def events(self) -> list[ChangeEvent]:
        """One ``ChangeEvent`` per row, its key and rows parsed back from the tails."""
        base = self.first
        positions = (base.with_index(base.index + i) for i in range(self.size))
        return _tail_events(self.op, self.schema, self.table, self.ts_ms, self.tails, positions)

    def past(self, position: Position) -> RowRun | None:
        """The run without its events at or below ``position`` (None: nothing left)."""
        base = self.first
        drop = 0
        while drop < self.size and base.with_index(base.index + drop) <= position:
            drop += 1
        if drop == self.size:
            return None
        if not drop:
            return self
        lines = self.tails.split("\n")
        return self._replace(first=base.with_index(base.index + drop), size=self.size - drop,
                             tails="\n".join(lines[drop:]))


def encode_row_run(run: RowRun, connector: str, db: str, now_ms: int) -> list[Encoded]:
    """The change-log form of ``run``: one template ``EncodedBlock`` whose bodies are
    ``encode_event`` of ``run.events()``, byte for byte (the envelope around the index
    as ``encode_event`` cuts it for the run's table and transaction); events one by one
    where it cannot be cut."""
    pos = run.first
    ts = run.ts_ms
    tx_key = getattr(pos, "tx_key", None)
    parts = None
    if tx_key is not None and type(ts) is int and type(now_ms) is int and type(pos.index) is int:
        probe = ChangeEvent(run.op, run.schema, run.table, pos, ts)
        parts = _cached_tx_parts(probe, tx_key, connector, db, now_ms)
    if parts is None:
        return [encode_event(e, connector, db, now_ms) for e in run.events()]
    return [_new_tuple(EncodedBlock, (parts[0], run.op, ts, run.size, run.tails, parts[1],
                                      f'{parts[2]}"key":', pos.index))]


def encode_insert_run(run: InsertRun, connector: str, db: str, now_ms: int) -> list[Encoded]:
    """The change-log form of ``run``: one template ``EncodedBlock`` whose bodies are
    ``encode_event`` of ``run.events()``, byte for byte (the envelope around the index
    is ``encode_event``'s template for the run's table, lsn, txId and ts_ms); events
    one by one where there is no template."""
    lsn = run.lsn.value
    tx = run.tx_id
    ts = run.ts_ms
    op = run.op
    key = (op, run.schema, run.table, SnapshotKind.NONE, connector, db)
    last = _LAST_TX
    if last[0] == (key, now_ms, lsn, tx, ts):
        parts = last[1]
    else:
        t = _TEMPLATES.get(key)
        if t is None:
            probe = ChangeEvent(op, run.schema, run.table, run.first_position, ts)
            t = _template(probe, connector, db)
        parts = None if t is None else (
            t[0], f"{t[1]}{now_ms}{t[2]}{lsn}{t[3]}{'null' if tx is None else tx}{t[4]}",
            f"{t[5]}{ts}{t[6]}")
        _remember_tx((key, now_ms, lsn, tx, ts), parts)
    if parts is None or type(lsn) is not int or type(ts) is not int or type(now_ms) is not int:
        return [encode_event(e, connector, db, now_ms) for e in run.events()]
    return [_new_tuple(EncodedBlock, (parts[0], op, ts, run.size, run.tails, parts[1],
                                      f'{parts[2]}"key":', run.first))]


def last_position(item: Emitted) -> Position:
    if isinstance(item, SnapshotRows):
        return item.last_position
    return item.position


_INDEX_TEXT: list[str] = []
_INDEX_TEXT_MAX = 1 << 17


def _index_texts(first: int, n: int) -> Sequence[str]:
    """``str(i)`` for ``first <= i < first + n``: a chunk's row indexes start near 0 at
    every H, so their texts are cached rather than formatted per row."""
    end = first + n
    if first < 0 or end > _INDEX_TEXT_MAX:
        return list(map(str, range(first, end)))
    if end > len(_INDEX_TEXT):
        _INDEX_TEXT.extend(map(str, range(len(_INDEX_TEXT), end)))
    return _INDEX_TEXT[first:end]


_INDEX_SENTINEL = -7_306_185_142_913
_TAIL = ',"key":null,"before":null,"after":null}'


def encode_snapshot_rows(
    rows: SnapshotRows, connector: str, db: str, now_ms: int, block_events: int = 1024
) -> list[EncodedEvent] | list[EncodedBlock]:
    """The change-log form of every row, as ``encode_event`` would give it for each of
    ``rows.events()``, built from one envelope template per chunk: the per-row work is
    a few string concatenations around the pre-encoded key and row. An
    ``EncodedChunk`` becomes template ``EncodedBlock``s of at most ``block_events``
    rows: the chunk's tails as the database joined them (split only into blocks), the
    envelope's shared head and middle once per block."""
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
    sep = TAIL_SEP
    qualified = f"{rows.schema}.{rows.table}"
    op = Op.READ.value
    ts = rows.ts_ms
    ident = rows.identity or rows.key_columns
    new = tuple.__new__  # a NamedTuple's own __new__ is a Python function: 4x slower
    chunk = rows.rows
    if type(chunk) is EncodedChunk:
        # The database's text as it came (cut into blocks by the encoder): no split,
        # no join.
        cut: list[EncodedBlock] = []
        at = rows.first
        for n, text in chunk.blocks(block_events):
            cut.append(EncodedBlock(qualified, op, ts, n, text, head, mid, at))
            at += n
        return cut
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
