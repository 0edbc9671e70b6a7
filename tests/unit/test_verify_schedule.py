"""Scheduled verification: the rate limit, the health check and the metrics."""

from __future__ import annotations

from pydblog.api.health import HealthInputs, evaluate
from pydblog.api.settings import HealthConfig
from pydblog.config import parse_config
from pydblog.metrics import CaptureMetrics
from pydblog.verifier.schedule import RateLimit


def test_rate_limit_sleeps_to_the_cap() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    limit = RateLimit(1000.0, clock=lambda: now[0], sleep=sleep)
    limit(500)
    assert slept == [0.5]
    now[0] += 2.0  # slower than the cap: no sleep
    limit(1000)
    assert slept == [0.5]
    limit(3000)
    assert abs(sum(slept) - 0.5 - 2.0) < 1e-9  # 4500 rows by 4.5 s
    RateLimit(None)(10**9)  # no cap: returns at once


def _inputs(**kw: object) -> HealthInputs:
    base = dict(now=0.0, role="leader", capture_state="running", capture_error=None,
                status_age_s=1.0, reachable=True, probe_error=None, probe_age_s=1.0,
                probe_interval_s=5.0, lag_bytes=0, idle_s=1.0, source_moved=False,
                writer_error=None, log_writable=True, free_bytes=1 << 40,
                snapshot_running=False, snapshot_paused=False, progress_age_s=0.0)
    base.update(kw)
    return HealthInputs(**base)  # type: ignore[arg-type]


def test_health_reports_the_last_pass() -> None:
    cfg = HealthConfig()
    ok, checks = evaluate(_inputs(), cfg)
    assert ok and "verify" not in {c["name"] for c in checks}  # not scheduled
    ok, checks = evaluate(_inputs(verify_scheduled=True), cfg)
    assert ok and checks[-1] == {"name": "verify", "ok": True, "detail": "not run yet"}
    bad = {"ok": False, "error": None, "rows": 10, "differing_ranges": 2,
           "differing": [{"table": "public.t", "sink": "delta", "ranges": 2}]}
    ok, checks = evaluate(_inputs(verify_scheduled=True, verify=bad), cfg)
    assert not ok and "public.t -> delta (2 ranges)" in checks[-1]["detail"]
    ok, checks = evaluate(_inputs(verify_scheduled=True, verify={**bad, "error": "boom"}), cfg)
    assert not ok and "boom" in checks[-1]["detail"]
    ok, _ = evaluate(_inputs(verify_scheduled=True, verify={"ok": True, "rows": 5}), cfg)
    assert ok


def test_metrics_of_a_pass() -> None:
    m = CaptureMetrics()
    m.observe_verify({"ok": False, "differing_ranges": 3, "rows": 100, "seconds": 2.0,
                      "finished_at": 1234.0})
    text = m.render().decode()
    assert "dblog_verify_ok 0.0" in text
    assert "dblog_verify_differing_ranges 3.0" in text
    assert "dblog_verify_runs_total 1.0" in text


def test_config() -> None:
    cfg = parse_config({"source": {"dsn": "postgresql://x@h/db"},
                        "verify": {"interval_minutes": 5, "tables": ["public\\.t"],
                                   "max_rows_per_s": 1000}})
    assert cfg.verify.interval_minutes == 5 and cfg.verify.tables == ["public\\.t"]
    assert parse_config({"source": {"dsn": "postgresql://x@h/db"}}).verify.interval_minutes is None
