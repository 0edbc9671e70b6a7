"""Concurrent windows across tables (``CoreSettings.parallelism > 1``), IO-free.

``core.flight`` keeps one table's ranges and their windows; this module runs the
flights of the incremental lane's tables: which request goes next, where each answer
and watermark goes, when a head range's rows are emitted (whole, or in slices) and how
the table's progress follows. ``SnapshotCore`` hands it the stream's events, the
worker's answers and the watermarks it does not own, and places what it returns.

Invariants:

- Which tables: an incremental table chunked by its own key (``wants``; a surrogate
  key may repeat and group, so its chunks are read one at a time). A table not yet
  started is started by one concurrent ``TableStartRequest`` at a time (``starting``);
  its answer takes effect at its watermark (read-only: at the next progress).
- Order: tables are read in lane order. A table's ranges and bounds go first; only
  once its flight is ``exhausted`` (every chunk of it started) may the next table's
  chunks start, so up to ``parallelism`` chunks are in flight across the tail of one
  table and the next tables.
- Limits: at most ``parallelism`` requests read at once; at most ``2·parallelism``
  ranges issued and not emitted across the tables (a table's own limit is
  ``parallelism + 1``), except the oldest table's first range, which may always go
  (it waits for nothing, so the snapshot always moves on).
- Emission: a flight's ranges are emitted in key order, each at its H (read-only: once
  the stream passed its fence), so the table's progress is always the end of a
  contiguous prefix of emitted ranges (``core.flight``). A range that cannot close
  conclusively is read again; the ones after it wait with their windows open.
- Slices (``CoreSettings.slice_rows`` > 0): the head range hands out at most a budget
  of rows read at a time; each slice moves the table's progress to its last key read
  (``core.flight``, "Slices").
- While paused or while key re-reads wait nothing new is issued; a flight with nothing
  issued (or whose first range must be read again) is dropped then: it is planned
  again from the table's progress. A dropped flight's ids are forgotten: late answers
  and watermarks of its requests are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydblog.core.fence import FencedWindow, Fencing, ReadFence
from pydblog.core.flight import Flight, Range
from pydblog.core.keys import match_key
from pydblog.core.notices import Notice, Outbox, PositionCursor, table_scan_completed
from pydblog.core.planner import Planner, window_for
from pydblog.core.progress import TableJob
from pydblog.core.requests import ChunkRequest, Request, TableStartRequest
from pydblog.core.rereads import RereadQueue
from pydblog.core.run import Run, StartAnswer
from pydblog.core.sizing import CoreSettings
from pydblog.core.window import WindowResult, keyed
from pydblog.events import ChangeEvent, ChunkRow, Emitted, SnapshotKind
from pydblog.positions import Position

NO_FENCE = "a read-only chunk came without its fence"
NO_KEY = "chunk rows lack a key column (the reader must select the key columns)"


@dataclass(slots=True)
class Starting:
    """A concurrent table start in flight, and its answer once it is in."""

    request: TableStartRequest
    answer: StartAnswer | None = None


class ConcurrentWindows:
    """The flights of the incremental lane's tables (see the module docstring)."""

    __slots__ = ("_fencing", "_observers", "_out", "_planner", "_rereads", "_run", "flights",
                 "read_again", "settings", "starting")

    def __init__(
        self, settings: CoreSettings, run: Run, planner: Planner, fencing: Fencing,
        out: Outbox, rereads: RereadQueue,
    ) -> None:
        self.settings = settings
        self._run = run
        self._planner = planner
        self._fencing = fencing
        self._out = out
        self._rereads = rereads
        # One flight per table being read, in lane order, keyed by the job's table and
        # by (schema, name) for the stream's events.
        self.flights: dict[str, Flight] = {}
        self._observers: dict[tuple[str, str], Flight] = {}
        self.starting: Starting | None = None
        self.read_again = 0  # ranges whose window could not decide (this process)

    @property
    def busy(self) -> bool:
        """Some table is being read (or started) in concurrent windows."""
        return bool(self.flights) or self.starting is not None

    def wants(self, job: TableJob) -> bool:
        """The table's chunks are read several at once, each in its own window: an
        incremental table chunked by its own key."""
        return (
            self.settings.parallelism > 1 and job.surrogate_key is None
            and job.kind is SnapshotKind.INCREMENTAL
        )

    # -- flights --------------------------------------------------------------------------

    def _add(self, job: TableJob) -> Flight:
        assert job.key_columns is not None and job.max_key is not None
        flight = Flight(
            job.table, job.schema_name, job.table_name, job.key_columns, job.max_key,
            self.settings.parallelism,
        )
        self.flights[job.table] = flight
        self._observers[(flight.schema, flight.name)] = flight
        return flight

    def drop(self, table: str) -> None:
        """Abandon a table's flight: its requests' late answers and watermarks are ignored."""
        flight = self.flights.pop(table, None)
        if flight is not None:
            self._observers.pop((flight.schema, flight.name), None)

    def forget(self, table: str) -> None:
        """``table`` starts over: its flight and its start are abandoned."""
        self.drop(table)
        if self.starting is not None and self.starting.request.table == table:
            self.starting = None

    def forget_gone(self) -> None:
        """Drop the flights and the start of tables no longer running in the lane."""
        running = {j.table for j in self._run.incr.running()}
        for table in [t for t in self.flights if t not in running]:
            self.drop(table)
        starting = self.starting
        if starting is not None and starting.request.table not in running:
            self.starting = None

    def _reading(self) -> int:
        """Concurrent requests being read (ranges, bounds, a table start)."""
        n = sum(len(f.reading) for f in self.flights.values())
        starting = self.starting
        return n + (1 if starting is not None and starting.answer is None else 0)

    # -- requests -------------------------------------------------------------------------

    def next_request(self) -> Request | None:
        """The next concurrent request, or None (see the module docstring for order
        and limits)."""
        lane = self._run.incr
        self.forget_gone()
        if self._run.paused or self._rereads:
            for table, flight in list(self.flights.items()):
                head = flight.ranges[0] if flight.ranges else None
                if not flight.open or (head is not None and head.request is None):
                    self.drop(table)
            return None
        p = self.settings.parallelism
        if self._reading() >= p:
            return None
        issued = sum(f.issued for f in self.flights.values())
        for job in lane.running():
            if not self.wants(job):
                return None  # (cannot happen: only such tables run beside others)
            if not job.started:
                return self._start(job)
            flight = self.flights.get(job.table) or self._add(job)
            request = self._next_of(flight, job, issued < 2 * p, job is lane.current)
            if request is not None or not flight.exhausted:
                return request
        if self.starting is not None or issued >= 2 * p:
            return None
        following = lane.queue[0] if lane.queue else None
        if following is None or not self.wants(following):
            return None  # a table read one chunk at a time waits for the flights to land
        taken = lane.take_next()
        assert taken is not None
        if not taken.started:
            return self._start(taken)
        return self._next_of(self._add(taken), taken, True, False)

    def _next_of(self, flight: Flight, job: TableJob, room: bool, oldest: bool) -> Request | None:
        """The flight's next range (if ``room``, or if it is the ``oldest`` table's first
        range) or bounds."""
        rng = flight.next_range()
        if rng is not None and (room or (oldest and rng is flight.ranges[0])):
            return self._issue(flight, job, rng)
        if flight.wants_bounds():
            assert job.key_columns is not None and job.max_key is not None
            if flight.plan(job.last_key, self._planner.step):  # integer keys
                rng = flight.next_range()
                if rng is not None and (room or (oldest and rng is flight.ranges[0])):
                    return self._issue(flight, job, rng)
                return None
            bounds = self._planner.bounds(job, flight.planned_end(job.last_key))
            flight.ask_bounds(bounds)
            return bounds
        return None

    def _start(self, job: TableJob) -> Request | None:
        """The ``TableStartRequest`` of a table read in concurrent windows (one at a
        time)."""
        if self.starting is not None:
            return None
        request = self._planner.start_concurrent(job)
        self.starting = Starting(request)
        return request

    def _issue(self, flight: Flight, job: TableJob, rng: Range) -> ChunkRequest:
        request = self._planner.range_read(job, rng.after, rng.upper, rng.planned)
        window = window_for(job, request)
        flight.issue(rng, request, window, self._fencing.window(window))
        return request

    # -- answers --------------------------------------------------------------------------

    def owner(self, request_id: str) -> Flight | None:
        return next((f for f in self.flights.values() if f.owns(request_id)), None)

    def starts(self, request_id: str) -> bool:
        """``request_id`` is the concurrent start in flight."""
        return self.starting is not None and self.starting.request.id == request_id

    def on_started(self, request_id: str, answer: StartAnswer) -> None:
        """The answer to the concurrent start (``starts``): kept until its watermark
        (read-only: the next progress). A second answer is ignored."""
        if self.starts(request_id) and self.starting is not None and self.starting.answer is None:
            self.starting.answer = answer

    def on_bounds(self, request_id: str, keys: Sequence[Sequence[Any]], integer: bool) -> None:
        flight = self.owner(request_id)
        if flight is not None:
            flight.on_bounds(request_id, [tuple(k) for k in keys], integer)

    def on_rows(
        self, flight: Flight, request_id: str, rows: Sequence[ChunkRow], elapsed_ms: float,
        fence: ReadFence | None,
    ) -> str | None:
        """A range's rows; returns the error that fails the request for good, if any."""
        rng = flight.range_of(request_id)
        request = rng.request if rng is not None else None
        if request is None or request_id not in flight.reading:
            return None
        if request.fenced and fence is None:
            return NO_FENCE
        if not keyed(rows, request.key_columns):
            return NO_KEY
        if rng is not None and rng.planned:  # an arithmetic range (core.intsplit)
            self._planner.resize_planned(rng.planned, len(rows), elapsed_ms)
        else:
            self._planner.resize(request, len(rows), elapsed_ms)
        flight.set_rows(request_id, rows, fence, self._planner.step)
        if fence is not None:
            self._fencing.prune(fence, request_id)
        return None

    def on_failed(self, request_id: str, error: str, retriable: bool | None) -> bool:
        """A concurrent request failed: its range (or bounds, or start) is planned
        again, or, after ``max_attempts`` (or a fatal error), the table is dropped (its
        REJECTED waits for a position). False: not a concurrent request."""
        flight = self.owner(request_id)
        if flight is not None:
            rng = flight.range_of(request_id)
            request: Request | None = rng.request if rng is not None else flight.bounds
            if request is None:
                return True
            flight.failed(request_id)  # also after its answer: its H may never come
            self._planner.failed(request)
            notices = self._run.failed(self._run.incr, request, error, retriable)
            self.forget_gone()
            self._out.waiting.extend(notices)
            return True
        starting = self.starting
        if starting is not None and starting.request.id == request_id:
            self.starting = None  # also after its answer: its watermark may never come
            self._out.waiting.extend(self._run.failed(self._run.incr, starting.request, error,
                                                      retriable))
            return True
        return False

    def on_watermark(self, watermark_id: str, position: Position, ts_ms: int) -> list[Emitted] | None:
        """L or H of a range, or the start's watermark: what lands there (None: not one
        of these)."""
        for table, flight in self.flights.items():
            if flight.on_watermark(watermark_id):
                cursor = PositionCursor(position, ts_ms)
                return self._emit_table(table, cursor, None)[0] + self._out.place(cursor, [])
        starting = self.starting
        if starting is not None and watermark_id == starting.request.watermark:
            return self.apply_start(PositionCursor(position, ts_ms))
        return None

    def apply_start(self, cursor: PositionCursor) -> list[Emitted]:
        """The concurrent start's answer takes effect: the table is started (its flight
        is planned by the next ``next_request``), empty or rejected."""
        starting, self.starting = self.starting, None
        assert starting is not None
        if starting.answer is None:  # watermark before the answer: plan it again
            return self._out.place(cursor, [])
        notices = self._run.start(self._run.incr, starting.answer, starting.request.table)
        return self._out.place(cursor, notices)

    # -- the stream -----------------------------------------------------------------------

    def observe(self, event: ChangeEvent) -> None:
        """A stream event: the flight of its table, if any, sees it."""
        if self._observers:
            flight = self._observers.get((event.schema, event.table))
            if flight is not None:
                flight.observe(event)

    @property
    def waiting(self) -> bool:
        """Read-only: a range's rows, or the start's answer, wait for a passed fence
        or a progress."""
        for flight in self.flights.values():
            if any(r.read and r.fenced is not None for r in flight.ranges):
                return True
        return self.starting is not None and self.starting.answer is not None

    def closes_at(self, reached: Position) -> bool:
        """Read-only: a head range's fence has been passed at ``reached`` (a head
        already handing out slices closes nothing: its slices go with the stream's
        events before them, ``on_boundary``)."""
        def passed(fenced: FencedWindow) -> bool:
            return fenced.passed(reached)

        for flight in self.flights.values():
            head = flight.head_ready(passed)
            if head is not None and not head.draining:
                return True
        return False

    @property
    def draining(self) -> bool:
        """Some window has rows to hand out now (slices)."""
        return self.settings.slice_rows > 0 and any(f.emitting for f in self.flights.values())

    # -- emission -------------------------------------------------------------------------

    def progress(self, cursor: PositionCursor, reached: Position) -> list[Emitted]:
        """Read-only progress: every head range whose fence ``reached`` passed, then
        the start's answer if it is in."""
        out = self.emit(cursor, reached)
        if self.starting is not None and self.starting.answer is not None:
            out += self.apply_start(cursor)
        return out

    def emit(
        self, cursor: PositionCursor, reached: Position | None, budget: int | None = None,
    ) -> list[Emitted]:
        """``_emit_table`` for every table's flight, in lane order, sharing one budget
        of rows (None: ``settings.slice_rows``)."""
        out: list[Emitted] = []
        left = self.settings.slice_rows if budget is None else budget
        for table in list(self.flights):
            events, left = self._emit_table(table, cursor, reached, left)
            out += events
        return out

    def _emit_table(
        self, table: str, cursor: PositionCursor, reached: Position | None,
        budget: int | None = None,
    ) -> tuple[list[Emitted], int]:
        """Emit, in key order, every range at the head of ``table``'s flight whose window
        may close (its H came back; read-only: the stream passed its fence, ``reached``).
        A range that cannot close conclusively is read again and the ones after it
        wait; their windows stay open meanwhile (see ``core.flight``).

        Slices (``settings.slice_rows`` > 0): at most ``budget`` rows read (None:
        ``slice_rows``) are handed out; a head range not emitted whole stays the head,
        its window open, its progress at its last slice's last key (``core.flight``,
        "Slices"). Returns the events and the budget left (0 without slices)."""
        out: list[Emitted] = []
        slicing = self.settings.slice_rows > 0
        left = (self.settings.slice_rows if budget is None else budget) if slicing else 0

        def passed(fenced: FencedWindow) -> bool:
            return reached is not None and fenced.passed(reached)

        while (flight := self.flights.get(table)) is not None:
            head = flight.head_ready(passed)
            if head is None or (slicing and left <= 0):
                break
            job = self._run.incr.job(table)
            window = head.window
            if job is None or window is None:
                self.drop(table)
                break
            source = head.fenced if head.fenced is not None else window
            if not head.read or not (head.low_seen or head.fenced is not None):
                result = WindowResult([], 0, None, False)
            elif slicing:
                result = source.take(left, self.settings.slice_bytes)
                left -= result.read
            else:
                result = source.close()
            if not result.conclusive:
                self.read_again += 1
                flight.forget(head)
                head.reset()  # read again; the ranges after it wait, their windows open
                break
            out += self._out.job_rows(job, result.rows, cursor)
            self._rereads.add_all(job.schema_name, job.table_name, result.reread)
            if result.left:  # a slice: the rest of the range follows later
                self._slice_done(head, job, result)
                continue
            if window.taken:  # the last slice: the range is done as a whole chunk
                result = WindowResult(result.rows, window.read_count, window.last_read_key, True)
            out += self._out.place(cursor, self._range_done(flight, job, head, result))
        return out, left

    def _slice_done(self, head: Range, job: TableJob, result: WindowResult) -> None:
        """A slice of the head range is out: the table's progress (what a restart
        resumes after) moves to the slice's last key read, and so does the range's
        start (``Flight``: ``ranges[0].after`` is the progress). Its window stays
        open for the rest, which ``head_ready`` now offers at any point."""
        assert result.last_key is not None
        head.after = result.last_key
        head.draining = True
        self._run.slice_done(job, result.last_key, len(result.rows))

    def _range_done(
        self, flight: Flight, job: TableJob, head: Range, result: WindowResult
    ) -> list[Notice]:
        """Progress after the head range's rows were emitted: to its upper key if the
        read saw the whole range, else to the last key read (the rest is read next)."""
        request = head.request
        assert request is not None
        last = result.last_key
        whole = result.read < request.limit or (
            last is not None and match_key(last) == match_key(head.upper)
        )
        lane = self._run.incr
        job = self._run.advance(lane, job, head.upper if whole else last, len(result.rows))
        if not whole:
            flight.forget(head)
            head.reset(after=last)
            return [self._run.in_progress(lane, job)]
        flight.pop_head()
        if head.last:
            self.drop(job.table)
            return self._run.finish(lane, [table_scan_completed(job)], job.table)
        return [self._run.in_progress(lane, job)]
