"""The HTTP API of `dblog run`, through real HTTP requests against a running process
and a real PostgreSQL: /health, /metrics, POST/GET /snapshots, /events (long-poll
and server-sent events), the status page's data; tokens, redaction, bad bodies."""

from __future__ import annotations

import http.client
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import psycopg

from tests.helpers import materialize, source_rows, start_run, stop_run, wait_for, write_config

TOKEN = "s3cret-token-0123456789"


class Api:
    """A tiny client for the API of one `dblog run` (URL from its api.json)."""

    def __init__(self, config: Path) -> None:
        path = config.parent / "data" / "api.json"
        wait_for(path.exists, 30, "api.json")
        url = urlsplit(orjson.loads(path.read_bytes())["url"])
        self.host, self.port = url.hostname or "", url.port or 0

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None,
                timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        code, _, body = self.request(method, path, **kw)
        return code, orjson.loads(body)

    def metrics(self) -> dict[str, float]:
        code, _, body = self.request("GET", "/metrics")
        assert code == 200
        out: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def events(self, query: str) -> list[dict[str, Any]]:
        code, _, body = self.request("GET", f"/events?{query}", headers=AUTH)
        assert code == 200, body
        return [orjson.loads(line) for line in body.splitlines() if line]


def _config(tmp: Path, dsn: str, health: str = "", source_extra: str = "") -> Path:
    return write_config(
        tmp, dsn,
        extra=f'[api]\nlisten = "127.0.0.1:0"\ntoken = "{TOKEN}"\n'
              f"[health]\nprobe_interval_s = 0.3\n{health}",
        source_extra=source_extra,
    )


