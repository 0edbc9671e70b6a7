"""Benchmark: `dblog run` against the slot's ceilings, on the same load, in one run.

In one run, on one machine, against one throwaway PostgreSQL (1M inserts by default):
 (a) bare loop: a psycopg2 loop that reads every pgoutput message of the load from a
     slot and discards it (the Python ceiling);
 (a2) pg_recvlogical (C): `pg_recvlogical --start -o proto_version=1
     -o publication_names=... -E <lsn> -f /dev/null` on its own slot (the server's ceiling:
     the walsender's decoding bounds it);
 (b) dblog: `dblog run` (a real process, default configuration) draining the same load
     from its own slot into the durable change log (fsync'd SQLite commits), timed from
     its first event in the change log to its last; CPU per row of `dblog run` and of
     PostgreSQL (every process of the throwaway cluster) during (b);
 (c) commit -> change-log latency p50/p99 at a steady ~5k events/s;
 (d) peak RSS of the `dblog run` process.
Each figure is printed as a ratio against (a2), pg_recvlogical from a slot made before
the load and stopped at the WAL end after it (the server's ceiling), and against (a), of
the same run. During (b) the HTTP API is on (as by default, on a free port) and a
``/metrics`` scraper reads it every second; the CPU of `dblog run` is also given per
thread (``/proc/PID/task``: the capture thread ``MainThread``/``python``, the writer
``dblog-writer``, ...) per event.

Usage: .venv/bin/python bench/stream.py [--rows 1000000] [--tx 100] [--profile DIR]
           [--log embedded|kafka] [--op insert|update|delete] [--replica-identity full]

``--op update`` / ``--op delete``: the load updates (every non-key column) or deletes
rows inserted before the slots were made, one event per row, in the same transactions.
``--replica-identity full``: the table's ``REPLICA IDENTITY FULL`` (updates and deletes
carry the old row).

``--log kafka``: `dblog run` writes into Kafka instead (an Apache Kafka broker started
for the run, ``pydblog.devtools.kafka``, or ``KAFKA_BOOTSTRAP_SERVERS``); (b) counts the events of the log's last commit
(bench/kafka.py's ``KafkaEnd``) and (c) follows the log with ``KafkaChangeLogReader.follow``
(as `dblog tail -f` does; polling ``read`` costs an exact read of the checkpoint topic a
call).

``--profile DIR`` (needs ``pip install py-spy``) records a py-spy profile of `dblog run`
during (b) as raw collapsed stacks in ``DIR/stream.txt`` (`--idle` off: CPU only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
import psycopg2
import psycopg2.extras

import results
from kafka import add_broker_cpus  # bench/kafka.py
from pydblog.api.capture import read_api_address
from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.proc import cpu_seconds, cpu_since, family_cpu, peak_rss_kb, thread_cpu

INSERT = ("INSERT INTO bench SELECT g, g %% 1000, 'text-' || g, g * 1.5, now() "
          "FROM generate_series(%s::bigint, %s::bigint) g")
LOADS = {
    "insert": INSERT,
    # every row's non-key columns change (a ``u`` event each, the key unchanged)
    "update": "UPDATE bench SET a = a + 1, b = b || '+', d = now() WHERE id BETWEEN %s AND %s",
    "delete": "DELETE FROM bench WHERE id BETWEEN %s AND %s",
}
"""``--op``: the statement each transaction runs over its range of ids (one event per
row). For ``update`` and ``delete`` the rows are inserted before any slot exists."""


BROKER_OTHERS = "the database, `dblog run` and the baselines"


def load(dsn: str, rows: int, txs: int, op: str = "insert") -> None:
    per = rows // txs
    with psycopg.connect(dsn) as conn:
        for t in range(txs):
            conn.execute(LOADS[op], (t * per, (t + 1) * per - 1))
            conn.commit()


def raw_rate(dsn: str, slot: str, rows: int, op: str = "insert") -> float:
    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    cur.start_replication(
        slot_name=slot,
        decode=False,
        options={"proto_version": "1", "publication_names": "benchpub", "messages": "true"},
    )
    import select

    seen = 0
    kind = op[:1].upper().encode()  # the pgoutput message of one row: I, U or D
    t0 = time.perf_counter()
    while seen < rows:
        msg = cur.read_message()
        if msg is None:
            select.select([conn.fileno()], [], [], 0.1)
            continue
        if msg.payload[:1] == kind:
            seen += 1
    elapsed = time.perf_counter() - t0
    conn.close()
    return rows / elapsed


def write_config(directory: Path, dsn: str, log_keys: str = "") -> Path:
    path = directory / "dblog.toml"
    path.write_text(
        f'[source]\ndsn = "{dsn}"\ntables = ["public\\\\.bench", "public\\\\.steady"]\n'
        f'slot = "dblogbench"\npublication = "dblogpub"\n'
        f'[log]\npath = "{directory / "data"}"\n{log_keys}'
        # The API on, as by default, on a free port (another run may hold 8083).
        f'[api]\nlisten = "127.0.0.1:0"\n'
    )
    return path


def recvlogical_rate(cluster: PgCluster, dsn: str, slot: str, rows: int) -> tuple[float, float]:
    """Rows/s of pg_recvlogical draining the load up to the current WAL end, and its
    own CPU per row (us)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    end_lsn = row[0]
    cmd = [
        str(cluster.bindir / "pg_recvlogical"), "-d", dsn, "--slot", slot, "--start",
        "-o", "proto_version=1", "-o", "publication_names=benchpub",
        "-E", end_lsn, "-f", "/dev/null", "--no-loop",
    ]
    t0 = time.perf_counter()
    before = os.times()
    subprocess.run(cmd, check=True)
    elapsed = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return rows / elapsed, cpu * 1e6 / rows


