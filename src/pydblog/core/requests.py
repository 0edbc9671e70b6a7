"""What the snapshot core asks the runner's workers to do (one request at a time, or
several at once with concurrent windows: ``core.flight``).

Every request has a unique ``id`` and names fresh watermark ids (unique across restarts:
they carry the core's random instance id). The worker's duty per kind, in order:

``TableStartRequest`` (incremental: ``watermark`` set; blocking: None)
    1. ``info = reader.table_info(table, surrogate_key)``; if ``condition``:
       ``reader.check_filter(info, condition)``; ``max_key = reader.max_key(info, condition)``
    2. ``core.on_table_started(id, info, max_key, error=None)`` (or ``error=str(exc)`` for a
       bad filter / surrogate key; ``on_request_failed`` for a transient failure)
    3. incremental only: ``reader.write_watermark(watermark)``. The answer takes effect
       when that watermark comes back through the stream.

``ChunkRequest`` (incremental: both watermarks set; blocking: both None)
    1. incremental only: ``reader.write_watermark(low_watermark)``
    2. ``info = reader.table_info(table, surrogate_key)`` (fresh: columns may have
       changed since the previous chunk), ``rows = reader.read_chunk(info, after_key,
       max_key, limit, condition)``: rows with ``after_key < key <= max_key`` in key order
       (``after_key`` None: from the first row)
    3. ``core.on_chunk_read(id, rows, elapsed_ms)`` -- for incremental chunks this MUST
       happen before the stream delivers the high watermark
    4. incremental only: ``reader.write_watermark(high_watermark)``

``KeyReadRequest`` (a key-level re-read, see ``core.rereads``; always incremental)
    1. ``reader.write_watermark(low_watermark)``
    2. ``info = reader.table_info(table)`` with ``identity`` as chunk key and identity,
       ``rows = reader.read_keys(info, keys)``: the rows whose identity is one of
       ``keys`` (in ``identity`` order), in key order
    3. ``core.on_chunk_read(id, rows, elapsed_ms)`` before the stream delivers H
    4. ``reader.write_watermark(high_watermark)``

``KeyReadRequest`` with ``fenced`` (read-only snapshots: no watermarks)
    1. ``info`` as above; ``rows, fence = reader.read_keys_fenced(info, keys)``
    2. ``core.on_chunk_read(id, rows, elapsed_ms, fence=fence)``; the rows land at the
       first ``core.on_progress`` whose ``reached`` the fence has passed.

``ChunkRequest`` with ``fenced`` (read-only snapshots: no watermarks)
    1. ``info = reader.table_info(...)``; ``rows, fence = reader.read_chunk_fenced(info,
       after_key, max_key, limit, condition)``: the rows as above and the ``ReadFence``
       of the read's own snapshot (``core.fence``); nothing is written to the source
    2. ``core.on_chunk_read(id, rows, elapsed_ms, fence=fence)``. The rows land at the
       first ``core.on_progress`` whose ``reached`` the fence has passed.
    A ``TableStartRequest`` without a watermark in a read-only snapshot takes effect at
    the next ``core.on_progress``. Blocking requests of a fenced core (read-only, or
    ``CoreSettings.fenced``) are fenced too: their answers take effect at once, as
    without a fence, unless the fence cannot decide (the read is planned again).

``TableStartRequest`` with ``concurrent`` (concurrent windows): as above, on any of the
    pool's forked readers, beside the range and bounds requests of other tables.

``BoundsRequest`` (concurrent windows, ``core.flight``; no watermark)
    ``info = reader.table_info(table)``, ``keys = reader.chunk_bounds(info, after_key,
    max_key, step, count, condition)``: the keys of the ``step``-th, ``2·step``-th, ...
    row after ``after_key`` (at most ``count``, none beyond ``max_key``), ascending;
    then ``core.on_bounds(id, keys)``. Bounds only cut the key space into ranges; each
    range is then read by a ``ChunkRequest`` (``max_key`` = the range's upper key) with
    its own window, and several may be in flight at once.

``MarkRequest``
    ``reader.write_watermark(watermark)``: gives notifications that wait for a position
    (e.g. after a failed table) a place in the log. No answer is expected.

If any step fails: ``core.on_request_failed(id, error, retriable)`` (also when a final
watermark could not be written after the answer was given), and do not write the
remaining watermarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydblog.events import SnapshotKind
from pydblog.positions import Position


@dataclass(frozen=True, slots=True)
class TableStartRequest:
    """Look the table up and take its max key (the snapshot's upper bound).

    ``concurrent``: the start of a table read in concurrent windows (``core.flight``):
    the worker may run it beside the other tables' range and bounds requests.
    ``fenced`` (read-only, and fenced watermark windows, ``CoreSettings.fenced``): the
    max key is read as a fenced chunk is (``max_key_fenced``), and answered with its
    read's fence (``SnapshotCore.on_table_started``); a watermark, if any, is still
    written after the answer."""

    id: str
    table: str
    kind: SnapshotKind
    surrogate_key: str | None
    condition: str | None
    watermark: str | None
    concurrent: bool = False
    fenced: bool = False
    floor: Position | None = None


@dataclass(frozen=True, slots=True)
class ChunkRequest:
    """Read one chunk: ``after_key < key <= max_key``, key order, at most ``limit`` rows.

    ``key_columns`` are the key columns fixed when the table started (the primary key or
    the surrogate key); ``identity`` the row identity fixed then (``TableInfo.identity``;
    empty: as the reader says); the reader re-reads the other columns' list itself.
    ``concurrent``: one range of concurrent windows (``core.flight``): the worker may
    run it beside other such requests; every other request runs alone, in order.
    ``floor`` (fenced requests, here and in ``KeyReadRequest``/``TableStartRequest``):
    the read's fence must cover it (``core.fence.Floor``) or the read is wasted; a
    reader that can (a hot standby) waits, bounded, until it has replayed past it.
    """

    id: str
    table: str
    kind: SnapshotKind
    surrogate_key: str | None
    key_columns: tuple[str, ...]
    after_key: tuple[Any, ...] | None
    max_key: tuple[Any, ...]
    limit: int
    condition: str | None
    low_watermark: str | None
    high_watermark: str | None
    identity: tuple[str, ...] = ()
    fenced: bool = False
    concurrent: bool = False  # a range of ``core.flight``: may run beside others
    floor: Position | None = None

    @property
    def blocking(self) -> bool:
        return self.kind is SnapshotKind.BLOCKING


@dataclass(frozen=True, slots=True)
class KeyReadRequest:
    """Re-read the rows of ``table`` whose identity is one of ``keys`` (values in
    ``identity`` order), through a window of their own (L, SELECT, H; read-only
    snapshots: ``fenced``, the read's own fence and no watermarks)."""

    id: str
    table: str
    identity: tuple[str, ...]
    keys: tuple[tuple[Any, ...], ...]
    low_watermark: str | None
    high_watermark: str | None
    fenced: bool = False
    floor: Position | None = None


@dataclass(frozen=True, slots=True)
class BoundsRequest:
    """Cut ``after_key < key <= max_key`` into ranges of ``step`` rows: the keys of the
    ``step``-th, ``2·step``-th, ... row (at most ``count``), by an index-only query."""

    id: str
    table: str
    key_columns: tuple[str, ...]
    after_key: tuple[Any, ...] | None
    max_key: tuple[Any, ...]
    step: int
    count: int
    condition: str | None
    identity: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MarkRequest:
    """Write one watermark and nothing else."""

    id: str
    watermark: str


Request = TableStartRequest | ChunkRequest | KeyReadRequest | MarkRequest | BoundsRequest
