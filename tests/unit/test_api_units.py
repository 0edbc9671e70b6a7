"""The API's pure parts: [api]/[health] validation, the /health verdicts, the
POST /snapshots body, per-batch metric counting."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import generate_latest

from pydblog.api.capture import parse_signal_body
from pydblog.api.events import render_events
from pydblog.api.health import HealthInputs, evaluate
from pydblog.api.settings import HealthConfig, split_listen
from pydblog.changelog.sqlite import SqliteChangeLog, SqliteChangeLogReader
from pydblog.config import parse_config
from pydblog.errors import ConfigError, SignalError
from pydblog.events import EncodedBlock, EncodedEvent
from pydblog.metrics import CaptureMetrics
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition

SRC = {"dsn": "postgresql://u:pw@h/db"}


def test_api_defaults_to_loopback_8083() -> None:
    cfg = parse_config({"source": SRC})
    assert cfg.api.listen == "127.0.0.1:8083" and cfg.api.token is None
    assert cfg.health.max_idle_minutes == 30


@pytest.mark.parametrize("listen", ["0.0.0.0:8083", "10.1.2.3:80", "[::]:8083", "example.com:1"])
def test_no_listening_beyond_loopback_without_token(listen: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"source": SRC, "api": {"listen": listen}})
    assert "no api.token is set" in str(err.value)
    cfg = parse_config({"source": SRC, "api": {"listen": listen, "token": "x" * 20}})
    assert cfg.api.listen == listen


def test_token_never_echoed() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"source": SRC, "api": {"token": "short-secret"}})
    assert "api.token" in str(err.value) and "short-secret" not in str(err.value)
    cfg = parse_config({"source": SRC, "api": {"token": "a-long-enough-secret"}})
    assert "a-long-enough-secret" not in repr(cfg)


@pytest.mark.parametrize(("listen", "message"), [
    ("8083", "not host:port"), ("127.0.0.1:http", "not a number"), ("127.0.0.1:70000", "0..65535"),
])
def test_bad_listen(listen: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_listen(listen)
    with pytest.raises(ConfigError, match=message):
        parse_config({"source": SRC, "api": {"listen": listen}})


HEALTHY = HealthInputs(
    now=1000.0, role="leader", capture_state="running", capture_error=None, status_age_s=1.0,
    reachable=True, probe_error=None, probe_age_s=1.0, probe_interval_s=5.0, lag_bytes=100,
    idle_s=10.0, source_moved=False, writer_error=None, log_writable=True, free_bytes=1 << 40,
    snapshot_running=False, snapshot_paused=False, progress_age_s=5000.0,
)


@pytest.mark.parametrize(("change", "failing"), [
    ({}, None),
    ({"capture_state": "retrying", "capture_error": "server closed"}, "capture"),
    ({"status_age_s": 120.0}, "capture"),
    # no status yet: the runner is starting (opening the source), stuck after 30 s
    ({"status_age_s": None, "runner_age_s": 5.0}, None),
    ({"status_age_s": None, "runner_age_s": 31.0}, "capture"),
    ({"status_age_s": None}, "capture"),
    ({"reachable": False, "probe_error": "connection refused"}, "source"),
    ({"idle_s": 3600.0, "source_moved": True}, "idle"),
    ({"idle_s": 3600.0, "source_moved": False}, None),
    ({"idle_s": 3600.0, "source_moved": None}, None),
    ({"lag_bytes": 2 << 30}, "slot_lag"),
    ({"writer_error": "disk I/O error"}, "changelog"),
    ({"log_writable": False}, "changelog"),
    ({"free_bytes": 1 << 20}, "changelog"),
    ({"snapshot_running": True, "progress_age_s": 601.0}, "snapshot"),
    ({"snapshot_running": True, "progress_age_s": 601.0, "snapshot_paused": True}, None),
    ({"snapshot_running": True, "progress_age_s": 30.0}, None),
    ({"role": "standby", "capture_state": "starting", "status_age_s": None}, None),
])
def test_health_verdicts(change: dict[str, Any], failing: str | None) -> None:
    ok, checks = evaluate(dataclasses.replace(HEALTHY, **change), HealthConfig())
    bad = [c["name"] for c in checks if not c["ok"]]
    assert ok == (failing is None)
    assert bad == ([] if failing is None else [failing])
    assert all(c["detail"] for c in checks)


def test_signal_body() -> None:
    sid, kind, data = parse_signal_body(
        b'{"type": "execute-snapshot", "data": {"data-collections": ["public\\\\.t"]}}')
    assert sid.startswith("api-") and kind == "execute-snapshot"
    assert data == {"data-collections": ["public\\.t"]}
    assert parse_signal_body(b'{"id": "mine", "type": "pause-snapshot"}')[0] == "mine"
    for bad in [b"", b"null", b'{"type": 3}', b'{"type": "pause-snapshot", "data": []}',
                b'{"type": "pause-snapshot", "id": ""}',
                b'{"type": "stop-snapshot", "data": {"surrogate-key": "x"}}']:
        with pytest.raises(SignalError):
            parse_signal_body(bad)


def test_metrics_count_per_batch_with_blocks() -> None:
    m = CaptureMetrics()
    events: list[EncodedEvent | EncodedBlock] = [
        EncodedEvent("public.a", "c", 1, "{}"),
        EncodedEvent("public.a", "u", 1, "{}"),
        EncodedBlock("public.a", "r", 1, 500, ""),
        EncodedEvent("public.b", "d", 1, "{}"),
    ]
    m.observe_append(events, 503, 0.002, 503)
    text = m.render().decode()
    assert 'dblog_events_total{op="r",table="public.a"} 500.0' in text
    assert 'dblog_events_total{op="c",table="public.a"} 1.0' in text
    assert 'dblog_events_total{op="d",table="public.b"} 1.0' in text
    assert "dblog_changelog_next_offset 503.0" in text
    assert m.last_event_time is not None


def test_sync_metrics() -> None:
    from pydblog.api.sync import SyncMetrics

    m = SyncMetrics()
    m.observe_batch(1000, 0.5, {"delta": 0.2, "postgres": 0.25}, 1000)
    text = generate_latest(m.registry).decode()
    assert "dblog_sync_events_total 1000.0" in text
    assert 'dblog_sync_sink_apply_seconds_count{sink="delta"} 1.0' in text
    assert "dblog_sync_applied_offset 1000.0" in text


class _SlowReader:
    """The same reader without the block fast path (``read`` only)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def read(self, offset: int, limit: int, tables: Any = None) -> Any:
        return self.inner.read(offset, limit, tables)