def scrape(log_dir: Path, stop: threading.Event, count: list[int]) -> None:
    """GET the API's ``/metrics`` every second until ``stop`` (a Prometheus scraper)."""
    while not stop.wait(1.0):
        url = read_api_address(log_dir)
        if url is None:
            continue
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
                resp.read()
            count[0] += 1
        except OSError:
            pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--tx", type=int, default=100)
    ap.add_argument("--steady-seconds", type=float, default=20.0)
    ap.add_argument("--steady-rate", type=int, default=5000)
    ap.add_argument("--profile", type=Path, help="py-spy profile of (b) into DIR/stream.txt")
    ap.add_argument("--log", choices=["embedded", "kafka"], default="embedded")
    ap.add_argument("--op", choices=sorted(LOADS), default="insert",
                    help="what the load's transactions do to each row (one event per row)")
    ap.add_argument("--replica-identity", choices=["default", "full"], default="default",
                    help="the bench table's replica identity")
    add_broker_cpus(ap, BROKER_OTHERS)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-"))
    if args.log != "kafka":
        run(args, work, "", "", "")
        return
    from kafka import bench_broker, isolate_broker  # bench/kafka.py

    if args.broker_cpus:
        isolate_broker(args.broker_cpus, BROKER_OTHERS)
    with bench_broker(args.broker_cpus) as (bootstrap, broker_pid):
        prefix = f"s{uuid.uuid4().hex[:8]}"
        log_keys = f'type = "kafka"\nbootstrap_servers = "{bootstrap}"\ntopic_prefix = "{prefix}"\n'
        run(args, work, log_keys, bootstrap, prefix, broker_pid)


