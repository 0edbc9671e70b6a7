"""Benchmark: the change-log writer alone, the same stream events appended to the embedded
log, to Kafka by the Python path and to Kafka by the native path (``kafka_native``).

No database: ``--events`` insert events of the shape of ``bench/kafka.py``'s table are
encoded once, then appended in batches of ``--batch`` (the capture's default
``batch_max_events``) by each writer in turn, for ``--rounds`` rounds (the order rotates
each round). Per writer: events/s (wall) and CPU microseconds per event of the appending
thread (the thread that competes with the stream's decoding for the GIL) and of the whole
process (librdkafka's threads included). One Apache Kafka broker (devtools.kafka), or
KAFKA_BOOTSTRAP_SERVERS.

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/kafka_writer.py [--events 200000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import results
from pydblog.changelog import kafka_native
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.config import LogConfig
from pydblog.events import ChangeEvent, Encoded, Op, encode_event
from pydblog.ports import ChangeLogWriter, Checkpoint
from pydblog.positions import Lsn, PgPosition


def events(n: int, lsn0: int) -> list[Encoded]:
    """``n`` inserts in transactions of 50,000, encoded as the stream encodes them."""
    out: list[Encoded] = []
    for i in range(n):
        lsn = lsn0 + i // 50_000
        ev = ChangeEvent(Op.CREATE, "public", "bench", PgPosition(Lsn(lsn), i % 50_000, Lsn(lsn + 1), lsn),
                         1_764_260_000_000, {"id": i}, None,
                         {"id": i, "a": i % 1000, "b": f"text-{i}", "c": f"{i * 1.5}",
                          "d": "2026-11-27T17:00:00.000000Z"})
        out.append(encode_event(ev, "postgresql", "bench", 1_764_260_000_500 + i // 50_000))
    return out


def run(w: ChangeLogWriter, evs: list[Encoded], batch: int) -> tuple[float, float, float]:
    """(events/s, appending thread's CPU us/event, process CPU us/event)."""
    t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
    for s in range(0, len(evs), batch):
        w.append(evs[s:s + batch], Checkpoint(PgPosition(Lsn(100 + s), 0, Lsn(101 + s), 1)))
    wall = time.perf_counter() - t0
    n = len(evs)
    return n / wall, 1e6 * (time.thread_time() - c0) / n, 1e6 * (time.process_time() - p0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    assert kafka_native.writer_available(), "the native Kafka writer is not built"
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        from pydblog.devtools.kafka import KafkaBroker

        broker = KafkaBroker(optimize=True).start()
        bootstrap = broker.bootstrap
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-kwriter-"))
    runs: dict[str, list[tuple[float, float, float]]] = {"embedded": [], "kafka python": [],
                                                         "kafka native": []}
    try:
        for r in range(args.rounds):
            evs = events(args.events, 1000 * (r + 1))
            names = list(runs)
            for name in names[r % 3:] + names[:r % 3]:
                d = work / uuid.uuid4().hex[:8]
                w: ChangeLogWriter
                if name == "embedded":
                    w = SqliteChangeLog(d)
                else:
                    kafka_native._write_state = "ready" if name == "kafka native" else "unavailable"
                    w = KafkaChangeLog(LogConfig(type="kafka", path=str(d), bootstrap_servers=bootstrap,
                                                 topic_prefix=f"w{uuid.uuid4().hex[:8]}"))
                    assert w._native == (name == "kafka native")
                runs[name].append(run(w, evs, args.batch))
                w.close()
                rate, thread_us, proc_us = runs[name][-1]
                print(f"round {r + 1} {name:13s} {rate:10,.0f} events/s; appending thread "
                      f"{thread_us:5.2f} us/event, process {proc_us:5.2f} us/event", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    print(f"medians of {args.rounds} rounds, {args.events:,} events in batches of {args.batch:,}:")
    for name, rs in runs.items():
        print(f"  {name:13s} {statistics.median(x[0] for x in rs):10,.0f} events/s; appending "
              f"thread {statistics.median(x[1] for x in rs):5.2f} us/event, process "
              f"{statistics.median(x[2] for x in rs):5.2f} us/event")
    results.write("kafka_writer", {
        "events": args.events, "batch": args.batch, "rounds": args.rounds,
        "broker": "KAFKA_BOOTSTRAP_SERVERS" if broker is None else "tansu",
        "median_events_per_s": {n: round(statistics.median(x[0] for x in rs))
                                for n, rs in runs.items()},
        "median_thread_us_per_event": {n: round(statistics.median(x[1] for x in rs), 2)
                                       for n, rs in runs.items()},
        "median_process_us_per_event": {n: round(statistics.median(x[2] for x in rs), 2)
                                        for n, rs in runs.items()},
    })


if __name__ == "__main__":
    main()
