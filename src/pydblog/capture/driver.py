"""Drives the IO-free snapshot core: runs its requests on a worker thread, feeds the
answers back, and routes signals and watermarks to it.

The non-stalling window: for a chunk the worker writes the low watermark L, runs the
chunk SELECT on its own connection and queues the rows, and only then writes the high
watermark H. The capture loop drains the answer queue before it hands any watermark
to the core, so the rows are there when H arrives, and the stream never waits for a
SELECT. Blocking snapshots run their requests inline while the stream is paused.

Concurrent windows (``core.flight``, ``[snapshot] parallelism`` > 1 on a reader that
can ``fork``): the core's range, bounds and table-start requests (``concurrent`` set,
``BoundsRequest``), of one table or of several, run on a pool of ``parallelism``
threads, each with a forked reader (its own connections), several at once; each still
writes its own L, reads, queues its answer, then writes its own H. Every other request
runs alone, in order, on the one sequential worker (the core issues one only when no
concurrent request of its own is in flight).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import orjson

from pydblog.capture import lagtrace
from pydblog.config import Config
from pydblog.core.fence import describe
from pydblog.core.requests import (
    BoundsRequest,
    ChunkRequest,
    KeyReadRequest,
    MarkRequest,
    Request,
    TableStartRequest,
)
from pydblog.core.retry import RetryBackoff
from pydblog.core.signals import parse_signal
from pydblog.core.sizing import CoreSettings
from pydblog.core.snapshot import SnapshotCore
from pydblog.errors import ConfigError, DblogError, SignalError, SourceError
from pydblog.events import ChangeEvent, Emitted, Op
from pydblog.metrics import CAPTURE as METRICS
from pydblog.ports import (
    BlockingFencer,
    ConcurrentReader,
    FencedKeyReader,
    FencedReader,
    IntegerKeyReader,
    ReplayWaiter,
    RequestScoped,
    ResetKind,
    SnapshotReader,
    TableInfo,
    WindowFencer,
)
from pydblog.positions import Position
from pydblog.threads import name_native_thread

log = logging.getLogger(__name__)

Answer = Callable[[], list[Emitted]]

MAX_HOLD_S = 1.0
"""Longest a chunk request waits for the change log writer's backlog to clear."""

SLICE_ROWS = int(os.environ.get("PYDBLOG_SLICE_ROWS", "0"))
"""Concurrent windows hand their rows to the change log in slices of this many rows
(``CoreSettings.slice_rows``): one at H, the next ones at the stream's transaction
boundaries while the writer's backlog is short (``runner.SLICE_BACKLOG``), so a
stream event after H waits for a slice's write, not for the whole chunk's. **Off (0,
whole chunks at H) by default**: slices shorten the writer's part of the lag but cost
capture-thread CPU per row and several times the appends, so on a machine with few
cores the wait moves to the capture thread and rows/s fall.
``PYDBLOG_SLICE_ROWS`` turns them on (e.g. 4096: four of the log's blocks)."""

