"""Drives the IO-free snapshot core: runs its requests on a worker thread, feeds the
results back, and routes signals and watermarks to it.

The non-stalling window: for a chunk the worker writes the low watermark L, runs the
chunk SELECT on its own connection and queues the rows, and only then writes the high
watermark H. The capture loop drains the queue before it hands any watermark to the
core, so the rows are there when H arrives, and the stream never waits for a SELECT.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from pydblog.config import Config
from pydblog.core.signals import parse_signal
from pydblog.core.snapshot import ChunkRequest, CoreSettings, SnapshotCore, TableStartRequest
from pydblog.errors import DblogError, SignalError
from pydblog.events import ChangeEvent, Op
from pydblog.ports import LogSource, SnapshotReader
from pydblog.positions import Position

log = logging.getLogger(__name__)

Result = Callable[[], list[ChangeEvent]]


class SnapshotDriver:
    def __init__(self, cfg: Config, reader: SnapshotReader, state: dict[str, Any] | None) -> None:
        s = cfg.snapshot
        self.reader = reader
        self.core = SnapshotCore(
            CoreSettings(
                chunk_size=s.chunk_size,
                adaptive=s.adaptive,
                time_budget_ms=s.chunk_time_budget_ms,
                min_chunk=s.min_chunk_size,
                max_chunk=s.max_chunk_size,
            ),
            state,
        )
        self._results: queue.Queue[Result] = queue.Queue()
        self._inflight = False
        self._worker: threading.Thread | None = None
        self._requests: queue.Queue[Any] = queue.Queue()
        self._last_position: Position | None = None

    # -- routing ----------------------------------------------------------------------
    @property
    def window_open(self) -> bool:
        return self.core.active

    @property
    def blocking(self) -> bool:
        return bool(getattr(self.core, "blocking", False))

    def on_event(self, event: ChangeEvent) -> None:
        self.core.on_event(event)

    def on_signal_event(self, event: ChangeEvent, source: LogSource) -> list[ChangeEvent]:
        if event.op is not Op.CREATE or event.after is None:
            return []
        row = event.after
        self._drain()
        try:
            signal = parse_signal(str(row.get("id")), str(row.get("type")), row.get("data"))
        except SignalError as exc:
            log.warning("rejected signal %s: %s", row.get("id"), exc)
            return [self._rejected(event, str(exc))]
        captured = list(getattr(source, "captured_tables", []) or self.reader.captured_tables())
        log.info("signal %s: %s %s", signal.id, signal.type.value, ", ".join(signal.data_collections))
        return self.core.on_signal(signal, captured, event.position, event.ts_ms)

    def _rejected(self, event: ChangeEvent, reason: str) -> ChangeEvent:
        row = event.after or {}
        return ChangeEvent(
            Op.NOTIFICATION, "", "", event.position, event.ts_ms,
            notification={
                "aggregate_type": "Incremental Snapshot",
                "type": "REJECTED",
                "signal_id": row.get("id"),
                "additional_data": {"reason": reason, "signal_type": row.get("type")},
            },
        )

    def on_watermark(self, watermark_id: str, position: Position, ts_ms: int) -> list[ChangeEvent]:
        self._drain()
        return self.core.on_watermark(watermark_id, position, ts_ms)

    def on_schema_changed(self, qualified: str) -> None:
        """The core reads columns from rows, so nothing is cached to invalidate."""

    def start_initial(self, source: LogSource, position: Position) -> list[ChangeEvent]:
        captured = list(getattr(source, "captured_tables", []) or self.reader.captured_tables())
        log.info("initial snapshot of %d tables", len(captured))
        return self.core.start_initial(captured, position, int(time.time() * 1000))

    # -- requests -----------------------------------------------------------------------
    def submit_next(self) -> None:
        self._drain()
        if self._inflight:
            return
        request = self.core.next_request()
        if request is None:
            return
        self._inflight = True
        self._ensure_worker()
        self._requests.put(request)

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="dblog-chunks", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while True:
            request = self._requests.get()
            try:
                if isinstance(request, TableStartRequest):
                    self._start_table(request)
                elif isinstance(request, ChunkRequest):
                    self._read_chunk(request)
            except Exception as exc:  # reported to the core, capture goes on
                msg = str(exc) if isinstance(exc, DblogError) else f"{type(exc).__name__}: {exc}"
                log.warning("snapshot request failed: %s", msg)
                rid = request.id
                self._results.put(lambda rid=rid, msg=msg: self._failed(rid, msg))

    def _failed(self, request_id: str, msg: str) -> list[ChangeEvent]:
        pos = self._last_position
        if pos is None:
            return []
        return self.core.on_request_failed(request_id, msg, pos, int(time.time() * 1000))

    def _start_table(self, req: TableStartRequest) -> None:
        info = self.reader.table_info(req.table, req.surrogate_key)
        max_key = None
        error = None
        if info is None:
            error = f"table {req.table} does not exist"
        elif not info.key:
            error = (f"table {req.table} has no primary key: name a column with "
                     "surrogate-key (CLI: --surrogate-key COL)")
        else:
            if req.condition:
                self.reader.check_filter(info, req.condition)
            max_key = self.reader.max_key(info, req.condition)
        self._results.put(lambda: self._table_started(req, info, max_key, error))

    def _table_started(self, req: TableStartRequest, info: Any, max_key: Any, error: str | None) -> list[ChangeEvent]:
        self.core.on_table_started(req.id, info, max_key, error)
        return []

    def _read_chunk(self, req: ChunkRequest) -> None:
        if req.low_watermark is not None:
            self.reader.write_watermark(req.low_watermark)
        t0 = time.perf_counter()
        rows = self.reader.read_chunk(req.info, req.after_key, req.max_key, req.limit, req.condition)
        elapsed = (time.perf_counter() - t0) * 1000
        self._results.put(lambda: self._chunk_read(req, rows, elapsed))
        if req.high_watermark is not None:
            self.reader.write_watermark(req.high_watermark)

    def _chunk_read(self, req: ChunkRequest, rows: list[dict[str, Any]], elapsed: float) -> list[ChangeEvent]:
        self.core.on_chunk_read(req.id, rows, elapsed)
        return []

    def _drain(self) -> list[ChangeEvent]:
        out: list[ChangeEvent] = []
        while True:
            try:
                result = self._results.get_nowait()
            except queue.Empty:
                return out
            self._inflight = False
            out.extend(result())

    # -- blocking snapshots ---------------------------------------------------------------
    def run_blocking_step(self, position: Position) -> list[ChangeEvent]:
        step = getattr(self.core, "blocking_step", None)
        if step is None:
            return []
        events: list[ChangeEvent] = step(self.reader, position)
        return events

    def state(self) -> dict[str, Any] | None:
        return self.core.state()

    def status(self) -> dict[str, Any]:
        return self.core.status()
