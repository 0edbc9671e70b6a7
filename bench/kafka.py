"""Benchmark: capture into Kafka against capture into the embedded log, same load, one run.

One throwaway PostgreSQL, one Tansu broker (in memory, or KAFKA_BOOTSTRAP_SERVERS):
 (a) `dblog run` with the embedded log drains N inserts from its own slot (from its
     first event in the log to its last);
 (b) `dblog run` with [log] type = "kafka" drains the same N inserts from another slot
     (until the checkpoint topic's last valid commit covers N events);
 (c) commit -> Kafka latency p50/p99 at a steady ~5k events/s (source commit time to
     the event being readable through the Kafka log's reader);
 (d) `dblog sync --available-now` from the Kafka log into Delta: events/s.
(b) is printed as a ratio of (a).

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/kafka.py [--rows 500000]
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
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from pydblog.changelog.kafka import KafkaChangeLogReader
from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.config import LogConfig
from pydblog.devtools.pgcluster import PgCluster


def load(dsn: str, table: str, start: int, rows: int, txs: int) -> None:
    per = rows // txs
    with psycopg.connect(dsn) as conn:
        for t in range(txs):
            conn.execute(
                f"INSERT INTO {table} SELECT g, g %% 1000, 'text-' || g, g * 1.5, now() "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (start + t * per, start + (t + 1) * per - 1),
            )
            conn.commit()


def config(work: Path, name: str, dsn: str, log: str) -> Path:
    d = work / name
    d.mkdir()
    path = d / "dblog.toml"
    path.write_text(
        f'[source]\ndsn = "{dsn}"\ntables = ["public\\\\.bench"]\nslot = "{name}"\n'
        f'publication = "benchpub"\n[log]\npath = "{d / "data"}"\n{log}\n'
    )
    return path


def wait_slot(dsn: str, slot: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                               (slot,)).fetchone():
            time.sleep(0.2)


def start(cfg: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "pydblog", "run", "--config", str(cfg)],
                            stderr=subprocess.DEVNULL)


def drain(cfg: Path, rows: int, count: Callable[[], int]) -> float:
    """Events/s of a `dblog run` draining ``rows`` events, first event to last."""
    proc = start(cfg)
    first: tuple[float, int] | None = None
    try:
        while True:
            time.sleep(0.01)
            n = count()
            if first is None and n > 0:
                first = (time.perf_counter(), n)
            if n >= rows:
                break
        assert first is not None
        return (rows - first[1]) / (time.perf_counter() - first[0])
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--tx", type=int, default=10)
    ap.add_argument("--steady-seconds", type=float, default=20.0)
    ap.add_argument("--steady-rate", type=int, default=5000)
    ap.add_argument("--sync", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-kafka-"))
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        from pydblog.devtools.tansu import TansuBroker

        broker = TansuBroker().start()
        bootstrap = broker.bootstrap
    prefix = f"b{uuid.uuid4().hex[:8]}"
    kafka_keys = f'type = "kafka"\nbootstrap_servers = "{bootstrap}"\ntopic_prefix = "{prefix}"'
    try:
        with PgCluster() as cluster:
            dsn = cluster.create_database("bench")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE bench (id bigint PRIMARY KEY, a int, b text, "
                             "c numeric, d timestamptz)")
            emb = config(work, "emb", dsn, "")
            kaf = config(work, "kaf", dsn, kafka_keys)
            for name, cfg in (("emb", emb), ("kaf", kaf)):  # create the slots, then stop
                p = start(cfg)
                wait_slot(dsn, name)
                time.sleep(1)
                p.terminate()
                p.wait()
            load(dsn, "bench", 0, args.rows, args.tx)
            print(f"loaded {args.rows} rows in {args.tx} transactions")

            emb_reader = SqliteChangeLogReader(work / "emb" / "data")
            rate_emb = drain(emb, args.rows, emb_reader.next_offset)
            print(f"(a) dblog run -> embedded log: {rate_emb:,.0f} events/s")
            log_cfg = LogConfig(type="kafka", path=str(work / "kaf" / "data"),
                                bootstrap_servers=bootstrap, topic_prefix=prefix)
            kreader = KafkaChangeLogReader(log_cfg)
            rate_kafka = drain(kaf, args.rows, kreader.next_offset)
            print(f"(b) dblog run -> Kafka: {rate_kafka:,.0f} events/s = "
                  f"{rate_kafka / rate_emb:.2f} x (a)")

            # (c) commit -> readable in Kafka, at a steady rate
            proc = start(kaf)
            time.sleep(4)
            offset = kreader.next_offset()
            stop = threading.Event()
            latencies: list[float] = []
            stamps: list[int] = []

            def follow() -> None:
                nonlocal offset
                while not stop.is_set():
                    recs = kreader.read(offset, 100_000)
                    now_ms = time.time() * 1000
                    latencies.extend(now_ms - r.ts_ms for r in recs)
                    stamps.extend(r.ts_ms for r in recs)
                    if recs:
                        offset = recs[-1].offset + 1
                    else:
                        time.sleep(0.002)

            th = threading.Thread(target=follow)
            th.start()
            per_tx = 10
            interval = per_tx / args.steady_rate
            base = args.rows + 10
            steady_start_ms = time.time() * 1000
            with psycopg.connect(dsn, autocommit=True) as conn:
                t_end = time.perf_counter() + args.steady_seconds
                nxt = time.perf_counter()
                i = 0
                while time.perf_counter() < t_end:
                    conn.execute(
                        "INSERT INTO bench SELECT g, 1, 'x', 1, now() FROM generate_series(%s::bigint, %s::bigint) g",
                        (base + i, base + i + per_tx - 1))
                    i += per_tx
                    nxt += interval
                    time.sleep(max(0.0, nxt - time.perf_counter()))
            time.sleep(2)
            stop.set()
            th.join()
            proc.terminate()
            proc.wait()
            lat = sorted(latencies)
            print(f"(c) commit -> Kafka latency at {args.steady_rate} events/s: "
                  f"p50 {statistics.median(lat):.1f} ms, p99 {lat[int(len(lat) * 0.99)]:.1f} ms "
                  f"({len(lat)} events)")
            late = sorted(x for x, t in zip(latencies, stamps, strict=True)
                          if t > steady_start_ms + 5000)
            if late:
                print(f"    after the first 5 s: p50 {statistics.median(late):.1f} ms, "
                      f"p99 {late[int(len(late) * 0.99)]:.1f} ms ({len(late)} events)")
            total = kreader.next_offset()
            kreader.close()
            emb_reader.close()

            if args.sync:  # (d) dblog sync from Kafka into Delta
                sync_cfg = work / "kaf" / "sync.toml"
                sync_cfg.write_text(kaf.read_text() + (
                    f'\n[sync]\ncheckpoint = "{work / "cp"}"\ntrigger = "available-now"\n'
                    f'[[sync.sinks]]\ntype = "delta"\npath = "{work / "lake"}"\n'))
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "pydblog.spark.job", "--config", str(sync_cfg),
                                "--available-now"], check=True, capture_output=True)
                wall = time.perf_counter() - t0
                print(f"(d) dblog sync (available-now, process start included) Kafka -> Delta: "
                      f"{total:,} events in {wall:.1f} s = {total / wall:,.0f} events/s")
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
