"""Benchmark: `dblog verify` throughput against reading both sides whole, and the time
of a repair per damaged range.

(a) One throwaway PostgreSQL: a source table of ``--rows`` rows (int key, text,
    numeric, jsonb, timestamptz), a PostgreSQL mirror of it in another database (same
    types: verify's ``sql`` mode) and a Delta mirror (delta-rs: ``rows`` mode). Times,
    alternating rounds: the baseline, ``COPY (SELECT * ...) TO STDOUT`` of the source and
    of the PostgreSQL mirror read whole (what any row-level comparison must at least
    read); verify against the PostgreSQL mirror; verify against the Delta mirror.
    Prints rows/s of each and the ratios to the baseline (same run, same machine).
(b) `dblog run` on a source of ``--repair-rows`` rows, a PostgreSQL mirror applied by the
    sync's own sink (in process, no Spark), ``--ranges`` key ranges damaged (each
    ``--range-rows`` rows deleted from the mirror and one extra row added): times
    `dblog verify --repair` from the signal to every range-end marker logged, and to the
    mirror having applied them; per damaged range.

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/verify.py [--rows 500000]
       [--rounds 3] [--repair-rows 100000] [--ranges 10] [--range-rows 1000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import psycopg

from pydblog.devtools.pgcluster import PgCluster
from pydblog.ports import ColumnSchema, TableSchema

SCHEMA = TableSchema("public", "items", (
    ColumnSchema("id", "integer", "int32", False),
    ColumnSchema("name", "text", "string"),
    ColumnSchema("price", "numeric(12,2)", "decimal"),
    ColumnSchema("doc", "jsonb", "json"),
    ColumnSchema("at", "timestamp with time zone", "timestamptz"),
), ("id",))
DDL = ("CREATE TABLE items (id integer PRIMARY KEY, name text, price numeric(12,2), doc jsonb, "
       "at timestamptz)")
FILL = ("INSERT INTO items SELECT g, 'name ' || g, g * 1.25, jsonb_build_object('g', g, 'tags', "
        "jsonb_build_array('a', g %% 7)), '2024-01-01'::timestamptz + g * interval '1 second' "
        "FROM generate_series(1, %s) g")


def copy_bytes(dsn: str, table: str) -> int:
    n = 0
    with psycopg.connect(dsn) as conn, conn.cursor().copy(f"COPY (SELECT * FROM {table}) TO STDOUT") as cp:
        for block in cp:
            n += len(block)
    return n


def part_a(cluster: PgCluster, rows: int, rounds: int, tmp: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from pydblog.config import SinkConfig
    from pydblog.verifier.run import DeltaRoot, Options, PgMirror, verify_table

    src = cluster.create_database("bench_src")
    dst = cluster.create_database("bench_dst")
    for dsn in (src, dst):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(DDL)
            conn.execute(FILL, (rows,))
            conn.execute("VACUUM ANALYZE items")
    with psycopg.connect(src) as conn:
        data = conn.execute("SELECT id, name, price, doc::text, at FROM items ORDER BY id").fetchall()
    lake = tmp / "lake"
    table = pa.table({
        "id": pa.array([r[0] for r in data], pa.int32()),
        "name": pa.array([r[1] for r in data], pa.string()),
        "price": pa.array([r[2] for r in data], pa.decimal128(12, 2)),
        "doc": pa.array([r[3] for r in data], pa.string()),
        "at": pa.array([r[4] for r in data], pa.timestamp("us", tz="UTC")),
    })
    write_deltalake(str(lake / "public" / "items"), table)
    del data, table
    pg = PgMirror(SinkConfig(type="postgres", dsn=dst), "postgres")
    delta = DeltaRoot(SinkConfig(type="delta", path=str(lake)), "delta")
    opts = Options(chunk_size=10_000)
    times: dict[str, list[float]] = {"copy both": [], "verify postgres (sql)": [], "verify delta (rows)": []}
    src_conn = psycopg.connect(src, autocommit=True, options="-c TimeZone=UTC")
    try:
        for r in range(rounds):
            t0 = time.monotonic()
            copy_bytes(src, "items")
            copy_bytes(dst, "items")
            times["copy both"].append(time.monotonic() - t0)
            for name, mirror in (("verify postgres (sql)", pg), ("verify delta (rows)", delta)):
                t0 = time.monotonic()
                res = verify_table(SCHEMA, src_conn, mirror, None, opts, lambda _n: None)  # type: ignore[arg-type]
                times[name].append(time.monotonic() - t0)
                assert res.ok and res.source_rows == rows, res.to_json()
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    finally:
        src_conn.close()
        pg.close()
    base = statistics.median(times["copy both"])
    print(f"\n(a) {rows} rows, median of {rounds} rounds")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"  {k:<24} {m:7.2f} s  {rows / m:>10,.0f} rows/s  {m / base:5.2f} x copy")


def part_b(cluster: PgCluster, rows: int, ranges: int, range_rows: int, tmp: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.helpers import DBLOG, start_run, stop_run, wait_for_marker, write_config
    from tests.integration.test_verify import MiniSync, SyncThread

    src = cluster.create_database("bench_rsrc")
    dst = cluster.create_database("bench_rdst")
    with psycopg.connect(src, autocommit=True) as conn:
        conn.execute(DDL)
    config = write_config(tmp / "b", src, extra=f"""
