"""The run of snapshots: which tables are read, how far each is, how each ends. IO-free.

A run is everything ``SnapshotCore`` has been asked to snapshot and has not finished:
the incremental and blocking lanes of table jobs (``core.progress``), the counters
every notification reports, the pause flag, and the per-table bookkeeping of
failures and stops. This module holds the rules of a table's life; the core decides
*when* they apply (at a watermark, a passed fence, an answer) and places the
notifications they return.

Invariants:

- A table is in at most one lane, once: ``enqueue`` takes the jobs as given, and the
  signal planners (``core.commands``) leave out the tables already ``queued``.
- A table's progress (``TableJob.last_key``) only moves through ``chunk_done``,
  ``advance`` and ``slice_done``, i.e. when rows read up to that key have been
  emitted (or starts over, ``Lane.reset``, when the table names another relation):
  ``state()`` after the returned events are logged is what a restart needs.
- Every snapshot (signal id) ends with exactly one terminal notification under its
  own id: COMPLETED when its last table leaves its lane (``finish``; listing the
  tables a stop took from it, ``aborted_data_collections``), or ABORTED when a stop
  took its last tables (``stop``).
- Consecutive failures are counted per table (a table's requests): with several
  tables in flight one table's failures neither count against nor reset another's.
  ``max_attempts`` failures of unknown kind in a row (or one fatal failure) drop the
  table with a REJECTED notification.
- The counters (``totals``) and stops are reset when nothing is left to do
  (``settle``); ``paused`` is dropped once the incremental lane is empty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydblog.core.commands import snapshot_stopped
from pydblog.core.keys import RawKey
from pydblog.core.notices import (
    Notice,
    in_progress,
    lane_completed,
    table_empty,
    table_rejected,
    table_scan_completed,
    table_scan_started,
)
from pydblog.core.progress import Lane, TableJob
from pydblog.core.requests import ChunkRequest, Request
from pydblog.core.sizing import CoreSettings
from pydblog.core.window import WindowResult
from pydblog.events import SnapshotKind
from pydblog.ports import TableInfo


@dataclass(slots=True)
class StartAnswer:
    """The worker's answer to a TableStartRequest, applied at its watermark."""

    info: TableInfo | None
    max_key: RawKey | None
    error: str | None


@dataclass(slots=True)
class Totals:
    """Counters of the current run (reset when the core becomes idle)."""

    tables: int = 0
    tables_done: int = 0
    chunks: int = 0
    rows: int = 0


