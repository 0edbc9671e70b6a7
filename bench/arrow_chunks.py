"""Benchmark: one chunk's rows read the current way vs through Arrow (ADBC, connectorx).

Against one throwaway PostgreSQL with a table shaped like bench/snapshot.py's (``id
bigint PRIMARY KEY, a int, b text, c numeric(12,2), d timestamptz, n int``), every key
range of ``--chunk`` rows read, in one run:

 (a) ``PgSnapshotReader.read_chunk`` (PostgreSQL writes each row's JSON: the fast path),
     one connection, no sub-reads;
 (b) ``COPY (SELECT * FROM big) TO STDOUT`` received as raw bytes (the baseline);
 (b2) ``COPY (SELECT * FROM big WHERE id > lo AND id <= hi) TO STDOUT`` per range;
 (c) ADBC (``adbc-driver-postgresql``: libpq COPY BINARY -> Arrow in C++)
     ``fetch_arrow_table()`` of ``SELECT * FROM big WHERE id > lo AND id <= hi ORDER BY
     id``, then the chunk's texts built by polars expressions (the tails and keys exactly
     as the fast path's ``EncodedChunk``: compared byte for byte, every chunk);
 (c0) the ADBC fetch alone (no JSON);
 (c1), (c2) as (c0), (c) with the numeric column selected as ``c::text`` (ADBC's own
     binary numeric decoding costs the client ~0.6 us/row);
 (d) connectorx ``read_sql(..., return_type="arrow")`` of the same query, fetch alone.

For each: rows/s (ratio to (b) in the same run), the client process's CPU per row
(``time.process_time``: every thread of this process) and the PostgreSQL cluster's CPU
per row (``/proc``, every backend; nothing else runs against the cluster).

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/arrow_chunks.py [--rows 1000000]
           [--chunk 65536] [--types]

``--types`` runs only a byte-equality probe of more types with edge values (int2,
bool, varchar, date, timestamp, uuid, jsonb, numeric as ``::text``; NULLs, unicode,
control characters, NaN/Infinity, years 1 and 9999) through ADBC + polars against the
fast path.
Needs ``adbc-driver-postgresql``, ``polars`` (and ``connectorx`` for (d)): not dependencies
of pydblog.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

import results
from pydblog.config import Config
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.proc import cpu_seconds
from pydblog.events import TAIL_SEP, EncodedChunk
from pydblog.sources.postgres.chunks import PgSnapshotReader

SERVER_PID = 0
NUMERIC_AS_TEXT = "id, a, b, c::text AS c, d, n"
"""ADBC converts binary numerics to text itself at ~0.6 us/row of client CPU; the
server's numeric_out (which COPY pays too) is much cheaper."""


def server_cpu() -> float:
    """CPU used so far by the throwaway cluster: the postmaster and its children (live
    and ended)."""
    # the postmaster's own CPU and that of its children it reaped (backends that ended)
    fields = Path(f"/proc/{SERVER_PID}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == SERVER_PID:
            total += cpu_seconds(int(stat.parent.name))
    return total


class _Source:
    captured_tables: tuple[str, ...] = ()


MEASURED: dict[str, list[dict[str, float]]] = {}
"""Every measurement of the run by label, for ``results.write``."""


def measure(label: str, rows: int, run: Callable[[], int], base: float | None) -> float:
    t0, c0, s0 = time.perf_counter(), time.process_time(), server_cpu()
    n = run()
    time.sleep(0.3)  # a closed connection's backend exits and is reaped
    elapsed, cpu, server = time.perf_counter() - t0 - 0.3, time.process_time() - c0, server_cpu() - s0
    assert n == rows, (label, n)
    rate = rows / elapsed
    ratio = f" = {rate / base:.2f} x (b)" if base else ""
    print(f"{label}: {rate:,.0f} rows/s{ratio} (client CPU {cpu * 1e6 / rows:.2f} us/row, "
          f"PostgreSQL CPU {server * 1e6 / rows:.2f} us/row)", flush=True)
    MEASURED.setdefault(label, []).append({
        "rows_per_s": round(rate), "x_raw_copy": round(rate / base, 3) if base else 1.0,
        "client_cpu_us_per_row": round(cpu * 1e6 / rows, 2),
        "postgres_cpu_us_per_row": round(server * 1e6 / rows, 2),
    })
    return rate


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
            "\t": "\\t"}
_ESCAPES.update({chr(i): f"\\u{i:04x}" for i in range(1, 0x20) if chr(i) not in _ESCAPES})


