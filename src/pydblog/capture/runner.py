"""The capture loop: reads the source's stream, interleaves snapshot chunks, and
appends to the change log in batches.

Commit order (see ``ports``): change log append (events + checkpoint, one commit)
-> state store save -> source ack. On start the change log's checkpoint wins (a newer
state store checkpoint is refused: ``resume_from``), and every stream item at or below
its position is dropped, so a ``kill -9`` at any point loses nothing and logs nothing
twice.

Batching: a batch is flushed when the stream has momentarily nothing more to give
(``Idle``), at a heartbeat, at a commit once the batch is ``batch_max_ms`` old, or when
it holds ``batch_max_events`` (then possibly mid-transaction: the checkpoint records
the last logged event's position, the ack stays at the last complete transaction).

Snapshot slices (off by default, ``driver.SLICE_ROWS``): a concurrent window's rows
go to the writer a slice at a time, the first at its high watermark, the next ones at the stream's
transaction boundaries while the writer's backlog is short (``_slices``), each in the
batch whose checkpoint holds the progress it makes: the stream's events after H wait
for a slice's write, not for the chunk's.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import Any

from pydblog.capture import lagtrace, repairs
from pydblog.capture.driver import SLICE_ROWS, SnapshotDriver
from pydblog.capture.inbox import INBOX, REMEMBER
from pydblog.capture.kafka_signals import CHECKPOINT_KEY, Handled
from pydblog.capture.status import StatusWriter
from pydblog.capture.writer import Batch, BatchWriter
from pydblog.changelog import log_name
from pydblog.config import Config
from pydblog.core.notices import at_index, position_index
from pydblog.errors import ChangeLogError
from pydblog.events import (
    BLOCK_EVENTS,
    ChangeEvent,
    Emitted,
    Encoded,
    InsertRun,
    Op,
    RowRun,
    SnapshotRows,
    encode_event,
    encode_insert_run,
    encode_row_run,
    encode_snapshot_rows,
    last_position,
)
from pydblog.ports import (
    ChangeLogReader,
    ChangeLogWriter,
    Checkpoint,
    Commit,
    DescribesTables,
    Heartbeat,
    Idle,
    KeepsAlive,
    Lease,
    LogSource,
    ProgressRequesting,
    RefreshesTables,
    RelationReset,
    ResetKind,
    RunBatching,
    SchemaChanged,
    SnapshotReader,
    SourceState,
    StateStore,
    StreamPassed,
    TableSchema,
    Wakeable,
    WatermarkSeen,
)
from pydblog.positions import PgPosition, Position
from pydblog.state.file import STATE_FILE

log = logging.getLogger(__name__)

RETENTION_EVERY_S = 60.0
HOLD_BACKLOG_EVENTS = 16_384
"""New snapshot chunks wait while the change log writer has this many events queued
(about two chunks of the largest adaptive size, ~30 ms of writing): the stream's next
events are not queued behind more snapshot rows, and chunk reads still overlap writes.
(Holding whenever the writer's queue was full held read-ahead back behind a few small
stream batches most of the time.)"""

HOLD_STREAM_WAIT_S = float(os.environ.get("PYDBLOG_HOLD_STREAM_WAIT_MS", "50")) / 1000
"""New snapshot chunks also wait while a stream event received this long ago is not yet
in the change log (pending, or queued to the writer). On a busy machine the writer and
the capture thread wait for a CPU most of the time (a lag trace shows it,
``capture/lagtrace.py``): each chunk read in that state only queues more rows in front of the stream's
next events. Measured on this process's own clock (no clock skew to the server).
``PYDBLOG_HOLD_STREAM_WAIT_MS`` overrides it for benchmarks (0: off)."""

SLICE_BACKLOG = 2 * max(1, SLICE_ROWS)
"""The next slice of a snapshot window (``driver.SLICE_ROWS``) goes to the writer at a
transaction boundary only while it has fewer events than this queued: a stream event
then waits for at most about two slices' writes, whatever the chunk's size, and the
writer always has the next slice queued (it wakes the stream when its backlog falls
below this, ``BatchWriter.wake_below``)."""


MID_TX = "mid_tx"
"""Checkpoint ``extra`` key: the checkpoint's position is inside a transaction (a batch
flushed at ``batch_max_events`` or before a schema change)."""


def resume_from(from_log: Checkpoint | None, from_state: Checkpoint | None,
                cfg: Config) -> Checkpoint | None:
    """The checkpoint capture resumes from: the change log's (``from_log``), unless the
    state file's (``from_state``) is newer, which is refused.

    The state file is saved only after the change log committed the same checkpoint
    (``BatchWriter``; fenced commits save nothing), and checkpoints only move forward,
    so with its own log it is never ahead: the log wins ties and is ahead after a crash
    between its commit and the save, or after another host wrote it (Kafka, an empty
    local ``[log] path``). A state file *newer* than the log means that the log is not
    the one this capture wrote, or lost commits: ``topic_prefix`` or
    ``bootstrap_servers`` changed, the topics deleted, a new cluster, an in-memory
    broker restarted, the SQLite file deleted, replaced or restored from an older copy.
    Resuming at the state file's position would continue that log as if it held every
    event before it, and ``mode = "initial"`` would take no snapshot (its flag is in the
    checkpoint): a silent gap. So it is refused."""
    if from_state is None or not from_state.is_newer_than(from_log):
        return from_log
    state_file = cfg.log_dir / STATE_FILE
    have = (f"an older checkpoint, at {position_text(from_log)}," if from_log is not None
            and from_log.position is not None else "no checkpoint")
    if from_log is not None and from_log.position is not None \
            and not isinstance(from_log.position, PgPosition):
        fix = ("point [log] at the change log this capture wrote (a newer copy of it); or "
               f"remove {state_file}: capture resumes this log at its checkpoint, and the "
               "binlog still holds the changes since (acknowledging MySQL/MariaDB discards "
               "nothing); if its expiry purged the files or GTIDs needed, the source refuses "
               "to start, naming them (then start a new change log: another [log] path, with "
               'Kafka also another topic_prefix, and [snapshot] mode = "initial")')
    elif from_log is not None and from_log.position is not None:
        fix = ("point [log] at the change log this capture wrote (a newer copy of it); or "
               "start a new change log: another [log] path (with Kafka also another "
               'topic_prefix) and [snapshot] mode = "initial" (every captured table is '
               f"snapshotted). Removing only {state_file} would resume this log at its older "
               "checkpoint, and the source, acknowledged up to the state file's position (a "
               "PostgreSQL slot), would not give the changes in between again")
    else:
        fix = (f"point [log] at the change log this capture wrote; or, to start this log "
               f"afresh, remove {state_file} (or use another [log] path): capture then starts "
               "at the replication slot's (or binlog's) current position, and with [snapshot] "
               'mode = "initial" snapshots every captured table')
    raise ChangeLogError(
        f"{log_name(cfg.log)} has {have} but the state file {state_file} has one at "
        f"{position_text(from_state)}: this is not the change log that capture wrote, or "
        "it lost commits (topic_prefix or bootstrap_servers changed, its topics deleted or "
        "emptied, a retention set on its checkpoint topic deleting its checkpoints while "
        "capture was down, a new Kafka cluster or a restarted in-memory broker; the SQLite file "
        "deleted, replaced or restored from an older copy). Resuming would leave every "
        "event before that position out of this log, so dblog does not start",
        hint=fix,
    )


def position_text(checkpoint: Checkpoint | None) -> str:
    """A checkpoint's source position, for messages."""
    pos = checkpoint.position if checkpoint is not None else None
    if pos is None:
        return "no position"
    if isinstance(pos, PgPosition):
        return f"LSN {pos.commit_lsn} (index {pos.index})"
    return str(pos)