class Run:
    """The lanes, counters and per-table bookkeeping of the current snapshots (see the
    module docstring).

    What the core does when the run changes shape: ``finished(lane, table)`` after a
    table left a lane (read, empty, rejected); ``changed()`` after tables joined or
    left a lane (the fenced modes watch them); ``settle()`` when the run may have
    nothing left to do."""

    __slots__ = ("_changed", "_failures", "_finished", "_settle", "aborted", "block", "incr",
                 "paused", "settings", "totals")

    def __init__(
        self, settings: CoreSettings, *, finished: Callable[[Lane, str], None],
        changed: Callable[[], None], settle: Callable[[], None],
    ) -> None:
        self.settings = settings
        self._finished = finished
        self._changed = changed
        self._settle = settle
        self.incr = Lane()
        self.block = Lane()
        self.paused = False
        self.totals = Totals()
        # Tables stopped of a snapshot (signal id) that still has others (``stop``).
        self.aborted: dict[str, list[str]] = {}
        self._failures: dict[str, int] = {}

    def __bool__(self) -> bool:
        """Some table is queued or being read."""
        return bool(self.incr) or bool(self.block)

    def queued(self) -> set[str]:
        return set(self.incr.tables()) | set(self.block.tables())

    # -- tables join ----------------------------------------------------------------------

    def enqueue(self, jobs: list[TableJob]) -> None:
        for job in jobs:
            lane = self.block if job.kind is SnapshotKind.BLOCKING else self.incr
            lane.queue.append(job)
            # A table a stop removed from this snapshot and queued in it again (only
            # ``initial`` reuses its id: a stream reset) is read, not aborted.
            stopped = self.aborted.get(job.signal_id)
            if stopped is not None and job.table in stopped:
                stopped.remove(job.table)
                if not stopped:
                    del self.aborted[job.signal_id]
        self.totals.tables += len(jobs)
        self._changed()

    def start(self, lane: Lane, answer: StartAnswer, table: str | None = None) -> list[Notice]:
        """A start's answer for ``table``'s running job (None: the lane's current one):
        the table is started (its key and max key fixed), empty, or rejected."""
        job = lane.current if table is None else lane.job(table)
        if job is None or job.started:
            return []
        problem = _start_problem(job, answer)
        if problem is not None:
            return self.finish(lane, [table_rejected(job, problem)], job.table)
        if answer.max_key is None:
            return self.finish(lane, [table_empty(job)], job.table)
        assert answer.info is not None
        info = answer.info
        job = job.start(info.schema, info.table, info.key, answer.max_key, info.identity)
        lane.put(job)
        return [table_scan_started(job)]

    # -- progress -------------------------------------------------------------------------

    def chunk_done(self, lane: Lane, request: ChunkRequest, result: WindowResult) -> list[Notice]:
        """Progress after a conclusive chunk of the lane's current table: IN_PROGRESS,
        or the table's completion."""
        job = lane.current
        if job is None or job.table != request.table or not result.conclusive:
            return []
        job = self.advance(lane, job, result.last_key, len(result.rows))
        if job.reached_end(result.read, request.limit, result.last_key):
            return self.finish(lane, [table_scan_completed(job)])
        return [self.in_progress(lane, job)]

    def advance(self, lane: Lane, job: TableJob, last_key: RawKey | None, rows: int) -> TableJob:
        """A chunk of ``job``'s table up to ``last_key`` is emitted (``rows`` rows)."""
        self._failures.pop(job.table, None)
        job = job.advance(last_key, rows)
        lane.put(job)
        self.totals.chunks += 1
        self.totals.rows += rows
        return job

    def slice_done(self, job: TableJob, last_key: RawKey, rows: int) -> None:
        """A slice of a chunk of ``job``'s (incremental) table up to ``last_key`` is
        emitted (``core.flight``, "Slices")."""
        self.incr.put(job.advance(last_key, rows, chunk=False))
        self.totals.rows += rows

    def in_progress(self, lane: Lane, job: TableJob) -> Notice:
        return in_progress(job, lane.tables(), self.percent())

    def finish(self, lane: Lane, notices: list[Notice], table: str | None = None) -> list[Notice]:
        """A running table (``table``, else the lane's current one) is done (read,
        empty, rejected): move on; when no table of its snapshot (its signal id) is left
        in the lane, add that snapshot's COMPLETED. Once per signal, also when another
        snapshot's tables joined the lane meanwhile (a later signal, a table reset by
        the stream, queued as ``initial``): the lane's last job's signal alone would
        leave every other one without its COMPLETED."""
        job = lane.current if table is None else lane.job(table)
        if job is not None:
            self._failures.pop(job.table, None)
            lane.finish(job.table)
            self._finished(lane, job.table)
        self.totals.tables_done += 1
        self._changed()
        if job is None or any(j.signal_id == job.signal_id
                              for j in (*lane.running(), *lane.queue)):
            return notices
        t = self.totals
        aborted = self.aborted.pop(job.signal_id, ())
        done = lane_completed(job, t.tables, t.rows, t.chunks, aborted)
        if not lane:
            self._settle()
        return [*notices, done]

    def failed(
        self, lane: Lane, request: Request, error: str, retriable: bool | None
    ) -> list[Notice]:
        """A request of a table in ``lane`` failed: planned again, or the table is
        dropped with REJECTED (see the module docstring)."""
        table = getattr(request, "table", None)
        job = lane.job(table) if table is not None else None
        job = job if job is not None else lane.current
        key = job.table if job is not None else str(table or "")
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        give_up = failures >= self.settings.max_attempts
        if retriable or (retriable is None and not give_up) or job is None:
            return []
        notice = table_rejected(job, error, attempts=failures)
        return self.finish(lane, [notice], job.table)

    # -- tables leave ---------------------------------------------------------------------

    def stop(self, matches: Callable[[str], bool], by: str) -> tuple[list[TableJob], list[Notice]]:
        """Remove the matching tables from both lanes; returns them, and the ABORTED
        notifications of the snapshots that had no other table left. ``by``: the
        stop-snapshot's signal id."""
        dropped = self.incr.drop(matches) + self.block.drop(matches)
        self.totals.tables_done += len(dropped)
        return dropped, self._stopped(dropped, by)

    def _stopped(self, dropped: list[TableJob], by: str) -> list[Notice]:
        """Each snapshot (signal id) a stop took tables from still ends with exactly one
        terminal notification under its own id: when these were its last tables, its
        ABORTED now (listing every table of it stopped, and the stop's id; placed at the
        next watermark like any waiting notice); else its COMPLETED, once its other
        tables are done, lists them (``aborted_data_collections``)."""
        left = {j.signal_id for lane in (self.incr, self.block)
                for j in (*lane.running(), *lane.queue)}
        for job in dropped:
            self.aborted.setdefault(job.signal_id, []).append(job.table)
        out = []
        for job in {j.signal_id: j for j in dropped}.values():
            if job.signal_id not in left:
                tables = self.aborted.pop(job.signal_id)
                out.append(snapshot_stopped(job.signal_id, job.kind, tables, by))
        return out

    def settle(self, active: bool) -> None:
        """Reset the run's counters and flags once nothing is left to do (``active``:
        the core still has work, key re-reads included)."""
        if not self.incr:
            self.paused = False
        if not active:
            self.totals = Totals()
            self.aborted.clear()

    # -- reporting and state --------------------------------------------------------------

    def percent(self) -> float:
        """``(tables done + share of the current table) / tables``, the share being
        ``last_key / max_key`` for a single numeric key, else 0."""
        total = self.totals.tables
        if total <= 0:
            return 0.0
        running = [self.block.current] if self.block.current else self.incr.running()
        share = sum(j.fraction() for j in running)
        return round(100.0 * min(1.0, (self.totals.tables_done + share) / total), 1)

    def brief(self) -> dict[str, Any]:
        return {"data_collections": self.incr.tables(), "percent": self.percent()}

    def status(self) -> dict[str, Any]:
        current = self.block.current or self.incr.current
        return {
            "paused": self.paused,
            "current": None if current is None else current.status(),
            "in_flight": [j.table for j in self.incr.running()],
            "queued": [j.table for j in self.block.queue] + [j.table for j in self.incr.queue],
            "tables_total": self.totals.tables,
            "tables_done": self.totals.tables_done,
            "chunks_done": self.totals.chunks,
            "rows": self.totals.rows,
            "percent": self.percent(),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "paused": self.paused,
            "incremental": self.incr.to_json(),
            "blocking": self.block.to_json(),
            "totals": {
                "tables": self.totals.tables,
                "tables_done": self.totals.tables_done,
                "chunks": self.totals.chunks,
                "rows": self.totals.rows,
            },
            **({"aborted": self.aborted} if self.aborted else {}),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.paused = bool(state.get("paused", False))
        self.incr = Lane.from_json(state.get("incremental"))
        self.block = Lane.from_json(state.get("blocking"))
        totals = state.get("totals") or {}
        self.totals = Totals(**{k: int(v) for k, v in totals.items()})
        aborted = state.get("aborted") or {}
        self.aborted = {str(k): [str(t) for t in v] for k, v in aborted.items()}


def _start_problem(job: TableJob, answer: StartAnswer) -> str | None:
    if answer.error is not None:
        return answer.error
    if answer.info is None:
        return f"table {job.table} does not exist (any more)"
    if not answer.info.key:
        return (
            f"table {job.table} has no primary key; "
            'give a "surrogate-key" column in the execute-snapshot signal'
        )
    return None