def _signal_rows(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM dblog_signal").fetchone()
        assert row is not None
        return int(row[0])


AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def test_api_end_to_end(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, qty int)")
        conn.execute("INSERT INTO items SELECT g, 'old ' || g, g FROM generate_series(1, 300) g")
    config = _config(tmp_path, pg_db)
    proc = start_run(config)
    workers: list[int] = []
    try:
        api = Api(config)
        # /health: every check named, healthy
        wait_for(lambda: api.json("GET", "/health")[0] == 200, 30, "healthy")
        _, report = api.json("GET", "/health")
        assert {c["name"] for c in report["checks"]} == {
            "role", "capture", "source", "idle", "slot_lag", "changelog", "snapshot"}
        assert report["role"] == "leader"

        # live changes reach /events (long-poll: the request waits for them)
        got: list[list[dict[str, Any]]] = []
        poller = threading.Thread(
            target=lambda: got.append(api.events("from=0&table=public.items&wait=20")))
        poller.start()
        time.sleep(0.5)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (1001, 'new', 1), (1002, 'new', 2)")
            conn.execute("UPDATE items SET qty = 7 WHERE id = 1001")
            conn.execute("DELETE FROM items WHERE id = 1002")
        poller.join(30)
        assert got and got[0], "the long-poll returned nothing"
        assert got[0][0]["source"]["table"] == "items"

        # bad requests: 401 without/with a wrong token, nothing written
        before = _signal_rows(pg_db)
        body = orjson.dumps({"type": "execute-snapshot",
                             "data": {"data-collections": ["public\\.items"]}})
        assert api.request("POST", "/snapshots", body)[0] == 401
        assert api.request("POST", "/snapshots", body,
                           {"Authorization": "Bearer wrong-token-000000000"})[0] == 401
        for bad, needle in [
            (b"{not json", "not valid JSON"),
            (b"[]", "must be a JSON object"),
            (b'{"type": "explode"}', "unknown signal type"),
            (b'{"type": "execute-snapshot", "data": {}}', "'data-collections' is required"),
            (b'{"type": "execute-snapshot", "data": {"data-collections": ["("]}}',
             "not a valid regular expression"),
            (b'{"type": "execute-snapshot", "data": {"data-collection": ["x"]}}', "unknown field"),
            (b'{"type": "execute-snapshot", "extra": 1}', "unknown field(s) extra"),
        ]:
            code, err = api.json("POST", "/snapshots", body=bad, headers=AUTH)
            assert code == 400, (bad, err)
            assert needle in err["error"], (bad, err)
        assert api.request("POST", "/snapshots", b"x" * 70_000, AUTH)[0] == 413
        assert api.request("GET", "/nope")[0] == 404
        assert api.request("DELETE", "/snapshots")[0] == 405
        assert api.request("GET", "/events?from=x", headers=AUTH)[0] == 400
        raw = http.client.HTTPConnection(api.host, api.port, timeout=10)
        raw.putrequest("POST", "/snapshots")
        raw.putheader("Content-Length", "many")
        raw.endheaders()
        assert raw.getresponse().status == 400
        raw.close()
        assert _signal_rows(pg_db) == before

        # a valid signal: 202, the snapshot runs through the signal table's path
        code, accepted = api.json("POST", "/snapshots", body=body, headers=AUTH)
        assert code == 202 and accepted["type"] == "execute-snapshot"
        assert _signal_rows(pg_db) == before + 1

        def snapshot_done() -> bool:
            evs = api.events("from=0&limit=10000")
            return any(e["op"] == "n" and e.get("notification", {}).get("type") == "SNAPSHOT_COMPLETED"
                       for e in evs) or sum(e["op"] == "r" for e in evs) >= 301

        wait_for(snapshot_done, 60, "the snapshot in the change log")
        wait_for(lambda: api.json("GET", "/snapshots")[1]["snapshot"] is not None, 10, "status")
        code, snaps = api.json("GET", "/snapshots")
        assert code == 200 and "tables_total" in snaps["snapshot"]

        # the oracle: /events materialized equals the source table
        events = api.events("from=0&limit=10000")
        assert [e["offset"] for e in events] == list(range(len(events)))
        mirror = materialize(events)["public.items"]
        assert mirror == source_rows(pg_db, "public.items", ["id"])

        # /metrics: events by table and op, the signal, offsets
        m = api.metrics()
        assert m['dblog_events_total{op="c",table="public.items"}'] == 2
        assert m['dblog_events_total{op="d",table="public.items"}'] == 1
        assert m['dblog_events_total{op="r",table="public.items"}'] >= 301
        assert m['dblog_signals_total{type="execute-snapshot"}'] == 1
        assert m["dblog_changelog_next_offset"] == len(events)
        assert m['dblog_ha_role{role="leader"}'] == 1
        assert m["dblog_capture_running"] == 1
        assert m["dblog_commit_to_log_seconds_count"] >= 1
        assert m["dblog_changelog_size_bytes"] > 0

        # server-sent events: the same events, with ids
        sse = http.client.HTTPConnection(api.host, api.port, timeout=10)
        sse.request("GET", "/events?from=0&table=public.items", headers={
            "Authorization": f"Bearer {TOKEN}", "Accept": "text/event-stream"})
        resp = sse.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
        ids: list[int] = []
        while len(ids) < 3:
            line = resp.fp.readline().decode()
            if line.startswith("id: "):
                ids.append(int(line[4:]))
        sse.close()
        assert ids == sorted(ids)

        # /events was served by the events process, a child of dblog run
        workers = _children(proc.pid, "pydblog.api.events_worker")
        assert len(workers) == 1, workers

        # /events needs the token when one is set; nothing shows the DSN's password
        assert api.request("GET", "/events?from=0")[0] == 401
        for path in ("/api/status", "/health", "/snapshots", "/metrics", "/"):
            code, _, page = api.request("GET", path)
            assert code == 200 and b":postgres@" not in page, path
        code, status = api.json("GET", "/api/status")
        assert status["source"].startswith("postgresql://postgres:***@")
        assert status["tables"]["public.items"]["c"] == 2
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
    wait_for(lambda: not any(Path(f"/proc/{w}").exists() for w in workers), 10,
             "the events process to exit with dblog run")


def _children(pid: int, needle: str) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
            cmd = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and needle in cmd:
            out.append(int(stat.parent.name))
    return out


def test_health_idle_rule(tmp_path: Path) -> None:
    """DBLog's rule: no event for max_idle_minutes is unhealthy only when the source
    changed meanwhile (here: writes to a table that is not captured). The server is the
    test's own: the source's position is the cluster's WAL, which other tests' databases
    on a shared server move."""
    from pydblog.devtools.pgcluster import PgCluster

    with PgCluster() as cluster:
        _idle_rule(cluster.create_database("idle"), tmp_path)


def _idle_rule(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE captured (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE ignored (id int PRIMARY KEY)")
    config = _config(tmp_path, pg_db, health="max_idle_minutes = 0.03\n",
                     source_extra='exclude_tables = ["public\\\\.ignored"]')
    proc = start_run(config)
    try:
        api = Api(config)

        def idle_check() -> dict[str, Any]:
            _, report = api.json("GET", "/health")
            return next(c for c in report["checks"] if c["name"] == "idle")

        # quiet source: past the limit and still healthy
        time.sleep(3)
        code, report = api.json("GET", "/health")
        assert code == 200, report["checks"]
        assert "has not changed" in idle_check()["detail"]
        # the source changes, nothing is captured: unhealthy once past the limit
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO ignored VALUES (1)")
        wait_for(lambda: api.request("GET", "/health")[0] == 503, 20, "503 from /health")
        check = idle_check()
        assert not check["ok"] and "although the source has changed" in check["detail"]
        # a captured event makes it healthy again
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO captured VALUES (1)")
        wait_for(lambda: api.request("GET", "/health")[0] == 200, 20, "200 from /health")
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
