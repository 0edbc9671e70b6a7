"""`dblog snapshot --wait` follows its snapshot to the end; `dblog status` shows bars."""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.helpers import dblog, materialize, source_rows, start_run, stop_run, tail, write_config


def test_snapshot_wait_and_status(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 5000) g")
    config = write_config(tmp_path, pg_db, extra="[snapshot]\nchunk_size = 500\nadaptive = false\n")
    proc = start_run(config)
    try:
        res = dblog("snapshot", "--config", str(config), "public\\.t", "--wait", timeout=120)
        assert "completed" in res.stderr, res.stderr
        assert materialize(tail(config))["public.t"] == source_rows(pg_db, "public.t", ["id"])
        bad = dblog("snapshot", "--config", str(config), "public\\.nope", "--wait",
                    check=False, timeout=120)
        assert bad.returncode == 1 and "skipped: no table to snapshot" in bad.stderr, bad.stderr
        status = dblog("status", "--config", str(config))
        assert "capture: running" in status.stdout
        assert "api: http://127.0.0.1:" in status.stdout
        assert "snapshot" in status.stdout and "tables" in status.stdout, status.stdout
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
