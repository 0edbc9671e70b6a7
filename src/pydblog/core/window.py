"""The DBLog window of one chunk: which chunk rows are still newer than the log at H.

Timeline of one chunk (L and H are watermarks, T the moment the SELECT's snapshot was
taken; the worker commits L, runs the SELECT, hands the rows over, then commits H)::

    stream:   ... e1 ... [L] ... e2 ... (T) ... e3 ... [H] ... e4 ...
    chunk:                              rows as of T

- e1 (before L) is older than T: the chunk row already includes it.
- e2 and e3 (between L and H) may be older or newer than T; either way the log event
  is at least as new as the row, so the row's key is dropped from the chunk.
- e4 (after H) is newer than T and is placed after the rows, which are emitted at H.

So the rows emitted at H are ``rows - {keys of table events between L and H}`` (all of
them dropped after a truncate of the table between L and H). Events may arrive before
or after the rows (the SELECT runs concurrently with the stream); both orders give the
same answer because drops are remembered as a set of keys until the window closes.
Memory: the rows (at most one chunk) plus one key per table event in the window.

Slices (``take``): the rows may also be handed out a part at a time at points after H;
each part is judged by every event observed until it is taken (the window's end moves
from H to that point: an event after H is newer than the row, so dropping its key is
as exact as at H). See ``core.flight``, "Slices".

If a table event's chunk key cannot be determined (see ``keys.event_keys``) the window
is *inconclusive*: nothing is emitted at H and the same chunk is read again.

Partial events (``ChangeEvent.unchanged``: PostgreSQL's unchanged TOAST values) are
remembered by identity too: a chunk row they drop leaves its key with no full row in
the log, so ``WindowResult.reread`` names those rows' identities for a key-level
re-read (``core.rereads``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from pydblog.core.keys import MatchKey, RawKey, event_keys, hashable, match_key, row_key
from pydblog.events import ChangeEvent, ChunkRow, EncodedChunk, EncodedRow, Op

Row = ChunkRow


@dataclass(frozen=True, slots=True)
class WindowResult:
    """What a window yields at H (``close``), or one slice of it (``take``).

    ``rows``: the chunk rows to emit, in key order. ``read``: how many rows the SELECT
    returned (a slice: how many of them the slice covers). ``last_key``: the raw key of
    the last row *read* (progress moves there even if that row was dropped), None for
    an empty chunk. ``conclusive``: False when the window could not decide (nothing may
    be emitted and progress must not move). ``reread``: identities (column -> value) of
    rows read but dropped by a partial event (unchanged TOAST), to be re-read.
    ``left``: rows read and not yet handed out (``take``: more slices to come).
    """

    rows: Sequence[Row]
    read: int
    last_key: RawKey | None
    conclusive: bool
    reread: tuple[dict[str, Any], ...] = ()
    left: int = 0


class ChunkWindow:
    """Window state for one chunk of one table (mutable; owned by the core)."""

    __slots__ = (
        "_dropped", "_ident_cols", "_inconclusive", "_partial", "_rows", "_taken", "_truncated",
        "by_identity", "columns", "identity", "schema", "table",
    )

    def __init__(
        self, schema: str, table: str, columns: Sequence[str], *, by_identity: bool = False,
        identity: Sequence[str] = (),
    ) -> None:
        """``columns``: the chunk key; ``identity``: the row identity (the chunk key when
        empty), which stream events' keys name."""
        self.schema = schema
        self.table = table
        self.columns = tuple(columns)
        self.identity = tuple(identity) or self.columns
        self.by_identity = by_identity
        self._rows: Sequence[Row] | None = None
        self._dropped: set[MatchKey] = set()
        self._partial: set[MatchKey] = set()
        self._ident_cols: tuple[str, ...] = self.identity
        self._truncated = False
        self._inconclusive = False
        self._taken = 0  # rows handed out by ``take`` so far

    @property
    def taken(self) -> int:
        """Rows of the chunk handed out by ``take`` so far (0: none)."""
        return self._taken

    @property
    def has_rows(self) -> bool:
        return self._rows is not None

    @property
    def read_count(self) -> int:
        """How many rows the SELECT returned (0 before ``set_rows``)."""
        return 0 if self._rows is None else len(self._rows)

    @property
    def last_read_key(self) -> RawKey | None:
        """The raw key of the last row read (None: no rows, or a row without its key)."""
        if not self._rows:
            return None
        return row_key(self._rows[-1], self.columns)

    def set_rows(self, rows: Sequence[Row]) -> None:
        """The chunk as the SELECT returned it (key order)."""
        self._rows = rows

    def observe(self, event: ChangeEvent) -> None:
        """A stream event between L and H. The caller has checked it is of this table."""
        if event.op is Op.TRUNCATE:
            self._truncated = True
            return
        if event.unchanged and event.key:
            self._partial.add(_ident_key(event.key))
        if self.by_identity:
            self._observe_identity(event)
            return
        keys = event_keys(event, self.columns)
        if keys is None:
            self._inconclusive = True
            return
        self._dropped.update(keys)

    def _observe_identity(self, event: ChangeEvent) -> None:
        """Chunks by a surrogate key: rows are told apart by their identity (the event
        key: primary key, or every column), since surrogate values may repeat. The
        event's key and, where complete, its before and after images' identity values
        are dropped (a key change or a full-identity update touches both)."""
        key = event.key
        if not key:
            self._inconclusive = True
            return
        cols = tuple(key)
        self._ident_cols = cols
        self._dropped.add(_ident_key(key))
        for image in (event.before, event.after):
            if image is not None and all(c in image for c in cols):
                self._dropped.add(_ident_key({c: image[c] for c in cols}))

    def saw_partial(self, ident: dict[str, Any]) -> bool:
        """A partial event (unchanged columns) of this identity fell into the window."""
        return _ident_key(ident) in self._partial

    def close(self) -> WindowResult:
        """The outcome at H; call once, after ``set_rows``."""
        result = self._judge(self._rows)
        return self._with_reread(result, self._rows)

    def take(self, max_rows: int, max_bytes: int = 0) -> WindowResult:
        """The next slice of the chunk: its next ``max_rows`` rows read (an encoded
        chunk's: whole blocks, at most about ``max_bytes`` of them), judged by every
        event observed until now. The window stays open: the rows after the slice
        are judged by the events that come until their own slice is taken, so a
        slice may be taken at any point of the stream after H (see
        ``docs/snapshots.md``, "Slices"). An inconclusive window hands out nothing
        (``conclusive`` False) and keeps its position; after the last slice ``left``
        is 0. The slices' ``read`` add up to the chunk's, the last one's
        ``last_key`` is the chunk's last key read."""
        rows = self._rows
        if rows is None:
            return WindowResult([], 0, None, False)
        start = self._taken
        if type(rows) is EncodedChunk:
            stop = rows.span(start, max_rows, max_bytes)
            part: Sequence[Row] = rows.part(start, stop)
        else:
            stop = min(len(rows), start + max(1, max_rows))
            part = rows if start == 0 and stop == len(rows) else rows[start:stop]
        result = self._judge(part)
        if not result.conclusive:
            return result
        self._taken = stop
        if (self._dropped and type(rows) is EncodedChunk and rows.int_keys
                and not self.by_identity and stop < len(rows)):
            self._keep_drops_ahead(rows, stop)
        result = self._with_reread(result, part)
        left = len(rows) - stop
        return dataclasses.replace(result, left=left) if left else result

    def _keep_drops_ahead(self, rows: EncodedChunk, start: int) -> None:
        """Integer keys: forget the dropped keys outside the rows not yet handed out
        (most of a busy table's events are of keys in no window); the next slices test
        fewer. Keys of another type are all kept."""
        lo, hi = rows.key_at(start), rows.key_at(-1)
        with contextlib.suppress(TypeError):
            self._dropped = {d for d in self._dropped if lo <= d <= hi}

    def _with_reread(self, result: WindowResult, rows: Sequence[Row] | None) -> WindowResult:
        if not self._partial or not result.conclusive or self._truncated or not rows:
            return result
        reread = []
        for row in rows:
            ident = self._identity_of(row)
            if _ident_key(ident) in self._partial:
                reread.append(ident)
        return dataclasses.replace(result, reread=tuple(reread)) if reread else result

    def _identity_of(self, row: Row) -> dict[str, Any]:
        if type(row) is EncodedRow:
            ident: dict[str, Any] = orjson.loads(row.key_json)
            return ident
        assert isinstance(row, dict)
        return {c: row.get(c) for c in self.identity}

    def _judge(self, rows: Sequence[Row] | None) -> WindowResult:
        """``rows`` (the chunk, or a slice of it) less the ones the window drops."""
        if rows is None or self._inconclusive:
            return WindowResult([], 0 if rows is None else len(rows), None, False)
        last = row_key(rows[-1], self.columns) if rows else None
        if rows and last is None:
            return WindowResult([], len(rows), None, False)
        if self._truncated:
            return WindowResult([], len(rows), last, True)
        if not self._dropped:  # the common case: no event of the table in the window
            return WindowResult(rows if type(rows) is EncodedChunk else list(rows), len(rows), last, True)
        dropped = self._dropped
        if type(rows) is EncodedChunk and not self.by_identity:
            return WindowResult(_drop_encoded(rows, dropped), len(rows), last, True)
        if self.by_identity:
            return WindowResult([r for r in rows if self._identity(r) not in dropped], len(rows), last, True)
        if rows and type(rows[0]) is EncodedRow:  # the fast readers' rows carry their key
            try:  # a key of scalars is its own match key (hashable() changes nothing)
                kept = [r for r in rows if r[0] not in dropped]  # type: ignore[index]
            except TypeError:  # a list or an object in the key: not hashable as is
                kept = [r for r in rows if match_key(r.chunk_key) not in dropped]  # type: ignore[union-attr]
        else:
            kept = [r for r in rows if _key(r, self.columns) not in dropped]
        return WindowResult(kept, len(rows), last, True)

    def _identity(self, row: Row) -> MatchKey:
        """A row's identity in the form ``_observe_identity`` drops (an encoded row
        carries it as its event key's JSON)."""
        if type(row) is EncodedRow:
            ident = orjson.loads(row.key_json)
        else:
            assert isinstance(row, dict)
            ident = {c: row.get(c) for c in self._ident_cols}
        return _ident_key(ident)


