"""`dblog sync` as a process: /metrics and /health over HTTP while it runs, and its
console output is pydblog's lines only (Spark's go to spark.log)."""

from __future__ import annotations

import http.client
import subprocess
from pathlib import Path

import orjson
import psycopg

from pydblog.devtools.proc import end_process
from tests.helpers import DBLOG, start_run, stop_run, wait_for, wait_for_marker, write_config


def _get(url: str, path: str) -> tuple[int, bytes]:
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _metrics(url: str) -> dict[str, float]:
    code, body = _get(url, "/metrics")
    assert code == 200
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_sync_metrics_health_and_clean_output(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
    config = write_config(
        tmp_path, pg_db,
        extra=f'[api]\nlisten = "127.0.0.1:0"\nsync_listen = "127.0.0.1:0"\n'
              f'[sync]\ntrigger = "500 ms"\nmaster = "local[1]"\n'
              f'[[sync.sinks]]\ntype = "delta"\npath = "{tmp_path / "lake"}"\n',
    )
    proc = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO s SELECT g, 'v' || g FROM generate_series(1, 500) g")
        events = wait_for_marker(config, pg_db)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
    end = events[-1]["offset"] + 1

    sync = subprocess.Popen([*DBLOG, "sync", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    api_file = tmp_path / "data" / "sync-api.json"
    try:
        wait_for(lambda: api_file.exists() or sync.poll() is not None, 120, "sync-api.json")
        assert sync.poll() is None, sync.communicate()[1].decode()[-3000:]
        url = orjson.loads(api_file.read_bytes())["url"]
        wait_for(lambda: _metrics(url).get("dblog_sync_applied_offset") == end, 180,
                 "the sync to apply the change log")
        m = _metrics(url)
        assert m["dblog_sync_events_total"] == end
        assert m["dblog_sync_lag_events"] == 0
        assert m["dblog_sync_running"] == 1
        assert m['dblog_sync_sink_apply_seconds_count{sink="delta"}'] >= 1
        code, body = _get(url, "/health")
        assert code == 200, body
        checks = {c["name"]: c for c in orjson.loads(body)["checks"]}
        assert set(checks) == {"sync", "lag", "watermark"}
        assert checks["watermark"]["ok"] and set(checks["watermark"]["sources"]) == {"default"}
    finally:
        _, stdout, stderr = end_process(sync, 120)
    text = stdout.decode() + stderr.decode()
    for noise in ("log4j", " WARN ", "FutureWarning", "py4j", "[cds]", "incubator"):
        assert noise not in text, (noise, text[-3000:])
    assert "pydblog.sync" in text  # its own lines are there
    assert (tmp_path / "data" / "spark.log").stat().st_size > 0
