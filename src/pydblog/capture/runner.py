"""The capture loop: reads the source's stream, interleaves snapshot chunks, and
appends to the change log in batches.

Commit order (see ``ports``): change log append (events + checkpoint, one commit)
-> state store save -> source ack. On start the newer of the change log's and the
state store's checkpoint wins, and every stream item at or below its position is
dropped, so a ``kill -9`` at any point loses nothing and logs nothing twice.

Batching: a batch is flushed when the stream has momentarily nothing more to give
(``Idle``), at a heartbeat, at a commit once the batch is ``batch_max_ms`` old, or when
it holds ``batch_max_events`` (then possibly mid-transaction: the checkpoint records
the last logged event's position, the ack stays at the last complete transaction).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from pydblog.capture.driver import SnapshotDriver
from pydblog.capture.status import StatusWriter
from pydblog.capture.writer import Batch, BatchWriter
from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.config import Config
from pydblog.events import ChangeEvent, EncodedEvent, encode_event
from pydblog.ports import (
    Checkpoint,
    Commit,
    Heartbeat,
    Idle,
    LogSource,
    SchemaChanged,
    SnapshotReader,
    StateStore,
    TableSchema,
    WatermarkSeen,
)
from pydblog.positions import Position

log = logging.getLogger(__name__)

RETENTION_EVERY_S = 60.0


class Runner:
    def __init__(
        self,
        cfg: Config,
        source: LogSource,
        reader: SnapshotReader,
        changelog: SqliteChangeLog,
        state: StateStore,
    ) -> None:
        self.cfg = cfg
        self.source = source
        self.reader = reader
        self.changelog = changelog
        self.state = state
        self._pending: list[EncodedEvent] = []
        self._pending_since = 0.0
        self._schemas: list[TableSchema] = []
        self._known_schemas: dict[str, TableSchema] = {
            s.qualified: s for _, s in changelog.schemas()
        }
        self._position: Position | None = None
        self._saved_position: Position | None = None
        self._ack: Position | None = None
        self._extra: dict[str, Any] = {}
        self.status = StatusWriter(cfg.log_dir)
        self.writer = BatchWriter(changelog, state)
        self._acked: Position | None = None
        self.driver: SnapshotDriver | None = None
        self.opened = False
        self._in_tx = False

    # -- recovery ---------------------------------------------------------------------
    def recover(self) -> Checkpoint | None:
        from_log = self.changelog.last_checkpoint()
        from_state = self.state.load()
        best = from_state
        if from_log is not None and (from_state is None or from_log.is_newer_than(from_state)):
            best = from_log
            self.state.save(from_log)  # repair a crash between log commit and state save
        if best is not None:
            self._position = best.position
            self._saved_position = best.position
            self._extra = dict(best.extra)
        return best

    # -- main loop ----------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        checkpoint = self.recover()
        self.source.open(checkpoint)
        self.opened = True
        connector, db = self.source.connector, self.source.db
        self.driver = SnapshotDriver(
            self.cfg, self.reader, checkpoint.snapshot if checkpoint else None
        )
        skip = checkpoint.position if checkpoint else None
        if self.cfg.snapshot.mode == "initial" and not self._extra.get("initial_started"):
            self._extra["initial_started"] = True
            self.driver.start_initial(self.reader.captured_tables())
        signal_table = self.cfg.snapshot.signal_table
        watermark_table = self.cfg.snapshot.watermark_table
        driver = self.driver
        pending = self._pending
        max_events = self.cfg.log.batch_max_events
        max_age = self.cfg.log.batch_max_ms / 1000.0
        last_retention = time.monotonic()
        driver_active = driver.active
        now_ms = int(time.time() * 1000)
        log.info("capturing from %s (%s)", db, connector)
        for item in self.source.stream():
            kind = type(item)
            if kind is ChangeEvent:
                ev: ChangeEvent = item
                if skip is not None:
                    if ev.position <= skip:
                        continue
                    skip = None
                qualified = f"{ev.schema}.{ev.table}"
                self._in_tx = True
                if qualified == signal_table:
                    self._emit(driver.on_signal_event(ev, self.reader.captured_tables()), connector, db)
                    driver_active = driver.active
                elif qualified == watermark_table:
                    if ev.after is not None:
                        self._emit(driver.on_watermark(str(ev.after.get("value")), ev.position, ev.ts_ms), connector, db)
                        driver.submit_next()  # the next chunk starts now, not at the next idle
                        driver_active = driver.active
                else:
                    if driver_active:
                        driver.on_event(ev)
                    if not pending:
                        self._pending_since = time.monotonic()
                    pending.append(encode_event(ev, connector, db, now_ms))
                self._position = ev.position
                if len(pending) >= max_events:
                    self.flush()
            elif kind is Commit:
                if skip is not None and item.position <= skip:
                    continue
                self._advance(item.position)
                self._ack = item.position
                self._in_tx = False
                now_ms = int(time.time() * 1000)
                if pending and time.monotonic() - self._pending_since >= max_age:
                    self.flush()
            elif kind is Idle:
                self.flush()
                self._tick(stop, connector, db)
                driver_active = driver.active
                now_ms = int(time.time() * 1000)
                if stop.is_set():
                    break
                now = time.monotonic()
                if now - last_retention > RETENTION_EVERY_S:
                    last_retention = now
                    self._retention()
            elif kind is Heartbeat:
                if skip is not None and item.position <= skip:
                    continue
                self._advance(item.position)
                self._ack = item.position
                self._in_tx = False
                self.flush(force=True)
                refresh = getattr(self.source, "refresh_tables", None)
                if refresh is not None:
                    refresh()
            elif kind is WatermarkSeen:
                if skip is not None and item.position <= skip:
                    continue
                self._emit(driver.on_watermark(item.id, item.position, 0), connector, db)
                self._advance(item.position)
                driver.submit_next()
                driver_active = driver.active
            elif kind is SchemaChanged:
                ts: TableSchema = item.table_schema
                if self._known_schemas.get(ts.qualified) != ts:
                    # A schema applies from the next offset on: flush what came before
                    # (schema changes are rare; this may split a transaction, which the
                    # checkpoint handles like any other mid-transaction flush).
                    if pending:
                        self.flush()
                    self._known_schemas[ts.qualified] = ts
                    self._schemas = [s for s in self._schemas if s.qualified != ts.qualified]
                    self._schemas.append(ts)

            if stop.is_set() and kind is not ChangeEvent:
                self.flush()
                break
        self.flush(force=True)

    def _emit(self, events: list[ChangeEvent], connector: str, db: str) -> None:
        if not events:
            return
        if not self._pending:
            self._pending_since = time.monotonic()
        now_ms = int(time.time() * 1000)
        self._pending.extend(encode_event(e, connector, db, now_ms) for e in events)
        self._advance(events[-1].position)

    def _advance(self, position: Position) -> None:
        """The checkpoint position only moves forward (a commit's position may sort
        before snapshot rows placed after its watermark)."""
        if self._position is None or self._position < position:
            self._position = position

    def _tick(self, stop: threading.Event, connector: str, db: str) -> None:
        """Runs between stream reads: chunk results, the next snapshot request, blocking
        snapshots, status."""
        driver = self.driver
        assert driver is not None
        driver.submit_next()
        self._emit(driver.take(), connector, db)
        if driver.blocking and not self._in_tx and self._position is not None:
            self.flush()

            def emit(events: list[ChangeEvent]) -> None:
                self._emit(events, connector, db)
                self.flush()

            keepalive = getattr(self.source, "keepalive", None) or (lambda: None)
            driver.run_blocking(self._position, stop, emit, keepalive)
            self.flush(force=True)
        self.status.maybe_write(self)

    def flush(self, force: bool = False) -> None:
        """Hand the pending batch (with the checkpoint describing it) to the writer,
        and acknowledge the source up to what the writer made durable.

        With ``force`` a checkpoint is written even without events (heartbeats: the
        position moved) and the call waits until everything is durable."""
        writer = self.writer
        if self._pending or self._schemas or (
            force and self._position is not None and self._position != self._saved_position
        ):
            driver = self.driver
            checkpoint = Checkpoint(
                self._position, driver.state() if driver is not None else None, dict(self._extra)
            )
            writer.submit(Batch(list(self._pending), checkpoint, list(self._schemas), self._ack))
            self._pending.clear()
            self._schemas.clear()
            self._saved_position = self._position
        if force:
            writer.drain()
        ack = writer.take_ack()
        if ack is not None and ack is not self._acked:
            self.source.ack(ack)
            self._acked = ack
        self.status.count(writer.take_written())

    def _retention(self) -> None:
        hours = self.cfg.log.retention_hours
        removed = self.changelog.enforce_retention(
            int(hours * 3_600_000) if hours is not None else None, self.cfg.log.retention_bytes
        )
        if removed:
            log.info("retention removed %d old events", removed)
