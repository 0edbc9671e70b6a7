"""`dblog demo`: the whole pipeline on an embedded default, on one machine.

Starts a throwaway PostgreSQL, creates a small shop schema with rows that exist before
capture starts, runs `dblog run` with an initial (incremental) snapshot while a write
workload runs, shows the change log, then (when PySpark is installed) runs `dblog sync`
into Delta Lake mirrors and a second PostgreSQL database and proves that the mirrors
equal the source: row counts and per-table checksums.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from pydblog.capture.status import read_status
from pydblog.changelog.sqlite import SqliteChangeLogReader, log_path
from pydblog.devtools.pgcluster import PgCluster
from pydblog.errors import DblogError
from pydblog.events import decode_envelope

TABLES = {"public.customers": ["id"], "public.orders": ["id"]}


def _schema(conn: psycopg.Connection[Any], rows: int) -> None:
    conn.execute(
        "CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text, "
        "created timestamptz NOT NULL DEFAULT now(), vip boolean NOT NULL DEFAULT false)"
    )
    conn.execute(
        "CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int NOT NULL, "
        "amount numeric(10,2) NOT NULL, status text NOT NULL, items jsonb, tags text[])"
    )
    conn.execute(
        "INSERT INTO customers (id, name, email) SELECT g, 'customer ' || g, 'c' || g || '@example.com' "
        "FROM generate_series(1, %s) g",
        (rows // 4,),
    )
    conn.execute(
        "INSERT INTO orders SELECT g, 1 + g %% %s, (g %% 997) * 1.25, 'new', "
        "jsonb_build_object('sku', 'S' || g, 'qty', g %% 5 + 1), ARRAY['a', 'b'] "
        "FROM generate_series(1, %s) g",
        (rows // 4, rows),
    )


def _workload(dsn: str, rows: int, seed: int = 42) -> int:
    rng = random.Random(seed)
    n = 0
    with psycopg.connect(dsn) as conn:
        for i in range(rows):
            r = rng.random()
            if r < 0.4:
                conn.execute(
                    "INSERT INTO orders VALUES (%s, %s, %s, 'new', %s, %s)",
                    (10_000_000 + i, rng.randrange(1, rows // 4), rng.randrange(100_00) / 100,
                     orjson.dumps({"sku": f"N{i}", "qty": 1}).decode(), ["x"]),
                )
            elif r < 0.7:
                conn.execute("UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id = %s",
                             (rng.randrange(1, rows),))
            elif r < 0.8:
                conn.execute("DELETE FROM orders WHERE id = %s", (rng.randrange(1, rows),))
            else:
                conn.execute("UPDATE customers SET vip = NOT vip WHERE id = %s", (rng.randrange(1, rows // 4),))
            n += 1
            if i % 10 == 0:
                conn.commit()
        conn.commit()
    return n


def _config(work: Path, dsn: str, replica: str | None) -> Path:
    sinks = ""
    if replica is not None:
        sinks = f"""
[sync]
checkpoint = "{work / "sync-checkpoint"}"
trigger = "available-now"
master = "local[2]"

[[sync.sinks]]
type = "delta"
path = "{work / "lake"}"

[[sync.sinks]]
type = "postgres"
dsn = "{replica}"
schema = "public"

[[sync.sinks]]
type = "history"
path = "{work / "lake" / "_changes"}"
"""
    path = work / "dblog.toml"
    path.write_text(
        f"""# written by `dblog demo`
[source]
type = "postgres"
dsn = "{dsn}"
tables = ["public\\\\.(customers|orders)"]
heartbeat_interval_s = 1.0

[log]
path = "{work / "dblog-data"}"

[api]
listen = "127.0.0.1:0"