def run(args: argparse.Namespace, work: Path, log_keys: str, bootstrap: str, prefix: str,
        broker_pid: int | None = None) -> None:
    with PgCluster() as cluster:
        dsn = cluster.create_database("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE bench (id bigint PRIMARY KEY, a int, b text, c numeric, d timestamptz)"
            )
            conn.execute("CREATE TABLE steady (id bigint PRIMARY KEY, v int)")
            if args.replica_identity == "full":
                conn.execute("ALTER TABLE bench REPLICA IDENTITY FULL")
            if args.op != "insert":  # the rows to change, before any slot exists
                conn.execute(INSERT, (0, args.rows - 1))
            conn.execute("CREATE PUBLICATION benchpub FOR TABLE bench")
            conn.execute("SELECT pg_create_logical_replication_slot('rawbench', 'pgoutput')")
            conn.execute("SELECT pg_create_logical_replication_slot('recvbench', 'pgoutput')")
        config = write_config(work, dsn, log_keys)
        # Start dblog once so that it creates its slot and publication, then stop it.
        proc = subprocess.Popen(
            [sys.executable, "-m", "pydblog", "run", "--config", str(config)],
            stderr=(work / "first-run.log").open("w"),
        )
        deadline = time.monotonic() + 120
        while not (work / "data" / "api.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"dblog run did not start: {(work / 'first-run.log').read_text()[-2000:]}")
            time.sleep(0.1)
        time.sleep(1)
        proc.terminate()
        proc.wait()
        t0 = time.perf_counter()
        load(dsn, args.rows, args.tx, args.op)
        print(
            f"loaded {args.rows} rows ({args.op}) in {args.tx} transactions in "
            f"{time.perf_counter() - t0:.1f}s"
        )

        postmaster = int((cluster.datadir / "postmaster.pid").read_text().split()[0])
        raw = raw_rate(dsn, "rawbench", args.rows, args.op)
        print(f"(a) bare receive loop (Python): {raw:,.0f} events/s")
        recv, recv_cpu = recvlogical_rate(cluster, dsn, "recvbench", args.rows)
        print(f"(a2) pg_recvlogical (C): {recv:,.0f} events/s (its CPU {recv_cpu:.2f} us/row)")

        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "pydblog", "run", "--config", str(config)],
            stderr=(work / "run.log").open("w"),
        )
        spy = None
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
                 "--rate", "200", "--pid", str(proc.pid), "--output",
                 str(args.profile / "stream.txt")],
                stdout=subprocess.DEVNULL,
            )
        scraping = threading.Event()
        scrapes = [0]
        scraper = threading.Thread(target=scrape, args=(work / "data", scraping, scrapes), daemon=True)
        scraper.start()
        reader: Any
        if log_keys:
            from kafka import KafkaEnd  # bench/kafka.py
            from pydblog.changelog.kafka.reader import KafkaChangeLogReader
            from pydblog.config import LogConfig

            reader = KafkaChangeLogReader(LogConfig(type="kafka", path=str(work / "data"),
                                                    bootstrap_servers=bootstrap, topic_prefix=prefix))
            end_probe = KafkaEnd(bootstrap, prefix)
            end_probe.active(True)
            count = end_probe.count
        else:
            while not (work / "data" / "changelog.sqlite").exists():
                time.sleep(0.05)
            reader = SqliteChangeLogReader(work / "data")
            count = reader.next_offset
        first: tuple[float, int, float, dict[int, float], dict[str, float], float] | None = None
        while True:
            time.sleep(0.005)
            n = count()
            if first is None and n > 0:
                first = (time.perf_counter(), n, cpu_seconds(proc.pid), family_cpu(postmaster),
                         thread_cpu(proc.pid), cpu_seconds(broker_pid) if broker_pid else 0.0)
            if n >= args.rows:
                break
        end = time.perf_counter()
        dblog_cpu = cpu_seconds(proc.pid)
        broker_cpu = cpu_seconds(broker_pid) if broker_pid else 0.0
        if log_keys:
            end_probe.close()
        threads_end = thread_cpu(proc.pid)
        server_cpu = cpu_since(family_cpu(postmaster), first[3]) if first else 0.0
        rss_bulk = peak_rss_kb(proc.pid)
        if spy is not None:
            spy.send_signal(2)  # SIGINT: py-spy writes its profile and exits
            spy.wait()
        assert first is not None
        counted = args.rows - first[1]
        e2e = counted / (end - first[0])
        whole = args.rows / (end - t0)
        print(
            f"(b) dblog run end to end: {e2e:,.0f} events/s (from its first event in the change "
            f"log to its last) = {e2e / raw:.2f} x (a), {e2e / recv:.2f} x (a2); "
            f"{whole:,.0f} events/s including process start"
        )
        print(
            f"    CPU per row during (b): dblog run {(dblog_cpu - first[2]) * 1e6 / counted:.2f} us, "
            f"PostgreSQL {server_cpu * 1e6 / counted:.2f} us"
            + (f", Kafka broker {(broker_cpu - first[5]) * 1e6 / counted:.2f} us" if broker_pid else "")
        )
        per_thread = {name: (c - first[4].get(name, 0.0)) * 1e6 / counted
                      for name, c in sorted(threads_end.items())}
        print("    dblog run CPU per event by thread: " + ", ".join(
            f"{name} {us:.2f} us" for name, us in per_thread.items() if us >= 0.005))
        print(f"    /metrics scraped {scrapes[0]} times during (b)")
        figures: dict[str, Any] = {
            "log": args.log, "op": args.op, "replica_identity": args.replica_identity,
            "rows": args.rows, "transactions": args.tx,
            "env": {k: v for k, v in os.environ.items() if k.startswith("PYDBLOG_")},
            "bare_loop_events_per_s": round(raw), "pg_recvlogical_events_per_s": round(recv),
            "pg_recvlogical_cpu_us_per_event": round(recv_cpu, 3),
            "dblog_events_per_s": round(e2e), "ratio_to_pg_recvlogical": round(e2e / recv, 3),
            "dblog_events_per_s_with_process_start": round(whole),
            "ratio_to_bare_loop": round(e2e / raw, 3),
            "dblog_cpu_us_per_event": round((dblog_cpu - first[2]) * 1e6 / counted, 3),
            "dblog_cpu_us_per_event_by_thread": {k: round(v, 3) for k, v in per_thread.items()},
            "postgres_cpu_us_per_event": round(server_cpu * 1e6 / counted, 3),
            "kafka_broker_cpu_us_per_event": (round((broker_cpu - first[5]) * 1e6 / counted, 3)
                                              if broker_pid else None),
            "metrics_scrapes": scrapes[0],
        }

        # (c) steady load latency
        start_offset = reader.next_offset()
        stop = threading.Event()
        latencies: list[float] = []

        def follow() -> None:
            if log_keys:  # Kafka: as `dblog tail -f` follows it (the checkpoint topic's tail)
                for r in reader.follow(start_offset, poll_s=0.05):
                    if stop.is_set():  # (the generator waits for records: left running)
                        return
                    latencies.append(time.time() * 1000 - r.ts_ms)
                return
            offset = start_offset
            while not stop.is_set():
                recs = reader.read(offset, 10_000)
                now_ms = time.time() * 1000
                for r in recs:
                    latencies.append(now_ms - r.ts_ms)
                if recs:
                    offset = recs[-1].offset + 1
                else:
                    time.sleep(0.001)

        th = threading.Thread(target=follow, daemon=True)
        th.start()
        per_tx = 10
        interval = per_tx / args.steady_rate
        with psycopg.connect(dsn, autocommit=True) as conn:
            i = 0
            t_end = time.monotonic() + args.steady_seconds
            nxt = time.monotonic()
            while time.monotonic() < t_end:
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO steady SELECT g, 1 FROM generate_series(%s::bigint, %s::bigint) g",
                        (i, i + per_tx - 1),
                    )
                i += per_tx
                nxt += interval
                delay = nxt - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        time.sleep(1.0)
        stop.set()
        th.join(None if not log_keys else 2.0)
        scraping.set()
        scraper.join()
        rss = peak_rss_kb(proc.pid)
        proc.terminate()
        proc.wait()
        lat = sorted(latencies)
        p50 = statistics.median(lat)
        p99 = lat[int(len(lat) * 0.99)]
        rate = i / args.steady_seconds
        print(
            f"(c) commit->change log latency at {rate:,.0f} events/s: p50 {p50:.1f} ms, p99 {p99:.1f} ms "
            f"({len(lat)} events)"
        )
        print(
            f"(d) dblog run peak RSS: {rss / 1024:.0f} MB (after bulk drain: {rss_bulk / 1024:.0f} MB)"
        )
        figures.update({
            "steady_events_per_s": round(rate), "latency_p50_ms": round(p50, 2),
            "latency_p99_ms": round(p99, 2), "peak_rss_mb": round(rss / 1024),
        })
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    results.write("stream", figures)
    os.system(f"rm -rf {work}")


if __name__ == "__main__":
    main()
