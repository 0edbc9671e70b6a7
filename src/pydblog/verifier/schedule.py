"""Scheduled verification (``[verify] interval_minutes``): `dblog run` verifies its
mirrors in a background thread, ``interval_minutes`` after the end of each pass, reading
at most ``max_rows_per_s`` source rows per second. The last pass's summary is what
``/health`` (check ``verify``) and ``/metrics`` (``dblog_verify_*``) report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pydblog.config import Config
from pydblog.verifier.run import Options, Report, run_verify

log = logging.getLogger("pydblog.verify")

FIRST_DELAY_S = 10.0
"""The first pass waits this long after start (the capture opens its source first)."""


class RateLimit:
    """``advance(n)`` sleeps so that the rows counted since the start stay at or below
    ``rows_per_s`` per second (``None``: never sleeps)."""

    def __init__(self, rows_per_s: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rows_per_s
        self.clock, self.sleep = clock, sleep
        self.start = clock()
        self.rows = 0

    def __call__(self, n: int) -> None:
        if self.rate is None:
            return
        self.rows += n
        ahead = self.rows / self.rate - (self.clock() - self.start)
        if ahead > 0:
            self.sleep(ahead)


def summary(report: Report, finished_at: float) -> dict[str, Any]:
    differing = [
        {"table": t.table, "sink": t.sink, "ranges": len(t.differing),
         "drift": sum(1 for r in t.differing if r.status == "drift"), "error": t.error}
        for t in report.tables if not t.ok
    ]
    return {
        "ok": report.ok,
        "finished_at": finished_at,
        "seconds": report.seconds,
        "rows": report.rows,
        "tables": len(report.tables),
        "differing_ranges": sum(len(t.differing) for t in report.tables),
        "differing": differing,
        "error": None,
    }


class VerifyState:
    """The last scheduled pass (``latest``: None before the first), shared with the API."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] | None = None
        self.running = False


STATE = VerifyState()


class ScheduledVerify:
    def __init__(self, cfg: Config, state: VerifyState = STATE) -> None:
        self.cfg = cfg
        self.state = state
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="dblog-verify", daemon=True)

    def start(self) -> ScheduledVerify:
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)

    def _run(self) -> None:
        v = self.cfg.verify
        assert v.interval_minutes is not None
        wait = FIRST_DELAY_S
        while not self.stop.wait(wait):
            self.run_once()
            wait = v.interval_minutes * 60

    def run_once(self) -> dict[str, Any]:
        from pydblog.metrics import CAPTURE

        v = self.cfg.verify
        self.state.running = True
        try:
            report = run_verify(self.cfg, v.tables, v.sink,
                                Options(v.chunk_size, 3, v.lag_timeout_s),
                                advance=RateLimit(v.max_rows_per_s))
            result = summary(report, time.time())
            if not report.ok:
                log.warning("scheduled verify: %d differing ranges in %s", result["differing_ranges"],
                            ", ".join(f"{d['table']} -> {d['sink']}" for d in result["differing"]))
        except Exception as exc:  # reported on /health; the next pass tries again
            log.warning("scheduled verify failed: %s", exc)
            result = {"ok": False, "finished_at": time.time(), "error": str(exc),
                      "seconds": 0.0, "rows": 0, "tables": 0, "differing_ranges": 0,
                      "differing": []}
        finally:
            self.state.running = False
        self.state.latest = result
        CAPTURE.observe_verify(result)
        return result
