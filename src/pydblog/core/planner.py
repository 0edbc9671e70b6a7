"""How the snapshot core words its requests: ids, watermarks, fences, chunk size. IO-free.

Every request the core hands the worker (``core.requests``) is built here, so the
rules that decide its shape live in one place:

- Ids are ``<instance>-<prefix><n>``: the instance is random per core, ``n`` counts up,
  so ids (and the watermark ids derived from them, ``<id>:low`` / ``<id>:high`` /
  ``<id>:start`` / ``<id>:mark``) are unique across restarts: a watermark of a request
  a previous process issued is never mistaken for one of this process.
- Incremental requests name watermarks unless the snapshot is read-only (a read-only
  read is fenced by its own snapshot instead); blocking requests never do (the stream
  is paused).
- ``fenced`` is set on incremental requests when windows are fenced
  (``CoreSettings.fenced`` or ``read_only``), on blocking ones when blocking reads are
  (those, or ``CoreSettings.fenced_blocking``); a fenced request carries the open
  floor's position (``floor``, ``core.fence.Floor``) when there is one.
- The chunk size (``chunk_size``) adapts after each read (``sizing.next_chunk_size``)
  and halves after a failed chunk read (``sizing.shrink``); it is always within the
  settings' clamp, and it is what ``SnapshotCore.state()`` persists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydblog.core.intsplit import as_planned, cap
from pydblog.core.progress import TableJob
from pydblog.core.requests import (
    BoundsRequest,
    ChunkRequest,
    KeyReadRequest,
    MarkRequest,
    Request,
    TableStartRequest,
)
from pydblog.core.sizing import CoreSettings, next_chunk_size, shrink
from pydblog.core.window import ChunkWindow
from pydblog.positions import Position


class Planner:
    """Builds the core's requests (see the module docstring for the rules).

    ``floor``: the position of the open floor of fenced reads, if any (asked for every
    fenced request)."""

    __slots__ = ("_floor", "_instance", "_seq", "chunk_size", "fenced", "fenced_blocking",
                 "marks", "settings")

    def __init__(
        self, settings: CoreSettings, instance: str, floor: Callable[[], Position | None],
    ) -> None:
        self.settings = settings
        self._instance = instance
        self._seq = 0
        self._floor = floor
        self.chunk_size = settings.clamp(settings.chunk_size)
        self.marks = not settings.read_only  # incremental requests name watermarks
        self.fenced = settings.read_only or settings.fenced
        self.fenced_blocking = self.fenced or settings.fenced_blocking

    def new_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{self._instance}-{prefix}{self._seq}"

    # -- the chunk size -------------------------------------------------------------------

    def restore_size(self, size: int) -> None:
        self.chunk_size = self.settings.clamp(size)

    def resize(self, request: Request, read: int, elapsed_ms: float) -> None:
        """After a chunk read of ``read`` rows in ``elapsed_ms``."""
        if isinstance(request, ChunkRequest):
            self.chunk_size = next_chunk_size(self.settings, request.limit, read, elapsed_ms)

    def resize_planned(self, planned: int, read: int, elapsed_ms: float) -> None:
        """After the read of an arithmetic range cut for ``planned`` rows (``intsplit``)."""
        read, elapsed_ms = as_planned(planned, read, elapsed_ms)
        self.chunk_size = next_chunk_size(self.settings, planned, read, elapsed_ms)

    def failed(self, request: Request) -> None:
        """A request failed: a chunk read is halved (adaptive)."""
        if isinstance(request, ChunkRequest):
            self.chunk_size = shrink(self.settings, self.chunk_size)

    @property
    def step(self) -> int:
        """Rows a range or bounds step is cut for (at least 1)."""
        return max(1, self.chunk_size)

    # -- requests -------------------------------------------------------------------------

    def plan(self, job: TableJob, *, blocking: bool) -> Request:
        """The next request of a table read one chunk at a time: its start, else its
        next chunk after its progress."""
        rid = self.new_id("blk" if blocking else "inc")
        marks = not blocking and self.marks
        fenced = self.fenced_blocking if blocking else self.fenced
        if not job.started:
            return TableStartRequest(
                rid, job.table, job.kind, job.surrogate_key, job.condition,
                f"{rid}:start" if marks else None,
                fenced=fenced,  # blocking reads too: see ``blocking.BlockingReads``
                floor=self._floor(),
            )
        assert job.key_columns is not None and job.max_key is not None
        return ChunkRequest(
            id=rid,
            table=job.table,
            kind=job.kind,
            surrogate_key=job.surrogate_key,
            key_columns=job.key_columns,
            after_key=job.last_key,
            max_key=job.max_key,
            limit=self.chunk_size,
            condition=job.condition,
            low_watermark=f"{rid}:low" if marks else None,
            high_watermark=f"{rid}:high" if marks else None,
            fenced=fenced,
            identity=job.identity or (),
            floor=self._floor(),
        )

    def start_concurrent(self, job: TableJob) -> TableStartRequest:
        """The start of a table read in concurrent windows (``core.flight``)."""
        rid = self.new_id("inc")
        return TableStartRequest(
            rid, job.table, job.kind, job.surrogate_key, job.condition,
            f"{rid}:start" if self.marks else None, concurrent=True, fenced=self.fenced,
            floor=self._floor(),
        )

    def range_read(
        self, job: TableJob, after: tuple[Any, ...] | None, upper: tuple[Any, ...], planned: int,
    ) -> ChunkRequest:
        """The read of one range ``(after, upper]`` of concurrent windows (``planned``:
        the rows an arithmetic range was cut for, its ``LIMIT`` is ``intsplit.cap`` of
        it; 0: the chunk size)."""
        assert job.key_columns is not None
        rid = self.new_id("inc")
        marks = self.marks
        return ChunkRequest(
            id=rid, table=job.table, kind=job.kind, surrogate_key=None,
            key_columns=job.key_columns, after_key=after, max_key=upper,
            limit=cap(planned) if planned else self.chunk_size, condition=job.condition,
            low_watermark=f"{rid}:low" if marks else None,
            high_watermark=f"{rid}:high" if marks else None,
            fenced=self.fenced, identity=job.identity or (), concurrent=True,
            floor=self._floor(),
        )

    def bounds(self, job: TableJob, after: tuple[Any, ...] | None) -> BoundsRequest:
        """Boundary keys after ``after``: ``2·parallelism`` steps of ``step`` rows."""
        assert job.key_columns is not None and job.max_key is not None
        return BoundsRequest(
            self.new_id("bnd"), job.table, job.key_columns, after, job.max_key, self.step,
            2 * self.settings.parallelism, job.condition, job.identity or (),
        )

    def reread(
        self, schema: str, table: str, identity: tuple[str, ...], keys: tuple[tuple[Any, ...], ...],
    ) -> KeyReadRequest:
        """A key-level re-read (``core.rereads``)."""
        rid = self.new_id("key")
        marks = self.marks  # read-only: fenced by the read's own snapshot
        return KeyReadRequest(
            rid, f"{schema}.{table}", identity, keys, f"{rid}:low" if marks else None,
            f"{rid}:high" if marks else None, fenced=self.fenced,
            floor=self._floor(),
        )

    def mark(self) -> MarkRequest:
        rid = self.new_id("m")
        return MarkRequest(rid, f"{rid}:mark")


def window_for(job: TableJob, request: ChunkRequest) -> ChunkWindow:
    """A chunk's window: by chunk key when that is the row identity (the common, fast
    case), else by row identity (a surrogate key, whose values may repeat; a primary key
    beside a ``REPLICA IDENTITY USING INDEX``): stream events name rows by identity."""
    by_identity = request.surrogate_key is not None or (
        job.identity is not None and set(job.identity) != set(request.key_columns)
    )
    return ChunkWindow(
        job.schema_name, job.table_name, request.key_columns, by_identity=by_identity,
        identity=job.identity or (),
    )
