"""The HTTP API of ``dblog run`` (endpoints in docs/operations.md).

``start_capture_api`` serves it from its own threads; the capture loop never waits for
it. Snapshot signals sent here go the signal table's way (validated here first, for a
clear 400; then written as a signal row, which the capture reads from the log, exactly
like a row inserted by hand or by ``dblog snapshot``): the same validation, the same
notifications, and under high availability whichever process leads picks them up. With
read-only snapshots (nothing is written to the source) they go to this process's capture
instead (``capture.inbox``): only the leader takes them, and 202 means applied.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from importlib import resources
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from pydblog.api.events import (
    EventsRequest,
    long_poll,
    open_log_reader,
    sse_stream,
)
from pydblog.api.events_worker import EventsWorker
from pydblog.api.health import HealthInputs, evaluate
from pydblog.api.http import ApiServer, Request, Response, Router, error, json_response
from pydblog.api.live import LiveCapture
from pydblog.api.logfigures import LogFigures
from pydblog.api.probe import SourceProbe
from pydblog.api.settings import split_listen
from pydblog.apiaddress import API_FILE
from pydblog.apiaddress import read_api_address as read_api_address  # (re-exported)
from pydblog.capture.inbox import deliver
from pydblog.capture.signals import send_signal, signals_go_direct
from pydblog.config import Config, redact_dsn
from pydblog.core.signals import parse_signal
from pydblog.errors import DblogError, SignalError
from pydblog.metrics import CAPTURE, CaptureMetrics
from pydblog.ports import ChangeLogReader
from pydblog.verifier.schedule import STATE as VERIFY

log = logging.getLogger(__name__)

MAX_LIMIT = 10_000
MAX_WAIT_S = 60.0
DIRECT_SIGNAL_WAIT_S = 10.0
"""How long ``POST /snapshots`` waits for the capture to take a read-only snapshot's
signal before withdrawing it (503)."""


def open_reader(cfg: Config) -> ChangeLogReader | None:
    """A reader of the change log, or None while it does not exist yet."""
    return open_log_reader(cfg.log)


class CaptureApi:
    def __init__(self, cfg: Config, live: LiveCapture, metrics: CaptureMetrics = CAPTURE) -> None:
        self.cfg = cfg
        self.live = live
        self.metrics = metrics
        self.probe = SourceProbe(cfg, live, metrics, cfg.health.probe_interval_s)
        router = self.router = Router(cfg.api.token)
        router.on_request = lambda path, code: metrics.api_requests.labels(
            path if path in _PATHS else "other", str(code)).inc()
        router.add("GET", "/health", self.health)
        router.add("GET", "/metrics", self.prometheus)
        router.add("GET", "/snapshots", self.snapshots)
        router.add("POST", "/snapshots", self.signal, auth=True)
        router.add("POST", "/repairs", self.repair, auth=True)
        router.add("GET", "/events", self.events, auth=cfg.api.token is not None)
        router.add("GET", "/api/status", self.page_status)
        router.add("GET", "/", self.page)
        self.figures = LogFigures(cfg.log)
        metrics.scrape_hooks.append(self._scrape)
        self.server: ApiServer | None = None
        self.worker: EventsWorker | None = None
        self._worker_lock = threading.Lock()
        self._closed = False

    def _events_worker(self) -> EventsWorker | None:
        """The events process, started at the first ``/events`` request (and again if
        it died); None when it cannot start (the API then serves events itself)."""
        with self._worker_lock:
            if self._closed:
                return None
            if self.worker is not None and self.worker.alive():
                return self.worker
            try:
                self.worker = EventsWorker(self.cfg.log)
            except OSError as exc:
                log.warning("cannot start the events process (%s); serving /events here", exc)
                self.worker = None
            return self.worker

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> CaptureApi:
        """Serve on ``self.server`` (bound by ``start_capture_api``)."""
        assert self.server is not None
        self.server.start()
        self.probe.start()
        path = self.cfg.log_dir / API_FILE
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # HA members share the directory
        tmp.write_bytes(orjson.dumps({"url": self.server.url, "pid": os.getpid()}))
        os.replace(tmp, path)
        log.info("HTTP API on %s (status page %s/)", self.server.url, self.server.url)
        return self

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.metrics.scrape_hooks.remove(self._scrape)
        if self.server is not None:
            self.server.close()
        with self._worker_lock:
            self._closed = True
            if self.worker is not None:
                self.worker.close()
        self.probe.close()
        self.figures.close()
        path = self.cfg.log_dir / API_FILE
        with contextlib.suppress(FileNotFoundError, orjson.JSONDecodeError, KeyError):
            if orjson.loads(path.read_bytes())["pid"] == os.getpid():  # ours, not a peer's
                path.unlink()

    # -- /health ----------------------------------------------------------------------------
    def health_report(self) -> tuple[bool, dict[str, Any]]:
        now = time.time()
        live, probe, metrics = self.live, self.probe, self.metrics
        state, error, runner = live.view()
        status = None if runner is None else runner.status.latest
        snap = (status or {}).get("snapshot") or {}
        last = metrics.last_event_time or live.started_at
        log_dir = self.cfg.log_dir
        try:
            free: int | None = shutil.disk_usage(log_dir).free
        except OSError:
            free = None
        inp = HealthInputs(
            now=now,
            role=live.role,
            capture_state=state,
            capture_error=error,
            status_age_s=None if status is None else now - float(status["updated_at"]),
            reachable=probe.reachable,
            probe_error=probe.error,
            probe_age_s=None if probe.checked_at is None or not probe.reachable
            else now - probe.checked_at,
            probe_interval_s=probe.interval_s,
            lag_bytes=probe.lag_bytes,
            idle_s=now - last,
            source_moved=probe.source_moved(),
            writer_error=live.writer_error(),
            log_writable=os.access(log_dir, os.W_OK),
            free_bytes=free,
            snapshot_running=bool(snap.get("active")),
            snapshot_paused=bool(snap.get("paused")),
            progress_age_s=now - metrics.progress_time,
            runner_age_s=None if runner is None else now - runner.status.started_at,
            verify=VERIFY.latest,
            verify_scheduled=self.cfg.verify.interval_minutes is not None,
        )
        ok, checks = evaluate(inp, self.cfg.health)
        return ok, {"status": "ok" if ok else "unhealthy", "role": live.role, "checks": checks}

    def health(self, req: Request) -> Response:
        ok, report = self.health_report()
        return json_response(200 if ok else 503, report)

    # -- /metrics ---------------------------------------------------------------------------
    def prometheus(self, req: Request) -> Response:
        return Response(200, self.metrics.render(), content_type=CONTENT_TYPE_LATEST)

    def _scrape(self) -> None:
        m, live = self.metrics, self.live
        m.running.set(1 if live.state == "running" and live.role == "leader" else 0)
        m.set_role(live.role)
        m.backlog.set(live.backlog())
        info = self._changelog_info()
        if info is not None:
            if info.get("size_bytes") is not None:
                m.size_bytes.set(info["size_bytes"])
            m.first_offset.set(info["first_offset"])
            m.next_offset.set(info["next_offset"])

    def _changelog_info(self) -> dict[str, Any] | None:
        """Size (when the backend knows it), first and next offset of the change log
        (``LogFigures``: a slow change log never holds a scrape for long)."""
        return self.figures.get()

    # -- /snapshots -------------------------------------------------------------------------
    def snapshots(self, req: Request) -> Response:
        status = self.live.status() or {}
        return json_response(200, {"capture": self.live.state,
                                   "snapshot": status.get("snapshot")})

    def repair(self, req: Request) -> Response:
        """``POST /repairs``: a repair signal (docs/verify.md), whole tables
        (``{"tables": [REGEX...]}``) or key ranges (``{"ranges": {"schema.table":
        [{"lo": [...], "hi": [...]}]}}``, as ``dblog verify --json`` reports them)."""
        try:
            data = repair_signal_data(self.cfg, req.body)
            signal_id = f"repair-{uuid.uuid4()}"
            from pydblog.core.signals import parse_signal

            parse_signal(signal_id, "execute-snapshot", orjson.dumps(data).decode())
        except SignalError as exc:
            return error(400, exc.message, exc.hint)
        except DblogError as exc:
            return error(503, redact_dsn(exc.message), exc.hint)
        return self._send(signal_id, "execute-snapshot", data)

    def signal(self, req: Request) -> Response:
        try:
            signal_id, kind, data = parse_signal_body(req.body)
        except SignalError as exc:
            return error(400, exc.message, exc.hint)
        return self._send(signal_id, kind, data)

    def _send(self, signal_id: str, kind: str, data: dict[str, Any]) -> Response:
        if signals_go_direct(self.cfg):
            return self._signal_direct(signal_id, kind, data)
        try:
            send_signal(self.cfg, signal_id, kind, data)
        except DblogError as exc:
            return error(503, redact_dsn(exc.message), exc.hint)
        log.info("API: %s signal %s accepted", kind, signal_id)
        return json_response(202, {"id": signal_id, "type": kind, "accepted": True,
                                   "progress": "/snapshots"})

    def _signal_direct(self, signal_id: str, kind: str, data: dict[str, Any]) -> Response:
        """Read-only snapshots: the signal goes to this process's capture
        (``capture.inbox``); 202 once its effect is in a durable checkpoint."""
        if self.live.role != "leader" or self.live.state not in ("running", "retrying"):
            return error(503, f"this process is not capturing (role {self.live.role}, "
                         f"state {self.live.state}): the signal was not taken",
                         "send it to the capture that leads (its API), or retry once it runs")
        item = deliver(signal_id, kind, data, DIRECT_SIGNAL_WAIT_S)
        if item is None:
            return error(503, f"the capture did not take signal {signal_id} within "
                         f"{DIRECT_SIGNAL_WAIT_S:.0f} s; it was withdrawn and will not apply",
                         "retry; /health shows whether the capture is stuck")
        if not item.done.is_set():
            return error(503, f"the outcome of signal {signal_id} is unknown: the capture "
                         "took it and did not confirm it",
                         "retry with the same id: if it was applied the answer says duplicate")
        if item.outcome == "rejected":
            return error(400, item.error or f"signal {signal_id} was rejected")
        log.info("API: %s signal %s %s", kind, signal_id, item.outcome)
        return json_response(202, {"id": signal_id, "type": kind, "accepted": True,
                                   "applied": item.outcome == "applied",
                                   "duplicate": item.outcome == "duplicate",
                                   "notification": item.notification,
                                   "progress": "/snapshots"})

    # -- /events ----------------------------------------------------------------------------
    def events(self, req: Request) -> Response:
        try:
            start = _int_arg(req, "from", None, 0)
            limit = min(_int_arg(req, "limit", 1000, 1) or 1000, MAX_LIMIT)
            wait = min(_float_arg(req, "wait", 0.0), MAX_WAIT_S)
        except ValueError as exc:
            return error(400, str(exc))
        tables = req.query.get("table") or None
        if "last-event-id" in req.headers:
            try:
                start = int(req.headers["last-event-id"]) + 1
            except ValueError:
                return error(400, "Last-Event-ID must be an offset (an integer)")
        sse = "text/event-stream" in req.headers.get("accept", "") or req.arg("sse") in ("1", "true")
        params = EventsRequest(sse, start, limit, wait, tables)
        worker = self._events_worker()
        if worker is not None:  # served by the events process, off the capture's CPU
            return Response(200, handoff=lambda sock: worker.handoff(sock, params),
                            fallback=lambda: self._local(params, req))
        return self._local(params, req)

    def _local(self, params: EventsRequest, req: Request) -> Response:
        if params.sse:
            return Response(200, content_type="text/event-stream",
                            stream=sse_stream(self.cfg.log, params.start, params.tables,
                                              req.stopping))
        return self._long_poll(params.start, params.limit, params.wait, params.tables, req)

    def _long_poll(self, start: int | None, limit: int, wait: float,
                   tables: list[str] | None, req: Request) -> Response:
        body, nxt = long_poll(self.cfg.log, start, limit, wait, tables, req.stopping)
        return Response(200, body, content_type="application/x-ndjson",
                        headers={"X-Next-Offset": str(nxt)})

    # -- the status page --------------------------------------------------------------------
    def page(self, req: Request) -> Response:
        html = resources.files("pydblog.api").joinpath("page.html").read_bytes()
        return Response(200, html, content_type="text/html; charset=utf-8")

    def page_status(self, req: Request) -> Response:
        ok, report = self.health_report()
        status = self.live.status() or {}
        tables: dict[str, dict[str, float]] = {}
        for family in self.metrics.events.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["op"] != "n":
                    t = tables.setdefault(sample.labels["table"], {})
                    t[sample.labels["op"]] = sample.value
        return json_response(200, {
            "source": redact_dsn(self.cfg.source.dsn),
            "connector": self.cfg.source.type,
            "capture": self.live.state,
            "role": self.live.role,
            "healthy": ok,
            "health": report["checks"],
            "position": status.get("position"),
            "events_per_second": status.get("events_per_second"),
            "snapshot": status.get("snapshot"),
            "changelog": self._changelog_info(),
            "tables": tables,
            "lag_bytes": self.probe.lag_bytes,
            "history": list(self.probe.history),
        })


_PATHS = {"/health", "/metrics", "/snapshots", "/repairs", "/events", "/api/status", "/"}
_BODY_FIELDS = {"id", "type", "data"}


def parse_signal_body(body: bytes) -> tuple[str, str, dict[str, Any]]:
    """``(id, type, data)`` of a ``POST /snapshots`` body, validated exactly as a signal
    row is (``core.signals.parse_signal``); raises ``SignalError`` naming the problem."""
    example = ('{"type": "execute-snapshot", "data": {"data-collections": '
               '["public\\\\.orders"]}}')
    if not body.strip():
        raise SignalError("the request body is empty", hint=f"send a JSON object: {example}")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise SignalError(f"the request body is not valid JSON ({exc})",
                          hint=f"send a JSON object: {example}") from None
    if not isinstance(doc, dict):
        raise SignalError("the request body must be a JSON object",
                          hint=f"for example {example}")
    unknown = sorted(set(doc) - _BODY_FIELDS)
    if unknown:
        raise SignalError(f"unknown field(s) {', '.join(unknown)} in the request body",
                          hint="the body has type, data and optionally id (Debezium's signal)")
    kind = doc.get("type")
    if not isinstance(kind, str):
        raise SignalError("'type' is required: a signal type as a string",
                          hint="execute-snapshot, stop-snapshot, pause-snapshot or resume-snapshot")
    signal_id = doc.get("id", f"api-{uuid.uuid4()}")
    if not isinstance(signal_id, str) or not signal_id or len(signal_id) > 200:
        raise SignalError("'id' must be a non-empty string (at most 200 characters)")
    data = doc.get("data")
    if data is not None and not isinstance(data, dict):
        raise SignalError("'data' must be a JSON object")
    data = data or {}
    parse_signal(signal_id, kind, orjson.dumps(data).decode())
    return signal_id, kind, data


def repair_signal_data(cfg: Config, body: bytes) -> dict[str, Any]:
    """The ``execute-snapshot`` data of a ``POST /repairs`` body; raises ``SignalError``
    naming the problem."""
    example = '{"ranges": {"public.orders": [{"lo": [100], "hi": [200]}]}} or {"tables": ["public\\\\.orders"]}'
    try:
        doc = orjson.loads(body or b"null")
    except orjson.JSONDecodeError as exc:
        raise SignalError(f"the request body is not valid JSON ({exc})", hint=example) from None
    if not isinstance(doc, dict) or not (set(doc) <= {"tables", "ranges", "surrogate-key"}) \
            or not (doc.get("tables") or doc.get("ranges")):
        raise SignalError("the body is an object with tables (regexes) or ranges", hint=example)
    tables, ranges = doc.get("tables") or [], doc.get("ranges") or {}
    chunk_by = doc.get("surrogate-key")
    if chunk_by is not None and (not isinstance(chunk_by, str) or not chunk_by or ranges):
        raise SignalError("'surrogate-key' is a column name, for whole tables without primary "
                          "key (the column their repair chunks by), not with 'ranges'",
                          hint='{"tables": ["public\\\\.events"], "surrogate-key": "created_at"}')
    if not isinstance(tables, list) or not all(isinstance(t, str) and t for t in tables):
        raise SignalError("'tables' must be an array of regexes on schema.table", hint=example)
    if not isinstance(ranges, dict):
        raise SignalError("'ranges' must map schema.table to [{lo, hi}...]", hint=example)
    data: dict[str, Any] = {"data-collections": list(tables), "type": "incremental",
                            "repair": [{"data-collection": t, "ranges": None} for t in tables]}
    if chunk_by is not None:
        data["surrogate-key"] = chunk_by
    if ranges:
        from pydblog.changelog import open_reader
        from pydblog.verifier.ranges import Range
        from pydblog.verifier.repair import RepairPlan, signal_data

        reader = open_reader(cfg.log)
        try:
            known = {s.qualified: s for _, s in reader.schemas()}
        finally:
            reader.close()
        plan = RepairPlan()
        for table, items in ranges.items():
            schema = known.get(table)
            if schema is None or not schema.key:
                raise SignalError(f"{table!r} is not a captured table with a primary key",
                                  hint="name it as schema.table, as dblog verify reports it")
            if not isinstance(items, list) or not items:
                raise SignalError(f"ranges of {table}: a non-empty array of {{lo, hi}}", hint=example)
            out = []
            for i, r in enumerate(items):
                bounds = []
                for end in ("lo", "hi"):
                    b = r.get(end) if isinstance(r, dict) else None
                    if b is not None and (not isinstance(b, list) or len(b) != len(schema.key)):
                        raise SignalError(f"ranges of {table}[{i}].{end}: an array of "
                                          f"{len(schema.key)} key value(s) or null", hint=example)
                    bounds.append(None if b is None else tuple(b))
                lo, hi = bounds
                out.append(Range(i, None if lo is None else tuple(map(_key_text, lo)),
                                 None if hi is None else tuple(map(_key_text, hi)), lo, hi))
            plan.schemas[table] = schema
            plan.ranges[table] = out
        more = signal_data(cfg, plan)
        data["data-collections"] += more["data-collections"]
        data["repair"] += more["repair"]
        data["additional-conditions"] = more.get("additional-conditions", [])
    if not data["data-collections"]:
        raise SignalError("name at least one table", hint=example)
    if not data.get("additional-conditions"):
        data.pop("additional-conditions", None)
    return data


def _key_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else str(v)


def _int_arg(req: Request, name: str, default: int | None, minimum: int) -> int | None:
    raw = req.arg(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}")
    return value


def _float_arg(req: Request, name: str, default: float) -> float:
    raw = req.arg(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number (seconds)") from None
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0")
    return value


def start_capture_api(cfg: Config, live: LiveCapture) -> CaptureApi | None:
    """Serve the API per ``[api] listen`` ("" turns it off). A port already taken is
    logged as an error and capture goes on without the API (capture matters more)."""
    if not cfg.api.listen:
        return None
    api = CaptureApi(cfg, live)
    host, port = split_listen(cfg.api.listen)
    try:
        api.server = ApiServer(host, port, api.router)
    except OSError as exc:
        api.close()
        log.error("HTTP API not served: cannot listen on %s (%s); set [api] listen to a "
                  "free address, or \"\" to turn the API off", cfg.api.listen, exc.strerror)
        return None
    return api.start()
