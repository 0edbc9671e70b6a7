"""Metrics and ``/health`` of ``dblog sync`` (served on ``[api] sync_listen``).

Updated once per micro-batch by the ``foreachBatch`` function in the Spark driver
(``observe_batch``); the change log's end is read when scraped. Health: the query
runs, no sink has failed, and the sync is not behind the change log without moving
for ``[health] max_idle_minutes``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from pydblog.api.http import ApiServer, Request, Response, Router, json_response
from pydblog.api.logfigures import LogFigures
from pydblog.api.settings import split_listen
from pydblog.config import Config

log = logging.getLogger(__name__)

SYNC_API_FILE = "sync-api.json"
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
SINK_BUCKETS = (0.005, 0.01, 0.025, *BATCH_BUCKETS)


class SyncMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.batches = Counter("dblog_sync_batches", "Micro-batches applied to every sink.",
                               registry=r)
        self.events = Counter("dblog_sync_events", "Change-log events applied.", registry=r)
        self.batch_seconds = Histogram("dblog_sync_batch_seconds", "Time to apply one "
                                       "micro-batch (read, reduce, every sink).",
                                       buckets=BATCH_BUCKETS, registry=r)
        self.sink_seconds = Histogram("dblog_sync_sink_apply_seconds", "Time one sink took "
                                      "to apply a micro-batch.", ["sink"],
                                      buckets=SINK_BUCKETS, registry=r)
        self.applied = Gauge("dblog_sync_applied_offset", "One past the last change-log "
                             "offset applied.", registry=r)
        self.log_end = Gauge("dblog_sync_changelog_next_offset", "One past the last offset "
                             "in the change log (when scraped).", registry=r)
        self.lag = Gauge("dblog_sync_lag_events", "Change-log events not yet applied.",
                         registry=r)
        self.last_batch = Gauge("dblog_sync_last_batch_timestamp_seconds", "Unix time of the "
                                "last applied micro-batch.", registry=r)
        self.running = Gauge("dblog_sync_running", "1 while the streaming query runs.",
                             registry=r)
        self.source_progress = Gauge("dblog_sync_source_progress_ms", "Per source: the "
                                     "source commit (or heartbeat) time up to which its "
                                     "changes are applied, ms since the epoch.", ["source"],
                                     registry=r)
        self.low_watermark = Gauge("dblog_sync_low_watermark_ms", "T: the merged targets "
                                   "hold every source's changes committed at or before it "
                                   "(the least source progress), ms since the epoch.",
                                   registry=r)
        self.complete_cut = Gauge("dblog_sync_complete_cut_ms", "consistent = true: the "
                                  "time of the last round every source finished, when the "
                                  "targets were exactly a cut of every source at it, ms "
                                  "since the epoch.", registry=r)
        self.watermarks: dict[str, int | None] = {}
        self.low_ms: int | None = None
        self.cut_ms: int | None = None
        self.holding_back: list[str] = []
        self.state = "starting"
        self.error: str | None = None
        self.applied_end: int | None = None
        self.last_batch_time: float | None = None
        self.started_at = time.time()

    def observe_batch(self, events: int, seconds: float, sinks: Mapping[str, float],
                      end: int) -> None:
        now = time.time()
        self.batches.inc()
        self.events.inc(events)
        self.batch_seconds.observe(seconds)
        for name, s in sinks.items():
            self.sink_seconds.labels(name).observe(s)
        self.applied.set(end)
        self.applied_end = end
        self.last_batch.set(now)
        self.last_batch_time = now

    def observe_watermarks(self, sources: Mapping[str, int | None], low: int | None,
                           holding_back: list[str], cut: int | None = None) -> None:
        for name, ms in sources.items():
            if ms is not None:
                self.source_progress.labels(name).set(ms)
        if low is not None:
            self.low_watermark.set(low)
        if cut is not None:
            self.complete_cut.set(cut)
            self.cut_ms = cut
        self.watermarks = dict(sources)
        self.low_ms = low
        self.holding_back = list(holding_back)


SYNC = SyncMetrics()


class SyncApi:
    def __init__(self, cfg: Config, metrics: SyncMetrics = SYNC) -> None:
        self.cfg = cfg
        self.metrics = metrics
        router = self.router = Router(cfg.api.token)
        router.add("GET", "/health", self.health)
        router.add("GET", "/metrics", self.prometheus)
        self.server: ApiServer | None = None
        self.figures = LogFigures(cfg.log)

    def start(self) -> SyncApi:
        host, port = split_listen(self.cfg.api.sync_listen)
        self.server = ApiServer(host, port, self.router).start()
        path = self.cfg.log_dir / SYNC_API_FILE
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(f'{{"url": "{self.server.url}", "pid": {os.getpid()}}}')
        os.replace(tmp, path)
        log.info("sync metrics and health on %s", self.server.url)
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.figures.close()
        (self.cfg.log_dir / SYNC_API_FILE).unlink(missing_ok=True)

    def _log_end(self) -> int | None:
        info = self.figures.get()  # (a slow change log never holds a scrape for long)
        return None if info is None else int(info["next_offset"])

    def _scrape(self) -> int | None:
        m = self.metrics
        m.running.set(1 if m.state == "running" else 0)
        end = self._log_end()
        if end is not None:
            m.log_end.set(end)
            if m.applied_end is not None:
                m.lag.set(max(0, end - m.applied_end))
        return end

    def prometheus(self, req: Request) -> Response:
        self._scrape()
        return Response(200, generate_latest(self.metrics.registry),
                        content_type=CONTENT_TYPE_LATEST)

    def health(self, req: Request) -> Response:
        m = self.metrics
        end = self._scrape()
        checks: list[dict[str, Any]] = []
        ok_run = m.state == "running" and m.error is None
        why = m.error or m.state
        checks.append({"name": "sync", "ok": ok_run, "detail": "running" if ok_run else why})
        behind = None if end is None or m.applied_end is None else end - m.applied_end
        since = time.time() - (m.last_batch_time or m.started_at)
        stale = behind is not None and behind > 0 and since > self.cfg.health.max_idle_minutes * 60
        checks.append({
            "name": "lag", "ok": not stale,
            "detail": "unknown (no batch yet)" if behind is None else
            f"{behind} events behind the change log, last batch {since:.0f} s ago",
        })
        if m.watermarks:
            now_ms = time.time() * 1000
            low = m.low_ms
            behind_s = None if low is None else (now_ms - low) / 1000
            limit_s = self.cfg.health.max_idle_minutes * 60
            stalled = behind_s is None or behind_s > limit_s
            checks.append({
                "name": "watermark", "ok": not stalled or len(m.watermarks) < 2,
                "detail": ("T unknown: no progress yet from " if low is None else
                           f"T is {behind_s:.0f} s behind now, held back by ")
                + ", ".join(m.holding_back),
                "low_ms": low, "sources": m.watermarks,
                **({"cut_ms": m.cut_ms} if m.cut_ms is not None else {}),
            })
        ok = all(c["ok"] for c in checks)
        return json_response(200 if ok else 503,
                             {"status": "ok" if ok else "unhealthy", "checks": checks})


def start_sync_api(cfg: Config) -> SyncApi | None:
    if not cfg.api.sync_listen:
        return None
    api = SyncApi(cfg)
    try:
        return api.start()
    except OSError as exc:
        log.error("sync metrics not served: cannot listen on %s (%s); set [api] sync_listen",
                  cfg.api.sync_listen, exc.strerror)
        return None
