"""Benchmark: what fencing costs a MySQL/MariaDB blocking snapshot's reads.

Blocking reads are fenced on MySQL/MariaDB (``MySqlSnapshotReader.fences_blocking_reads``,
docs/snapshots.md "Fenced blocking reads"): each chunk is read by ``read_chunk_fenced``
(the GTID fence's reads and a consistent-snapshot transaction) instead of
``read_chunk`` (one ``START TRANSACTION READ ONLY``). This reads a whole table both ways
with the same reader, chunk by chunk as a blocking snapshot does, each chunk both ways
one right after the other (so both see the same machine load: this machine's load
swings by 2 x within seconds), at each ``--chunk`` size, ``--repeat`` times, and prints
rows/s of each, the ratio, and the median extra time of a fenced chunk. The stream is
paused during a blocking snapshot, so the core's part (judging an empty window) is
left out.

Usage: ``flock /tmp/pydblog-bench.lock .venv/bin/python bench/mysql_blocking_fence.py
[--rows 200000] [--server mariadb|mysql57] [--chunk 1024 8192] [--repeat 2]``
(results: bench/results/, docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import results
from pydblog.config import parse_config
from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.mysql57 import MySQL57
from pydblog.sources.mysql.chunks import MySqlSnapshotReader
from pydblog.sources.mysql.factory import create

sys.path.insert(0, os.path.dirname(__file__))
from mysql_snapshot import DB, TABLE, load  # the same table and load


def read_both(reader: MySqlSnapshotReader, chunk: int) -> tuple[int, list[float], list[float]]:
    """The whole table in chunks of ``chunk`` rows, each chunk read both ways, one right
    after the other (their order alternating), so both see the same load: (rows, each
    unfenced chunk's seconds, each fenced chunk's seconds)."""
    info = reader.table_info(f"{DB}.t")
    assert info is not None
    top = reader.max_key(info, None)
    assert top is not None
    after: tuple[Any, ...] | None = None
    n = 0
    plain: list[float] = []
    fenced: list[float] = []
    while True:
        got: list[Any] = []
        for fence in ((False, True) if len(plain) % 2 == 0 else (True, False)):
            t0 = time.perf_counter()
            if fence:
                rows, _ = reader.read_chunk_fenced(info, after, top, chunk, None)
            else:
                rows = reader.read_chunk(info, after, top, chunk, None)
            (fenced if fence else plain).append(time.perf_counter() - t0)
            got.append(rows)
        assert len(got[0]) == len(got[1])
        rows = got[0]
        n += len(rows)
        if len(rows) < chunk:
            return n, plain, fenced
        last = rows[-1]
        after = (last["id"] if isinstance(last, dict) else last[0][0],)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--server", choices=["mariadb", "mysql57"], default="mariadb")
    ap.add_argument("--chunk", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    factory = MariaDB if args.server == "mariadb" else MySQL57
    with factory() as server:
        server.execute(f"CREATE DATABASE {DB}")
        server.execute(TABLE, DB)
        load(server, args.rows)
        cfg = parse_config({"source": {"type": "mysql", "dsn": server.dsn(DB), "server_id": 9005}})
        _, reader = create(cfg)
        assert isinstance(reader, MySqlSnapshotReader)
        figures: list[dict[str, float]] = []
        try:
            assert reader.fences_blocking_reads()
            for _ in range(args.repeat):
                for chunk in args.chunk:
                    n, plain, fenced = read_both(reader, chunk)
                    assert n == args.rows, n
                    extra_ms = statistics.median(f - p for f, p in zip(fenced, plain, strict=True))
                    print(f"  chunk {chunk:6d} ({len(plain)} chunks): unfenced "
                          f"{n / sum(plain):,.0f} rows/s, fenced {n / sum(fenced):,.0f} rows/s: "
                          f"fenced = {sum(plain) / sum(fenced):.3f} x unfenced; median extra "
                          f"per chunk {extra_ms * 1000:.2f} ms; load {os.getloadavg()[0]:.1f}",
                          flush=True)
                    figures.append({
                        "chunk": chunk, "unfenced_rows_per_s": round(n / sum(plain)),
                        "fenced_rows_per_s": round(n / sum(fenced)),
                        "fenced_over_unfenced": round(sum(plain) / sum(fenced), 3),
                        "median_extra_ms_per_chunk": round(extra_ms * 1000, 2),
                    })
        finally:
            reader.close()
    print(f"load average after: {os.getloadavg()}")
    results.write("mysql_blocking_fence", {"server": args.server, "rows": args.rows,
                                           "runs": figures})


if __name__ == "__main__":
    main()
