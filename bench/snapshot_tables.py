"""Benchmark: an incremental snapshot of many small tables, parallelism 1 vs the default.

In one run, against one throwaway PostgreSQL with --tables tables of --rows rows each:
 (a) `COPY (SELECT * FROM t_i) TO STDOUT` of every table in turn, received as raw bytes
     (what pg_dump pays): rows/s, the baseline;
 (b) for each variant (default: `parallelism = 1` and the default configuration), the
     snapshot of every table (one execute-snapshot signal) into the durable change log
     by a real `dblog run`: rows/s from the first snapshot row to COMPLETED, as a ratio
     of (a), with `dblog run`'s and PostgreSQL's CPU per row, and how many tables were
     being read at once at most (from the TABLE_SCAN_STARTED/COMPLETED notifications).

No write load: this measures what concurrent windows across tables give (the tail of
each table no longer leaves the pool idle). Usage:

    flock /tmp/pydblog-bench.lock .venv/bin/python bench/snapshot_tables.py \
        [--tables 50] [--rows 20000] [--variant 'name:k = v; k = v' ...] [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psycopg

import results
from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.proc import cpu_seconds
from pydblog.events import decode_envelope

sys.path.insert(0, str(Path(__file__).parent))
import snapshot as base  # bench/snapshot.py: the cluster CPU helpers

VARIANTS = {"p1": "parallelism = 1", "default": ""}


def copy_all(dsn: str, tables: int, rows: int) -> float:
    """Rows/s of COPY TO STDOUT of every table in turn, as raw bytes."""
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        t0 = time.perf_counter()
        n = 0
        for i in range(tables):
            with cur.copy(f"COPY (SELECT * FROM t{i}) TO STDOUT") as copy:
                for _ in copy:
                    n += 1
        elapsed = time.perf_counter() - t0
    assert n == tables * rows, n
    return n / elapsed


def run_variant(dsn: str, work: Path, label: str, extra: str, total: int,
                copy: float) -> dict[str, float]:
    name = re.sub(r"[^a-z0-9_]", "_", label.lower())
    data = work / f"{name}-data"
    config = work / f"{name}.toml"
    config.write_text(
        f'[source]\ndsn = "{dsn}"\ntables = ["public\\\\.t[0-9]+"]\nslot = "{name}"\n'
        f'publication = "{name}"\n[log]\npath = "{data}"\n[snapshot]\n{extra}\n'
    )
    proc = subprocess.Popen([sys.executable, "-m", "pydblog", "run", "--config", str(config)],
                            stderr=subprocess.PIPE)
    while not (data / "changelog.sqlite").exists():
        if proc.poll() is not None:
            raise SystemExit(f"dblog run ({label}) exited: {proc.stderr.read().decode()[-2000:]}"
                             if proc.stderr else "dblog run exited")
        time.sleep(0.1)
    reader = SqliteChangeLogReader(data)
    while reader.last_checkpoint() is None:
        time.sleep(0.1)
    cpu0, server0 = cpu_seconds(proc.pid), base.server_cpu()
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dblog_signal VALUES (%s, 'execute-snapshot', %s)",
            (f"bench-{label}", orjson.dumps({"data-collections": ["public\\.t[0-9]+"]}).decode()),
        )
    offset, first, done, snap = 0, None, False, 0
    open_, most = set(), 0
    while not done:
        records = list(reader.read(offset, 100_000))
        for r in records:
            e = decode_envelope(r.offset, r.body)
            offset = r.offset + 1
            if e["op"] == "r":
                snap += 1
                first = first or time.perf_counter()
            elif e["op"] == "n":
                typ = e["notification"]["type"]
                table = e["source"]["table"]
                if typ == "TABLE_SCAN_STARTED":
                    open_.add(table)
                    most = max(most, len(open_))
                elif typ == "TABLE_SCAN_COMPLETED":
                    open_.discard(table)
                done = done or typ == "COMPLETED"
        if not records:
            time.sleep(0.01)
    end = time.perf_counter()
    cpu = cpu_seconds(proc.pid) - cpu0
    server = base.server_cpu_since(server0)
    proc.terminate()
    proc.wait()
    elapsed = end - (first or t0)
    assert snap == total, (snap, total)
    print(
        f"(b) {label}: {snap:,} rows in {end - t0:.2f} s from the signal "
        f"({snap / elapsed:,.0f} rows/s from the first row = {snap / elapsed / copy:.2f} x (a)); "
        f"dblog run CPU {cpu * 1e6 / snap:.1f} us/row, PostgreSQL CPU {server * 1e6 / snap:.1f} "
        f"us/row; at most {most} tables being read at once"
    )
    shutil.rmtree(data, ignore_errors=True)
    return {
        "seconds_from_signal": round(end - t0, 2), "rows_per_s": round(snap / elapsed),
        "x_raw_copy": round(snap / elapsed / copy, 3),
        "dblog_run_cpu_us_per_row": round(cpu * 1e6 / snap, 2),
        "postgres_cpu_us_per_row": round(server * 1e6 / snap, 2),
        "most_tables_at_once": most,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=50)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--only", action="append")
    ap.add_argument("--variant", action="append", default=[])
    args = ap.parse_args()
    variants = dict(VARIANTS)
    for spec in args.variant:
        label, _, settings = spec.partition(":")
        variants[label.strip()] = settings.replace(";", "\n")
    work = Path(tempfile.mkdtemp(prefix="dblog-tablesbench-"))
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    with PgCluster() as cluster:
        dsn = cluster.create_database("bench")
        base.SERVER_PID = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(args.tables):
                conn.execute(
                    f"CREATE TABLE t{i} (id bigint PRIMARY KEY, a int, b text, "
                    "c numeric(12,2), d timestamptz, n int)"
                )
                conn.execute(
                    f"INSERT INTO t{i} SELECT g, g % 1000, 'text-' || g, g * 1.5, now(), 0 "
                    f"FROM generate_series(0, {args.rows - 1}) g"
                )
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
        os.sync()
        total = args.tables * args.rows
        copy = copy_all(dsn, args.tables, args.rows)
        print(f"(a) COPY TO STDOUT of {args.tables} tables x {args.rows:,} rows as raw bytes: "
              f"{copy:,.0f} rows/s")
        measured = {label: run_variant(dsn, work, label, extra, total, copy)
                    for label, extra in variants.items() if not args.only or label in args.only}
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    shutil.rmtree(work, ignore_errors=True)
    results.write("snapshot_tables", {
        "tables": args.tables, "rows_per_table": args.rows,
        "variants": {label: variants[label].strip() for label in measured},
        "a_raw_copy_rows_per_s": round(copy), "b": measured,
    })


if __name__ == "__main__":
    main()
