"""Benchmark: what the PostgreSQL chunk reader pays to guarantee its rows' key order.

Before PostgreSQL 16 the fast path's aggregates (``string_agg`` over the sorted chunk
subquery) are not promised to take their input in order, and an ``ORDER BY`` inside
them sorts again. This reads a whole table in 65,536-row chunks through
``PgSnapshotReader.read_chunk`` three ways, alternating, in one run:

- ``unchecked``: plain aggregates, order trusted (the reader before the check; the
  baseline the others are given as ratios of);
- ``checked``: the reader's default before 16 (``_in_key_order``: an integer key's
  values checked by the client; any other key by ``row_number()`` ordinals);
- ``ordered``: ``ORDER BY`` inside the aggregates (16+'s default; a sort before 16).

for a table with a ``bigint`` primary key and one with a ``text`` primary key.

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/chunk_order.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import psycopg

import results
from pydblog.config import Config
from pydblog.devtools.pgcluster import PgCluster
from pydblog.sources.postgres.chunks import PgSnapshotReader

CHUNK = 65_536


class _Source:
    captured_tables: tuple[str, ...] = ()


def scan(reader: PgSnapshotReader, table: str, variant: str) -> float:
    """Seconds to read the whole table in chunks the ``variant`` way."""
    info = reader.table_info(table)
    assert info is not None
    reader.ordered_agg = variant == "ordered"
    reader._plans.clear()
    plan = reader._plan(info)
    if variant == "unchecked":
        (key,) = [k for k, v in reader._plans.items() if v is plan]
        reader._plans[key] = dataclasses.replace(plan, check="")
    top = reader.max_key(info, None)
    assert top is not None
    after = None
    t0 = time.perf_counter()
    while True:
        rows = reader.read_chunk(info, after, top, CHUNK, None)
        if len(rows) < CHUNK:
            return time.perf_counter() - t0
        after = rows[-1].chunk_key


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with PgCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name, key in (("big", "g::bigint"), ("bigt", "md5(g::text)")):
                key_type = "bigint" if name == "big" else "text"
                conn.execute(
                    f"CREATE TABLE {name} (id {key_type} PRIMARY KEY, a int, b text, "
                    "c numeric(12,2), d timestamptz, n int)"
                )
                conn.execute(
                    f"INSERT INTO {name} SELECT {key}, g % 1000, md5(g::text), g / 100.0, "
                    f"now() - g * interval '1 s', 0 FROM generate_series(1, {args.rows}) g"
                )
                conn.execute(f"VACUUM ANALYZE {name}")
        cfg = Config.model_validate({"source": {"dsn": dsn}, "log": {"path": str(Path(tmp) / "log")},
                                     "snapshot": {"parallelism": 1}})
        reader = PgSnapshotReader(cfg, _Source())  # type: ignore[arg-type]
        variants = ("unchecked", "checked", "ordered")
        figures: dict[str, dict[str, list[float]]] = {}
        try:
            for table in ("public.big", "public.bigt"):
                times: dict[str, list[float]] = {v: [] for v in variants}
                figures[table] = times
                scan(reader, table, "unchecked")  # warm the cache
                for _ in range(args.repeats):
                    for v in variants:
                        times[v].append(scan(reader, table, v))
                base = statistics.median(times["unchecked"])
                for v in variants:
                    med = statistics.median(times[v])
                    print(f"{table:12s} {v:10s} median {med:.3f} s  min {min(times[v]):.3f} s  "
                          f"{args.rows / med:,.0f} rows/s  {med / base:.3f} x unchecked")
        finally:
            reader.close()
    results.write("chunk_order", {
        "rows": args.rows,
        "scan_seconds": figures,
        "median_x_unchecked": {
            t: {v: round(statistics.median(ts[v]) / statistics.median(ts["unchecked"]), 3)
                for v in ts}
            for t, ts in figures.items()
        },
    })


if __name__ == "__main__":
    main()