SLICE_BYTES = 1 << 20
"""... and of at most about this many bytes of encoded rows (wide rows)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class SnapshotDriver:
    def __init__(self, cfg: Config, reader: SnapshotReader, state: dict[str, Any] | None) -> None:
        s = cfg.snapshot
        self.reader = reader
        self.parallelism = _parallelism(reader)
        fenced = s.watermark != "read-only" and _fences_windows(reader)
        if fenced:
            log.info("snapshot watermark windows are read fenced: commits can become visible "
                     "out of log order on this source (docs/snapshots.md)")
        # Blocking reads are fenced with fenced or read-only windows; else if the reader
        # says so (MySQL/MariaDB: its stream can deliver a commit before it is visible).
        fenced_blocking = (not fenced and s.watermark != "read-only"
                           and _fences_blocking_reads(reader))
        slice_rows = _slice_rows(SLICE_ROWS, fenced or s.watermark == "read-only")
        self.core = SnapshotCore(
            CoreSettings(
                chunk_size=s.chunk_size,
                adaptive=s.effective_adaptive,
                time_budget_ms=s.chunk_time_budget_ms,
                min_chunk=s.min_chunk_size,
                max_chunk=s.max_chunk_size,
                read_only=s.watermark == "read-only",
                parallelism=self.parallelism,
                fenced=fenced,
                fenced_blocking=fenced_blocking,
                slice_rows=slice_rows,
                slice_bytes=SLICE_BYTES,
            ),
            state,
        )
        self.read_only = s.watermark == "read-only"
        self._initial = s.mode == "initial"
        if self.read_only and not isinstance(reader, FencedReader):
            raise ConfigError(
                f'snapshot.watermark = "read-only" is not supported by the {cfg.source.type} '
                'source yet: use "table"'
            )
        self._answers: queue.Queue[tuple[str, Answer]] = queue.Queue()
        self._requests: queue.Queue[Request | None] = queue.Queue()
        self._pool_requests: queue.Queue[Request | None] = queue.Queue()
        self._inflight: set[str] = set()  # ids of requests handed out, not answered yet
        self._chunk_tables: dict[str, str] = {}  # chunk requests handed out: id -> table
        self._worker: threading.Thread | None = None
        self._pool: list[threading.Thread] = []
        self._out: list[Emitted] = []
        self._paused_stream = False
        # Called (from the worker thread) when an answer is queued: wakes the runner
        # so it takes the answer and submits the next (read-ahead) request at once.
        self.wakeup: Callable[[], None] = lambda: None
        # True while new chunk requests should wait (the runner: the writer's backlog is long).
        self.hold: Callable[[], bool] = lambda: False
        self._held_since: float | None = None
        self._backoff = RetryBackoff()  # after inconclusive reads (core.retry)
        self._last_fence: object = None  # the last read's fence (for the log)
        self._closing = False  # close() began: a request failing now was cut by it

    # -- routing ----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.core.active

    @property
    def blocking(self) -> bool:
        return self.core.blocking

    def on_event(self, event: ChangeEvent) -> None:
        self.core.on_event(event)

    def on_signal_event(self, event: ChangeEvent, captured: list[str]) -> list[Emitted]:
        """A row event of the signal table; only inserts are signals."""
        if event.op is not Op.CREATE or event.after is None:
            return []
        row = event.after
        signal_id = str(row.get("id"))
        try:
            signal = parse_signal(signal_id, str(row.get("type")), row.get("data"))
        except SignalError as exc:
            log.warning("rejected signal %s: %s", signal_id, exc)
            METRICS.signal_rejected()
            return self.take() + self.core.on_signal_error(signal_id, str(exc), event.position, event.ts_ms)
        log.info("signal %s: %s %s", signal.id, signal.type.value, " ".join(signal.data_collections))
        METRICS.signal(signal.type.value)
        return self.take() + self.core.on_signal(signal, captured, event.position, event.ts_ms)

    def on_direct_signal(
        self, signal_id: str, kind: str, data: dict[str, Any], captured: list[str],
        position: Position, problem: str | None = None,
    ) -> tuple[list[Emitted], str | None]:
        """A signal handed to the capture (``capture.inbox``), applied at ``position``
        (the last logged event's) as a signal row read there would be. Returns the
        events and the rejection's reason, if the signal was rejected (always, with
        ``problem``: a message that was no valid signal, rejected for that reason)."""
        try:
            if problem is not None:
                raise SignalError(problem)
            signal = parse_signal(signal_id, kind, orjson.dumps(data).decode())
        except SignalError as exc:
            log.warning("rejected signal %s: %s", signal_id, exc)
            METRICS.signal_rejected()
            return self.take() + self.core.on_signal_error(
                signal_id, str(exc), position, _now_ms()), str(exc)
        log.info("signal %s (direct): %s %s", signal.id, signal.type.value,
                 " ".join(signal.data_collections))
        METRICS.signal(signal.type.value)
        return self.take() + self.core.on_signal(signal, captured, position, _now_ms()), None

    def on_watermark(self, watermark_id: str, position: Position, ts_ms: int) -> list[Emitted]:
        out = self.take()
        return out + self.core.on_watermark(watermark_id, position, ts_ms or _now_ms())

    def on_progress(self, position: Position, reached: Position) -> list[Emitted]:
        """Read-only snapshots: the stream is at a transaction boundary (see
        ``SnapshotCore.on_progress``)."""
        out = self.take()
        return out + self.core.on_progress(position, reached, _now_ms())

    def closes_at(self, reached: Position) -> bool:
        """Read-only: ``on_progress`` at ``reached`` would close a window (answers not
        yet taken aside: ``SnapshotCore.closes_at``)."""
        return self.core.closes_at(reached)

    def on_boundary(self, position: Position) -> list[Emitted]:
        """The stream is at a transaction boundary, ``position`` the highest logged:
        the next slices of the windows being handed out (``SnapshotCore.on_boundary``)."""
        out = self.take()
        return out + self.core.on_boundary(position, _now_ms())

    @property
    def draining(self) -> bool:
        """Some window has a slice to hand out (``on_boundary``)."""
        return self.core.draining

    @property
    def waiting_for_progress(self) -> bool:
        return self.core.waiting_for_progress

    def restart_table(self, table: str, kind: ResetKind) -> None:
        """``table`` names a new relation, or none (``ports.RelationReset``): a snapshot
        of it starts over. A re-created table is snapshotted in any case (its rows from
        before it joined the publication are in no event, and rows a chunk read from it
        before the reset lie before the truncate); one found at start outside the
        publication with ``mode = "initial"`` (full state promised)."""
        queue = kind is ResetKind.RECREATED or (kind is ResetKind.JOINED and self._initial)
        self.core.restart_table(table, queue=queue)

    def start_initial(self, captured: list[str]) -> None:
        log.info("initial snapshot of %d tables", len(captured))
        self.core.start_initial(captured)

    def take(self) -> list[Emitted]:
        """Apply the worker's answers; returns the events they produced."""
        while True:
            try:
                request_id, answer = self._answers.get_nowait()
            except queue.Empty:
                break
            self._inflight.discard(request_id)  # (a late failure may answer twice)
            self._chunk_tables.pop(request_id, None)
            self._out.extend(answer())
        out, self._out = self._out, []
        return out

    # -- incremental requests on the worker ----------------------------------------------
    def submit_next(self) -> None:
        """Hand the core's next requests to the workers: one at a time, or, for
        concurrent windows, as many as the core issues (it keeps at most
        ``parallelism`` being read)."""
        self._out.extend(self.take())
        while not self.core.blocking and self._submit_one():
            pass

    def _submit_one(self) -> bool:
        if self._inflight and not self._concurrent_inflight:
            return False
        if self.hold():
            # The stream comes first: while the change log writer has a long backlog, a new
            # chunk would only queue more rows in front of the stream's next events.
            # Held at most MAX_HOLD_S at a time, so a busy stream cannot starve it.
            now = time.monotonic()
            if self._held_since is None:
                self._held_since = now
            if now - self._held_since < MAX_HOLD_S:
                return False
        self._held_since = None
        if not self._backoff_ready():
            return False  # (the next tick, 50 ms at most on an idle stream, looks again)
        request = self.core.next_request()
        if request is None:
            return False
        self._backoff.submitted()
        self._inflight.add(request.id)
        concurrent = isinstance(request, BoundsRequest) or (
            isinstance(request, ChunkRequest | TableStartRequest) and request.concurrent
        )
        self._concurrent_inflight = concurrent
        if concurrent:
            self._start_pool()
            self._note_beside(request)
            self._pool_requests.put(request)
            return True
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(
                target=self._work, args=(self._requests, self.reader), name="dblog-chunks",
                daemon=True,
            )
            self._worker.start()
        self._requests.put(request)
        return False

    _concurrent_inflight = False

    def _note_beside(self, request: Request) -> None:
        """Tracks the concurrent chunk reads handed out; a table's start handed out while
        chunks of other tables are being read is logged (one line per table)."""
        if isinstance(request, ChunkRequest):
            self._chunk_tables[request.id] = request.table
        elif isinstance(request, TableStartRequest):
            others = sorted({t for t in self._chunk_tables.values() if t != request.table})
            if others:
                log.info("snapshot of %s: started beside the last chunks of %s",
                         request.table, ", ".join(others))

    def _backoff_ready(self) -> bool:
        """After reads that could not decide, the next request waits (``core.retry``)."""
        now = time.monotonic()
        if self._backoff.note(self.core.read_again, now):
            log.warning(
                "snapshot: %d reads in a row could not decide (the read did not see "
                "everything the stream delivered: a lagging standby, a commit waiting for a "
                "synchronous standby, or a transaction in doubt; last fence: %s); reading "
                "again every %.1f s at most", self._backoff.streak,
                describe(self._last_fence), self._backoff.max_s,
            )
        return self._backoff.ready(now)

    def _start_pool(self) -> None:
        if self._pool:
            return
        fork = cast(ConcurrentReader, self.reader).fork
        log.info("snapshot chunks: up to %d read at once, each in its own window", self.parallelism)
        for n in range(self.parallelism):
            th = threading.Thread(
                target=self._work_forked, args=(fork,), name=f"dblog-chunks-{n}", daemon=True
            )
            th.start()
            self._pool.append(th)

    def _work_forked(self, fork: Callable[[], SnapshotReader]) -> None:
        name_native_thread()
        reader: SnapshotReader | None = None
        while True:
            request = self._pool_requests.get()
            if request is None:  # close()
                return
            answer = self._answerer(request.id)
            if reader is None:
                try:
                    reader = fork()
                except Exception as exc:  # reported like any failure of the request
                    self._fail(request, exc, answer)
                    continue
            self._execute(request, answer, reader)

    def _answerer(self, request_id: str) -> Callable[[Answer], None]:
        """Queues a worker's answer to one request and wakes the runner."""
        def answer(result: Answer) -> None:
            self._answers.put((request_id, result))
            self.wakeup()
        return answer

    def _work(self, requests: queue.Queue[Request | None], reader: SnapshotReader) -> None:
        name_native_thread()
        while True:
            request = requests.get()
            if request is None:  # close()
                return
            self._execute(request, self._answerer(request.id), reader)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the worker threads (each ends after its request in flight; the caller
        closes the readers, which ends a request stuck on the server)."""
        self._closing = True
        for _ in self._pool:
            self._pool_requests.put(None)
        if self._worker is not None:
            self._requests.put(None)
        deadline = time.monotonic() + timeout_s
        for th in [*self._pool, *([self._worker] if self._worker is not None else [])]:
            th.join(max(0.0, deadline - time.monotonic()))
        self._pool = []
        self._worker = None

    def _execute(
        self, request: Request, answer: Callable[[Answer], None],
        reader: SnapshotReader | None = None,
    ) -> None:
        """Runs one request (see ``core.requests`` for each kind's duty, in order) on
        ``reader`` (the driver's own by default)."""
        core = self.core
        reader = reader if reader is not None else self.reader
        for used in {id(reader): reader, id(self.reader): self.reader}.values():
            if isinstance(used, RequestScoped):  # (a replica reader waits once)
                used.begin_request()
        try:
            if isinstance(request, MarkRequest):
                reader.write_watermark(request.watermark)
                answer(lambda: [])
            elif isinstance(request, TableStartRequest):
                info, max_key, error, start_fence = self._start_table(request, reader)
                self._last_fence = start_fence
                answer(lambda: core.on_table_started(request.id, info, max_key, error, start_fence))
                if request.watermark is not None:  # the answer (even an error) lands there
                    reader.write_watermark(request.watermark)
            elif isinstance(request, KeyReadRequest):
                self._reread(request, answer)
            elif isinstance(request, BoundsRequest):
                self._bounds(request, answer, reader)
            else:
                if request.low_watermark is not None:
                    reader.write_watermark(request.low_watermark)
                info = reader.table_info(request.table, request.surrogate_key)
                if info is None:
                    raise SignalError(f"table {request.table} no longer exists")
                t0 = time.perf_counter()
                w0 = time.time() if lagtrace.ON else 0.0
                if request.fenced:
                    _await_floor(reader, request.floor)
                    fenced = cast(FencedReader, reader)
                    rows, fence = fenced.read_chunk_fenced(
                        _keyed(info, request), request.after_key, request.max_key,
                        request.limit, request.condition,
                    )
                else:
                    fence = None
                    rows = reader.read_chunk(
                        _keyed(info, request), request.after_key, request.max_key,
                        request.limit, request.condition,
                    )
                elapsed = (time.perf_counter() - t0) * 1000
                if lagtrace.ON:
                    lagtrace.chunk_read(w0, len(rows))
                self._last_fence = fence
                answer(lambda: core.on_chunk_read(request.id, rows, elapsed, fence=fence))
                if request.high_watermark is not None:
                    reader.write_watermark(request.high_watermark)
        except Exception as exc:  # reported to the core; capture goes on
            self._fail(request, exc, answer)

    def _fail(self, request: Request, exc: Exception, answer: Callable[[Answer], None]) -> None:
        core = self.core
        retriable = exc.retriable if isinstance(exc, DblogError) else None
        msg = str(exc) if isinstance(exc, DblogError) else f"{type(exc).__name__}: {exc}"
        if self._closing:
            # The capture is stopping and closed the request's connection under it (the
            # error then reads like a server crash): nothing takes this answer any more,
            # and the request runs again from the checkpoint at the next start.
            log.info("snapshot request for %s stopped: the capture is stopping and closed "
                     "its connection", getattr(request, "table", "?"))
            log.debug("the stopped request's error: %s", msg)
            return
        log.warning("snapshot request for %s failed: %s", getattr(request, "table", "?"), msg)
        answer(lambda: core.on_request_failed(request.id, msg, retriable=retriable))

    def _bounds(
        self, request: BoundsRequest, answer: Callable[[Answer], None], reader: SnapshotReader
    ) -> None:
        """Boundary keys of the next ranges (``core.flight``); no watermark."""
        info = reader.table_info(request.table)
        if info is None:
            raise SignalError(f"table {request.table} no longer exists")
        keyed = info.with_key(request.key_columns, request.identity or info.identity)
        keys = cast(ConcurrentReader, reader).chunk_bounds(
            keyed, request.after_key, request.max_key, request.step, request.count,
            request.condition,
        )
        integer = _integer_key(reader, keyed)
        if integer and request.after_key is None:
            log.info("snapshot of %s: an integer key, its ranges after the first are cut "
                     "by arithmetic", request.table)
        core = self.core
        answer(lambda: core.on_bounds(request.id, keys, integer))

    def _reread(self, request: KeyReadRequest, answer: Callable[[Answer], None]) -> None:
        """A key-level re-read (``core.rereads``): L, the rows of those keys, H (read-only
        snapshots: the rows and their read's fence, no watermarks)."""
        core = self.core
        if request.low_watermark is not None:
            self.reader.write_watermark(request.low_watermark)
        info = self.reader.table_info(request.table)
        if info is None:
            raise SignalError(f"table {request.table} no longer exists")
        keyed = info.with_key(request.identity, request.identity)
        t0 = time.perf_counter()
        fence = None
        if request.fenced:
            if not isinstance(self.reader, FencedKeyReader):
                raise SourceError(
                    f"the {type(self.reader).__name__} cannot re-read keys in a read-only "
                    "snapshot", hint='use snapshot.watermark = "table"',
                )
            _await_floor(self.reader, request.floor)
            rows, fence = self.reader.read_keys_fenced(keyed, request.keys)
            self._last_fence = fence
        else:
            rows = self.reader.read_keys(keyed, request.keys)
        elapsed = (time.perf_counter() - t0) * 1000
        answer(lambda: core.on_chunk_read(request.id, rows, elapsed, fence=fence))
        if request.high_watermark is not None:
            self.reader.write_watermark(request.high_watermark)

    def _start_table(
        self, req: TableStartRequest, reader: SnapshotReader
    ) -> tuple[TableInfo | None, Any, str | None, Any]:
        """(info, max key, error, the max key read's fence if ``req.fenced``)."""
        try:
            info = reader.table_info(req.table, req.surrogate_key)
            if info is None:
                return None, None, f"table {req.table} does not exist", None
            if not info.key:
                return info, None, (
                    f"table {req.table} has no primary key (nor a REPLICA IDENTITY USING "
                    "INDEX): name a column to chunk by with surrogate-key "
                    "(CLI: --surrogate-key COL)"
                ), None
            if req.condition:
                reader.check_filter(info, req.condition)
            if req.fenced:
                _await_floor(reader, req.floor)
                max_key, fence = cast(FencedReader, reader).max_key_fenced(info, req.condition)
                return info, max_key, None, fence
            return info, reader.max_key(info, req.condition), None, None
        except SignalError as exc:
            return None, None, str(exc), None

    # -- blocking snapshots ------------------------------------------------------------------
    def run_blocking(self, position: Position, stop: threading.Event,
                     emit: Callable[[list[Emitted]], None], keepalive: Callable[[], None]) -> None:
        """The stream is paused at a transaction boundary at ``position``: read the
        blocking snapshot's tables inline, emitting rows as they come."""
        while self._inflight:  # let the incremental requests in flight finish first
            emit(self.take())
            time.sleep(0.01)
        self.core.on_stream_paused(position, _now_ms())
        results: list[Answer] = []
        while self.core.blocking and not stop.is_set():
            keepalive()
            # a fenced blocking read that could not decide is read again, backing off
            request = self.core.next_request() if self._backoff_ready() else None
            if request is None:
                emit(self.take())
                time.sleep(0.01)
                continue
            self._backoff.submitted()
            self._execute(request, results.append)
            for result in results:
                emit(result())
            results.clear()

    def state(self) -> dict[str, Any] | None:
        return self.core.state()

    def status(self) -> dict[str, Any]:
        return self.core.status()


def _await_floor(reader: SnapshotReader, floor: Position | None) -> None:
    """Before a fenced read: a reader that lags the stream (a hot standby) waits until
    it has replayed the floor, so that the read is not wasted (its fence would not
    cover it); bounded (``ReplayWaiter``), after which the read goes ahead anyway and
    the core reads it again if it must."""
    if floor is not None and isinstance(reader, ReplayWaiter):
        reader.wait_replayed(floor)


def _parallelism(reader: SnapshotReader) -> int:
    """Chunks read at once in their own windows: the reader's ``parallelism`` if it can
    fork (``ConcurrentReader``), else 1 (one chunk at a time, with read-ahead)."""
    if not isinstance(reader, ConcurrentReader):
        return 1
    return max(1, reader.parallelism())


def _integer_key(reader: SnapshotReader, info: TableInfo) -> bool:
    """The chunk key is one column of an integer type, so its ranges may be cut by
    arithmetic (``core.intsplit``): the reader's ``integer_key`` says so (a reader
    without one: never)."""
    return isinstance(reader, IntegerKeyReader) and reader.integer_key(info)


def _slice_rows(wanted: int, fenced: bool) -> int:
    """``PYDBLOG_SLICE_ROWS`` unless the windows are fenced (PostgreSQL's watermark
    windows, read-only windows): slices of fenced windows have a known wrong-result bug
    (docs/snapshots.md, test_sliced_windows_long[late]), so they are ignored there with
    one warning, and windows are emitted whole at H."""
    if wanted > 0 and fenced:
        log.warning("PYDBLOG_SLICE_ROWS=%d ignored: snapshot windows are fenced on this source "
                    "(or read-only), and slices of fenced windows have a known wrong-result "
                    "bug (docs/snapshots.md); windows are emitted whole", wanted)
        return 0
    return wanted


def _fences_windows(reader: SnapshotReader) -> bool:
    """The reader hands a ``ReadFence`` with every watermark window's rows
    (``CoreSettings.fenced``): its ``fences_watermark_windows()`` says so."""
    return isinstance(reader, WindowFencer) and reader.fences_watermark_windows()


def _fences_blocking_reads(reader: SnapshotReader) -> bool:
    """The reader hands a ``ReadFence`` with every blocking read's rows
    (``CoreSettings.fenced_blocking``): its ``fences_blocking_reads()`` says so."""
    return isinstance(reader, BlockingFencer) and reader.fences_blocking_reads()


def _keyed(info: TableInfo, request: ChunkRequest) -> TableInfo:
    """The chunk key and the row identity are the ones fixed when the table's snapshot
    started (persisted with its progress), whatever the catalog says now."""
    identity = request.identity or info.identity
    if info.key == request.key_columns and info.identity == identity:
        return info
    return info.with_key(request.key_columns, identity)
