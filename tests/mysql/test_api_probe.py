"""The API's source probe on MySQL/MariaDB (`api/probe.py`, ``SHOW MASTER STATUS`` as the
change marker): /health's idle rule, reachability and the binlog lag, through a real
`dblog run` against MariaDB and MySQL 5.7."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydblog.devtools.mysql57 import TestServer
from tests.helpers import first_checkpoint, start_run, stop_run, wait_for
from tests.integration.test_api import TOKEN, Api
from tests.mysql.helpers import run_sql


def test_mysql_probe_and_idle_rule(server: TestServer, db: str, tmp_path: Path) -> None:
    run_sql(server, db, "CREATE TABLE captured (id INT PRIMARY KEY)",
            "CREATE TABLE ignored (id INT PRIMARY KEY)")
    config = tmp_path / "dblog.toml"
    config.write_text(
        f'[source]\ntype = "mysql"\ndsn = "{server.dsn(db)}"\nserver_id = 778\n'
        f'tables = ["{db}\\\\.captured"]\nheartbeat_interval_s = 0.5\n'
        f'[log]\npath = "{tmp_path / "data"}"\n'
        f'[api]\nlisten = "127.0.0.1:0"\ntoken = "{TOKEN}"\n'
        "[health]\nprobe_interval_s = 0.3\nmax_idle_minutes = 0.03\n"
    )
    proc = start_run(config, wait=False)
    try:
        api = Api(config)

        def check(name: str) -> dict[str, Any]:
            _, report = api.json("GET", "/health")
            found: dict[str, Any] = next(c for c in report["checks"] if c["name"] == name)
            return found

        # From the API's first answer until the capture loop's first status: a runner
        # still opening the source (or making its first binlog read) is starting, never
        # "stuck" (a loaded CI machine took seconds there, and /health said 503 "has
        # not reported for over 30 s" at once).
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while (capture := check("capture"))["detail"] != "running":
            seen.add(capture["detail"])
            assert proc.poll() is None and time.monotonic() < deadline, seen
        assert not [d for d in seen if "stuck" in d], seen
        wait_for(lambda: first_checkpoint(config), 30, "the first checkpoint")
        wait_for(lambda: check("source")["ok"], 30, "the probe reaching the source")
        # quiet source (heartbeats write nothing to the binlog): past the limit, healthy
        wait_for(lambda: "has not changed" in check("idle")["detail"], 30, "idle, unchanged")
        code, report = api.json("GET", "/health")
        assert code == 200, report["checks"]
        wait_for(lambda: "dblog_source_lag_bytes" in api.metrics(), 30, "the lag metric")
        # the source changes, nothing is captured: unhealthy once past the limit
        run_sql(server, db, "INSERT INTO ignored VALUES (1)")
        wait_for(lambda: api.request("GET", "/health")[0] == 503, 30, "503 from /health")
        idle = check("idle")
        assert not idle["ok"] and "although the source has changed" in idle["detail"], idle
        # a captured event makes it healthy again
        run_sql(server, db, "INSERT INTO captured VALUES (1)")
        wait_for(lambda: api.request("GET", "/health")[0] == 200, 30, "200 from /health")
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
