"""Terminal progress for the long commands (``rich``), on stderr.

- ``snapshot_bars``: ``dblog status``'s snapshot section as bars;
- ``wait_for_snapshot``: ``dblog snapshot ... --wait`` follows its signal through the
  change log's notifications to the end, with a bar from the capture's status;
- ``SyncProgress``: ``dblog sync --available-now``: change-log offsets applied.

On a terminal the bars move; elsewhere (pipes, CI) rich prints only the final state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

import orjson
from rich.console import Console, Group, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress_bar import ProgressBar
from rich.table import Table

from pydblog.api.events import open_log_reader
from pydblog.capture.status import read_status
from pydblog.changelog import open_reader
from pydblog.config import Config

log = logging.getLogger(__name__)

TERMINAL = frozenset({"COMPLETED", "ABORTED"})


def stderr_console() -> Console:
    return Console(stderr=True)


def snapshot_bars(snapshot: dict[str, Any]) -> RenderableType:
    """The snapshot status of ``SnapshotCore.status()`` as progress bars."""
    table = Table.grid(padding=(0, 1))
    table.add_column(no_wrap=True)
    table.add_column(width=32)
    table.add_column(no_wrap=True)
    pct = float(snapshot.get("percent") or 0.0)
    state = "paused" if snapshot.get("paused") else ("blocking" if snapshot.get("blocking")
                                                      else "running")
    table.add_row(
        "snapshot", ProgressBar(total=100, completed=pct, width=30),
        f"{pct:5.1f} %  {snapshot.get('tables_done', 0)}/{snapshot.get('tables_total', 0)} "
        f"tables, {snapshot.get('rows', 0)} rows, chunk {snapshot.get('chunk_size')}, {state}",
    )
    current = snapshot.get("current")
    if current:
        cp = float(current.get("percent") or 0.0)
        table.add_row(
            f"  {current.get('table')}", ProgressBar(total=100, completed=cp, width=30),
            f"{cp:5.1f} %  {current.get('rows', 0)} rows, {current.get('chunks', 0)} chunks",
        )
    parts: list[RenderableType] = [table]
    for name in snapshot.get("queued") or []:
        parts.append(f"  {name} (queued)")
    return Group(*parts)


def wait_for_snapshot(cfg: Config, signal_id: str, start_offset: int,
                      poll_s: float = 0.5, console: Console | None = None) -> int:
    """Follow the notifications of ``signal_id`` from ``start_offset`` until the snapshot
    completes (0) or is aborted / rejected (1), with a progress bar."""
    out = console or stderr_console()
    reader = open_reader(cfg.log)
    offset = start_offset
    started = False
    result: int | None = None
    message = ""
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      TaskProgressColumn(), TimeElapsedColumn(), console=out) as bar:
            task = bar.add_task(f"snapshot {signal_id}", total=100)
            while result is None:
                recs = reader.read(offset, 10_000)
                for rec in recs:
                    offset = rec.offset + 1
                    if rec.op != "n":
                        continue
                    note = orjson.loads(rec.body).get("notification") or {}
                    if note.get("signal_id") != signal_id:
                        continue
                    kind = note.get("type")
                    if kind == "STARTED":
                        started = True
                    elif kind in ("REJECTED", "SKIPPED") and not started:
                        result, message = 1, _reason(note)
                    elif kind in TERMINAL:
                        result = 0 if kind == "COMPLETED" else 1
                        message = _completed(note) if kind == "COMPLETED" else _reason(note)
                if result is None:
                    status = read_status(cfg.log_dir) or {}
                    snap = status.get("snapshot") or {}
                    if started and snap.get("active"):
                        bar.update(task, completed=float(snap.get("percent") or 0.0))
                    if not recs:
                        time.sleep(poll_s)
            if result == 0:
                bar.update(task, completed=100)
    finally:
        reader.close()
    out.print(f"snapshot {signal_id}: {message}")
    return 1 if result is None else result


def _completed(note: dict[str, Any]) -> str:
    """A COMPLETED snapshot's line, naming the tables a stop-snapshot removed from it
    (``aborted_data_collections``): those were not read to their end."""
    stopped = (note.get("additional_data") or {}).get("aborted_data_collections") or []
    if not stopped:
        return "completed"
    return f"completed; stopped before their end: {', '.join(map(str, stopped))}"


def _reason(note: dict[str, Any]) -> str:
    data = note.get("additional_data") or {}
    reason = data.get("reason") or data.get("message") or ""
    kind = str(note.get("type", "")).lower()
    return f"{kind}: {reason}" if reason else kind


class _Applier(Protocol):
    last_end: int | None


class SyncProgress:
    """``dblog sync --available-now``: a bar of change-log offsets applied (the change
    log's end as read at start, and re-read as the capture appends). ``end``: how to
    read the change log's end (default: a change-log reader's ``next_offset``).

    The end is read in a background thread, never in the job's loop: a fresh Kafka
    reader reads the whole checkpoint topic (14 s for 3,700 commits on Tansu), and the
    loop would notice the query's end, or a stop, only after it (a cold
    ``--available-now`` sync of 1.2M events waited 20 s past its last batch).
    Until it is known the bar has no total."""

    def __init__(self, cfg: Config, applier: _Applier, enabled: bool,
                 end: Callable[[], int] | None = None) -> None:
        self.cfg = cfg
        self.applier = applier
        self.enabled = enabled
        self._read_end = end or self._reader_end
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._last_check = 0.0
        self._total = 0
        self._reading: threading.Thread | None = None
        self._found: int | None = None

    def __enter__(self) -> SyncProgress:
        if self.enabled:
            self._bar = Progress(TextColumn("[bold]sync"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("events"), TimeElapsedColumn(),
                                 console=stderr_console())
            self._bar.start()
            self._task = self._bar.add_task("sync", total=None)
            self._refresh()
        return self

    def _reader_end(self) -> int:
        reader = open_log_reader(self.cfg.log)
        if reader is None:
            return 0
        try:
            return reader.next_offset()
        finally:
            reader.close()

    def _refresh(self) -> None:
        """Read the end again in the background, unless a read is under way."""
        if self._reading is not None and self._reading.is_alive():
            return
        self._last_check = time.monotonic()

        def read() -> None:
            try:
                self._found = self._read_end()
            except Exception as exc:  # a progress bar: the sync goes on without a total
                log.debug("reading the change log's end for the progress bar failed: %s", exc)

        self._reading = threading.Thread(target=read, name="dblog-sync-progress", daemon=True)
        self._reading.start()

    def update(self, refresh: bool = True) -> None:
        if self._bar is None or self._task is None:
            return
        found, self._found = self._found, None
        if found is not None:
            self._total = found
            self._bar.update(self._task, total=found or None)
        done = self.applier.last_end or 0
        if refresh and done >= self._total and time.monotonic() - self._last_check > 1.0:
            self._refresh()
        self._bar.update(self._task, completed=done)

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None and self._task is not None:
            if self._reading is not None:
                self._reading.join(1.0)  # a read under way: its end if it comes soon
            self.update(refresh=False)
            done = self.applier.last_end or 0
            if done > self._total:
                self._bar.update(self._task, total=done)
            self._bar.stop()
