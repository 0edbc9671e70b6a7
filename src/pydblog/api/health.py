"""``GET /health``: each check a named verdict with a reason; healthy when all pass.

The checks (thresholds from ``[health]``):

- ``capture``: the capture loop runs and wrote its status in the last 30 s (a loop
  stuck in a call stops writing it); before its first status (the runner is opening the
  source or making its first log read), the 30 s count from the runner's start: a start
  is not a stuck loop, a start that hangs becomes one;
- ``role``: leader or standby (a standby is healthy; the capture checks then do not
  apply);
- ``source``: the probe reached the source within the last three probe intervals;
- ``idle``: DBLog's rule: no event logged for ``max_idle_minutes`` is unhealthy only
  when the source changed meanwhile (see ``probe``); a quiet source is fine;
- ``slot_lag``: source log retained for us <= ``max_slot_lag_bytes``;
- ``changelog``: the writer has not failed, the log directory is writable and has
  at least 64 MiB free;
- ``snapshot``: a running, unpaused snapshot moved within ``snapshot_stuck_minutes``;
- ``verify`` (with ``[verify] interval_minutes``): the last scheduled verification found
  every mirror equal to its source (before the first pass: healthy, "not run yet").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydblog.api.settings import HealthConfig

STATUS_MAX_AGE_S = 30.0
MIN_FREE_BYTES = 64 << 20


@dataclass(frozen=True)
class HealthInputs:
    now: float
    role: str
    capture_state: str
    capture_error: str | None
    status_age_s: float | None
    """Age of the capture loop's last status; None before its first."""
    reachable: bool | None
    probe_error: str | None
    probe_age_s: float | None
    probe_interval_s: float
    lag_bytes: int | None
    idle_s: float
    source_moved: bool | None
    writer_error: str | None
    log_writable: bool
    free_bytes: int | None
    snapshot_running: bool
    snapshot_paused: bool
    progress_age_s: float
    runner_age_s: float | None = None
    """Time since the runner was created (None: unknown, taken as long ago)."""
    verify: dict[str, Any] | None = None
    """The last scheduled verification (``verifier.schedule``); None: not scheduled."""
    verify_scheduled: bool = False


def evaluate(inp: HealthInputs, cfg: HealthConfig) -> tuple[bool, list[dict[str, Any]]]:
    checks: list[dict[str, Any]] = [_check("role", True, inp.role)]
    if inp.role == "standby":  # waiting for leadership: the capture checks do not apply
        return True, checks
    checks.append(_capture(inp))
    checks.append(_source(inp))
    checks.append(_idle(inp, cfg))
    checks.append(_lag(inp, cfg))
    checks.append(_changelog(inp))
    checks.append(_snapshot(inp, cfg))
    if inp.verify_scheduled:
        checks.append(_verify(inp))
    return all(c["ok"] for c in checks), checks


def _verify(inp: HealthInputs) -> dict[str, Any]:
    v = inp.verify
    if v is None:
        return _check("verify", True, "not run yet")
    if v.get("error"):
        return _check("verify", False, f"the last verification failed: {v['error']}")
    if not v.get("ok"):
        where = ", ".join(f"{d['table']} -> {d['sink']} ({d['ranges']} ranges)"
                          for d in v.get("differing") or [])
        return _check("verify", False, f"mirrors differ from their source: {where} "
                      "(`dblog verify --repair` heals them)")
    return _check("verify", True, f"every mirror equal to its source ({v.get('rows', 0)} rows)")


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail}


def _capture(inp: HealthInputs) -> dict[str, Any]:
    if inp.capture_state != "running":
        why = f": {inp.capture_error}" if inp.capture_error else ""
        return _check("capture", False, f"capture is {inp.capture_state}{why}")
    if inp.status_age_s is None:
        age = inp.runner_age_s
        if age is not None and age <= STATUS_MAX_AGE_S:
            return _check("capture", True, f"starting: opening the source ({age:.0f} s)")
        since = "" if age is None else f" since it started {age:.0f} s ago"
        return _check("capture", False, f"the capture loop has not reported{since} (stuck "
                      "opening the source?)")
    if inp.status_age_s > STATUS_MAX_AGE_S:
        return _check("capture", False, "the capture loop has not reported for "
                      f"{inp.status_age_s:.0f} s (over {STATUS_MAX_AGE_S:.0f} s: stuck?)")
    return _check("capture", True, "running")


def _source(inp: HealthInputs) -> dict[str, Any]:
    if inp.reachable is None:
        return _check("source", True, "not probed yet")
    if not inp.reachable:
        return _check("source", False, f"source unreachable: {inp.probe_error}")
    if inp.probe_age_s is not None and inp.probe_age_s > 3 * inp.probe_interval_s + 10:
        return _check("source", False, f"last successful probe {inp.probe_age_s:.0f} s ago")
    return _check("source", True, "reachable")


def _idle(inp: HealthInputs, cfg: HealthConfig) -> dict[str, Any]:
    limit = cfg.max_idle_minutes * 60
    minutes = inp.idle_s / 60
    if inp.idle_s <= limit:
        return _check("idle", True, f"last event {inp.idle_s:.0f} s ago")
    if inp.source_moved:
        return _check("idle", False, f"no event logged for {minutes:.1f} min (limit "
                      f"{cfg.max_idle_minutes:g}) although the source has changed since")
    return _check("idle", True, f"no event for {minutes:.1f} min, and the source has not "
                  "changed since")


def _lag(inp: HealthInputs, cfg: HealthConfig) -> dict[str, Any]:
    if inp.lag_bytes is None:
        return _check("slot_lag", True, "unknown")
    limit = cfg.max_slot_lag_bytes
    if limit is not None and inp.lag_bytes > limit:
        return _check("slot_lag", False, f"{inp.lag_bytes} bytes retained for the capture "
                      f"(limit {limit})")
    return _check("slot_lag", True, f"{inp.lag_bytes} bytes")


def _changelog(inp: HealthInputs) -> dict[str, Any]:
    if inp.writer_error:
        return _check("changelog", False, f"the change log writer failed: {inp.writer_error}")
    if not inp.log_writable:
        return _check("changelog", False, "the log directory is not writable")
    if inp.free_bytes is not None and inp.free_bytes < MIN_FREE_BYTES:
        return _check("changelog", False, f"only {inp.free_bytes >> 20} MiB free on the "
                      "change log's disk")
    return _check("changelog", True, "writable")


def _snapshot(inp: HealthInputs, cfg: HealthConfig) -> dict[str, Any]:
    if not inp.snapshot_running:
        return _check("snapshot", True, "none running")
    if inp.snapshot_paused:
        return _check("snapshot", True, "paused")
    limit = cfg.snapshot_stuck_minutes * 60
    if inp.progress_age_s > limit:
        return _check("snapshot", False, f"no snapshot progress for "
                      f"{inp.progress_age_s / 60:.1f} min (limit {cfg.snapshot_stuck_minutes:g})")
    return _check("snapshot", True, f"progressed {inp.progress_age_s:.0f} s ago")
