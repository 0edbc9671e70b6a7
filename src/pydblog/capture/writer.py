"""The batch writer: commits batches on its own thread so that decoding the stream
overlaps with SQLite's inserts and fsyncs.

In this order (``ports`` commit order): change log append (events and checkpoint
in one commit) -> state store save -> publish the ack position. Every batch is
appended at once (that is what makes it visible to readers: latency); the state store
is saved at most every ``state_interval_s`` (its write and two fsyncs per batch cost a
fast snapshot ~8 % of its time) and when the writer drains, and only a saved batch's
ack position is published. The capture thread acknowledges the source
only with a published position, so the slot never moves past what is durable in both.
Batches are committed in submission order; batches that queued up while a commit ran
are committed together (group commit: one transaction and one fsync for all of them,
so a stream of small transactions does not pay one fsync each); the queue is bounded,
so a slow disk slows the stream instead of growing memory.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from pydblog import failpoints
from pydblog.capture import lagtrace
from pydblog.events import Encoded
from pydblog.metrics import CAPTURE as METRICS
from pydblog.ports import ChangeLogWriter, Checkpoint, StateStore, TableSchema
from pydblog.positions import Position
from pydblog.threads import name_native_thread

GROUP_MAX_BATCHES = 64
"""At most this many queued batches are committed together."""

GROUP_BULK_EVENTS = 4096
"""A batch of more events than this (a snapshot chunk's rows) starts a new group: the
small batches queued before it (the stream's events) commit without waiting for its
write, instead of in one transaction with it."""


@dataclass(frozen=True, slots=True)
class Batch:
    events: Sequence[Encoded]
    checkpoint: Checkpoint
    schemas: Sequence[TableSchema]
    ack: Position | None
    size: int  # how many events ``events`` hold (an ``EncodedBlock`` holds several)
    trace: list[tuple[int, float, float]] | None = None  # ``lagtrace``: its stream events
    batches: int = 1  # submitted batches this one stands for (group commit)


class BatchWriter:
    def __init__(
        self,
        changelog: ChangeLogWriter,
        state: StateStore,
        depth: int = 8,
        state_interval_s: float = 0.2,
    ) -> None:
        self._state_interval = state_interval_s
        self._unsaved: Batch | None = None
        self._last_save = 0.0
        self.changelog = changelog
        self.state = state
        self._queue: queue.Queue[Batch | Callable[[], None] | None] = queue.Queue(maxsize=depth)
        self._carry: list[Batch | Callable[[], None] | None] = []  # taken, not yet run
        # Called on the writer thread whenever it has appended everything submitted (the
        # runner: wake the stream, which holds small batches back while a commit runs).
        self.on_drained: Callable[[], None] = lambda: None
        # Also called after an append that leaves fewer than this many events queued
        # (0: never; the runner sets it while snapshot slices wait to be handed over).
        self.wake_below = 0
        self._error: BaseException | None = None
        self._durable_ack: Position | None = None
        self._written = 0
        self._queued = 0  # events submitted and not yet appended
        self._appended_batches = 0  # submitted batches appended so far (in order)
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="dblog-writer", daemon=True)
        self._thread.start()

    def submit(self, batch: Batch) -> None:
        self.raise_error()
        self._idle.clear()
        with self._lock:
            self._queued += batch.size
        self._put(batch)

    def _put(self, item: Batch | Callable[[], None]) -> None:
        """Queue ``item``; while the queue is full, raise the writer thread's error once
        it has one (a thread that stopped on an error takes nothing more: a plain
        ``put`` waited for good, the capture standing still without a word)."""
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                self.raise_error()

    def run_task(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the writer thread between two batches (the change log's
        connection belongs to that thread: retention runs there, never concurrently
        with an append)."""
        self.raise_error()
        self._idle.clear()
        self._put(task)

    def take_ack(self) -> Position | None:
        """The newest position that is durable in the change log and the state store."""
        self.raise_error()
        return self._durable_ack

    def backlog(self) -> int:
        """Events submitted but not yet appended to the change log."""
        return self._queued

    def appended_batches(self) -> int:
        """How many of the submitted batches are appended (batches append in
        submission order: the first ``n`` submitted)."""
        return self._appended_batches

    def take_written(self) -> int:
        with self._lock:
            n, self._written = self._written, 0
        return n

    def drain(self) -> None:
        """Wait until every submitted batch is committed and saved (the state store is
        saved right away, not at its next interval)."""
        self.run_task(self._save)
        while not self._idle.wait(0.1):
            self.raise_error()
        self.raise_error()

    def close(self) -> None:
        # A writer thread that stopped on an error (e.g. fenced) no longer takes from a
        # full queue: never block on it.
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.1)
                break
            except queue.Full:
                continue
        self._thread.join(timeout=30)

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the writer thread (``raise_error`` raises it), None
        while it writes."""
        return self._error

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        name_native_thread()
        while True:
            if self._carry:
                item = self._carry.pop()
            else:
                unsaved = self._unsaved is not None
                wait = self._state_interval - (time.monotonic() - self._last_save) if unsaved else None
                try:
                    item = self._queue.get(timeout=None if wait is None else max(wait, 0.0))
                except queue.Empty:  # the state store's interval is up: save the newest batch
                    if not self._guard(self._save):
                        return
                    if self._queue.empty():
                        self._idle.set()
                    continue
            if item is None:
                self._guard(self._save)
                return
            step = item if callable(item) else partial(self._append, self._group(item))
            if not self._guard(step):
                return
            if not self._carry and self._queue.empty():
                self.on_drained()
                if self._unsaved is None:
                    self._idle.set()
            elif self.wake_below and self._queued < self.wake_below:
                self.on_drained()

    def _group(self, batch: Batch) -> Batch:
        """Group commit: ``batch`` and the batches queued behind it, as one append (one
        transaction, one fsync) described by the last one's checkpoint. A batch with
        schemas starts a new group (a schema applies from its append's first offset),
        and so does one of more than ``GROUP_BULK_EVENTS`` events; a task or the end
        stays queued (``_carry``) for the next turn. Groups append in submission
        order: the change log's order is the batches' whatever the grouping."""
        group = [batch]
        while len(group) < GROUP_MAX_BATCHES:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(nxt, Batch) and not nxt.schemas and nxt.size <= GROUP_BULK_EVENTS:
                group.append(nxt)
            else:
                self._carry.append(nxt)
                break
        if len(group) == 1:
            return batch
        acks = [b.ack for b in group if b.ack is not None]
        return Batch(
            [e for b in group for e in b.events], group[-1].checkpoint, batch.schemas,
            acks[-1] if acks else None, sum(b.size for b in group),
            [t for b in group for t in b.trace or ()] if lagtrace.ON else None,
            sum(b.batches for b in group),
        )

    def _append(self, batch: Batch) -> None:
        t0 = time.perf_counter()
        w0, c0, q0 = ((time.time(), time.thread_time(), lagtrace.run_wait())
                      if batch.trace is not None else (0.0, 0.0, 0.0))
        end = self.changelog.append(batch.events, batch.checkpoint, batch.schemas)
        if batch.trace is not None:
            lagtrace.appended(batch.trace, w0, time.time(), batch.size,
                              time.thread_time() - c0, lagtrace.run_wait() - q0)
        METRICS.observe_append(batch.events, batch.size, time.perf_counter() - t0, end)
        failpoints.hit("after-log")
        self._unsaved = batch
        with self._lock:
            self._written += batch.size
            self._queued -= batch.size
            self._appended_batches += batch.batches
        if time.monotonic() - self._last_save >= self._state_interval:
            self._save()

    def _save(self) -> None:
        batch = self._unsaved
        if batch is None:
            return
        t0 = time.perf_counter()
        self.state.save(batch.checkpoint)
        METRICS.observe_state_save(time.perf_counter() - t0)
        failpoints.hit("after-state")
        self._last_save = time.monotonic()
        self._unsaved = None
        if batch.ack is not None:
            self._durable_ack = batch.ack

    def _guard(self, step: Callable[[], None]) -> bool:
        try:
            step()
        except BaseException as exc:
            self._error = exc
            self._idle.set()
            return False
        return True
