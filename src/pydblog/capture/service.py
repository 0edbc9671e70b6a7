"""Wires a capture process together from the config, and reads its status."""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from pydblog.apiaddress import read_api_address
from pydblog.capture.kafka_signals import Handled, KafkaSignalListener, first_run_ms
from pydblog.capture.live import LIVE, LiveCapture
from pydblog.capture.runner import Runner
from pydblog.capture.status import read_status
from pydblog.changelog import describe, open_writer
from pydblog.config import Config, redact_dsn
from pydblog.errors import DblogError, LeadershipLost, SlotInUse
from pydblog.ha.fencing import GuardedStateStore, claim
from pydblog.ha.member import run_member
from pydblog.ha.members import election_leader, read_members
from pydblog.ha.role import ROLE, RoleInfo
from pydblog.ha.takeover import free_slot
from pydblog.metrics import CAPTURE as METRICS
from pydblog.ports import Lease, StateStore
from pydblog.sources.postgres.connect import connect
from pydblog.sources.postgres.source import slot_lag
from pydblog.sources.registry import create_source
from pydblog.state.file import FileStateStore

log = logging.getLogger(__name__)


class Served(Protocol):
    """What serves the capture's API (``api.capture.CaptureApi``), to be closed when the
    capture stops."""

    def close(self) -> None: ...


ServeApi = Callable[[Config, LiveCapture], Served | None]
"""Starts the capture's API on ``LIVE`` (``api.capture.start_capture_api``; None when
``[api] listen`` turns it off). ``dblog run`` passes it in: the capture does not import
the API, which reads the capture."""


def run_capture(cfg: Config, stop: threading.Event, serve_api: ServeApi | None = None) -> None:
    """Run until ``stop`` is set; flushes, acknowledges and closes on the way out.

    Errors before the stream first opens are raised (the CLI prints them and exits
    with their code: bad DSN, server down, slot in use, setup missing). Once capture
    ran, retriable errors (the server restarting) are retried with backoff. With
    ``[ha]`` the process is a member of an election and captures only while it leads
    (``ha.member``). ``serve_api`` serves the API (leaders and standbys alike) from
    before the capture starts until after its state is final.
    """
    # The chunk worker thread does many short database round trips; with the default
    # 5 ms GIL switch interval each one could wait that long behind the stream thread.
    sys.setswitchinterval(0.001)
    # Capture allocates millions of short-lived tuples and strings (rows, events) that
    # hold no reference cycles; with the default threshold (700) the cyclic collector
    # ran so often that it cost a quarter of the snapshot's CPU. Refcounting frees them;
    # the collector still runs, just every 100k allocations.
    gc.set_threshold(100_000, 50, 100)
    gc.freeze()  # modules and config loaded so far: never scanned again
    api = serve_api(cfg, LIVE) if serve_api is not None else None
    scheduled = None
    if cfg.verify.interval_minutes is not None:
        from pydblog.verifier.schedule import ScheduledVerify

        scheduled = ScheduledVerify(cfg).start()
    try:
        if cfg.ha is not None:
            run_member(cfg, stop, _capture)
            return
        ROLE.set(RoleInfo("leader"))
        try:
            _capture(cfg, stop, None)
        finally:
            ROLE.set(RoleInfo("stopped"))
    except BaseException as exc:
        LIVE.state, LIVE.error = "failed", str(exc)
        raise
    finally:
        if LIVE.state != "failed":
            LIVE.state = "stopped"
        if scheduled is not None:
            scheduled.close()
        if api is not None:
            api.close()


RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
HEALTHY_S = 60.0
"""A runner that captured at least this long before its retriable error is retried
after ``RETRY_FIRST_S`` again: the delay doubles only while errors come close together
(it never started over: a capture that had reconnected once an hour waited 30 s at
every reconnection after the fifth)."""

SLOT_WAIT_S = 30.0
"""How long a new leader retries while the previous leader's connection still holds
the replication slot (it terminates that connection first: see ``ha.takeover``)."""
SLOT_POLL_S = 0.5
"""How often a capture without a lease looks again at a slot another connection holds
(``[source] slot_wait_s``)."""


