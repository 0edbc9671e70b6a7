"""Benchmark: incremental snapshot throughput vs a raw COPY, and stream lag during it.

In one run, against one throwaway PostgreSQL with a table of --rows rows:
 (a) `COPY (SELECT * FROM t) TO STDOUT` received as raw bytes by the client (psycopg 3,
     no parsing: what pg_dump pays), rows/s and CPU per row of the client and PostgreSQL;
 (b) the incremental snapshot's rows/s into the durable change log (`dblog run`, a real
     process) for each variant (by default: the default configuration, and fixed
     1,024-row chunks), each while a background writer does ~1k updates/s on the same
     table, with `dblog run`'s and PostgreSQL's CPU per row;
 (c) the stream's lag (commit -> change log) p50/p99 of those updates during (b);
 (d) peak RSS of `dblog run`.

Usage: .venv/bin/python bench/snapshot.py [--rows 5000000] [--only default]
           [--variant 'name:k = v; k = v' ...] [--keys dense|sparse|skewed]
           [--profile DIR] [--trace DIR] [--updates-per-s 1000]

``--standby`` starts a streaming hot standby of the loaded cluster; ``{standby}`` in a
variant's settings is its DSN (``read_dsn = "{standby}"`` with ``watermark =
"read-only"``: chunks read on the standby, the stream from the primary; the standby's
CPU is not counted). ``--updates-per-s N`` sets the background writer's rate (default 1,000; 0: no writes, an
idle stream, where a read-only snapshot's fences are passed only by the keepalives it
asks for). ``--keys`` picks the ids' distribution (``KEYS``); variant ``env PYDBLOG_INT_RANGES=0``
cuts integer keys by bounds queries instead of arithmetic (``core.intsplit``). ``--gil``
(needs ``pip install py-spy``) prints the share of the snapshot's time some thread of
`dblog run` held the GIL, and the rows/s that bounds on a machine with many cores.

``--variant`` adds a variant with these ``[snapshot]`` settings (repeatable; ``--only``
then picks among all); a setting ``env NAME=value`` sets the environment of its `dblog run`
instead (variant ``sql-path`` is ``env PYDBLOG_NATIVE_CHUNKS=0``). ``--profile DIR`` records a py-spy profile (raw collapsed stacks
of every thread while it is on CPU) of `dblog run` per variant into DIR; it slows the
run down a little. ``--trace DIR`` splits each variant's stream lag into its terms
(``pydblog.capture.lagtrace``: receive, batching, writer queue, append; the writer's CPU
and run-queue wait per append; the capture thread's long steps), traces kept in DIR.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import psycopg

import results
from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.proc import cpu_seconds, peak_rss_kb, thread_cpu

UPDATE_TS = re.compile("\x1fu\x1f(\\d+)")  # an update's meta entry: its commit ts_ms


SERVER_PID = 0  # the throwaway cluster's postmaster


def server_cpu() -> dict[int, float]:
    """CPU used so far by each process of the throwaway cluster (the postmaster and
    every process it started: backends, walsenders, background workers)."""
    out = {SERVER_PID: cpu_seconds(SERVER_PID)}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == SERVER_PID:
            out[int(stat.parent.name)] = cpu_seconds(int(stat.parent.name))
    return out


def server_cpu_since(start: dict[int, float]) -> float:
    """Cluster CPU since ``start`` (processes that ended in between are not counted)."""
    return sum(c - start.get(pid, 0.0) for pid, c in server_cpu().items())


def server_cpu_top(start: dict[int, float], n: int = 3) -> list[tuple[str, float]]:
    """The cluster processes that used most CPU since ``start``: (process title, s)."""
    used = sorted(((c - start.get(pid, 0.0), pid) for pid, c in server_cpu().items()), reverse=True)
    out = []
    for cpu, pid in used[:n]:
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            title = str(pid)
        out.append((title, cpu))
    return out


def copy_rate(dsn: str, rows: int) -> tuple[float, float, float]:
    """Rows/s of ``COPY (SELECT * FROM big) TO STDOUT`` received as raw bytes (the
    protocol's CopyData messages, one per row, never parsed: what pg_dump pays), the
    client's CPU per row and PostgreSQL's (us)."""
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        t0, c0, s0 = time.perf_counter(), time.thread_time(), server_cpu()
        size = 0
        messages = 0
        with cur.copy("COPY (SELECT * FROM big) TO STDOUT") as copy:
            for block in copy:
                size += len(block)
                messages += 1
        elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
        server = server_cpu_since(s0)
    assert messages == rows, messages
    print(f"    COPY: {size / 1e6:,.0f} MB in {elapsed:.2f} s")
    return rows / elapsed, cpu * 1e6 / rows, server * 1e6 / rows


UPDATER_PID: list[int] = []  # the updater's backend (its CPU is the load, not the snapshot)


MUL = 11400714819323198485  # odd: g -> g * MUL mod 2**k is a bijection (unique keys)
KEYS = ("dense", "sparse", "skewed")
"""Key distributions (``--keys``): ``dense`` ids 0 .. rows-1; ``sparse`` every id a
pseudo-random bigint in [0, 2**62); ``skewed`` 40 % dense at the start, 20 % sparse over
2**60 keys, 40 % dense again at 2**61 (the arithmetic ranges of ``core.intsplit`` must
follow the density down and up again)."""


def key_of(keys: str, rows: int, g: int) -> int:
    """The id of the ``g``-th row (as ``key_sql`` computes it in the load)."""
    if keys == "sparse":
        return (g * MUL) % 2**62
    if keys == "skewed":
        if g < rows * 4 // 10:
            return g
        if g < rows * 6 // 10:
            return rows + (g * MUL) % 2**60
        return 2**61 + g
    return g


def key_sql(keys: str, rows: int) -> str:
    """``key_of`` in SQL over ``generate_series`` column ``g`` (numeric: no overflow),
    with ``%`` doubled for psycopg."""
    if keys == "sparse":
        return f"((g::numeric * {MUL}) %% {2**62})::bigint"
    if keys == "skewed":
        return (f"CASE WHEN g < {rows * 4 // 10} THEN g WHEN g < {rows * 6 // 10} THEN "
                f"{rows} + ((g::numeric * {MUL}) %% {2**60})::bigint ELSE {2**61} + g END")
    return "g"


def updater(dsn: str, rows: int, stop: threading.Event, rate: int, keys: str = "dense") -> None:
    rng = random.Random(1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        UPDATER_PID[:] = [conn.info.backend_pid]
        nxt = time.monotonic()
        while not stop.is_set():
            key = key_of(keys, rows, rng.randrange(rows))
            conn.execute("UPDATE big SET n = n + 1 WHERE id = %s", (key,))
            nxt += 1 / rate
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def run_snapshot(
    dsn: str, rows: int, work: Path, extra: str, label: str, copy: float,
    profile: Path | None = None, trace: Path | None = None, keys: str = "dense",
    gil: bool = False, rate: int = 1000,
) -> dict[str, float]:
    """Runs one variant's snapshot and prints its figures; returns them for the results."""
    name = re.sub(r"[^a-z0-9_]", "_", label.lower())
    # "env NAME=value" lines set the process's environment, not [snapshot]
    env = dict(os.environ)
    trace_file = (trace or work) / f"{name}-lagtrace.txt"
    if trace:
        trace.mkdir(parents=True, exist_ok=True)
        trace_file.unlink(missing_ok=True)
        env["PYDBLOG_LAG_TRACE"] = str(trace_file)
    lines = []
    for line in extra.splitlines():
        key, eq, value = line.strip().removeprefix("env ").partition("=")
        if line.strip().startswith("env ") and eq:
            env[key.strip()] = value.strip()
        else:
            lines.append(line)
    extra = "\n".join(lines)
    config = work / f"{name}.toml"
    data = work / f"{name}-data"
    config.write_text(
        f'[source]\ndsn = "{dsn}"\ntables = ["public\\\\.big"]\nslot = "{name}"\n'
        f'publication = "{name}"\n[log]\npath = "{data}"\n[snapshot]\n{extra}\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pydblog", "run", "--config", str(config)], stderr=subprocess.DEVNULL,
        env=env,
    )
    while not (data / "changelog.sqlite").exists():
        if proc.poll() is not None:
            raise SystemExit(f"dblog run ({label}) exited with {proc.returncode}: run it with "
                             f"--config {config} to see why")
        time.sleep(0.1)
    reader = SqliteChangeLogReader(data)
    while reader.last_checkpoint() is None:
        time.sleep(0.1)
    spy = None
    if gil and profile is None:
        profile = work
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        spy = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw", "--rate", "200", "--pid",
             str(proc.pid), "--output", str(profile / f"{label}.txt"), *(["--gil"] if gil else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    stop = threading.Event()
    upd = threading.Thread(target=updater, args=(dsn, rows, stop, rate, keys))
    if rate > 0:
        upd.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dblog_signal VALUES (%s, 'execute-snapshot', %s)",
            (f"bench-{label}", orjson.dumps({"data-collections": ["public\\.big"]}).decode()),
        )
    lags: list[float] = []
    snap_rows = 0
    t_first: float | None = None
    cpu_first = 0.0
    server_first: dict[int, float] = {}
    threads_first: dict[str, float] = {}
    offset = 0
    done = False
    rss_samples: list[int] = []
    # The change log is scanned block by block with C-level string searches on the
    # blocks' meta column (bodies only of blocks with a notification): a reader that
    # decoded every event in Python would fall behind a fast snapshot on these two
    # cores and report its own delay as the stream's lag, and would take CPU from it.
    db = sqlite3.connect(f"file:{data / 'changelog.sqlite'}?mode=ro", uri=True)
    while not done:
        blocks = db.execute(
            "SELECT first_offset, last_offset, meta FROM blocks WHERE first_offset >= ? "
            "ORDER BY first_offset LIMIT 64", (offset,)
        ).fetchall()
        now_ms = time.time() * 1000
        for first, last, meta in blocks:
            if meta.startswith("\x1d"):  # a template block: one entry for all its events
                n_r = last - first + 1 if "\x1fr\x1f" in meta.split("\x1d", 2)[1] + "\x1f" else 0
            else:
                n_r = meta.count("\x1fr\x1f")
            if n_r and t_first is None:
                t_first = time.perf_counter()
                cpu_first = cpu_seconds(proc.pid)
                threads_first = thread_cpu(proc.pid)
                server_first = server_cpu()
            snap_rows += n_r
            lags.extend(now_ms - int(ts) for ts in UPDATE_TS.findall(meta))
            if "\x1fn\x1f" in meta:
                row = db.execute("SELECT body FROM blocks WHERE first_offset = ?", (first,)).fetchone()
                bodies = row[0].split("\n") if row is not None else []
                done = done or any(
                    m.split("\x1f")[1] == "n" and '"COMPLETED"' in b
                    for m, b in zip(meta.split("\x1e"), bodies, strict=False)
                )
            offset = last + 1
        if not blocks:
            time.sleep(0.005)
            rss_samples.append(peak_rss_kb(proc.pid))
    db.close()
    elapsed = time.perf_counter() - (t_first or time.perf_counter())
    cpu = cpu_seconds(proc.pid) - cpu_first
    threads = {k: v - threads_first.get(k, 0.0) for k, v in thread_cpu(proc.pid).items()}
    server = server_cpu_since(server_first)
    top = server_cpu_top(server_first)
    load_pid = UPDATER_PID[0] if UPDATER_PID else 0
    updates = cpu_seconds(load_pid) - server_first.get(load_pid, 0.0) if load_pid else 0.0
    stop.set()
    if rate > 0:
        upd.join()
    rss = peak_rss_kb(proc.pid)
    if spy is not None:
        spy.send_signal(2)
        spy.wait()
    proc.terminate()
    proc.wait()
    lag = sorted(lags)
    p50 = statistics.median(lag) if lag else float("nan")
    p99 = lag[int(len(lag) * 0.99)] if lag else float("nan")
    print(
        f"(b) {label}: {snap_rows:,} snapshot rows at {snap_rows / elapsed:,.0f} rows/s "
        f"= {snap_rows / elapsed / copy:.2f} x (a) "
        f"(dblog run CPU {cpu * 1e6 / max(snap_rows, 1):.1f} us/row, a load-independent figure; "
        f"PostgreSQL CPU {server * 1e6 / max(snap_rows, 1):.1f} us/row)"
    )
    print(f"    {label}: dblog run CPU by thread: " + "; ".join(
        f"{name} {c * 1e6 / max(snap_rows, 1):.2f} us/row"
        for name, c in sorted(threads.items(), key=lambda t: -t[1]) if c > 0))
    print(f"    {label}: PostgreSQL CPU by process: " + "; ".join(
        f"{t.split(' (')[0][:60]} {c * 1e6 / max(snap_rows, 1):.2f} us/row" for t, c in top))
    print(f"    {label}: PostgreSQL CPU without the updater's backend ({rate:,} updates/s): "
          f"{(server - updates) * 1e6 / max(snap_rows, 1):.2f} us/row (updater "
          f"{updates * 1e6 / max(snap_rows, 1):.2f})")
    print(
        f"(c) {label}: stream lag of {len(lag):,} concurrent updates p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        f", max {lag[-1] if lag else float('nan'):.0f} ms"
    )
    print(f"(d) {label}: dblog run peak RSS {rss / 1024:.0f} MB")
    if gil and profile is not None:
        report_gil(label, profile / f"{label}.txt", elapsed, snap_rows)
    if trace:
        report_trace(label, trace_file, t_first)
    shutil.rmtree(data, ignore_errors=True)
    return {
        "rows_per_s": round(snap_rows / elapsed), "x_raw_copy": round(snap_rows / elapsed / copy, 3),
        "dblog_run_cpu_us_per_row": round(cpu * 1e6 / max(snap_rows, 1), 2),
        "postgres_cpu_us_per_row": round(server * 1e6 / max(snap_rows, 1), 2),
        "postgres_cpu_us_per_row_without_updater": round(
            (server - updates) * 1e6 / max(snap_rows, 1), 2),
        "lag_p50_ms": round(p50, 1), "lag_p99_ms": round(p99, 1),
        "lag_max_ms": round(lag[-1], 1) if lag else float("nan"),
        "peak_rss_mb": round(rss / 1024),
    }


def report_gil(label: str, path: Path, elapsed: float, rows: int) -> None:
    """``py-spy record --gil`` keeps only the samples of the thread holding the GIL (at
    most one per tick, 200 a second): their count over the snapshot's time is the share
    of it during which some thread of `dblog run` held the GIL (the samples before the
    first and after the last snapshot row, when the process is idle, are few). A process
    whose Python threads need the GIL for a share ``s`` of the time cannot go faster than
    ``rows/s / s``, however many cores it gets."""
    samples = sum(int(line.rsplit(" ", 1)[1]) for line in path.read_text().splitlines() if line.strip())
    share = samples / (200 * elapsed) if elapsed else float("nan")
    print(f"(e) {label}: GIL held {share:.0%} of the snapshot's time ({samples:,} samples in "
          f"{elapsed:.1f} s): at most ~{rows / elapsed / max(share, 1e-9):,.0f} rows/s with "
          f"every core it wants, unless less of the work holds the GIL")


def report_trace(label: str, path: Path, t_first: float | None) -> None:
    """The stream's lag split into its terms (``pydblog.capture.lagtrace``): per event
    p50/p99 of each term, and the capture thread's stalls."""
    terms: dict[str, list[float]] = {k: [] for k in (
        "server->capture thread", "capture thread->writer", "writer queue", "append+commit",
        "total (commit->log)")}
    stalls: dict[str, list[float]] = {}
    appends: list[tuple[float, int, float, float]] = []
    for line in path.read_text().splitlines():
        f = line.split()
        if f[0] == "e":
            c, r, s, a, e = int(f[1]) / 1000, float(f[2]), float(f[3]), float(f[4]), float(f[5])
            for k, sec in zip(terms, (r - c, s - r, a - s, e - a, e - c), strict=True):
                terms[k].append(sec * 1000)
        elif f[0] == "a":
            appends.append((float(f[2]) * 1000, int(f[3]), float(f[5]) * 1000, float(f[6]) * 1000))
        elif f[0] == "s":
            stalls.setdefault(f[3], []).append(float(f[2]) * 1000)
    for k, v in terms.items():
        v.sort()
        if v:
            print(f"    {label} lag term {k}: p50 {statistics.median(v):.1f} ms, "
                  f"p99 {v[int(len(v) * 0.99)]:.1f} ms, max {v[-1]:.1f} ms ({len(v):,} events)")
    for what, sel in (("with > 4,096 events", [a for a in appends if a[1] > 4096]),
                      ("with <= 4,096 events", [a for a in appends if a[1] <= 4096])):
        ms = sorted(a[0] for a in sel)
        if ms:
            print(f"    {label} writer appends {what}: {len(ms):,}, p50 {statistics.median(ms):.1f} ms, "
                  f"max {ms[-1]:.1f} ms, busy {sum(ms) / 1000:.2f} s, of which the writer's "
                  f"CPU {sum(a[2] for a in sel) / 1000:.2f} s, waiting for a CPU "
                  f"{sum(a[3] for a in sel) / 1000:.2f} s ({sum(a[1] for a in sel):,} events)")
    for k, v in sorted(stalls.items(), key=lambda kv: -sum(kv[1])):
        v.sort()
        print(f"    {label} capture-thread stalls in {k}: {len(v):,} >= 5 ms, total "
              f"{sum(v) / 1000:.2f} s, p50 {statistics.median(v):.1f} ms, max {v[-1]:.1f} ms")


VARIANTS = {
    "default": "", "fixed-1024": "chunk_size = 1024", "sql-path": "env PYDBLOG_NATIVE_CHUNKS=0",
}
"""The default configuration, the previous default (fixed 1,024-row chunks), and the
default without the native chunk encoder (PostgreSQL writes the rows' JSON)."""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--only", action="append", help="run only this variant (repeatable)")
    ap.add_argument("--variant", action="append", default=[],
                    help="'name:k = v; k = v': a variant with these [snapshot] settings")
    ap.add_argument("--keys", choices=KEYS, default="dense",
                    help="the ids' distribution (dense 0..rows-1, sparse, skewed)")
    ap.add_argument("--profile", type=Path)
    ap.add_argument("--gil", action="store_true",
                    help="measure the share of time dblog run holds the GIL (py-spy --gil)")
    ap.add_argument("--updates-per-s", type=int, default=1000, metavar="N",
                    help="the background updates' rate during each variant (0: an idle stream)")
    ap.add_argument("--standby", action="store_true",
                    help="start a hot standby of the table's cluster (pg_basebackup -R); a "
                    "variant's '{standby}' is its DSN, e.g. 'read_dsn = \"{standby}\"'")
    ap.add_argument("--trace", type=Path, metavar="DIR",
                    help="split the stream's lag into its terms (PYDBLOG_LAG_TRACE files in DIR)")
    args = ap.parse_args()
    variants = dict(VARIANTS)
    for spec in args.variant:
        name, _, settings = spec.partition(":")
        variants[name.strip()] = settings.replace(";", "\n")
    unknown = set(args.only or ()) - set(variants)
    if unknown:
        ap.error(f"unknown variant(s) {sorted(unknown)}; known: {sorted(variants)}")
    work = Path(tempfile.mkdtemp(prefix="dblog-snapbench-"))
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    with PgCluster() as cluster:
        dsn = cluster.create_database("bench")
        global SERVER_PID
        SERVER_PID = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        t0 = time.perf_counter()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE big (id bigint PRIMARY KEY, a int, b text, c numeric(12,2), "
                "d timestamptz, n int)"
            )
            conn.execute(
                f"INSERT INTO big SELECT {key_sql(args.keys, args.rows)}, g %% 1000, "
                "'text-' || g, g * 1.5, now(), 0 FROM generate_series(0, %s) g",
                (args.rows - 1,),
            )
            # The signal table, as an administrator creates it for read-only snapshots
            # (which create nothing): a read-only variant can then run first or alone.
            conn.execute("CREATE TABLE dblog_signal (id text PRIMARY KEY, type text NOT NULL, "
                         "data text)")
            conn.execute("VACUUM ANALYZE big")
            # The load's dirty pages (~1 GB) go to disk now, not during the measurements:
            # written back by the kernel seconds later, they stalled the change log's
            # fsyncs once per run (one 0.3-0.5 s lag spike: the p99 of a 20 s run).
            conn.execute("CHECKPOINT")
        os.sync()
        print(f"loaded {args.rows:,} rows ({args.keys} ids) in {time.perf_counter() - t0:.0f}s")
        standby = None
        if args.standby:
            # A streaming hot standby of the loaded cluster, for variants that read their
            # chunks there ('read_dsn = "{standby}"'; its CPU is not in the figures).
            from pydblog.devtools.pgstandby import PgStandby

            standby = PgStandby(cluster).start()
            standby.wait_caught_up(timeout=600)
            print(f"hot standby streaming on port {standby.port}")
        copy, copy_cpu, copy_server = copy_rate(dsn, args.rows)
        print(
            f"(a) COPY TO STDOUT as raw bytes: {copy:,.0f} rows/s (client CPU {copy_cpu:.2f} us/row, "
            f"PostgreSQL CPU {copy_server:.2f} us/row)"
        )
        measured: dict[str, dict[str, float]] = {}
        try:
            for label, extra in variants.items():
                if not args.only or label in args.only:
                    if "{standby}" in extra:
                        if standby is None:
                            raise SystemExit(f"variant {label} reads from the standby: add --standby")
                        extra = extra.replace("{standby}", standby.dsn("bench"))
                    measured[label] = run_snapshot(
                        dsn, args.rows, work, extra, label, copy, args.profile, args.trace,
                        args.keys, args.gil, args.updates_per_s)
        finally:
            if standby is not None:
                standby.stop()
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    shutil.rmtree(work, ignore_errors=True)
    results.write("snapshot", {
        "rows": args.rows, "keys": args.keys, "updates_per_s": args.updates_per_s,
        "variants": {label: variants[label].strip() for label in measured},
        "a_raw_copy_rows_per_s": round(copy),
        "a_raw_copy_client_cpu_us_per_row": round(copy_cpu, 2),
        "a_raw_copy_postgres_cpu_us_per_row": round(copy_server, 2),
        "b": measured,
    })


if __name__ == "__main__":
    main()