def polars_tails(table: Any) -> tuple[int, str, str]:
    """The chunk's (count, keys, tails) texts built from the Arrow table by polars,
    for this benchmark's table (bigint key; int, text, numeric, timestamptz, int)."""
    pl = importlib.import_module("polars")
    pa = importlib.import_module("pyarrow")
    cols = []
    for col in table.columns:
        arr = col.combine_chunks()
        if isinstance(arr, pa.ExtensionArray):
            arr = arr.storage
        cols.append(pa.chunked_array([arr]) if not isinstance(arr, pa.ChunkedArray) else arr)
    df = pl.from_arrow(pa.table(cols, names=table.column_names))
    c = pl.col
    d = c("d")
    exprs = {
        "id": c("id").cast(pl.String),
        "a": c("a").cast(pl.String),
        "b": pl.concat_str([pl.lit('"'), c("b").str.replace_many(
            list(_ESCAPES), list(_ESCAPES.values())), pl.lit('"')]),
        "c": pl.concat_str([pl.lit('"'), c("c").replace(
            {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}), pl.lit('"')]),
        "d": pl.concat_str([pl.lit('"'), d.dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").str.replace(
            ".000000Z", "Z", literal=True), pl.lit('"')]),
        "n": c("n").cast(pl.String),
    }
    parts: list[Any] = [pl.lit('{"id":'), exprs["id"], pl.lit("}" + TAIL_SEP)]
    for i, name in enumerate(table.column_names):
        parts.append(pl.lit(("{" if i == 0 else ",") + f'"{name}":'))
        parts.append(exprs[name].fill_null(pl.lit("null")))
    parts.append(pl.lit("}}"))
    out = df.select(
        pl.concat_str(parts).str.join("\n").alias("t"),
        exprs["id"].str.join("\n").alias("k"),
    )
    return df.height, out["k"][0], out["t"][0]


PROBE_ROWS = """
(1, 32767, true, 'ü€😀', '0001-01-01', '2024-02-29 23:59:59.000001',
 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2.50, "x\\"y"], "b": null}', 'NaN'),
(2, -32768, false, E'\\t\\r\\b\\f\\x1f/"\\\\', '9999-12-31', '2000-01-01 00:00:00',
 '00000000-0000-0000-0000-000000000000', '"ü\\u0001"', '-1.000e-20'),
(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
(4, 0, true, '', '2020-01-01', '1970-01-01 00:00:00.5',
 'ffffffff-ffff-ffff-ffff-ffffffffffff', '1e400', 'Infinity'),
(5, 1, false, 'x', '0099-01-01', '0010-03-04 05:06:07',
 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '[]', '123456789012345678901234567890.123456789')
"""