def _capture(cfg: Config, stop: threading.Event, lease: Lease | None) -> None:
    """Capture until ``stop``; with a ``lease`` (an elected leader), own the change log
    with its epoch first and check the lease before every acknowledgement."""
    delay = RETRY_FIRST_S
    slot_deadline: float | None = None
    started_ms = int(time.time() * 1000)  # (a new signal topic's since_ms: kafka_signals)
    ran = False  # a runner opened once: a change log that is away now is retried
    while not stop.is_set():
        try:
            changelog = open_writer(cfg.log)
        except DblogError as exc:
            if not (ran and exc.retriable):  # (at first start: fail, naming the problem)
                raise
            log.warning("%s; retrying in %.1f s", exc, delay)  # e.g. a broker restarting
            LIVE.state, LIVE.error = "retrying", str(exc)
            stop.wait(delay)
            if lease is not None:
                lease.check()
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        state: StateStore = FileStateStore(cfg.log_dir)
        check_unclaimed = getattr(changelog, "check_unclaimed", None)
        if lease is None and check_unclaimed is not None:
            try:
                check_unclaimed()
            except BaseException:
                changelog.close()
                raise
        if lease is not None:
            try:
                claim(changelog, lease, stop)
            except BaseException:
                changelog.close()
                raise
            state = GuardedStateStore(state, lease)
        source, reader = create_source(cfg)
        runner = Runner(cfg, source, reader, changelog, state)
        runner.lease = lease
        LIVE.runner, LIVE.state = runner, "running"
        signals = _kafka_signals(cfg, runner, started_ms)
        started = time.monotonic()
        try:
            runner.run(stop)
            return
        except DblogError as exc:
            ran = ran or runner.opened
            if runner.opened:  # (a slot held later is waited for anew)
                slot_deadline = None
            if runner.opened and time.monotonic() - started >= HEALTHY_S:
                delay = RETRY_FIRST_S  # a healthy run ended: the backoff starts over
            if isinstance(exc, LeadershipLost) or not exc.retriable:
                raise
            if lease is not None and isinstance(exc, SlotInUse) and not runner.opened:
                # The previous leader's walsender may still hold the slot.
                now = time.monotonic()
                slot_deadline = slot_deadline or now + SLOT_WAIT_S
                if now > slot_deadline:
                    raise
                free_slot(cfg)
                log.info("the previous leader still holds the replication slot; retrying")
                delay = 0.2
            elif isinstance(exc, SlotInUse) and not runner.opened:
                # Not terminated: the holder may be a live capture (or another consumer)
                # of this slot. A killed run's walsender ends by itself, soon.
                now = time.monotonic()
                if slot_deadline is None:
                    slot_deadline = now + cfg.source.slot_wait_s
                    log.warning("%s; waiting up to %.0f s for it (a capture killed just now "
                                "holds it until PostgreSQL notices; [source] slot_wait_s)",
                                exc, cfg.source.slot_wait_s)
                if now >= slot_deadline:
                    raise
                delay = SLOT_POLL_S
            elif not ran:  # (the first start fails; once it ran, it retries)
                raise
            else:
                log.warning("%s; retrying in %.1f s", exc, delay)
                LIVE.state, LIVE.error = "retrying", str(exc)
                METRICS.restart()
        finally:
            try:
                if signals is not None:
                    signals.close()
                if runner.driver is not None:
                    runner.driver.close()
                runner.writer.close()
                source.close()
                reader.close()
            finally:
                changelog.close()
        stop.wait(delay)
        if lease is not None:
            lease.check()
        delay = min(delay * 2, RETRY_MAX_S)


