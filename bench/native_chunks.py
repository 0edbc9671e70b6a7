"""Benchmark: a chunk read by the SQL fast path vs by the native encoder.

Against one throwaway PostgreSQL with a table shaped like bench/snapshot.py's (``id
bigint PRIMARY KEY, a int, b text, c numeric(12,2), d timestamptz, n int``; every 97th
row with a quote, a backslash, a newline, U+0001 and ``ü`` in ``b`` and NULL ``c``,
``d``), every key range of ``--chunk`` rows read, in one run:

 (b)  ``COPY (SELECT * FROM big) TO STDOUT`` received as raw bytes (the baseline);
 (b2) ``COPY (SELECT * FROM big WHERE id >= lo AND id <= hi) TO STDOUT`` per range;
 (a)  ``PgSnapshotReader.read_chunk`` by the SQL fast path (PostgreSQL writes every
      row's JSON and joins the chunk), one connection, no sub-reads;
 (n)  ``read_chunk`` by the native encoder (``sources.postgres.native``: ``COPY (SELECT
      columns ... ORDER BY id) TO STDOUT`` received and encoded in C without the GIL);
      every chunk compared byte for byte with (a)'s;
 (n0) the encoder alone on each range's COPY text already in memory (client CPU of
      the encoding without the receiving).

For each: rows/s (ratio to (b) in the same run), the client process's CPU per row
(``time.process_time``: every thread of this process) and the PostgreSQL cluster's CPU
per row (``/proc``, every backend; nothing else runs against the cluster).

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/native_chunks.py [--rows 1000000]
           [--chunk 65536] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import psycopg

import results
from pydblog.config import Config
from pydblog.devtools.pgcluster import PgCluster
from pydblog.events import EncodedChunk
from pydblog.sources.postgres import native
from pydblog.sources.postgres.chunks import PgSnapshotReader

sys.path.insert(0, str(Path(__file__).parent))
import arrow_chunks as cluster_cpu  # bench/arrow_chunks.py: the cluster CPU and measure helpers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=65536)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    rows, size = args.rows, args.chunk
    ranges = [(lo, min(lo + size, rows) - 1) for lo in range(0, rows, size)]
    enc = native.encoder()
    if enc is None:
        raise SystemExit("the native encoder is not built (pip install -e . with a C compiler)")
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    with PgCluster() as cluster:
        dsn = cluster.create_database("bench")
        cluster_cpu.SERVER_PID = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE big (id bigint PRIMARY KEY, a int, b text, c numeric(12,2), "
                "d timestamptz, n int)"
            )
            conn.execute(
                "INSERT INTO big SELECT g, g %% 1000, 'text-' || g, g * 1.5, "
                "now() + g * interval '1.5 ms', 0 FROM generate_series(0, %s) g",
                (rows - 1,),
            )
            conn.execute("UPDATE big SET b = E'q\"\\\\\\n\\x01ü', c = NULL, d = NULL WHERE id % 97 = 0")
            conn.execute("VACUUM ANALYZE big")
            conn.execute("CHECKPOINT")
        os.sync()
        print(f"loaded {rows:,} rows, {len(ranges)} ranges of {size:,}", flush=True)

        cfg = Config.model_validate({"source": {"dsn": dsn}, "log": {"path": "/nonexistent"}})
        reader = PgSnapshotReader(cfg, cluster_cpu._Source(), split=False)  # type: ignore[arg-type]
        info = reader.table_info("public.big")
        assert info is not None
        expected: list[tuple[str, str]] = []

        def read(use_native: bool) -> int:
            reader.native = use_native
            n = 0
            for i, (lo, hi) in enumerate(ranges):
                chunk = reader.read_chunk(info, (lo - 1,), (hi,), size, None)
                assert isinstance(chunk, EncodedChunk)
                got = (chunk.keys, chunk.tails)
                if not use_native:
                    expected.append(got)
                elif got != expected[i]:
                    raise SystemExit(f"native chunk {lo}..{hi} differs from the SQL path's")
                n += chunk.size
            return n

        def copy_all() -> int:
            n = 0
            with psycopg.connect(dsn) as conn, conn.cursor() as cur, \
                    cur.copy("COPY (SELECT * FROM big) TO STDOUT") as copy:
                for _ in copy:
                    n += 1
            return n

        texts: list[bytes] = []

        def copy_ranges() -> int:
            n = 0
            texts.clear()
            with psycopg.connect(dsn) as conn, conn.cursor() as cur:
                for lo, hi in ranges:
                    q = f"COPY (SELECT * FROM big WHERE id >= {lo} AND id <= {hi} ORDER BY id) TO STDOUT"
                    parts = []
                    with cur.copy(q) as copy:
                        for data in copy:
                            parts.append(bytes(data))
                            n += 1
                    texts.append(b"".join(parts))
            return n

        spec = reader._plan(info).native_spec
        assert spec is not None

        def encode_only() -> int:
            n = 0
            for text in texts:
                count, _, _ = enc.encode(text, spec.types, spec.keys, spec.tail)
                n += count
            return n

        for _ in range(args.repeat):
            base = cluster_cpu.measure("(b) raw COPY, whole table", rows, copy_all, None)
            cluster_cpu.measure("(b2) raw COPY per key range (ORDER BY id)", rows, copy_ranges, base)
            expected.clear()
            cluster_cpu.measure("(a) read_chunk, SQL fast path (server JSON)", rows, lambda: read(False), base)
            cluster_cpu.measure("(n) read_chunk, native encoder (checked byte-equal to (a))", rows,
                    lambda: read(True), base)
            cluster_cpu.measure("(n0) the encoder alone, COPY text in memory", rows, encode_only, base)
        reader.close()
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    results.write("native_chunks", {"rows": rows, "chunk": size,
                                    "measurements": cluster_cpu.MEASURED})


if __name__ == "__main__":
    main()
