"""Core settings and the adaptive chunk size."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """How the snapshot core plans chunks.

    ``chunk_size``: rows per chunk (the first chunk's size when ``adaptive``).
    ``adaptive``: after each chunk, double the size if the SELECT took less than half of
    ``time_budget_ms``, halve it if it took more than ``time_budget_ms``, else keep it;
    always clamped to ``[min_chunk, max_chunk]``. A retriable read failure (e.g. a
    statement timeout) also halves it when adaptive.
    ``max_attempts``: consecutive failures of one table's requests (of unknown kind)
    before the table is dropped with a REJECTED notification.
    ``read_ahead``: plan a table's next chunk as soon as the current one's rows are read,
    before its high watermark arrives, so the worker reads chunk n+1 while the runner
    emits chunk n (``core.readahead``).
    ``read_only``: incremental chunks write no watermarks; each read comes with a
    ``ReadFence`` instead (``core.fence``).
    ``parallelism``: chunks of a table read at once, each with its own window
    (``core.flight``); 1 reads one chunk at a time (with ``read_ahead``).
    ``fenced``: watermark windows (L/H) are also judged by each read's ``ReadFence``:
    an event the read did not see drops its key even if the stream delivered it before
    L (PostgreSQL decodes a commit before it becomes visible). Every windowed request
    then carries ``fenced`` as well as its watermarks (``core.fence``); implied by
    ``read_only``. It fences blocking reads too.
    ``fenced_blocking``: blocking reads (table starts and chunks) are fenced and judged
    as ``fenced`` makes them (``core.blocking``), watermark windows are
    not: MySQL/MariaDB, whose windows are exact without fences (L commits after any
    commit the stream has), but whose stream can deliver a commit before it is visible
    (semi-synchronous replication, ``AFTER_SYNC``) while no L orders a blocking read.
    Only the blocking lane's tables' events are then kept (``core.fence.Unsettled``).
    ``slice_rows``: concurrent windows (``parallelism > 1``) hand their rows out in
    slices of this many rows read (and of about ``slice_bytes`` of an encoded chunk's
    tails, if set): one at H, the next ones at each ``on_boundary`` the runner calls
    (``core.flight``, "Slices"); 0 emits each window whole at H.
    """

    chunk_size: int = 1024
    adaptive: bool = False
    time_budget_ms: float = 75.0
    min_chunk: int = 64
    max_chunk: int = 65536
    max_attempts: int = 3
    read_ahead: bool = True
    read_only: bool = False
    parallelism: int = 1
    fenced: bool = False
    fenced_blocking: bool = False
    slice_rows: int = 0
    slice_bytes: int = 0

    def __post_init__(self) -> None:
        if self.slice_rows < 0 or self.slice_bytes < 0:
            raise ValueError(f"slice_rows and slice_bytes must be >= 0, not {self.slice_rows}, {self.slice_bytes}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, not {self.chunk_size}")
        if not 1 <= self.min_chunk <= self.max_chunk:
            raise ValueError(
                f"need 1 <= min_chunk <= max_chunk, got {self.min_chunk}, {self.max_chunk}"
            )
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, not {self.max_attempts}")
        if self.parallelism < 1:
            raise ValueError(f"parallelism must be >= 1, not {self.parallelism}")
        if self.time_budget_ms <= 0:
            raise ValueError(f"time_budget_ms must be > 0, not {self.time_budget_ms}")

    def clamp(self, size: int) -> int:
        if not self.adaptive:
            return self.chunk_size
        return max(self.min_chunk, min(self.max_chunk, size))


def next_chunk_size(settings: CoreSettings, current: int, read: int, elapsed_ms: float) -> int:
    """The size of the next chunk after one of ``current`` rows returned ``read`` rows in
    ``elapsed_ms``. A short chunk (``read < current``, the table's end) says nothing about
    speed, so it never grows the size."""
    if not settings.adaptive:
        return settings.chunk_size
    if elapsed_ms > settings.time_budget_ms:
        return settings.clamp(current // 2)
    if elapsed_ms < settings.time_budget_ms / 2 and read >= current:
        return settings.clamp(current * 2)
    return settings.clamp(current)


def shrink(settings: CoreSettings, current: int) -> int:
    """The size after a retriable failure of a chunk read."""
    return settings.clamp(current // 2)


def default_parallelism(cpus: int | None, free_connections: int) -> int:
    """``[snapshot] parallelism`` when unset: half the machine's cores (at least 2, at
    most 4), and no more than a tenth of the server's free connections (at least 1)."""
    want = max(2, min(4, (cpus or 2) // 2))
    return max(1, min(want, free_connections // 10))