def _kafka_signals(cfg: Config, runner: Runner, started_ms: int) -> Any:
    """The Kafka signal channel's listener, if ``[snapshot] signal_topic`` is set: it
    starts from the positions in the checkpoint ``runner`` recovers; a signal topic new
    to the checkpoint is read from ``started_ms`` (the process's start) on, or from the
    start of an earlier process noted in the log directory (``first_run_ms``)."""
    if cfg.snapshot.signal_topic is None:
        return None
    since = first_run_ms(cfg.log_dir, cfg.snapshot.signal_topic, started_ms)
    handled = Handled(cfg.snapshot.signal_topic, since)
    runner.kafka_signals = handled
    return KafkaSignalListener(cfg, handled)


def sync_watermarks(cfg: Config) -> dict[str, Any] | None:
    """What a running (or the last) `dblog sync` of this config published of its
    sources' progress times and ``T`` (``spark/drain.py``), with the times as UTC."""
    import datetime as dt

    import orjson

    path = cfg.log_dir / "sync-watermarks.json"
    try:
        raw = orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        return None

    def when(ms: Any) -> str | None:
        if not isinstance(ms, int):
            return None
        return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")

    return {
        "complete_up_to": when(raw.get("low_ms")),
        "low_ms": raw.get("low_ms"),
        "lag_ms": raw.get("lag_ms"),
        "holding_back": ", ".join(raw.get("holding_back") or []),
        **{f"source {k}": when(v) or "unknown" for k, v in (raw.get("sources") or {}).items()},
        **({"complete_cut": when(raw["cut_ms"]) or "none yet", "cut_ms": raw["cut_ms"],
            "round": raw.get("round")} if "cut_ms" in raw else {}),
        "written": when(raw.get("updated_ms")),
    }


def collect_status(cfg: Config) -> dict[str, Any]:
    from pydblog.config import SYNC_ONLY_DSN

    marks = sync_watermarks(cfg)
    if cfg.source.dsn == SYNC_ONLY_DSN:
        out: dict[str, Any] = {}
        for src in cfg.sync.sources:
            try:
                info, _ = describe(src.log)
            except DblogError as exc:
                info = {"error": exc.message}
            out[f"source {src.name}"] = info
        out["sync watermarks"] = marks or "no sync has run with this config's [log] path"
        return out
    out = {"source": redact_dsn(cfg.source.dsn)}
    if marks is not None:
        out["sync watermarks"] = marks
    st = read_status(cfg.log_dir)
    if st is not None:
        alive = _pid_alive(int(st.get("pid", 0)))
        out["capture"] = "running" if alive and time.time() - st["updated_at"] < 30 else "stopped"
        out["position"] = st.get("position")
        out["events_per_second"] = st.get("events_per_second") if alive else 0.0
        if st.get("snapshot"):
            out["snapshot"] = st["snapshot"]
    else:
        out["capture"] = "never started"
    try:
        info, cp = describe(cfg.log)
    except DblogError as exc:
        info, cp = {"error": exc.message}, None
    if info is not None:
        out["changelog"] = info
    if cp is not None and cp.position is not None and "position" not in out:
        out["position"] = cp.position.to_json()
    if cfg.ha is not None:
        members = read_members(cfg.log_dir)
        leaders = [m for m in members if m.get("role") == "leader"]
        out["ha"] = {
            "backend": cfg.ha.backend,
            # as the election backend knows it (members on other hosts included)
            "leader": election_leader(cfg) or (leaders[0]["member"] if leaders else None),
            "epoch": leaders[0].get("epoch") if leaders else None,
            # members sharing this log directory (this host, or a shared disk)
            "standbys": [m["member"] for m in members if m.get("role") == "standby"],
        }
    out["slot_lag_bytes"] = _lag(cfg)
    api = read_api_address(cfg.log_dir)
    if api is not None and out.get("capture") == "running":
        out["api"] = api
    return out


def _lag(cfg: Config) -> int | str | None:
    if cfg.source.type != "postgres":
        return None
    try:
        conn = connect(cfg.source.dsn, timeout_s=3)
    except DblogError as exc:
        return f"unknown ({exc.message})"
    try:
        return slot_lag(conn, cfg.source.slot)
    finally:
        conn.close()


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