class Runner:
    def __init__(
        self,
        cfg: Config,
        source: LogSource,
        reader: SnapshotReader,
        changelog: ChangeLogWriter,
        state: StateStore,
    ) -> None:
        self.cfg = cfg
        self.source = source
        self.reader = reader
        self.changelog = changelog
        self.state = state
        self._pending: list[Encoded] = []
        self._pending_extra = 0  # events in _pending beyond one per item (blocks)
        self._pending_since = 0.0
        self._trace: list[tuple[int, float]] = []  # lagtrace: (commit ms, received)
        # When the oldest stream event in _pending was received (monotonic), and for
        # each submitted batch holding stream events not yet appended: (its submission
        # number, that time). Chunk reads wait while one waits too long.
        self._stream_since: float | None = None
        self._stream_inflight: deque[tuple[int, float]] = deque()
        self._submitted = 0
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
        self._skip: Position | None = None
        self._connector = ""
        self._db = ""
        self._driver_active = False
        self._now_ms = int(time.time() * 1000)
        self._last_retention = -math.inf  # first idle moment applies retention (not
        # RETENTION_EVERY_S after the machine's boot: monotonic time)
        self._writer_wakes = False  # the writer wakes the stream when its queue drains
        # High availability: the elected leader's term, checked before every source ack
        # and at every idle tick (``None``: no [ha], a single capture process).
        self.lease: Lease | None = None
        # The Kafka signal channel's positions (``[snapshot] signal_topic``), kept in the
        # checkpoint's extra; set by the service before ``run``.
        self.kafka_signals: Handled | None = None
        self._extra_dirty = False  # extra changed: the next flush writes a checkpoint
        # when the last checkpoint was written (an idle source's is rewritten every
        # heartbeat interval: its time tells `dblog sync` how far the source is complete)
        self._last_checkpoint = time.monotonic()
        self._repair_reader: ChangeLogReader | None = None

    # -- recovery ---------------------------------------------------------------------
    @property
    def logged_position(self) -> Position | None:
        """The position of the last event handed to the change log writer."""
        return self._position

    def snapshot_status(self) -> dict[str, Any] | None:
        """The snapshot core's progress, None before the snapshot driver exists."""
        return self.driver.status() if self.driver is not None else None

    def recover(self) -> Checkpoint | None:
        from_log = self.changelog.last_checkpoint()
        from_state = self.state.load()
        best = resume_from(from_log, from_state, self.cfg)
        if best is not None and best is from_log:
            self.state.save(best)  # repair a crash between log commit and state save
        if best is not None:
            self._position = best.position
            self._saved_position = best.position
            self._extra = dict(best.extra)
            # Inside a transaction: the source replays it; until its Commit nothing may
            # be placed after the checkpoint's position (its next index is the
            # transaction's own next event).
            self._in_tx = bool(self._extra.pop(MID_TX, False))
        return best

    # -- main loop ----------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        checkpoint = self.recover()
        handled = self.kafka_signals
        if handled is not None:  # the listener starts from the recovered positions
            entry = handled.load(self._extra.get(CHECKPOINT_KEY))
            self._extra_dirty = entry != self._extra.get(CHECKPOINT_KEY)
            self._extra[CHECKPOINT_KEY] = entry
        self.source.open(checkpoint)
        self.opened = True
        self._connector, self._db = self.source.connector, self.source.db
        driver = self.driver = SnapshotDriver(
            self.cfg, self.reader, checkpoint.snapshot if checkpoint else None
        )
        wakeup = self.source.wakeup if isinstance(self.source, Wakeable) else None
        if wakeup is not None:
            driver.wakeup = wakeup
            self.writer.on_drained = wakeup
            self._writer_wakes = True
        driver.hold = self._hold
        if wakeup is not None:
            INBOX.wake = wakeup
        self._skip = checkpoint.position if checkpoint else None
        if self.cfg.snapshot.mode == "initial" and not self._extra.get("initial_started"):
            self._extra["initial_started"] = True
            driver.start_initial(self.reader.captured_tables())
        log.info("capturing from %s (%s)", self._db, self._connector)
        own = {self.cfg.snapshot.signal_table, self.cfg.snapshot.watermark_table}
        handlers: dict[type, Callable[[Any, threading.Event], bool | None]] = {
            Commit: self._on_commit,
            Idle: self._on_idle,
            Heartbeat: self._on_heartbeat,
            WatermarkSeen: self._on_watermark_seen,
            SchemaChanged: self._on_schema,
            StreamPassed: self._on_stream_passed,
            SourceState: self._on_source_state,
            RelationReset: self._on_relation_reset,
        }
        self._read_only = driver.read_only
        pending = self._pending
        max_events = self.cfg.log.batch_max_events
        trace = lagtrace.ON
        if isinstance(self.source, RunBatching):  # a batch never holds much more than max_events
            self.source.run_rows = max(1, min(BLOCK_EVENTS, max_events))
        self.status.maybe_write(self, force=True)  # opened (api.health: not stuck)
        for item in self.source.stream():
            if type(item) is ChangeEvent:
                # The hot path, kept inline: one captured row change.
                ev: ChangeEvent = item
                if self._skip is not None:
                    if ev.position <= self._skip:
                        continue
                    self._skip = None
                self._in_tx = True
                self._position = ev.position
                if f"{ev.schema}.{ev.table}" in own:
                    t0 = time.time() if trace else 0.0
                    self._route_own(ev)
                    if trace:
                        lagtrace.stall(t0, "Watermark")
                    continue
                if self._driver_active:
                    driver.on_event(ev)
                elif ev.unchanged:  # may need a key re-read (core.rereads) even when idle
                    driver.on_event(ev)
                    self._driver_active = driver.active
                if not pending:
                    self._pending_since = time.monotonic()
                if self._stream_since is None:
                    self._stream_since = time.monotonic()
                pending.append(encode_event(ev, self._connector, self._db, self._now_ms))
                if trace:
                    self._trace.append((ev.ts_ms, time.time()))
                if len(pending) >= max_events:
                    t0 = time.time() if trace else 0.0
                    self.flush()
                    if trace:
                        lagtrace.stall(t0, "flush")
                continue
            if type(item) is InsertRun or type(item) is RowRun:
                # Inserts the source encoded in C: one block, no event objects.
                run: InsertRun | RowRun | None = item
                if self._skip is not None:
                    assert run is not None
                    if run.last_position <= self._skip:
                        continue
                    run = run.past(self._skip)
                    self._skip = None
                    if run is None:
                        continue
                assert run is not None
                self._in_tx = True
                self._position = run.last_position
                if self._driver_active:  # the windows see every event
                    for ev in run.events():
                        driver.on_event(ev)
                if not pending:
                    self._pending_since = time.monotonic()
                if self._stream_since is None:
                    self._stream_since = time.monotonic()
                encoded = (encode_insert_run(run, self._connector, self._db, self._now_ms)
                           if isinstance(run, InsertRun) else
                           encode_row_run(run, self._connector, self._db, self._now_ms))
                pending.extend(encoded)
                self._pending_extra += run.size - len(encoded)
                if trace:
                    self._trace.extend(repeat((run.ts_ms, time.time()), run.size))
                if len(pending) + self._pending_extra >= max_events:
                    t0 = time.time() if trace else 0.0
                    self.flush()
                    if trace:
                        lagtrace.stall(t0, "flush")
                continue
            handler = handlers.get(type(item))
            t0 = time.time() if trace else 0.0
            if handler is not None and handler(item, stop) is False:
                break
            if trace:
                lagtrace.stall(t0, type(item).__name__)
            if stop.is_set():
                self.flush()
                break
        self.flush(force=True)
        if self._repair_reader is not None:
            self._repair_reader.close()
            self._repair_reader = None

    # -- stream items other than row changes -------------------------------------------
    def _route_own(self, ev: ChangeEvent) -> None:
        """A row event of the signal or the watermark table: never logged itself."""
        driver = self.driver
        assert driver is not None
        if f"{ev.schema}.{ev.table}" == self.cfg.snapshot.signal_table:
            self._mark_signal(ev.after.get("id") if ev.after is not None else None)
            self._emit_events(driver.on_signal_event(ev, self.reader.captured_tables()))
            # A snapshot starts now, not at the next idle moment (a busy MySQL stream
            # yields none while its transactions come closer than its idle interval).
            driver.submit_next()
        elif ev.after is not None:
            self._flush_before_window()
            self._emit_events(driver.on_watermark(str(ev.after.get("value")), ev.position, ev.ts_ms))
            driver.submit_next()  # the next chunk starts now, not at the next idle moment
        self._driver_active = driver.active

    def _slices(self) -> None:
        """At a transaction boundary: the next slices of the snapshot windows being
        handed out (``driver.SLICE_ROWS``; the first one lands at H), while the
        writer has fewer than ``SLICE_BACKLOG`` events queued. Each goes to the writer
        in one batch with the stream's events received before it, checkpointed with
        the progress it makes (the table's progress at the slice's last key: a restart
        reads the rest of that chunk again). A stream event received after H thus
        waits for a slice's write, not for the whole chunk's (``core.flight``, "Slices")."""
        driver = self.driver
        if driver is None or self._in_tx or self._position is None:
            return
        writer = self.writer
        if not driver.draining:
            writer.wake_below = 0
            return
        handed = False
        while driver.draining and writer.backlog() + len(self._pending) < SLICE_BACKLOG:
            events = driver.on_boundary(self._position)
            if not events:
                break
            handed = True
            self._emit_events(events)
            self.flush()
        writer.wake_below = SLICE_BACKLOG if driver.draining else 0
        if handed:
            driver.submit_next()  # a range done makes room for the next read
            self._driver_active = driver.active

    def _flush_before_window(self) -> None:
        """At a watermark, before the core sees it: the events pending so far go to
        the writer as their own batch, so that they commit without waiting for the
        rows the watermark may release (``writer.GROUP_BULK_EVENTS``). The checkpoint
        holds the core's state before the watermark: a restart reads that chunk again
        (the watermark itself is at or below the checkpoint, so it is skipped, as any
        watermark of an interrupted chunk is ignored)."""
        if self._pending:
            self.flush()

    def _skipped(self, position: Position) -> bool:
        return self._skip is not None and position <= self._skip

    def _on_commit(self, item: Commit, stop: threading.Event) -> None:
        if self._skipped(item.position):
            return
        self._advance(item.position)
        self._ack = item.position
        self._in_tx = False
        self._now_ms = int(time.time() * 1000)
        if self._read_only and self._driver_active:
            self._progress(item.position)
        if INBOX.waiting:
            self._take_signals()
        if self._driver_active:
            self._slices()
        max_age = self.cfg.log.batch_max_ms / 1000.0
        if self._pending and time.monotonic() - self._pending_since >= max_age:
            self.flush()
        if repairs.REPAIR_MARKERS in self._extra:
            self._log_repairs()

    def _on_idle(self, item: Idle, stop: threading.Event) -> bool:
        # The source has nothing more right now: flush, unless the writer is still
        # committing and will wake the stream when done (the events then go in one
        # commit with those that arrive meanwhile, instead of one fsync per
        # transaction; they would only have queued behind that commit anyway). A batch
        # older than ``batch_max_ms`` goes at the next transaction end regardless.
        if not (self._pending and self._writer_wakes and self.writer.backlog()):
            self.flush()
        if (not self._in_tx and not self._pending and self._position is not None
                and time.monotonic() - self._last_checkpoint
                >= self.cfg.source.heartbeat_interval_s):
            # Caught up and idle: the checkpoint is rewritten (same position), so its time
            # moves as a heartbeat's would (a MySQL/MariaDB source sends none while its
            # position stands still).
            self._extra_dirty = True
            self.flush()
        self._tick(stop)
        if self._driver_active:
            self._slices()
        if repairs.REPAIR_MARKERS in self._extra:
            self._log_repairs()
        self._now_ms = int(time.time() * 1000)
        if stop.is_set():
            return False
        now = time.monotonic()
        if now - self._last_retention > RETENTION_EVERY_S:
            self._last_retention = now
            self._retention()
        return True

    def _on_stream_passed(self, item: StreamPassed, stop: threading.Event) -> None:
        driver = self.driver
        waiting = self._driver_active or (driver is not None and driver.waiting_for_progress)
        if self._read_only and waiting and not self._in_tx:
            self._progress(item.position)

    def _progress(self, reached: Position) -> None:
        """Read-only snapshots, at a transaction boundary: rows whose fence the stream
        has passed land here, after everything logged so far. As at a watermark, the
        stream's pending events first go to the writer as their own batch
        (``_flush_before_window``) when a window closes here."""
        driver = self.driver
        assert driver is not None
        if self._position is None:  # nothing logged yet to place rows after
            return
        if self._pending and driver.closes_at(reached):
            self._flush_before_window()
        self._emit_events(driver.on_progress(self._position, reached))
        driver.submit_next()
        self._driver_active = driver.active

    def _take_signals(self) -> None:
        """Signals handed to this process (``capture.inbox``), applied at a transaction
        boundary after the last logged event; each offer is answered once the
        checkpoint holding its effect is durable."""
        driver = self.driver
        if self._in_tx or self._position is None or driver is None:
            return  # not yet: they wait for the next boundary
        items = INBOX.take()
        if not items:
            return
        answers: list[tuple[Any, str, str | None, dict[str, Any] | None]] = []
        try:
            seen = [str(i) for i in self._extra.get("direct_signals", [])]
            captured = self.reader.captured_tables()
            for item in items:
                if item.id in seen:
                    answers.append((item, "duplicate", None, None))
                    continue
                # A fresh position right after the highest logged (the next
                # transaction commits later): one notification per signal, like a
                # signal row's own position.
                at = at_index(self._position, position_index(self._position) + 1)
                events, error = driver.on_direct_signal(item.id, item.kind, item.data, captured, at,
                                                       item.problem)
                self._emit_events(events)
                seen.append(item.id)
                notice = next((e.notification for e in events if type(e) is ChangeEvent
                               and e.notification and e.notification.get("signal_id") == item.id),
                              None)
                answers.append((item, "rejected" if error else "applied", error, notice))
            for item in items:
                self._mark_signal(item.id)
            self._extra["direct_signals"] = seen[-REMEMBER:]
            self.flush(force=True)
        except BaseException:
            INBOX.put_back(items)  # a new capture applies them (or finds them applied)
            raise
        for item, outcome, error, notice in answers:
            item.answer(outcome, error, notice)
        self._driver_active = driver.active
        driver.submit_next()

    def _mark_signal(self, signal_id: object) -> None:
        """A signal handled: if it came from the Kafka signal topic, its offset goes
        into the checkpoint (``kafka_signals.Handled``)."""
        handled = self.kafka_signals
        if handled is not None and isinstance(signal_id, str) and handled.mark(signal_id):
            self._extra[CHECKPOINT_KEY] = handled.entry()
            self._extra_dirty = True

    def _on_heartbeat(self, item: Heartbeat, stop: threading.Event) -> None:
        if self._skipped(item.position):
            return
        self._advance(item.position)
        self._ack = item.position
        self._in_tx = False
        self.flush(force=True)
        if repairs.REPAIR_MARKERS in self._extra:
            self._log_repairs()
        if self._driver_active:
            self._slices()
        if isinstance(self.source, RefreshesTables):
            self.source.refresh_tables()

    def _on_source_state(self, item: SourceState, stop: threading.Event) -> None:
        if item.position is not None:
            if self._skipped(item.position):
                return
            self._advance(item.position)
        self._extra[item.key] = item.value

    def _on_watermark_seen(self, item: WatermarkSeen, stop: threading.Event) -> None:
        if self._skipped(item.position):
            return
        driver = self.driver
        assert driver is not None
        self._flush_before_window()
        self._emit_events(driver.on_watermark(item.id, item.position, 0))
        self._advance(item.position)
        driver.submit_next()
        self._driver_active = driver.active

    def _on_relation_reset(self, item: RelationReset, stop: threading.Event) -> None:
        """A captured table's name names a new relation (``ports.RelationReset``): its
        truncate is logged like a stream event, and its snapshot starts over."""
        ev = item.event
        if self._skipped(ev.position):
            return
        driver = self.driver
        assert driver is not None
        self._in_tx = True
        self._position = ev.position
        driver.on_event(ev)
        kind = item.kind
        if kind is ResetKind.JOINED and ev.qualified_table in self._known_schemas:
            # Found at start outside the publication, yet the log holds rows of it: a
            # relation that replaced the one captured before (while dblog was down, or
            # before a heartbeat noticed it). Its rows are in no event: snapshot it.
            kind = ResetKind.RECREATED
        driver.restart_table(ev.qualified_table, kind)
        # The new relation's schema is recorded again (from its first event or row).
        known = self._known_schemas.pop(ev.qualified_table, None) is not None
        self._driver_active = driver.active
        if kind is ResetKind.GONE and not known:
            # Dropped, with no schema recorded since its last truncate: no row of it is in
            # the log, so the truncate changes nothing (a DROP TABLE IF EXISTS of a missing
            # table, a table created and dropped without a row), and a sink could not
            # apply a truncate of a table it has no columns for. (A re-created table's
            # truncate stays: its snapshot follows and records the schema.)
            driver.submit_next()
            return
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(encode_event(ev, self._connector, self._db, self._now_ms))
        driver.submit_next()

    def _on_schema(self, item: SchemaChanged, stop: threading.Event) -> None:
        ts: TableSchema = item.table_schema
        if self._known_schemas.get(ts.qualified) == ts:
            return
        # A schema applies from the next offset on: flush what came before (schema
        # changes are rare; this may split a transaction, which the checkpoint handles
        # like any other mid-transaction flush).
        if self._pending:
            self.flush()
        self._known_schemas[ts.qualified] = ts
        self._schemas = [s for s in self._schemas if s.qualified != ts.qualified]
        self._schemas.append(ts)

    def _emit_events(self, events: list[Emitted]) -> None:
        """Log what the snapshot core produced (chunk rows in bulk, notifications)."""
        if not events:
            return
        for item in events:
            if type(item) is SnapshotRows and f"{item.schema}.{item.table}" not in self._known_schemas:
                self._describe(item.schema, item.table)
        if not self._pending:
            self._pending_since = time.monotonic()
        now_ms = int(time.time() * 1000)
        pending = self._pending
        connector, db = self._connector, self._db
        for item in events:
            if isinstance(item, SnapshotRows):
                encoded = encode_snapshot_rows(item, connector, db, now_ms, BLOCK_EVENTS)
                self._pending_extra += len(item.rows) - len(encoded)
                pending.extend(encoded)
            else:
                if item.op is Op.NOTIFICATION and self._repair_notice(item):
                    continue  # a range-end marker: logged by _log_repairs
                pending.append(encode_event(item, connector, db, now_ms))
        self._advance(last_position(events[-1]))

    # -- repairs (capture.repairs) -------------------------------------------------------
    def _repair_notice(self, ev: ChangeEvent) -> bool:
        """Note a repair's start; defer its range-end marker (True: not logged now)."""
        kind = repairs.kind_of(ev)
        if kind is None:
            return False
        note = ev.notification or {}
        sid = str(note.get("signal_id"))
        if kind == "start":
            self._extra.setdefault(repairs.REPAIR_SPANS, {})[sid] = self._repair_log().next_offset()
            return False
        if kind == "done":
            spans = self._extra.get(repairs.REPAIR_SPANS)
            waiting = self._extra.get(repairs.REPAIR_MARKERS) or []
            if spans and sid in spans and not any(
                (m["notification"] or {}).get("signal_id") == sid for m in waiting
            ):
                del spans[sid]
                if not spans:
                    del self._extra[repairs.REPAIR_SPANS]
            return False
        self._extra.setdefault(repairs.REPAIR_MARKERS, []).append(repairs.stored(ev))
        return True

    def _repair_log(self) -> ChangeLogReader:
        if self._repair_reader is None:
            from pydblog.changelog import open_reader

            self._repair_reader = open_reader(self.cfg.log)
        return self._repair_reader

    def _log_repairs(self) -> None:
        """At a transaction boundary: log the deferred range-end markers, each with the
        keys of its span (everything logged before it is durable first)."""
        waiting = self._extra.get(repairs.REPAIR_MARKERS)
        if not waiting or self._in_tx or self._position is None:
            return
        self.flush(force=True)
        reader = self._repair_log()
        end = reader.next_offset()
        spans: dict[str, int] = self._extra.get(repairs.REPAIR_SPANS) or {}
        now_ms = int(time.time() * 1000)
        for entry in waiting:
            table = f"{entry['schema']}.{entry['table']}"
            sid = str((entry["notification"] or {}).get("signal_id"))
            start = spans.get(sid)
            if start is None:  # (a span always is recorded; else the widest one)
                start = reader.first_offset()
            known = self._known_schemas.get(table)
            # a table without primary key: its identity (the events' key) is every column
            key = ([] if known is None else
                   list(known.key) or [c.name for c in known.columns])
            keep = repairs.span_keys(reader, table, key, repairs.ranges_of(entry, table), start, end)
            ev = repairs.marker_event(entry, key, keep)
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append(encode_event(ev, self._connector, self._db, now_ms))
            log.info("repair %s of %s: range-end marker logged (%d keys kept)", sid, table, len(keep))
        del self._extra[repairs.REPAIR_MARKERS]
        self._extra_dirty = True
        self.flush(force=True)

    def _describe(self, schema: str, table: str) -> None:
        """Record the schema of a table whose first logged rows are snapshot rows (no
        stream event described it yet), from the source's catalog, as the stream would
        describe it: the sinks then need not guess column types from values."""
        if not isinstance(self.source, DescribesTables):
            return
        try:
            ts = self.source.table_schema(schema, table)
        except Exception as exc:  # best effort: the sinks can still infer a schema
            log.warning("cannot describe %s.%s for the change log: %s: %s", schema, table,
                        type(exc).__name__, exc)
            return
        if ts is not None:
            self._on_schema(SchemaChanged(ts), threading.Event())

    def _advance(self, position: Position) -> None:
        """The checkpoint position only moves forward (a commit's position may sort
        before snapshot rows placed after its watermark)."""
        if self._position is None or self._position < position:
            self._position = position

    def _tick(self, stop: threading.Event) -> None:
        """Runs between stream reads: chunk results, the next snapshot request, blocking
        snapshots, status."""
        driver = self.driver
        assert driver is not None
        if INBOX.waiting:
            self._take_signals()
        driver.submit_next()
        self._emit_events(driver.take())
        if (self._read_only and driver.waiting_for_progress
                and isinstance(self.source, ProgressRequesting)):
            self.source.request_progress()
        if driver.blocking and not self._in_tx and self._position is not None:
            self.flush()

            def emit(events: list[Emitted]) -> None:
                self._emit_events(events)
                self.flush()

            source = self.source
            source_keepalive = source.keepalive if isinstance(source, KeepsAlive) else (lambda: None)

            def keepalive() -> None:
                source_keepalive()
                self.status.maybe_write(self)  # (``dblog status``: the blocking progress)

            driver.run_blocking(self._position, stop, emit, keepalive)
            self.flush(force=True)
        self._driver_active = driver.active
        if self.lease is not None:
            self.lease.check()
        self.status.maybe_write(self)

    def flush(self, force: bool = False) -> None:
        """Hand the pending batch (with the checkpoint describing it) to the writer,
        and acknowledge the source up to what the writer made durable.

        With ``force`` a checkpoint is written even without events (heartbeats: the
        position moved) and the call waits until everything is durable."""
        writer = self.writer
        if self._pending or self._schemas or (
            force and self._position is not None and self._position != self._saved_position
        ) or (self._extra_dirty and self._position is not None):
            self._extra_dirty = False
            self._last_checkpoint = time.monotonic()
            driver = self.driver
            extra = dict(self._extra)
            if self._in_tx:
                extra[MID_TX] = True
            else:
                extra.pop(MID_TX, None)
            checkpoint = Checkpoint(
                self._position, driver.state() if driver is not None else None, extra
            )
            t0 = time.time() if lagtrace.ON else 0.0
            writer.submit(Batch(
                list(self._pending), checkpoint, list(self._schemas), self._ack,
                len(self._pending) + self._pending_extra,
                [(c, r, time.time()) for c, r in self._trace] if lagtrace.ON else None,
            ))
            if lagtrace.ON:
                lagtrace.stall(t0, "submit")
            self._trace.clear()
            if self._stream_since is not None:
                self._prune_stream_inflight().append((self._submitted, self._stream_since))
                self._stream_since = None
            self._submitted += 1
            self._pending.clear()
            self._pending_extra = 0
            self._schemas.clear()
            self._saved_position = self._position
        if force:
            writer.drain()
        ack = writer.take_ack()
        if ack is not None and ack is not self._acked:
            if self.lease is not None:
                self.lease.check()
            self.source.ack(ack)
            self._acked = ack
        self.status.count(writer.take_written())

    def _hold(self) -> bool:
        """Whether new snapshot chunks should wait (``HOLD_BACKLOG_EVENTS``,
        ``HOLD_STREAM_WAIT_S``)."""
        if self.writer.backlog() >= HOLD_BACKLOG_EVENTS:
            return True
        inflight = self._prune_stream_inflight()
        oldest = inflight[0][1] if inflight else self._stream_since
        return (HOLD_STREAM_WAIT_S > 0 and oldest is not None
                and time.monotonic() - oldest >= HOLD_STREAM_WAIT_S)

    def _prune_stream_inflight(self) -> deque[tuple[int, float]]:
        """Forget the submitted batches the writer has appended (the rest, oldest first)."""
        inflight = self._stream_inflight
        if inflight:
            done = self.writer.appended_batches()
            while inflight and inflight[0][0] < done:
                inflight.popleft()
        return inflight

    def _retention(self) -> None:
        """Queued to the writer thread, which owns the change log's connection."""
        hours = self.cfg.log.retention_hours
        max_age = int(hours * 3_600_000) if hours is not None else None
        max_bytes = self.cfg.log.retention_bytes

        def task() -> None:
            removed = self.changelog.enforce_retention(max_age, max_bytes)
            if removed:
                log.info("retention removed %d old events", removed)

        self.writer.run_task(task)