[snapshot]
mode = "initial"
chunk_size = 1024
{sinks}"""
    )
    return path


def _events(work: Path) -> list[dict[str, Any]]:
    reader = SqliteChangeLogReader(work / "dblog-data")
    try:
        return [decode_envelope(r.offset, r.body) for r in reader.read(0, 10**9)]
    finally:
        reader.close()


def _wait_started(work: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the capture's slot exists (its first checkpoint is in the change log): the
    workload's changes from then on are in the stream."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DblogError("the demo's `dblog run` exited", hint="see its messages above")
        if log_path(work / "dblog-data").exists():
            reader = SqliteChangeLogReader(work / "dblog-data")
            try:
                if reader.last_checkpoint() is not None:
                    api = work / "dblog-data" / "api.json"
                    if api.exists():
                        print(f"status page: {orjson.loads(api.read_bytes())['url']}/")
                    return
            finally:
                reader.close()
        time.sleep(0.2)
    raise DblogError("the demo capture did not start in time", hint="see the log lines above")


def _wait_caught_up(work: Path, dsn: str, timeout: float = 180) -> list[dict[str, Any]]:
    """Until the initial snapshot completed and a marker written now is in the log."""
    token = f"demo-{time.time_ns()}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE customers SET email = %s WHERE id = 1", (token,))
    deadline = time.monotonic() + timeout
    with Progress(TextColumn("initial snapshot"), BarColumn(), TaskProgressColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task("snapshot", total=100)
        while time.monotonic() < deadline:
            if log_path(work / "dblog-data").exists():
                events = _events(work)
                done = any(
                    e["op"] == "n" and e.get("notification", {}).get("type") == "COMPLETED"
                    for e in events
                )
                marker = any((e.get("after") or {}).get("email") == token for e in events)
                snap = (read_status(work / "dblog-data") or {}).get("snapshot") or {}
                bar.update(task, completed=100 if done else float(snap.get("percent") or 0))
                if done and marker:
                    return events
            time.sleep(0.5)
    raise DblogError("the demo capture did not catch up in time", hint="see the log lines above")


def checksum(rows: list[dict[str, Any]]) -> str:
    """Order-independent checksum over rows rendered as canonical JSON."""
    digest = hashlib.sha256()
    for line in sorted(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in rows):
        digest.update(line)
    return digest.hexdigest()[:16]


def run_demo(workdir: Path | None, rows: int, with_sync: bool | None) -> int:
    if with_sync is None:
        try:
            import deltalake  # noqa: F401
            import pyspark  # noqa: F401

            with_sync = True
        except ImportError:
            with_sync = False
    work = workdir or Path(tempfile.mkdtemp(prefix="dblog-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"demo directory: {work}")
    cluster = PgCluster().start()
    proc: subprocess.Popen[bytes] | None = None
    try:
        dsn = cluster.create_database("app")
        replica = cluster.create_database("replica") if with_sync else None
        with psycopg.connect(dsn, autocommit=True) as conn:
            _schema(conn, rows)
        print(f"PostgreSQL {cluster.port}: app database with {rows} orders, {rows // 4} customers")
        config = _config(work, dsn, replica)
        proc = subprocess.Popen([sys.executable, "-m", "pydblog", "run", "--config", str(config)])
        _wait_started(work, proc)
        n = _workload(dsn, rows)
        print(f"workload: {n} inserts/updates/deletes while the initial snapshot ran")
        events = _wait_caught_up(work, dsn)
        ops: dict[str, int] = {}
        for e in events:
            ops[e["op"]] = ops.get(e["op"], 0) + 1
        print(f"change log: {len(events)} events by op {ops}")
        print("last events (`dblog tail --config", config, "--no-follow`):")
        for e in events[-3:]:
            print("  " + orjson.dumps(e).decode()[:300])
        code = 0
        if with_sync:
            from pydblog.demo_sync import sync_and_verify

            code = sync_and_verify(config, dsn, replica or "", work, TABLES)
        else:
            print("PySpark not installed: skipping `dblog sync` (pip install 'pydblog[spark]')")
        return code
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        cluster.stop()
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