def types_probe(dsn: str) -> None:
    """More types (int2, bool, varchar, date, timestamp, uuid, jsonb, numeric as
    ``::text``) with edge values through ADBC + polars, compared row by row with the
    fast path's tails; prints SAME or both texts."""
    pl = importlib.import_module("polars")
    pa = importlib.import_module("pyarrow")
    adbc = importlib.import_module("adbc_driver_postgresql.dbapi")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE probe (id int PRIMARY KEY, i2 smallint, bo bool, v varchar(20), "
                     "dt date, ts timestamp, u uuid, j jsonb, nm numeric)")
        conn.execute(f"INSERT INTO probe VALUES {PROBE_ROWS}")
    c = pl.col

    def quoted(e: Any) -> Any:
        return pl.concat_str([pl.lit('"'), e, pl.lit('"')])

    hexed = c("u").bin.encode("hex")
    enc = {
        "id": c("id").cast(pl.String), "i2": c("i2").cast(pl.String), "bo": c("bo").cast(pl.String),
        "v": quoted(c("v").str.replace_many(list(_ESCAPES), list(_ESCAPES.values()))),
        "dt": quoted(c("dt").dt.strftime("%Y-%m-%d")),
        "ts": quoted(c("ts").dt.strftime("%Y-%m-%dT%H:%M:%S%.6f").str.replace(r"\.000000$", "")),
        "u": quoted(pl.concat_str([hexed.str.slice(0, 8), pl.lit("-"), hexed.str.slice(8, 4),
                                   pl.lit("-"), hexed.str.slice(12, 4), pl.lit("-"),
                                   hexed.str.slice(16, 4), pl.lit("-"), hexed.str.slice(20, 12)])),
        "j": c("j"),
        "nm": quoted(c("nm")),
    }
    cfg = Config.model_validate({"source": {"dsn": dsn}, "log": {"path": "/nonexistent"}})
    reader = PgSnapshotReader(cfg, _Source(), split=False)  # type: ignore[arg-type]
    info = reader.table_info("public.probe")
    assert info is not None
    chunk = reader.read_chunk(info, None, (5,), 100, None)
    assert isinstance(chunk, EncodedChunk)
    reader.close()
    with adbc.connect(dsn) as aconn, aconn.cursor() as cur:
        cur.execute("SELECT id, i2, bo, v, dt, ts, u, j, nm::text AS nm FROM probe ORDER BY id")
        table = cur.fetch_arrow_table()
    cols = []
    for col in table.columns:
        arr = col.combine_chunks()
        cols.append(arr.storage if isinstance(arr, pa.ExtensionArray) else arr)
    df = pl.from_arrow(pa.table(cols, names=table.column_names))
    parts: list[Any] = [pl.lit('{"id":'), enc["id"], pl.lit("}" + TAIL_SEP)]
    for i, name in enumerate(df.columns):
        parts += [pl.lit(("{" if i == 0 else ",") + f'"{name}":'), enc[name].fill_null(pl.lit("null"))]
    parts.append(pl.lit("}}"))
    got = df.select(pl.concat_str(parts))[:, 0].to_list()
    for mine, want in zip(got, (chunk._tail_text or "").split("\n"), strict=True):
        print("types probe: SAME" if mine == want else f"types probe: DIFF\n  arrow {mine}\n  fast  {want}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=65536)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--types", action="store_true", help="only the byte-equality probe of more types")
    args = ap.parse_args()
    rows, size = args.rows, args.chunk
    ranges = [(lo, min(lo + size, rows) - 1) for lo in range(0, rows, size)]
    print(f"load average at start: {os.getloadavg()[0]:.1f}; "
          f"POLARS_MAX_THREADS={os.environ.get('POLARS_MAX_THREADS', '(unset)')}")
    with PgCluster() as cluster:
        dsn = cluster.create_database("bench")
        global SERVER_PID
        SERVER_PID = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        if args.types:
            types_probe(dsn)
            return
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
        reader = PgSnapshotReader(cfg, _Source(), split=False)  # type: ignore[arg-type]
        info = reader.table_info("public.big")
        assert info is not None
        expected: list[tuple[str, str]] = []

        def current() -> int:
            expected.clear()
            n = 0
            for lo, hi in ranges:
                chunk = reader.read_chunk(info, (lo - 1,), (hi,), size, None)
                assert isinstance(chunk, EncodedChunk)
                expected.append((chunk._key_text or "", chunk._tail_text or ""))
                n += chunk.size
            return n

        def copy_all() -> int:
            n = 0
            with psycopg.connect(dsn) as conn, conn.cursor() as cur, \
                    cur.copy("COPY (SELECT * FROM big) TO STDOUT") as copy:
                for _ in copy:
                    n += 1
            return n

        def copy_ranges() -> int:
            n = 0
            with psycopg.connect(dsn) as conn, conn.cursor() as cur:
                for lo, hi in ranges:
                    q = f"COPY (SELECT * FROM big WHERE id >= {lo} AND id <= {hi}) TO STDOUT"
                    with cur.copy(q) as copy:
                        for _ in copy:
                            n += 1
            return n

        adbc = importlib.import_module("adbc_driver_postgresql.dbapi")
        aconn = adbc.connect(dsn)
        acur = aconn.cursor()

        def adbc_fetch(encode: bool, select: str = "*") -> int:
            n = 0
            for i, (lo, hi) in enumerate(ranges):
                acur.execute(f"SELECT {select} FROM big WHERE id > {lo - 1} AND id <= {hi} ORDER BY id")
                table = acur.fetch_arrow_table()
                if encode:
                    count, keys, tails = polars_tails(table)
                    if expected and (keys, tails) != expected[i]:
                        want_t = expected[i][1]
                        for a, b in zip(tails.split("\n"), want_t.split("\n"), strict=False):
                            if a != b:
                                raise SystemExit(f"differs:\n arrow {a}\n fast  {b}")
                        raise SystemExit(f"differs (keys or count) in range {lo}..{hi}")
                    n += count
                else:
                    n += table.num_rows
            return n

        def cx_fetch(cx: Any) -> int:
            n = 0
            for lo, hi in ranges:
                t = cx.read_sql(dsn, f"SELECT * FROM big WHERE id > {lo - 1} AND id <= {hi} "
                                "ORDER BY id", return_type="arrow")
                n += t.num_rows
            return n

        try:
            cx = importlib.import_module("connectorx")
        except ImportError:
            cx = None
        for _ in range(args.repeat):
            base = measure("(b) raw COPY, whole table", rows, copy_all, None)
            measure("(b2) raw COPY per key range", rows, copy_ranges, base)
            measure("(a) PgSnapshotReader fast path (server JSON)", rows, current, base)
            measure("(c0) ADBC fetch_arrow_table only", rows, lambda: adbc_fetch(False), base)
            measure("(c) ADBC + polars tails (checked byte-equal to (a))", rows,
                    lambda: adbc_fetch(True), base)
            measure("(c1) ADBC, numeric as c::text, fetch only", rows,
                    lambda: adbc_fetch(False, NUMERIC_AS_TEXT), base)
            measure("(c2) ADBC, numeric as c::text, + polars tails (checked)", rows,
                    lambda: adbc_fetch(True, NUMERIC_AS_TEXT), base)
            if cx is None:
                print("(d) connectorx not installed")
            else:
                measure("(d) connectorx read_sql arrow only", rows, lambda: cx_fetch(cx), base)
        aconn.close()
        reader.close()
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    results.write("arrow_chunks", {"rows": rows, "chunk": size, "measurements": MEASURED})


if __name__ == "__main__":
    main()
