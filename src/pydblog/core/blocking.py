"""Blocking snapshots: the blocking lane read while the stream is paused, IO-free.

While the blocking lane has a table, the runner keeps the stream paused at a
transaction boundary and calls ``SnapshotCore.on_stream_paused`` once; the position
then taken is the *anchor*, and every event of the blocking snapshot (rows and
notifications) is placed at ``anchor.index + 1 + k``, k counting on across calls.

Invariants:

- Nothing is read before the anchor is set, and one blocking request is outstanding
  at a time (``request``); its answer takes effect at once (no watermarks, no window:
  no event comes while the stream is paused).
- A blocking chunk's rows are emitted whole, and the table's progress moves to its
  last key read (``Run.chunk_done``); a chunk whose rows lack the key is never
  emitted.
- Fenced blocking reads (``Fencing.fenced_blocking``): a chunk is judged as a fenced
  window that closes at once (``_judge``): the kept events of its table the read did
  not see drop their keys (the event stands for the row), and a read whose fence
  does not cover the table's floor, or what was forgotten, is read again.
- The anchor is dropped when the blocking lane is empty: the positions after it
  belong to the stream again.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydblog.core.fence import FencedWindow, Fencing, ReadFence
from pydblog.core.notices import Notice, Outbox, PositionCursor
from pydblog.core.planner import Planner, window_for
from pydblog.core.requests import ChunkRequest, Request
from pydblog.core.rereads import RereadQueue
from pydblog.core.run import Run, StartAnswer
from pydblog.core.window import WindowResult, last_key
from pydblog.events import ChunkRow, Emitted
from pydblog.positions import Position


class BlockingReads:
    """The blocking lane's reads: the anchor and the one request outstanding (see the
    module docstring)."""

    __slots__ = ("_fencing", "_out", "_planner", "_rereads", "_run", "anchor", "read_again",
                 "request")

    def __init__(
        self, run: Run, planner: Planner, fencing: Fencing, out: Outbox, rereads: RereadQueue,
    ) -> None:
        self._run = run
        self._planner = planner
        self._fencing = fencing
        self._out = out
        self._rereads = rereads
        self.anchor: PositionCursor | None = None
        self.request: Request | None = None
        self.read_again = 0  # fenced reads that could not decide (this process)

    def next_request(self) -> Request | None:
        """The blocking lane's next request, once the stream is paused (None before)."""
        job = self._run.block.head()
        if self.anchor is None or job is None:
            return None
        self.request = self._planner.plan(job, blocking=True)
        return self.request

    def owns(self, request_id: str) -> bool:
        return self.request is not None and self.request.id == request_id

    def on_paused(self, horizon: Position, ts_ms: int) -> None:
        self.anchor = PositionCursor(horizon, ts_ms)

    def on_started(self, answer: StartAnswer) -> list[Emitted]:
        """The answer to the blocking start: the table is started, empty or rejected."""
        self.request = None
        return self._emit([], self._run.start(self._run.block, answer))

    def on_rows(
        self, rows: Sequence[ChunkRow], elapsed_ms: float, fence: ReadFence | None,
    ) -> list[Emitted]:
        """The rows of the outstanding blocking chunk (``owns``)."""
        request = self.request
        assert isinstance(request, ChunkRequest)
        self.request = None
        self._planner.resize(request, len(rows), elapsed_ms)
        if request.fenced and fence is not None:
            return self._judge(request, rows, fence)
        job, cursor = self._run.block.current, self.anchor
        last = last_key(rows, request.key_columns)
        if job is None or cursor is None or (rows and last is None):
            return []
        result = WindowResult(rows, len(rows), last, True)
        events = self._out.job_rows(job, rows, cursor)
        return self._emit(events, self._run.chunk_done(self._run.block, request, result))

    def on_failed(self, error: str, retriable: bool | None) -> list[Emitted]:
        """The outstanding request failed: planned again, or the table is dropped."""
        request, self.request = self.request, None
        assert request is not None
        self._planner.failed(request)
        return self._emit([], self._run.failed(self._run.block, request, error, retriable))

    def stopped(self) -> None:
        """Tables were stopped: a request of a table no longer running is forgotten, and
        the anchor with the lane."""
        if self.request is not None and self._run.block.current is None:
            self.request = None
        if not self._run.block:
            self.anchor = None

    def _emit(self, rows: list[Emitted], notices: list[Notice]) -> list[Emitted]:
        cursor = self.anchor
        assert cursor is not None
        events = rows + self._out.place(cursor, notices)
        if not self._run.block:
            self.anchor = None
        return events

    def _judge(
        self, request: ChunkRequest, rows: Sequence[ChunkRow], fence: ReadFence
    ) -> list[Emitted]:
        """A fenced blocking chunk (``CoreSettings.fenced``, read-only too): its SELECT
        can miss a commit the stream delivered before the pause (PostgreSQL decodes a
        commit before it becomes visible: one waiting for a synchronous standby, a
        lagging hot standby), and the paused stream will not deliver it again, so the
        stale row would land after that newer event for good. The chunk is judged as a
        fenced window that closes at once (no event comes while the stream is paused):
        the kept events of its table the read did not see drop their keys (the event
        stands for the row), and a read whose fence does not cover the table's floor
        (events delivered before it was queued, not kept) or what was forgotten is read
        again (``read_again``)."""
        job = self._run.block.current
        cursor = self.anchor
        if job is None or cursor is None or job.table != request.table:
            return []
        window = FencedWindow(window_for(job, request), self._fencing.unsettled)
        window.set_answer(rows, fence)
        self._fencing.prune(fence, request.id)
        result = window.close()
        if not result.conclusive:
            self.read_again += 1
            return []  # the same chunk is planned again
        self._rereads.add_all(job.schema_name, job.table_name, result.reread)
        events = self._out.job_rows(job, result.rows, cursor)
        return self._emit(events, self._run.chunk_done(self._run.block, request, result))