[[sync.sinks]]
type = "postgres"
dsn = "{dst}"
schema = "mirror"
""")
    proc = start_run(config)
    try:
        with psycopg.connect(src, autocommit=True) as conn:
            conn.execute(FILL, (rows,))
        wait_for_marker(config, src, timeout=600)
        sync = MiniSync(config)
        sync.catch_up()
        step = rows // ranges
        with psycopg.connect(dst, autocommit=True) as conn:
            for i in range(ranges):
                lo = i * step
                conn.execute("DELETE FROM mirror.items WHERE id > %s AND id <= %s", (lo, lo + range_rows))
                conn.execute("INSERT INTO mirror.items (id, name) VALUES (%s, 'extra')", (-(i + 1) * 7,))
        running = SyncThread(sync)
        try:
            t0 = time.monotonic()
            res = subprocess.run(
                [*DBLOG, "verify", "--config", str(config), "--json", "--chunk-size", str(range_rows),
                 r"public\.items", "--repair"], capture_output=True, text=True, timeout=1800)
            total = time.monotonic() - t0
        finally:
            running.close()
        out = orjson.loads(res.stdout)
        before = out["before"]["seconds"]
        after = out["after"]["seconds"] if out.get("after") else float("nan")
        n = sum(len(t["differing"]) for t in out["before"]["tables"])
        repair = total - before - after
        print(f"\n(b) {rows} rows, {ranges} damaged ranges of {range_rows} rows (+1 extra row each): "
              f"{n} differing ranges found in {before:.1f} s; repair (signal -> markers -> "
              f"mirror applied) {repair:.1f} s = {repair / max(n, 1):.2f} s per range; "
              f"verify after {after:.1f} s; exit {res.returncode}")
        sync.close()
    finally:
        stop_run(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repair-rows", type=int, default=100_000)
    ap.add_argument("--ranges", type=int, default=10)
    ap.add_argument("--range-rows", type=int, default=1000)
    ap.add_argument("--skip-a", action="store_true")
    ap.add_argument("--skip-b", action="store_true")
    args = ap.parse_args()
    cluster = PgCluster().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if not args.skip_a:
                part_a(cluster, args.rows, args.rounds, Path(tmp))
            if not args.skip_b:
                part_b(cluster, args.repair_rows, args.ranges, args.range_rows, Path(tmp))
    finally:
        cluster.stop()


if __name__ == "__main__":
    threading.excepthook = lambda a: print(a, file=sys.stderr)
    main()