@pytest.mark.parametrize("sse", [False, True])
@pytest.mark.parametrize(("start", "limit"), [(0, 10_000), (3, 7), (1500, 2000), (2999, 5)])
def test_events_fast_path_equals_read(tmp_path: Path, sse: bool, start: int, limit: int) -> None:
    """/events renders stored blocks directly; it must equal rendering ``read``."""
    log = SqliteChangeLog(tmp_path)
    body = orjson.dumps({"op": "c", "text": "line\nbreak", "u": "é"}).decode()
    events: list[EncodedEvent | EncodedBlock] = [
        EncodedEvent(f"public.t{i % 3}", "c", i, body) for i in range(1200)]
    events.append(EncodedBlock("public.t9", "r", 5, 1000, "\n".join([body] * 1000)))
    events.extend(EncodedEvent("public.t1", "u", i, body) for i in range(800))
    log.append(events, Checkpoint(PgPosition(Lsn(1), 0, Lsn(1)), None))
    log.close()
    reader = SqliteChangeLogReader(tmp_path)
    try:
        end = reader.next_offset()
        fast = render_events(reader, start, end, limit, None, sse=sse)
        slow = render_events(_SlowReader(reader), start, end, limit, None, sse=sse)  # type: ignore[arg-type]
        assert fast == slow
        text = fast[0].decode()
        sep = "\n\n" if sse else "\n"
        items = [x for x in text.split(sep) if x]
        assert len(items) == min(limit, end - start)
        first = items[0].split("data: ", 1)[-1]
        assert orjson.loads(first)["offset"] == start
    finally:
        reader.close()


def test_live_view_never_pairs_running_with_no_runner() -> None:
    """/health read the runner, then the state: when ``run_capture`` set both in
    between (runner first), it saw ``running`` with no runner and reported "stuck
    opening the source" at the first start (CI, MariaDB probe test)."""
    from pydblog.api.live import LiveCapture

    runner: Any = object()

    class Racing(LiveCapture):
        fired = False

        def __getattribute__(self, name: str) -> Any:
            value = super().__getattribute__(name)
            if name == "runner" and not Racing.fired:  # the capture thread runs now
                Racing.fired = True
                self.runner, self.state = runner, "running"
            return value

    state, _, seen = Racing().view()
    assert not (state == "running" and seen is None), (state, seen)
