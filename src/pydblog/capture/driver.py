"""Drives the IO-free snapshot core: runs its requests on a worker thread, feeds the
answers back, and routes signals and watermarks to it.

The non-stalling window: for a chunk the worker writes the low watermark L, runs the
chunk SELECT on its own connection and queues the rows, and only then writes the high
watermark H. The capture loop drains the answer queue before it hands any watermark
to the core, so the rows are there when H arrives, and the stream never waits for a
SELECT. Blocking snapshots run their requests inline while the stream is paused.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from pydblog.config import Config
from pydblog.core.requests import (
    ChunkRequest,
    KeyReadRequest,
    MarkRequest,
    Request,
    TableStartRequest,
)
from pydblog.core.signals import parse_signal
from pydblog.core.sizing import CoreSettings
from pydblog.core.snapshot import SnapshotCore
from pydblog.errors import ConfigError, DblogError, SignalError
from pydblog.events import ChangeEvent, Emitted, Op
from pydblog.metrics import CAPTURE as METRICS
from pydblog.ports import FencedReader, SnapshotReader, TableInfo
from pydblog.positions import Position
from pydblog.threads import name_native_thread

log = logging.getLogger(__name__)

Answer = Callable[[], list[Emitted]]

MAX_HOLD_S = 1.0
"""Longest a chunk request waits for the change log writer's backlog to clear."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class SnapshotDriver:
    def __init__(self, cfg: Config, reader: SnapshotReader, state: dict[str, Any] | None) -> None:
        s = cfg.snapshot
        self.reader = reader
        self.core = SnapshotCore(
            CoreSettings(
                chunk_size=s.chunk_size,
                adaptive=s.effective_adaptive,
                time_budget_ms=s.chunk_time_budget_ms,
                min_chunk=s.min_chunk_size,
                max_chunk=s.max_chunk_size,
                read_only=s.watermark == "read-only",
            ),
            state,
        )
        self.read_only = s.watermark == "read-only"
        if self.read_only and not hasattr(reader, "read_chunk_fenced"):
            raise ConfigError(
                f'snapshot.watermark = "read-only" is not supported by the {cfg.source.type} '
                'source yet: use "table"'
            )
        self._answers: queue.Queue[Answer] = queue.Queue()
        self._requests: queue.Queue[Request] = queue.Queue()
        self._inflight = False
        self._worker: threading.Thread | None = None
        self._out: list[Emitted] = []
        self._paused_stream = False
        # Called (from the worker thread) when an answer is queued: wakes the runner
        # so it takes the answer and submits the next (read-ahead) request at once.
        self.wakeup: Callable[[], None] = lambda: None
        # True while new chunk requests should wait (the runner: the writer's backlog is long).
        self.hold: Callable[[], bool] = lambda: False
        self._held_since: float | None = None

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

    def on_watermark(self, watermark_id: str, position: Position, ts_ms: int) -> list[Emitted]:
        out = self.take()
        return out + self.core.on_watermark(watermark_id, position, ts_ms or _now_ms())

    def on_progress(self, position: Position, reached: Position) -> list[Emitted]:
        """Read-only snapshots: the stream is at a transaction boundary (see
        ``SnapshotCore.on_progress``)."""
        out = self.take()
        return out + self.core.on_progress(position, reached, _now_ms())

    @property
    def waiting_for_progress(self) -> bool:
        return self.core.waiting_for_progress

    def start_initial(self, captured: list[str]) -> None:
        log.info("initial snapshot of %d tables", len(captured))
        self.core.start_initial(captured)

    def take(self) -> list[Emitted]:
        """Apply the worker's answers; returns the events they produced."""
        while True:
            try:
                answer = self._answers.get_nowait()
            except queue.Empty:
                break
            self._inflight = False
            self._out.extend(answer())
        out, self._out = self._out, []
        return out

    # -- incremental requests on the worker ----------------------------------------------
    def submit_next(self) -> None:
        self._out.extend(self.take())
        if self._inflight or self.core.blocking:
            return
        if self.hold():
            # The stream comes first: while the change log writer has a long backlog, a new
            # chunk would only queue more rows in front of the stream's next events.
            # Held at most MAX_HOLD_S at a time, so a busy stream cannot starve it.
            now = time.monotonic()
            if self._held_since is None:
                self._held_since = now
            if now - self._held_since < MAX_HOLD_S:
                return
        self._held_since = None
        request = self.core.next_request()
        if request is None:
            return
        self._inflight = True
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="dblog-chunks", daemon=True)
            self._worker.start()
        self._requests.put(request)

    def _work(self) -> None:
        name_native_thread()
        def answer(result: Answer) -> None:
            self._answers.put(result)
            self.wakeup()

        while True:
            request = self._requests.get()
            self._execute(request, answer)

    def _execute(self, request: Request, answer: Callable[[Answer], None]) -> None:
        """Runs one request (see ``core.requests`` for each kind's duty, in order)."""
        core = self.core
        try:
            if isinstance(request, MarkRequest):
                self.reader.write_watermark(request.watermark)
                answer(lambda: [])
            elif isinstance(request, TableStartRequest):
                info, max_key, error = self._start_table(request)
                answer(lambda: core.on_table_started(request.id, info, max_key, error))
                if request.watermark is not None:  # the answer (even an error) lands there
                    self.reader.write_watermark(request.watermark)
            elif isinstance(request, KeyReadRequest):
                self._reread(request, answer)
            else:
                if request.low_watermark is not None:
                    self.reader.write_watermark(request.low_watermark)
                info = self.reader.table_info(request.table, request.surrogate_key)
                if info is None:
                    raise SignalError(f"table {request.table} no longer exists")
                t0 = time.perf_counter()
                if request.fenced:
                    fenced = cast(FencedReader, self.reader)
                    rows, fence = fenced.read_chunk_fenced(
                        _keyed(info, request), request.after_key, request.max_key,
                        request.limit, request.condition,
                    )
                else:
                    fence = None
                    rows = self.reader.read_chunk(
                        _keyed(info, request), request.after_key, request.max_key,
                        request.limit, request.condition,
                    )
                elapsed = (time.perf_counter() - t0) * 1000
                answer(lambda: core.on_chunk_read(request.id, rows, elapsed, fence=fence))
                if request.high_watermark is not None:
                    self.reader.write_watermark(request.high_watermark)
        except Exception as exc:  # reported to the core; capture goes on
            retriable = exc.retriable if isinstance(exc, DblogError) else None
            msg = str(exc) if isinstance(exc, DblogError) else f"{type(exc).__name__}: {exc}"
            log.warning("snapshot request for %s failed: %s", getattr(request, "table", "?"), msg)
            answer(lambda: core.on_request_failed(request.id, msg, retriable=retriable))

    def _reread(self, request: KeyReadRequest, answer: Callable[[Answer], None]) -> None:
        """A key-level re-read (``core.rereads``): L, the rows of those keys, H."""
        core = self.core
        self.reader.write_watermark(request.low_watermark)
        info = self.reader.table_info(request.table)
        if info is None:
            raise SignalError(f"table {request.table} no longer exists")
        t0 = time.perf_counter()
        rows = self.reader.read_keys(info.with_key(request.identity, request.identity), request.keys)
        elapsed = (time.perf_counter() - t0) * 1000
        answer(lambda: core.on_chunk_read(request.id, rows, elapsed))
        self.reader.write_watermark(request.high_watermark)

    def _start_table(self, req: TableStartRequest) -> tuple[TableInfo | None, Any, str | None]:
        try:
            info = self.reader.table_info(req.table, req.surrogate_key)
            if info is None:
                return None, None, f"table {req.table} does not exist"
            if not info.key:
                return info, None, (
                    f"table {req.table} has no primary key (nor a REPLICA IDENTITY USING "
                    "INDEX): name a column to chunk by with surrogate-key "
                    "(CLI: --surrogate-key COL)"
                )
            if req.condition:
                self.reader.check_filter(info, req.condition)
            return info, self.reader.max_key(info, req.condition), None
        except SignalError as exc:
            return None, None, str(exc)

    # -- blocking snapshots ------------------------------------------------------------------
    def run_blocking(self, position: Position, stop: threading.Event,
                     emit: Callable[[list[Emitted]], None], keepalive: Callable[[], None]) -> None:
        """The stream is paused at a transaction boundary at ``position``: read the
        blocking snapshot's tables inline, emitting rows as they come."""
        while self._inflight:  # let an incremental request in flight finish first
            emit(self.take())
            time.sleep(0.01)
        self.core.on_stream_paused(position, _now_ms())
        results: list[Answer] = []
        while self.core.blocking and not stop.is_set():
            keepalive()
            request = self.core.next_request()
            if request is None:
                emit(self.take())
                time.sleep(0.01)
                continue
            self._execute(request, results.append)
            for result in results:
                emit(result())
            results.clear()

    def state(self) -> dict[str, Any] | None:
        return self.core.state()

    def status(self) -> dict[str, Any]:
        return self.core.status()


def _keyed(info: TableInfo, request: ChunkRequest) -> TableInfo:
    """The chunk key and the row identity are the ones fixed when the table's snapshot
    started (persisted with its progress), whatever the catalog says now."""
    identity = request.identity or info.identity
    if info.key == request.key_columns and info.identity == identity:
        return info
    return info.with_key(request.key_columns, identity)
