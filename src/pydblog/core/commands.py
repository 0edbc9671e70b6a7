"""What each signal does to the queue, as pure functions (the core applies the result).

Every function here returns the single notification its signal yields (placed at the
signal's own position by the core).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

from pydblog.core.notices import Notice, NotificationType
from pydblog.core.progress import TableJob
from pydblog.core.signals import Signal, match_tables
from pydblog.events import SnapshotKind

N = NotificationType
INITIAL_SIGNAL_ID = "initial"


def plan_execute(
    signal: Signal, captured: Sequence[str], queued: Collection[str]
) -> tuple[list[TableJob], Notice]:
    """The jobs an execute-snapshot adds and its STARTED (or SKIPPED) notification.

    Regexes are fullmatched against ``captured``; a regex matching nothing is reported
    as ``unknown``; a table already in ``queued`` (either lane, current or queued) is not
    queued twice and is reported as ``already_queued``.
    """
    matched, unknown = match_tables(signal.data_collections, captured)
    kind = signal.snapshot_type
    jobs = [
        TableJob(t, signal.id, kind, signal.condition_for(t), signal.surrogate_key,
                 repair=signal.repair_for(t))
        for t in matched
        if t not in queued
    ]
    data: dict[str, Any] = {
        "data_collections": [j.table for j in jobs],
        "snapshot_type": kind.value,
        "unknown": unknown,
        "already_queued": [t for t in matched if t in queued],
    }
    if signal.repair:
        data["repair"] = True
    if not jobs:
        data["reason"] = "no table to snapshot (unknown or already queued)"
        return jobs, Notice(N.SKIPPED, signal.id, kind, "", data)
    return jobs, Notice(N.STARTED, signal.id, kind, "", data)


def plan_initial(
    captured: Sequence[str], queued: Collection[str]
) -> tuple[list[TableJob], Notice | None]:
    """Snapshot mode "initial": every captured table, incremental."""
    jobs = [TableJob(t, INITIAL_SIGNAL_ID) for t in captured if t not in queued]
    if not jobs:
        return jobs, None
    kind = SnapshotKind.INCREMENTAL
    data = {"data_collections": [j.table for j in jobs], "snapshot_type": kind.value}
    return jobs, Notice(N.STARTED, INITIAL_SIGNAL_ID, kind, "", data)


def stop_matcher(signal: Signal) -> Callable[[str], bool]:
    """Which tables a stop-snapshot removes: all without data-collections, else those
    fullmatching one of them."""
    patterns = signal.data_collections

    def matches(table: str) -> bool:
        return not patterns or any(re.fullmatch(p, table) for p in patterns)

    return matches


def stop_notice(signal: Signal, stopped: list[str]) -> Notice:
    if not stopped:
        data = {"reason": "no matching table in the snapshot", "data_collections": []}
        return Notice(N.SKIPPED, signal.id, signal.snapshot_type, "", data)
    return Notice(N.ABORTED, signal.id, signal.snapshot_type, "", {"data_collections": stopped})


def snapshot_stopped(signal_id: str, kind: SnapshotKind, tables: list[str], by: str) -> Notice:
    """The ABORTED of a snapshot (``signal_id``) whose last tables a stop-snapshot
    (``by``) removed: its terminal notification, under its own id (as Debezium's
    ABORTED carries the execute-snapshot's id, not the stop's)."""
    data = {"data_collections": tables, "stopped_by": by}
    return Notice(N.ABORTED, signal_id, kind, "", data)


def pause_notice(signal: Signal, running: bool, brief: dict[str, Any]) -> Notice:
    """PAUSED, or SKIPPED when no incremental snapshot runs."""
    kind = SnapshotKind.INCREMENTAL
    if not running:
        return Notice(
            N.SKIPPED, signal.id, kind, "", {"reason": "no incremental snapshot is running"}
        )
    return Notice(N.PAUSED, signal.id, kind, "", brief)


def resume_notice(signal: Signal, paused: bool, brief: dict[str, Any]) -> Notice:
    """RESUMED, or SKIPPED when not paused."""
    kind = SnapshotKind.INCREMENTAL
    if not paused:
        return Notice(N.SKIPPED, signal.id, kind, "", {"reason": "the snapshot is not paused"})
    return Notice(N.RESUMED, signal.id, kind, "", brief)


def rejected_signal(signal_id: str, error: str) -> Notice:
    """For a signal ``parse_signal`` refused."""
    return Notice(N.REJECTED, signal_id, SnapshotKind.INCREMENTAL, "", {"reason": error})
