"""The snapshot core: DBLog incremental (and blocking) snapshots, IO-free.

Events in, events out. The runner feeds it the stream and the worker's answers; it
returns the events to log (snapshot rows ``op: r`` and notifications ``op: n``) and
tells the runner what to read next. It does no IO, reads no clock and starts no
thread; it is not thread-safe (call it from the runner's thread only).

API (see docs/snapshots.md for the whole protocol)::

    core = SnapshotCore(CoreSettings(...), state=checkpoint.snapshot)
    core.on_signal(signal, captured_tables, position, ts_ms) -> [notification]
    core.on_signal_error(signal_id, error, position, ts_ms)  -> [REJECTED notification]
    core.start_initial(captured_tables, position=None, ts_ms=None) -> []  # mode "initial"
    core.next_request() -> TableStartRequest | ChunkRequest | MarkRequest | None
    core.on_table_started(request_id, info, max_key, error) -> [events] (blocking only)
    core.on_chunk_read(request_id, rows, elapsed_ms)         -> [events] (blocking only)
    core.on_request_failed(request_id, error, position=None, ts_ms=None,
                           *, retriable=None)                -> [events] (blocking only)
    core.on_watermark(watermark_id, position, ts_ms)          -> [r rows, notifications]
    core.on_event(event) -> None          # every captured stream event, in stream order
    core.on_boundary(position, ts_ms, budget=None) -> [r rows, notifications]  # slices
    core.on_stream_paused(position, ts_ms) -> None            # blocking: stream stopped
    core.state() -> dict | None           # persist with the checkpoint
    core.status() -> dict;  core.active;  core.blocking;  core.paused;  core.draining

Invariants (each mode's own rules are stated in the module that owns it):

- Requests outstanding: ``next_request`` returns None while no further request may go
  out. Without concurrent windows that is one request until it is answered
  (``on_table_started`` / ``on_chunk_read`` / ``on_request_failed``), plus, with
  read-ahead, the table's next chunk once the previous chunk's rows are in
  (``core.readahead``); with concurrent windows (``CoreSettings.parallelism > 1``,
  ``core.concurrent``) up to ``parallelism`` requests at once, each chunk with its own
  window. Every request is worded by ``core.planner``.
- An incremental request's effect lands only at its final watermark (read-only: at the
  ``on_progress`` whose ``reached`` passed its fence), so ``state()`` changes only at
  positions the stream has delivered, and ``state()`` taken after the returned events
  are logged is exactly what a restart needs (``core.run``: progress moves only with
  emitted rows).
- Incremental rows are emitted at H, at ``H.index + 1 + k``; a row whose key had a
  table event between L and H is dropped (``window.ChunkWindow``). A table's progress
  moves to the key of the chunk's last row *read*.
- Watermark ids the core does not expect (an interrupted chunk's, after a restart) are
  ignored; the interrupted chunk is read again with new watermarks.
- Key-level re-reads (``core.rereads``): queued keys are read (``KeyReadRequest``)
  before any chunk, also while paused (they are repairs); their rows land at their H
  under the same window rules. ``active`` is True while keys are queued.
- Blocking snapshots (``core.blocking``): while ``blocking`` is True the runner keeps
  the stream paused (at a transaction boundary) and calls ``on_stream_paused`` once;
  then the core issues requests without watermarks and returns rows directly,
  positioned after the anchor.
- Read-only snapshots and fenced windows (``CoreSettings.read_only`` / ``fenced`` /
  ``fenced_blocking``, ``core.fence``): a read answers with a ``ReadFence``; read-only
  rows are emitted at the first ``on_progress`` whose ``reached`` the fence has
  passed, and a table start and waiting notices take effect at the next
  ``on_progress``. Call ``on_progress`` only at transaction boundaries.
- Slices (``CoreSettings.slice_rows``, concurrent windows only): a range's rows land a
  slice at a time, the first at its H (or passed fence), the rest at ``on_boundary``
  calls while ``draining``; call it only at transaction boundaries.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pydblog.core.blocking import BlockingReads
from pydblog.core.commands import (
    pause_notice,
    plan_execute,
    plan_initial,
    rejected_signal,
    resume_notice,
    stop_matcher,
    stop_notice,
)
from pydblog.core.concurrent import NO_FENCE, NO_KEY, ConcurrentWindows
from pydblog.core.fence import Fencing, ReadFence
from pydblog.core.notices import Notice, Outbox, PositionCursor
from pydblog.core.planner import Planner, window_for
from pydblog.core.progress import Lane
from pydblog.core.readahead import Pending, continues, next_chunk
from pydblog.core.requests import (
    ChunkRequest,
    KeyReadRequest,
    MarkRequest,
    Request,
    TableStartRequest,
)
from pydblog.core.rereads import RereadQueue
from pydblog.core.run import Run, StartAnswer
from pydblog.core.signals import Signal, SignalType
from pydblog.core.sizing import CoreSettings
from pydblog.core.window import ChunkWindow, keyed
from pydblog.events import ChangeEvent, ChunkRow, Emitted, SnapshotKind
from pydblog.ports import TableInfo
from pydblog.positions import Position

STATE_VERSION = 1


class SnapshotCore:
    """DBLog snapshot state machine; see the module docstring for the protocol.

    State (``*`` = persisted by ``state()``; the rest is in-flight and dropped by a
    restart, which makes the core plan that work again):

    - ``_run``*: the incremental and blocking lanes of table jobs (``_incr``,
      ``_block``), the pause flag and the run's counters (``core.run``);
    - ``_rereads``*: identities waiting for a key-level re-read (``core.rereads``);
    - ``_planner``*: request ids and the adaptive chunk size (``core.planner``);
    - ``_fencing``*: the fenced modes' kept events and floor (``core.fence``);
    - ``_out``*: notifications waiting for a position (placed at the next watermark)
      and the horizon, the highest position seen or emitted (blocking anchors there);
    - ``_busy``: the id of the one request whose answer is awaited;
    - ``_pending``: the incremental request awaiting its final watermark, and
      ``_window``: its chunk window once L has been seen (what ``on_event`` checks);
    - ``_ahead``: the read-ahead chunk request planned behind ``_pending``;
    - ``_mark``: an outstanding ``MarkRequest``;
    - ``_blocking``: the blocking lane's anchor and outstanding request
      (``core.blocking``); ``_concurrent``: the flights of concurrent windows
      (``core.concurrent``).
    """

    def __init__(
        self,
        settings: CoreSettings,
        state: dict[str, Any] | None = None,
        *,
        instance: str | None = None,
    ) -> None:
        self._settings = settings
        self._planner = Planner(
            settings, instance if instance is not None else uuid.uuid4().hex[:12],
            self._floor_hint,
        )
        self._run = Run(settings, finished=self._table_finished, changed=self._watch,
                        settle=self._settle)
        self._out = Outbox()  # the horizon, and notices waiting for a position
        self._pending: Pending | None = None
        self._window: ChunkWindow | None = None
        self._ahead: Pending | None = None
        self._busy: str | None = None
        self._mark: MarkRequest | None = None
        self._rereads = RereadQueue()
        self._fencing = Fencing(settings.read_only, settings.fenced, settings.fenced_blocking)
        self._read_again = 0  # reads whose window was inconclusive (this process)
        # The blocking lane's anchor and outstanding request (``core.blocking``).
        self._blocking = BlockingReads(
            self._run, self._planner, self._fencing, self._out, self._rereads,
        )
        # Concurrent windows (``core.concurrent``, ``core.flight``).
        self._concurrent = ConcurrentWindows(
            settings, self._run, self._planner, self._fencing, self._out, self._rereads,
        )
        if state:
            self._restore(state)

    # -- properties ----------------------------------------------------------------

    @property
    def active(self) -> bool:
        """True while any table is queued or being read, or keys wait for a re-read."""
        return bool(self._incr) or bool(self._block) or bool(self._rereads)

    @property
    def blocking(self) -> bool:
        """True while a blocking snapshot needs the stream paused."""
        return bool(self._block)

    @property
    def paused(self) -> bool:
        return self._run.paused

    @property
    def _incr(self) -> Lane:
        return self._run.incr

    @property
    def _block(self) -> Lane:
        return self._run.block

    @property
    def waiting_for_progress(self) -> bool:
        """Read-only: an answered request, or a notification (a table rejected when no
        other was left), waits for ``on_progress`` (a passed fence, a table start, a
        position); the runner should make the stream report how far it is."""
        if not self._fencing.read_only:
            return False
        if self._out.waiting:
            return True
        if self._concurrent.waiting:
            return True
        pending = self._pending
        if pending is None:
            return False
        if isinstance(pending.request, TableStartRequest):
            return pending.answer is not None
        return pending.fence_in

    # -- signals -------------------------------------------------------------------

    def on_signal(
        self, signal: Signal, captured_tables: Sequence[str], position: Position, ts_ms: int
    ) -> list[Emitted]:
        """Apply a signal; returns exactly one notification, at the signal's position."""
        self._advance(position)
        if signal.type is SignalType.EXECUTE_SNAPSHOT:
            jobs, notice = plan_execute(signal, captured_tables, self._run.queued())
            self._run.enqueue(jobs)
        elif signal.type is SignalType.STOP_SNAPSHOT:
            notice = stop_notice(signal, self._stop(stop_matcher(signal), signal.id))
        elif signal.type is SignalType.PAUSE_SNAPSHOT:
            notice = pause_notice(signal, bool(self._incr), self._run.brief())
            self._run.paused = bool(self._incr)
        else:
            notice = resume_notice(signal, self._run.paused, self._run.brief())
            self._run.paused = False
        return [notice.event(position, ts_ms)]

    def on_signal_error(
        self, signal_id: str, error: str, position: Position, ts_ms: int
    ) -> list[Emitted]:
        """The REJECTED notification for a signal that ``parse_signal`` refused."""
        self._advance(position)
        return [rejected_signal(signal_id, error).event(position, ts_ms)]

    def start_initial(
        self,
        captured_tables: Sequence[str],
        position: Position | None = None,
        ts_ms: int | None = None,
    ) -> list[Emitted]:
        """Snapshot mode "initial": queue every captured table (incremental).

        Returns [] always: the STARTED notification waits for the first watermark (no
        position the runner has is free). ``position`` only raises the core's horizon;
        ``ts_ms`` is unused (kept so callers may pass it)."""
        if position is not None:
            self._advance(position)
        jobs, notice = plan_initial(captured_tables, self._run.queued())
        self._run.enqueue(jobs)
        if notice is not None:
            self._out.waiting.append(notice)
        return []

    def restart_table(self, table: str, *, queue: bool = False) -> None:
        """``table`` (qualified) now names another relation (dropped and created again;
        the runner has logged its truncate): progress that described the old one (chunk
        key, max key, last key) starts over with a new ``TableStartRequest``, and a
        request of it in flight is abandoned. With ``queue``, a table in no lane is
        queued (incremental; its STARTED notice waits for a watermark)."""
        pending = self._pending
        if pending is not None and getattr(pending.request, "table", None) == table:
            self._drop_pending()
        self._concurrent.forget(table)  # its requests' late answers are ignored
        for lane in (self._incr, self._block):
            lane.reset(table)
        if queue and table not in self._run.queued():
            self.start_initial([table])

    def _stop(self, matches: Callable[[str], bool], by: str) -> list[str]:
        """Remove the matching tables from both lanes (abandoning their in-flight work);
        returns them. ``by``: the stop-snapshot's signal id (``Run.stop``)."""
        current = self._incr.current
        dropped, notices = self._run.stop(matches, by)
        if current is not None and self._incr.current is None:
            self._drop_pending()
        self._concurrent.forget_gone()
        self._out.waiting.extend(notices)
        self._watch()
        self._blocking.stopped()
        self._settle()
        return [j.table for j in dropped]

    def _watch(self) -> None:
        """Fenced: the tables whose events must be kept until a fence settles them
        (``Fencing.watch``)."""
        if self._fencing.fenced_blocking:
            blocking = set(self._block.tables())
            tables = set(self._incr.tables()) | blocking | self._rereads.tables()
            self._fencing.watch(tables, blocking, self._out.horizon)

    # -- requests ------------------------------------------------------------------

    def next_request(self) -> Request | None:
        """The next thing for the worker, or None (idle, paused, or waiting for an answer,
        a watermark, or ``on_stream_paused``). Blocking work goes first."""
        request = self._next_request()
        if request is not None and getattr(request, "fenced", False):
            self._fencing.issue(request.id)
        return request

    def _next_request(self) -> Request | None:
        if self._busy is not None:
            return None
        if self._block:
            blocking = self._blocking.next_request()
            if blocking is not None:
                self._busy = blocking.id
            return blocking
        if self._pending is not None:
            return self._read_ahead()
        if self._concurrent.busy:
            concurrent = self._concurrent.next_request()
            if concurrent is not None or self._concurrent.busy:
                return concurrent
        if self._rereads:
            return self._plan_reread()
        job = None if self._run.paused else self._incr.head()
        if job is None:
            return self._next_mark()
        self._mark = None
        if self._concurrent.wants(job):
            return self._concurrent.next_request()
        request = self._planner.plan(job, blocking=False)
        self._pending = Pending(request)
        if isinstance(request, ChunkRequest):
            self._pending.window = window_for(job, request)
            self._pending.fence(self._fencing)
        self._busy = request.id
        return request

    def _read_ahead(self) -> Request | None:
        """Chunk n+1 of the current table while chunk n waits for its H
        (``core.readahead``), or None."""
        pending = self._pending
        if not self._settings.read_ahead or self._ahead is not None or self._run.paused or self._rereads:
            return None
        assert pending is not None
        job = self._incr.current
        ahead = next_chunk(pending, job, self._planner)
        if ahead is None or job is None:
            return None
        self._ahead = Pending(ahead, window=window_for(job, ahead))
        self._ahead.fence(self._fencing)
        self._busy = ahead.id
        return ahead

    def _plan_reread(self) -> KeyReadRequest | None:
        """A re-read of the first queued table's first keys (see ``core.rereads``)."""
        batch = self._rereads.next_batch()
        if batch is None:
            return None
        schema, table, identity, keys = batch
        request = self._planner.reread(schema, table, identity, keys)
        rid = request.id
        window = ChunkWindow(schema, table, identity)
        self._pending = Pending(request, window=window)
        self._pending.fence(self._fencing)
        self._busy = rid
        return request

    def _next_mark(self) -> MarkRequest | None:
        """A watermark for notices waiting for a position, once (a mark the runner never
        writes is superseded by the next request's watermarks, which place them too)."""
        if not self._out.waiting or self._mark is not None or self._fencing.read_only:
            return None  # read-only: notices are placed at the next on_progress
        self._mark = self._planner.mark()
        return self._mark

    def _floor_hint(self) -> Position | None:
        return self._fencing.floor_hint()

    # -- concurrent windows (core.concurrent) ----------------------------------------------

    def on_bounds(
        self, request_id: str, keys: Sequence[Sequence[Any]], integer: bool = False
    ) -> list[Emitted]:
        """The answer to a ``BoundsRequest``: boundary keys, ascending (returns []).
        ``integer``: the chunk key is one column of an integer type (the reader's
        ``integer_key``): the table's next ranges are cut by arithmetic
        (``core.intsplit``) instead of by more bounds queries."""
        self._concurrent.on_bounds(request_id, keys, integer)
        return []

    @property
    def draining(self) -> bool:
        """Some window has rows to hand out now (slices, ``on_boundary``)."""
        return self._concurrent.draining

    def on_boundary(self, position: Position, ts_ms: int, budget: int | None = None) -> list[Emitted]:
        """The stream is at a transaction boundary and ``position`` is the highest
        position logged so far: the next slices of the windows being emitted
        (``draining``), at most ``budget`` rows read (None: ``settings.slice_rows``),
        and the notifications that land with them, placed after ``position``. Call
        it only at transaction boundaries (a commit, or idle outside one)."""
        self._advance(position)
        if not self.draining or self._blocking.anchor is not None:
            return []  # (a blocking snapshot owns the positions after its anchor)
        assert self._out.horizon is not None
        cursor = PositionCursor(self._out.horizon, ts_ms)
        return self._concurrent.emit(cursor, None, budget) + self._out.place(cursor, [])

    # -- worker answers --------------------------------------------------------------

    def on_table_started(
        self,
        request_id: str,
        info: TableInfo | None,
        max_key: Sequence[Any] | None,
        error: str | None = None,
        fence: ReadFence | None = None,
    ) -> list[Emitted]:
        """The answer to a TableStartRequest. ``info`` None: no such table; ``max_key``
        None: the table (with its filter) is empty. Incremental: takes effect at the
        request's watermark (returns []). Blocking: takes effect now (returns events).
        Fenced (``request.fenced``: read-only, and fenced watermark windows too):
        ``fence`` is the max key's read's; a read that does not cover the floor may have
        missed rows that no event carries (committed before the stream's start, or
        before the table joined the publication) and that were not visible to it (a
        lagging standby, a commit waiting for a synchronous standby), so the start is
        read again (its watermark, if any, is then ignored)."""
        ours = self._concurrent.starts(request_id)
        if fence is not None and self._fencing.fenced_blocking and error is None \
                and not self._fencing.start_covered(fence, request_id):
            self._read_again += 1
            if ours:
                self._concurrent.starting = None  # the next request starts the table again
            elif self._blocking.owns(request_id):
                self._answer(request_id)
                self._blocking.request = None  # the next request starts it again
            elif self._answer(request_id) and self._pending is not None \
                    and self._pending.request.id == request_id:
                self._pending = None
            return []
        if ours:
            self._concurrent.on_started(
                request_id, StartAnswer(info, None if max_key is None else tuple(max_key), error)
            )
            return []
        if not self._answer(request_id):
            return []
        answer = StartAnswer(info, None if max_key is None else tuple(max_key), error)
        if self._pending is not None and self._pending.request.id == request_id:
            self._pending.answer = answer
            return []
        if self._blocking.owns(request_id):
            return self._blocking.on_started(answer)
        return []

    def on_chunk_read(
        self, request_id: str, rows: Sequence[ChunkRow], elapsed_ms: float,
        fence: ReadFence | None = None,
    ) -> list[Emitted]:
        """The rows of a ChunkRequest, in key order. Incremental: buffered until H (returns
        []); read-only (``request.fenced``): with the read's ``fence``, buffered until the
        stream has passed it. Blocking: emitted now, positioned after the anchor."""
        flight = self._concurrent.owner(request_id)
        if flight is not None:
            error = self._concurrent.on_rows(flight, request_id, rows, elapsed_ms, fence)
            if error is not None:
                return self.on_request_failed(request_id, error, retriable=False)
            return []
        if self._busy == request_id and fence is None and any(
            p is not None and p.request.id == request_id and p.fenced is not None
            for p in (self._pending, self._ahead)
        ):
            return self.on_request_failed(request_id, NO_FENCE,
                                          retriable=False)
        if self._busy == request_id and not keyed(rows, self._request_key(request_id)):
            return self.on_request_failed(request_id, NO_KEY, retriable=False)
        if not self._answer(request_id):
            return []
        for pending in (self._pending, self._ahead):
            if pending is not None and pending.request.id == request_id:
                self._planner.resize(pending.request, len(rows), elapsed_ms)
                if pending.fenced is not None and fence is not None:
                    pending.fenced.set_answer(rows, fence)
                    self._fencing.prune(fence, request_id)
                elif pending.window is not None:
                    pending.window.set_rows(rows)
                return []
        if self._blocking.owns(request_id):
            return self._blocking.on_rows(rows, elapsed_ms, fence)
        return []

    def on_request_failed(
        self,
        request_id: str,
        error: str,
        position: Position | None = None,
        ts_ms: int | None = None,
        *,
        retriable: bool | None = None,
    ) -> list[Emitted]:
        """A request failed (at any step, also when its final watermark could not be
        written after the answer was given).

        ``retriable`` True: plan it again; False: drop the table with a REJECTED
        notification; None (unknown): retry until ``settings.max_attempts`` consecutive
        failures, then drop the table. A retried chunk is halved when adaptive.
        Incremental: the REJECTED notification is placed at the next watermark (returns
        []). Blocking: returned now. ``position``/``ts_ms`` only raise the horizon (no
        position the runner has is free for a notification)."""
        if position is not None:
            self._advance(position)
        if self._concurrent.on_failed(request_id, error, retriable):
            return []
        if self._busy == request_id:
            self._busy = None
        if self._mark is not None and self._mark.id == request_id:
            self._mark = None
            return []
        if self._ahead is not None and self._ahead.request.id == request_id:
            self._ahead = None  # chunk n is still pending; n+1 is planned again after it
            return []
        pending = self._pending
        if pending is not None and pending.request.id == request_id:
            self._drop_pending()
            if isinstance(pending.request, KeyReadRequest) and pending.window is not None:
                self._reread_failed(pending.window, pending.request, retriable)
                return []
            self._out.waiting.extend(self._failed(self._incr, pending.request, error, retriable))
            return []
        if self._blocking.owns(request_id):
            return self._blocking.on_failed(error, retriable)
        return []

    def _failed(
        self, lane: Lane, request: Request, error: str, retriable: bool | None
    ) -> list[Notice]:
        """A table's request failed (``Run.failed``; a chunk read is halved)."""
        self._planner.failed(request)
        return self._run.failed(lane, request, error, retriable)

    def _reread_failed(
        self, window: ChunkWindow, request: KeyReadRequest, retriable: bool | None
    ) -> None:
        """A failed re-read (``RereadQueue.failed``)."""
        if self._rereads.failed(window.schema, window.table, request.keys, retriable,
                                self._settings.max_attempts):
            self._watch()
            self._settle()

    def _answer(self, request_id: str) -> bool:
        """Clear the busy flag; False for an answer nobody waits for any more."""
        if self._busy != request_id:
            return False
        self._busy = None
        return True

    def _request_key(self, request_id: str) -> tuple[str, ...]:
        """The key columns an answer's rows must carry."""
        pendings = [p.request for p in (self._pending, self._ahead) if p is not None]
        for request in (*pendings, self._blocking.request):
            if isinstance(request, ChunkRequest) and request.id == request_id:
                return request.key_columns
            if isinstance(request, KeyReadRequest) and request.id == request_id:
                return request.identity
        return ()

    @property
    def read_again(self) -> int:
        """Reads whose window could not decide, so far (this process): the driver backs
        off while they come in a row (``core.retry``)."""
        return self._read_again + self._concurrent.read_again + self._blocking.read_again

    # -- the stream ----------------------------------------------------------------

    def on_event(self, event: ChangeEvent) -> None:
        """A captured stream event (in stream order). O(1) unless a window of its table
        is open."""
        self._out.horizon = event.position
        if self._rereads.note(event):  # a key change's create (unchanged columns)
            self._watch()  # read-only: from this event on, the table's events are kept
        if self._fencing.fenced_blocking:
            self._observe_fenced(event)
            if self._fencing.fenced:
                return
        self._concurrent.observe(event)
        window = self._window
        if window is None or event.table != window.table or event.schema != window.schema:
            return
        window.observe(event)

    def _observe_fenced(self, event: ChangeEvent) -> None:
        kept = self._fencing.keep(event)
        if kept is None:
            return
        event = kept
        self._concurrent.observe(event)
        for pending in (self._pending, self._ahead):
            fenced = pending.fenced if pending is not None else None
            if fenced is not None and event.table == fenced.table and event.schema == fenced.schema:
                fenced.observe(event)

    def closes_at(self, reached: Position) -> bool:
        """Read-only: ``on_progress(..., reached)`` would close a chunk's (or a key
        re-read's) window: the stream has passed the fence of a read whose rows are in
        (the head range of a table's flight, or the request pending). Pure: the runner
        asks it at every commit, and hands the stream's pending events to the writer
        before such a call (as it does before a watermark), so that they do not wait
        for the rows the window releases."""
        if not self._fencing.read_only:
            return False

        # A head range already handing out slices closes nothing: its slices go with
        # the stream's events before them (``on_boundary``); flushing those first at
        # every commit queued one tiny batch per commit and filled the writer's queue.
        if self._concurrent.closes_at(reached):
            return True
        pending = self._pending
        return (pending is not None and isinstance(pending.request, ChunkRequest | KeyReadRequest)
                and pending.fenced is not None and pending.fenced.passed(reached))

    def on_progress(self, position: Position, reached: Position, ts_ms: int) -> list[Emitted]:
        """Read-only snapshots: the stream is at a transaction boundary; ``position`` is
        the highest position logged so far (events returned here are placed after it),
        ``reached`` says how far the stream is known to have delivered every commit (a
        commit's own position, or a keepalive's). Returns the rows of every chunk whose
        fence the stream has passed, in order, and the notifications that land here."""
        self._advance(position)
        if not self._fencing.read_only:
            return []
        assert self._out.horizon is not None
        cursor = PositionCursor(self._out.horizon, ts_ms)
        out: list[Emitted] = self._concurrent.progress(cursor, reached)
        while (pending := self._pending) is not None:
            request = pending.request
            if isinstance(request, TableStartRequest):
                if pending.answer is None:
                    break
                out += self._apply_start(pending, cursor)
            elif isinstance(request, ChunkRequest) and pending.fenced is not None:
                if not pending.fenced.passed(reached):
                    break
                out += self._close_window(pending, request, cursor)
            elif isinstance(request, KeyReadRequest) and pending.fenced is not None:
                if not pending.fenced.passed(reached):
                    break
                out += self._close_reread(pending, request, cursor)
            else:
                break
        if self._out.waiting:
            out += self._out.place(cursor, [])
        return out

    def on_watermark(self, watermark_id: str, position: Position, ts_ms: int) -> list[Emitted]:
        """A watermark came back through the stream. Returns what lands there: chunk rows
        (at H), then notifications. Unknown ids return []."""
        self._advance(position)
        mark = self._mark
        if mark is not None and watermark_id == mark.watermark:
            self._mark = None
            return self._out.place(PositionCursor(position, ts_ms), [])
        events = self._concurrent.on_watermark(watermark_id, position, ts_ms)
        if events is not None:
            return events
        pending = self._pending
        if pending is None:
            return []
        request = pending.request
        windowed = isinstance(request, ChunkRequest | KeyReadRequest)
        if windowed and watermark_id == request.low_watermark:  # type: ignore[union-attr]
            pending.low_seen = True
            self._window = pending.window
            return []
        cursor = PositionCursor(position, ts_ms)
        if isinstance(request, KeyReadRequest) and watermark_id == request.high_watermark:
            return self._close_reread(pending, request, cursor)
        if isinstance(request, ChunkRequest) and watermark_id == request.high_watermark:
            return self._close_window(pending, request, cursor)
        if isinstance(request, TableStartRequest) and watermark_id == request.watermark:
            return self._apply_start(pending, cursor)
        return []

    def on_stream_paused(self, position: Position | None, ts_ms: int) -> None:
        """The stream is paused for a blocking snapshot, at a transaction boundary.
        ``position``: the highest position in the change log (the checkpoint's); the
        anchor is the greater of it and the highest position the core has seen, and
        blocking events take ``anchor.index + 1 + k``."""
        if position is not None:
            self._advance(position)
        if self._out.horizon is None:
            raise ValueError("on_stream_paused needs a position: nothing has been seen yet")
        self._blocking.on_paused(self._out.horizon, ts_ms)

    def _close_window(
        self, pending: Pending, request: ChunkRequest, cursor: PositionCursor
    ) -> list[Emitted]:
        self._pending = None
        self._window = None
        window = pending.window
        if self._busy == request.id:  # H before the rows: the runner broke the contract
            self._busy = None
        if window is None or not pending.low_seen or not window.has_rows:
            self._drop_ahead()
            return self._out.place(cursor, [])
        result = pending.fenced.close() if pending.fenced is not None else window.close()
        job = self._incr.current
        self._read_again += not result.conclusive
        if job is None or job.table != request.table or not result.conclusive:
            self._drop_ahead()
            return self._out.place(cursor, [])
        events = self._out.job_rows(job, result.rows, cursor)
        self._rereads.add_all(job.schema_name, job.table_name, result.reread)
        notices = self._run.chunk_done(self._incr, request, result)
        self._promote_ahead()
        return events + self._out.place(cursor, notices)

    def _close_reread(
        self, pending: Pending, request: KeyReadRequest, cursor: PositionCursor
    ) -> list[Emitted]:
        """H of a key-level re-read: its rows not dropped land here; the keys leave the
        queue, and rows dropped by a partial event go back into it."""
        self._pending = None
        self._window = None
        if self._busy == request.id:
            self._busy = None
        window = pending.window
        if window is None or not pending.low_seen or not window.has_rows:
            return self._out.place(cursor, [])  # the keys stay queued: read again
        result = pending.fenced.close() if pending.fenced is not None else window.close()
        if not result.conclusive:
            self._read_again += 1
            return self._out.place(cursor, [])
        schema, table = window.schema, window.table
        self._rereads.landed(schema, table, request.identity, request.keys, result.reread,
                             window.saw_partial)
        self._watch()
        events: list[Emitted] = []
        events += self._out.rows(cursor, schema, table, SnapshotKind.INCREMENTAL, result.rows,
                                 request.identity, request.identity)
        self._settle()
        return events + self._out.place(cursor, [])

    def _promote_ahead(self) -> None:
        """After a conclusive chunk: the read-ahead chunk becomes the pending one if it
        continues exactly where the table's progress now is."""
        ahead = self._ahead
        if ahead is None:
            return
        if not continues(ahead, self._incr.current):
            self._drop_ahead()
            return
        self._ahead = None
        self._pending = ahead

    def _drop_ahead(self) -> None:
        """Abandon the read-ahead chunk: its watermarks and answer become unknown."""
        if self._ahead is not None and self._busy == self._ahead.request.id:
            self._busy = None
        self._ahead = None

    def _apply_start(self, pending: Pending, cursor: PositionCursor) -> list[Emitted]:
        self._pending = None
        if pending.answer is None:  # watermark before the answer: plan it again
            self._busy = None
            return self._out.place(cursor, [])
        return self._out.place(cursor, self._run.start(self._incr, pending.answer))

    # -- progress ------------------------------------------------------------------

    def _table_finished(self, lane: Lane, table: str) -> None:
        if lane is self._incr:
            self._concurrent.drop(table)

    def _settle(self) -> None:
        """Reset run counters and flags once nothing is left to do."""
        self._run.settle(self.active)

    def _drop_pending(self) -> None:
        self._pending = None
        self._window = None
        self._drop_ahead()

    def _advance(self, position: Position) -> None:
        self._out.advance(position)
        self._fencing.learn(position)

    # -- state ---------------------------------------------------------------------

    def state(self) -> dict[str, Any] | None:
        """JSON-serializable progress, to persist with the checkpoint (None when idle).
        In-flight work is not included: after a restart it is planned again."""
        if not self.active and not self._out.waiting:
            return None
        return {
            "version": STATE_VERSION,
            "chunk_size": self._planner.chunk_size,
            **self._run.to_json(),
            **self._out.to_json(),
            "rereads": self._rereads.to_json(),
            **self._fencing.state(),
        }

    def _restore(self, state: dict[str, Any]) -> None:
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(f"snapshot state version {version!r} is not {STATE_VERSION}")
        self._run.restore(state)
        self._planner.restore_size(int(state.get("chunk_size", self._planner.chunk_size)))
        self._out.restore(state)
        self._rereads.load(state.get("rereads"))
        self._fencing.restore(state)
        self._watch()

    def status(self) -> dict[str, Any]:
        """Progress for ``dblog status``: tables queued, current table, chunks, rows,
        percent (an estimate, ``Run.percent``), paused, blocking."""
        run = self._run.status()
        return {
            "active": self.active,
            "paused": run.pop("paused"),
            "blocking": self.blocking,
            **run,
            "chunk_size": self._planner.chunk_size,
            "rereads_queued": len(self._rereads),
            "reads_repeated": self.read_again,
        }
