"""Prometheus metrics of the capture process (``dblog run``), in one registry.

Cost rule (the capture loop is a tuned hot path): no metric is touched per row change.
They are updated per batch (``observe_append``, on the change log writer's thread,
after each commit), per status tick (``observe_status``, at most once a second), per
signal and per restart. Gauges that need IO (source lag, change-log size) are filled by
the API's probe thread or when scraped, never by the capture thread.

The names are listed in docs/operations.md; ``METRIC_NAMES`` is what a test checks the
Grafana dashboard and the alert rules against.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from pydblog.events import Encoded, EncodedBlock

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0,
)
TIMING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
BATCH_BUCKETS = (1, 10, 100, 1_000, 5_000, 20_000, 100_000, 1_000_000)
_TABLE_OP = itemgetter(0, 1)


class CaptureMetrics:
    """The capture's metrics. One instance per process (``CAPTURE``); tests may make
    their own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.events = Counter(
            "dblog_events", "Events appended to the change log, by source table and op "
            "(c, u, d, r, t; n = snapshot notification).", ["table", "op"], registry=r)
        self.commit_to_log = Histogram(
            "dblog_commit_to_log_seconds", "Source commit -> durable in the change log, "
            "one observation per batch: its oldest event (the batch's worst case).",
            buckets=LATENCY_BUCKETS, registry=r)
        self.batch_events = Histogram(
            "dblog_batch_events", "Events per change-log commit.", buckets=BATCH_BUCKETS,
            registry=r)
        self.append_seconds = Histogram(
            "dblog_changelog_append_seconds", "Time of one change-log commit (write + fsync).",
            buckets=TIMING_BUCKETS, registry=r)
        self.state_save_seconds = Histogram(
            "dblog_state_save_seconds", "Time of one state-file save (write + 2 fsyncs).",
            buckets=TIMING_BUCKETS, registry=r)
        self.source_lag_bytes = Gauge(
            "dblog_source_lag_bytes", "Source log retained for this capture: PostgreSQL slot "
            "(current WAL - confirmed flush), MySQL binlog bytes after the last event read.",
            registry=r)
        self.source_lag_seconds = Gauge(
            "dblog_source_lag_seconds", "Source commit -> change log of the newest event of "
            "the last batch.", registry=r)
        self.last_event = Gauge(
            "dblog_last_event_timestamp_seconds", "Unix time of the last change-log commit "
            "that held events.", registry=r)
        self.next_offset = Gauge(
            "dblog_changelog_next_offset", "One past the last offset in the change log.",
            registry=r)
        self.first_offset = Gauge(
            "dblog_changelog_first_offset", "Oldest offset kept (after retention).", registry=r)
        self.size_bytes = Gauge(
            "dblog_changelog_size_bytes", "Size of the change log on disk.", registry=r)
        self.backlog = Gauge(
            "dblog_writer_backlog_events", "Events handed to the change-log writer, not yet "
            "committed.", registry=r)
        self.snapshot_rows = Gauge(
            "dblog_snapshot_rows", "Rows read by the current snapshot, per table.", ["table"],
            registry=r)
        self.snapshot_chunks = Gauge(
            "dblog_snapshot_chunks", "Chunks read by the current snapshot, per table.",
            ["table"], registry=r)
        self.snapshot_percent = Gauge(
            "dblog_snapshot_table_percent", "Estimated share of a table read (0-100; 100 once "
            "the table is done).", ["table"], registry=r)
        self.snapshot_overall = Gauge(
            "dblog_snapshot_percent", "Estimated share of the running snapshot done (0-100).",
            registry=r)
        self.snapshot_chunk_size = Gauge(
            "dblog_snapshot_chunk_size", "Current chunk size (rows; adaptive snapshots move it).",
            registry=r)
        self.snapshot_active = Gauge(
            "dblog_snapshot_active", "1 while a snapshot runs.", registry=r)
        self.snapshot_paused = Gauge(
            "dblog_snapshot_paused", "1 while the snapshot is paused.", registry=r)
        self.snapshot_tables = Gauge(
            "dblog_snapshot_tables", "Tables of the running snapshot, total and done.",
            ["state"], registry=r)
        self.signals = Counter(
            "dblog_signals", "Snapshot signals received, by type.", ["type"], registry=r)
        self.signal_rejects = Counter(
            "dblog_signal_rejects", "Signals rejected as invalid.", registry=r)
        self.restarts = Counter(
            "dblog_capture_restarts", "Capture restarts after a retriable error.", registry=r)
        self.running = Gauge(
            "dblog_capture_running", "1 while the capture loop runs.", registry=r)
        self.verify_runs = Counter(
            "dblog_verify_runs", "Scheduled verification passes ([verify]).", registry=r)
        self.verify_ok = Gauge(
            "dblog_verify_ok", "1 when the last scheduled verification found every mirror "
            "equal to its source, 0 when not (absent before the first pass).", registry=r)
        self.verify_differing_ranges = Gauge(
            "dblog_verify_differing_ranges", "Key ranges that differed (drift or unsettled) "
            "in the last scheduled verification.", registry=r)
        self.verify_rows = Gauge(
            "dblog_verify_rows", "Source rows read by the last scheduled verification.",
            registry=r)
        self.verify_seconds = Gauge(
            "dblog_verify_seconds", "Duration of the last scheduled verification.", registry=r)
        self.verify_finished = Gauge(
            "dblog_verify_finished_timestamp_seconds", "When the last scheduled verification "
            "ended (Unix time).", registry=r)
        self.ha_role = Gauge(
            "dblog_ha_role", "1 for this process's high-availability role.", ["role"],
            registry=r)
        self.api_requests = Counter(
            "dblog_api_requests", "HTTP API requests, by path and status.", ["path", "code"],
            registry=r)
        self._lock = threading.Lock()
        self.last_event_time: float | None = None  # unix time, for /health
        self.lag_seconds: float | None = None  # the last batch's, for the status page
        self.progress_time = time.time()  # last time snapshot progress moved
        self._progress_key: tuple[Any, ...] | None = None
        self._tables: set[str] = set()
        self.scrape_hooks: list[Callable[[], None]] = []
        self.set_role("leader")

    # -- the change log writer's thread ---------------------------------------------------
    def observe_append(self, events: Sequence[Encoded], size: int, seconds: float,
                       next_offset: int) -> None:
        """One committed batch of ``size`` events (``events`` may hold blocks)."""
        self.append_seconds.observe(seconds)
        self.next_offset.set(next_offset)
        if not events:
            return
        now = time.time()
        self.batch_events.observe(size)
        tally = Tally(map(_TABLE_OP, events))
        if size != len(events):  # blocks: count their events
            for e in events:
                if type(e) is EncodedBlock:
                    tally[(e.table, e.op)] += e.size - 1
        for (table, op), n in tally.items():  # notifications of no table: table=""
            self.events.labels("" if table == "." else table, op).inc(n)
        first, last = events[0].ts_ms, events[-1].ts_ms
        if first > 0:
            self.commit_to_log.observe(max(0.0, now - first / 1000.0))
        if last > 0:
            self.lag_seconds = max(0.0, now - last / 1000.0)
            self.source_lag_seconds.set(self.lag_seconds)
        self.last_event.set(now)
        self.last_event_time = now

    def observe_state_save(self, seconds: float) -> None:
        self.state_save_seconds.observe(seconds)

    # -- the capture thread, at most once a second ----------------------------------------
    def observe_status(self, snapshot: dict[str, Any] | None, backlog: int) -> None:
        """Snapshot progress from ``SnapshotCore.status()``."""
        self.backlog.set(backlog)
        if snapshot is None:
            return
        self.snapshot_active.set(1 if snapshot.get("active") else 0)
        self.snapshot_paused.set(1 if snapshot.get("paused") else 0)
        self.snapshot_overall.set(float(snapshot.get("percent") or 0.0))
        self.snapshot_chunk_size.set(float(snapshot.get("chunk_size") or 0))
        self.snapshot_tables.labels("total").set(int(snapshot.get("tables_total") or 0))
        self.snapshot_tables.labels("done").set(int(snapshot.get("tables_done") or 0))
        current = snapshot.get("current")
        key = (snapshot.get("chunks_done"), snapshot.get("rows"),
               None if current is None else (current.get("table"), current.get("chunks")))
        if key != self._progress_key:
            self._progress_key = key
            self.progress_time = time.time()
        with self._lock:
            name = current.get("table") if current else None
            for table in self._tables - {name}:  # left the lane: done (or stopped)
                self.snapshot_percent.labels(table).set(100.0)
            self._tables = set() if name is None else {name}
            if current is not None and name is not None:
                self.snapshot_rows.labels(name).set(int(current.get("rows") or 0))
                self.snapshot_chunks.labels(name).set(int(current.get("chunks") or 0))
                self.snapshot_percent.labels(name).set(float(current.get("percent") or 0.0))

    # -- rare events -------------------------------------------------------------------------
    def signal(self, kind: str) -> None:
        self.signals.labels(kind).inc()

    def signal_rejected(self) -> None:
        self.signal_rejects.inc()

    def restart(self) -> None:
        self.restarts.inc()

    def observe_verify(self, result: dict[str, Any]) -> None:
        """A scheduled verification's summary (``verifier.schedule.summary``)."""
        self.verify_runs.inc()
        self.verify_ok.set(1 if result.get("ok") else 0)
        self.verify_differing_ranges.set(result.get("differing_ranges") or 0)
        self.verify_rows.set(result.get("rows") or 0)
        self.verify_seconds.set(result.get("seconds") or 0.0)
        self.verify_finished.set(result.get("finished_at") or 0.0)

    def set_role(self, role: str) -> None:
        for name in ("leader", "standby", "stopped"):
            self.ha_role.labels(name).set(1 if name == role else 0)

    def render(self) -> bytes:
        """The Prometheus text exposition (runs the scrape hooks first)."""
        for hook in self.scrape_hooks:
            hook()
        return generate_latest(self.registry)


def metric_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry can expose, whether or not a labelled metric has
    a child yet (counters as ``_total``; histograms' ``_bucket``, ``_sum``, ``_count``)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for family in registry.collect():
        for suffix in suffixes.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


CAPTURE = CaptureMetrics()
"""The capture process's metrics (``dblog run``)."""
