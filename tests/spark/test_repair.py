"""A repair through the real sync: `dblog sync` (Spark) carries the range-end markers of
`dblog verify --repair` and `dblog snapshot --repair` to the Delta and PostgreSQL sinks,
which delete what the source no longer has."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from deltalake import DeltaTable

from pydblog.config import load_config
from pydblog.devtools.pgcluster import PgCluster
from pydblog.spark.job import run_sync
from tests.conftest import drop_database
from tests.helpers import DBLOG, start_run, stop_run, wait_for_marker, write_config


@pytest.mark.slow
def test_repairs_through_spark(spark: Any, pg_db: str, pg_cluster: PgCluster, tmp_path: Path) -> None:
    name = f"r_{tmp_path.name[-8:].lower()}"
    replica = pg_cluster.create_database(name)
    lake = tmp_path / "lake"
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8,2))")
        conn.execute("CREATE TABLE tags (t text PRIMARY KEY, n int)")
    config = write_config(tmp_path, pg_db, extra=f"""
[snapshot]
chunk_size = 100
[sync]
checkpoint = "{tmp_path / "cp"}"
master = "local[2]"
sink_retries = 0
[[sync.sinks]]
type = "delta"
path = "{lake}"
[[sync.sinks]]
type = "postgres"
dsn = "{replica}"
schema = "mirror"
""")
    proc = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO items SELECT g, 'n' || g, g FROM generate_series(1, 1000) g")
            conn.execute("INSERT INTO tags SELECT 't' || g, g FROM generate_series(1, 100) g")
        wait_for_marker(config, pg_db)
        cfg = load_config(config)
        assert run_sync(cfg, available_now=True) == 0
        with psycopg.connect(replica, autocommit=True) as conn:
            conn.execute("INSERT INTO mirror.items VALUES (5000, 'ghost', 1), (-3, 'ghost', 1)")
            conn.execute("DELETE FROM mirror.items WHERE id BETWEEN 300 AND 310")
            conn.execute("INSERT INTO mirror.tags VALUES ('zz', 0)")
        DeltaTable(str(lake / "public" / "items")).delete("id = 700")
        res = subprocess.run([*DBLOG, "verify", "--config", str(config), "--json", "--chunk-size", "200",
                              r"public\.(items|tags)"], capture_output=True, text=True, timeout=300)
        assert res.returncode == 1, res.stderr
        before = orjson.loads(res.stdout)
        assert {(t["table"], t["sink"]) for t in before["tables"] if not t["ok"]} == {
            ("public.items", "postgres"), ("public.items", "delta"), ("public.tags", "postgres")}

        # verify --repair with the sync running in between (Spark, available-now, twice)
        job = subprocess.Popen([*DBLOG, "verify", "--config", str(config), "--json", "--chunk-size",
                                "200", r"public\.items", "--repair", "--repair-timeout", "240"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(60):
                wait_for_marker(config, pg_db)
                assert run_sync(cfg, available_now=True) == 0
                if job.poll() is not None:
                    break
            out, err = job.communicate(timeout=240)
        finally:
            if job.poll() is None:
                job.kill()
        assert job.returncode == 0, err + out
        assert orjson.loads(out)["after"]["ok"]

        # a whole-table repair of tags: its extra row goes
        res = subprocess.run([*DBLOG, "snapshot", "--config", str(config), "--repair", "--wait",
                              r"public\.tags"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        wait_for_marker(config, pg_db)
        assert run_sync(cfg, available_now=True) == 0
        res = subprocess.run([*DBLOG, "verify", "--config", str(config), "--json", r"public\.(items|tags)"],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
    finally:
        stop_run(proc)
        drop_database(pg_cluster, name)
