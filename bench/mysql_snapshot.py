"""Benchmark: MySQL/MariaDB incremental snapshots, read-only (GTID fences) vs the watermark
table, against a raw SELECT, in one run on one throwaway server.

1. baselines: ``SELECT * FROM t`` read by the C client (``mariadb --quick`` into
   /dev/null, over TLS as pydblog reads; the ratios' baseline), and streamed to PyMySQL
   (unbuffered cursor, rows as tuples, nothing else: "raw");
2. for each variant (``[snapshot] watermark = "table"`` and ``"read-only"``, each at
   every ``--parallelism`` (chunks read at once, each on its own connection), in turns,
   ``--repeat`` times): a fresh ``dblog run`` with ``snapshot.mode = "initial"`` over the
   table, optionally with a background writer (``--updates`` per second on the same
   table); rows/s from its first to its last snapshot row in the durable change log, and
   the CPU per row of ``dblog run`` and of the server.

Usage: ``flock /tmp/pydblog-bench.lock .venv/bin/python bench/mysql_snapshot.py
[--rows 1000000] [--server mariadb|mysql57] [--updates 1000] [--repeat 2]
[--parallelism 1 2 4]`` (results: bench/results/, docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pymysql.cursors

import results
from pydblog.changelog.sqlite import SqliteChangeLogReader, log_path
from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.devtools.proc import cpu_seconds

DB = "bench"
TABLE = (
    "CREATE TABLE t (id INT PRIMARY KEY, a INT NOT NULL, b VARCHAR(40), c DOUBLE, "
    "d DATETIME(6), e DECIMAL(12,2))"
)


def load(server: TestServer, rows: int, batch: int = 20_000) -> None:
    conn = server.connect(DB)
    with conn.cursor() as cur:
        for lo in range(0, rows, batch):
            values = ",".join(
                f"({i}, {i % 1000}, 'row-{i}', {i / 7}, '2026-01-01 00:00:00.{i % 999999:06d}', "
                f"{i / 100:.2f})"
                for i in range(lo, min(rows, lo + batch))
            )
            cur.execute(f"INSERT INTO t VALUES {values}")
    conn.close()


def server_pid(server: TestServer) -> int:
    return int((server.root / "mysqld.pid").read_text().strip())


def raw_rate(server: TestServer, rows: int) -> float:
    conn = server.connect(DB)
    try:
        with conn.cursor(pymysql.cursors.SSCursor) as cur:
            t0 = time.perf_counter()
            cur.execute("SELECT * FROM t")
            n = sum(1 for _ in cur)
            elapsed = time.perf_counter() - t0
    finally:
        conn.close()
    assert n == rows, n
    return n / elapsed


def client_rate(server: TestServer, rows: int) -> float:
    """The C client (``mariadb``, libmariadb) reading ``SELECT * FROM t`` row by row
    (``--quick``) into /dev/null over TLS, as pydblog's connections read (TLS when the
    server offers it): the baseline a user would pick instead."""
    from pydblog.devtools.mariadb import PASSWORD, SUPERUSER

    cmd = ["mariadb", "--quick", "--batch", "--skip-column-names", "--ssl",
           "-h", "127.0.0.1", "-P", str(server.port), "-u", SUPERUSER, f"-p{PASSWORD}", DB,
           "-e", "SELECT * FROM t"]
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(cmd, check=True, stdout=sink)
    return rows / (time.perf_counter() - t0)


def updater(server: TestServer, rows: int, per_s: int, stop: threading.Event) -> None:
    if per_s <= 0:
        return
    conn = server.connect(DB)
    rng = random.Random(7)
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                t0 = time.perf_counter()
                for _ in range(max(1, per_s // 100)):
                    cur.execute(f"UPDATE t SET a = a + 1 WHERE id = {rng.randrange(rows)}")
                time.sleep(max(0.0, 0.01 - (time.perf_counter() - t0)))
    finally:
        conn.close()


def snapshot(
    server: TestServer, work: Path, watermark: str, rows: int, updates: int, parallelism: int
) -> dict[str, Any]:
    data = work / f"data-{watermark}-{time.monotonic_ns()}"
    config = work / "dblog.toml"
    config.write_text(
        f'[source]\ntype = "mysql"\ndsn = "{server.dsn(DB)}"\nserver_id = 9004\n'
        f'tables = ["{DB}\\\\.t"]\n[log]\npath = "{data}"\n'
        f'[api]\nlisten = "127.0.0.1:0"\n'
        f'[snapshot]\nmode = "initial"\nwatermark = "{watermark}"\nparallelism = {parallelism}\n'
    )
    stop = threading.Event()
    writer = threading.Thread(target=updater, args=(server, rows, updates, stop))
    writer.start()
    spid = server_pid(server)
    s0 = cpu_seconds(spid)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pydblog", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    first: float | None = None
    count, at = 0, 0
    reader: SqliteChangeLogReader | None = None
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(proc.communicate()[1].decode()[-3000:])
            if reader is None and log_path(data).exists():
                reader = SqliteChangeLogReader(data)
            done = False
            if reader is not None:
                for rec in reader.read(at, 100_000):
                    at = rec.offset + 1
                    if rec.op == "r":
                        count += 1
                        if first is None:
                            first = time.perf_counter()
                    elif rec.op == "n" and b'"COMPLETED"' in rec.body:
                        done = True
            if done:
                break
            time.sleep(0.05)
        elapsed = time.perf_counter() - (first or time.perf_counter())
        cpu = cpu_seconds(proc.pid)
        server_cpu = cpu_seconds(spid) - s0
    finally:
        stop.set()
        writer.join()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        if reader is not None:
            reader.close()
    # Keys updated inside a chunk's window reach the log as the update, not as a row.
    assert count >= rows * 0.9, (count, rows)
    return {"rows_s": count / elapsed, "dblog_us": cpu / count * 1e6,
            "server_us": server_cpu / count * 1e6, "s": elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--server", choices=["mariadb", "mysql57"], default="mariadb")
    ap.add_argument("--updates", type=int, default=0, help="background updates per second")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--parallelism", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    factory = MariaDB if args.server == "mariadb" else MySQL57
    with tempfile.TemporaryDirectory(prefix="dblog-bench-") as tmp, factory() as server:
        server.execute(f"CREATE DATABASE {DB}")
        server.execute(TABLE, DB)
        load(server, args.rows)
        raw = raw_rate(server, args.rows)
        client = max(client_rate(server, args.rows) for _ in range(2))
        print(f"{args.server}: {args.rows:,} rows; raw SELECT * streamed: {raw:,.0f} rows/s "
              f"(PyMySQL), {client:,.0f} rows/s (the C client into /dev/null, best of 2)")
        variants = [(w, p) for p in args.parallelism for w in ("table", "read-only")]
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {v: [] for v in variants}
        for _ in range(args.repeat):
            for watermark, par in variants:
                r = snapshot(server, Path(tmp), watermark, args.rows, args.updates, par)
                runs[(watermark, par)].append(r)
                print(
                    f"  {watermark:9s} p{par}: {r['rows_s']:,.0f} rows/s ({r['rows_s'] / client:.2f} x "
                    f"the C client, {r['rows_s'] / raw:.2f} x raw) "
                    f"in {r['s']:.1f}s; CPU per row: dblog run {r['dblog_us']:.1f} us, "
                    f"server {r['server_us']:.1f} us; load {os.getloadavg()[0]:.1f}", flush=True,
                )
        best = {v: max(r["rows_s"] for r in rs) for v, rs in runs.items()}
        base = best[("table", args.parallelism[0])]
        for par in args.parallelism:
            t, ro = best[("table", par)], best[("read-only", par)]
            print(f"best p{par}: table {t:,.0f} ({t / base:.2f} x table p{args.parallelism[0]}, "
                  f"{t / client:.2f} x the C client), read-only {ro:,.0f} rows/s "
                  f"({ro / client:.2f} x the C client): "
                  f"read-only = {ro / t:.2f} x the watermark table")
        print(f"load average after: {os.getloadavg()}")
    results.write("mysql_snapshot", {
        "server": args.server, "rows": args.rows, "updates_per_s": args.updates,
        "raw_select_rows_per_s": round(raw), "c_client_rows_per_s": round(client),
        "runs": {f"{w} p{p}": rs for (w, p), rs in runs.items()},
        "best_rows_per_s": {f"{w} p{p}": round(b) for (w, p), b in best.items()},
        "read_only_over_table": {f"p{p}": round(best[("read-only", p)] / best[("table", p)], 3)
                                 for p in args.parallelism},
    })


if __name__ == "__main__":
    main()