def _drop_encoded(chunk: EncodedChunk, dropped: set[MatchKey]) -> EncodedChunk:
    """``chunk`` without the rows whose key is in ``dropped``. Integer keys (ascending in
    the chunk, as in the database) are found by bisection, after a check against the
    chunk's range that spares most windows decoding any key at all."""
    if not chunk.size:
        return chunk
    if chunk.int_keys:
        lo, hi = chunk.key_at(0), chunk.key_at(-1)
        try:
            inside = [d for d in dropped if lo <= d <= hi]
        except TypeError:  # a key of another type: decide key by key below
            pass
        else:
            if not inside:
                return chunk
            values = chunk.key_values()  # the integers themselves: key i is (values[i],)
            at = [(bisect_left(values, d[0]), d[0]) for d in inside]
            return chunk.without({i for i, v in at if values[i] == v})
    keys = chunk.key_list()
    try:  # a key of scalars is its own match key (hashable() changes nothing)
        drop = {i for i, k in enumerate(keys) if k in dropped}
    except TypeError:  # a list or an object in the key: not hashable as is
        drop = {i for i, k in enumerate(keys) if match_key(k) in dropped}
    return chunk.without(drop)


def _ident_key(ident: dict[str, Any]) -> MatchKey:
    """An identity (column -> value) as a hashable key, independent of column order."""
    return tuple(sorted((str(k), hashable(v)) for k, v in ident.items()))


def _key(row: Row, columns: tuple[str, ...]) -> MatchKey | None:
    raw = row_key(row, columns)
    return None if raw is None else match_key(raw)


def keyed(rows: Sequence[Row], columns: tuple[str, ...]) -> bool:
    """Every row carries every key column (a reader's answer a window can judge)."""
    n = len(columns)
    if type(rows) is EncodedChunk:
        return rows.arity == n
    if rows and type(rows[0]) is EncodedRow:  # the common, fast case
        return all(type(r) is EncodedRow and len(r[0]) == n for r in rows)
    return all(row_key(row, columns) is not None for row in rows)


def last_key(rows: Sequence[Row], columns: tuple[str, ...]) -> RawKey | None:
    """The key of the last row (None: no rows)."""
    if not rows:
        return None
    return row_key(rows[-1], columns)
