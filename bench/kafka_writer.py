"""Benchmark: the change-log writer alone, the same stream events appended to the embedded
log, to Kafka by the wire producer (the default: records encoded in C into pydblog's own
record batches), by librdkafka's producer fed from C (``kafka_native``, ``[log] producer
= "librdkafka"``) and by librdkafka's producer fed from Python.

No database: ``--events`` insert events of the shape of ``bench/kafka.py``'s table are
encoded once, then appended in batches of ``--batch`` (the capture's default
``batch_max_events``) by each writer in turn, for ``--rounds`` rounds (the order rotates
each round). Per writer: events/s (wall) and CPU microseconds per event of the appending
thread (the thread that competes with the stream's decoding for the GIL) and of the whole
process (librdkafka's threads included) and, for a broker this bench started, the
broker's CPU per event. One Apache Kafka broker (devtools.kafka), or
KAFKA_BOOTSTRAP_SERVERS. ``--compression C`` (repeatable) adds a writer with
``[log.kafka] compression.type = C`` per value, ``--setting key=value`` (repeatable) one
with that ``[log.kafka]`` setting, in the same rotation (the wire producer where it
speaks the setting, else librdkafka's fed from C).

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
from kafka import add_broker_cpus  # bench/kafka.py
from pydblog.changelog import kafka_native
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.config import KafkaSetting, LogConfig
from pydblog.events import ChangeEvent, Encoded, Op, encode_event
from pydblog.ports import ChangeLogWriter, Checkpoint
from pydblog.positions import Lsn, PgPosition

BROKER_OTHERS = "the writers"


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


def cpu_s(pid: int | None) -> float:
    """A process's CPU seconds so far (0 when unknown)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(w: ChangeLogWriter, evs: list[Encoded], batch: int,
        broker_pid: int | None = None) -> tuple[float, float, float, float]:
    """(events/s, appending thread's CPU us/event, process CPU us/event, broker CPU
    us/event)."""
    t0, c0, p0, b0 = time.perf_counter(), time.thread_time(), time.process_time(), cpu_s(broker_pid)
    for s in range(0, len(evs), batch):
        w.append(evs[s:s + batch], Checkpoint(PgPosition(Lsn(100 + s), 0, Lsn(101 + s), 1)))
    wall = time.perf_counter() - t0
    n = len(evs)
    return (n / wall, 1e6 * (time.thread_time() - c0) / n, 1e6 * (time.process_time() - p0) / n,
            1e6 * (cpu_s(broker_pid) - b0) / n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compression", action="append", default=[],
                    help="also a native writer with this compression.type (repeatable)")
    ap.add_argument("--setting", action="append", default=[],
                    help="also a native writer with this [log.kafka] key=value (repeatable)")
    add_broker_cpus(ap, BROKER_OTHERS)
    args = ap.parse_args()
    assert kafka_native.writer_available(), "the native Kafka writer is not built"
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        from kafka import isolate_broker, started_broker  # bench/kafka.py

        if args.broker_cpus:
            isolate_broker(args.broker_cpus, BROKER_OTHERS)
        broker = started_broker(args.broker_cpus)
        bootstrap = broker.bootstrap
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-kwriter-"))
    runs: dict[str, list[tuple[float, float, float, float]]] = {
        "embedded": [], "kafka wire": [], "kafka native": [], "kafka python": [],
        **{f"native {c}": [] for c in args.compression},
        **{f"native {kv}": [] for kv in args.setting}}
    broker_pid = broker.pid if broker is not None else None
    try:
        for r in range(args.rounds):
            evs = events(args.events, 1000 * (r + 1))
            names = list(runs)
            k = r % len(names)
            for name in names[k:] + names[:k]:
                d = work / uuid.uuid4().hex[:8]
                w: ChangeLogWriter
                if name == "embedded":
                    w = SqliteChangeLog(d)
                else:
                    native = name != "kafka python"
                    kafka_native._write_state = "ready" if native else "unavailable"
                    extra: dict[str, KafkaSetting] = {}
                    variant = name.removeprefix("native ")
                    if name.startswith("native ") and "=" in variant:
                        key, _, value = variant.partition("=")
                        extra[key] = ({"true": True, "false": False}.get(value.lower(), value)
                                      if not value.isdigit() else int(value))
                    elif name.startswith("native "):
                        extra["compression.type"] = variant
                    w = KafkaChangeLog(LogConfig(
                        type="kafka", path=str(d), bootstrap_servers=bootstrap,
                        topic_prefix=f"w{uuid.uuid4().hex[:8]}", kafka=extra,
                        producer="librdkafka" if name == "kafka native" else "wire"))
                    assert w._native == native
                    if not name.startswith("native "):
                        assert (w._wire is not None) == (name == "kafka wire"), name
                runs[name].append(run(w, evs, args.batch, broker_pid))
                w.close()
                rate, thread_us, proc_us, broker_us = runs[name][-1]
                print(f"round {r + 1} {name:13s} {rate:10,.0f} events/s; appending thread "
                      f"{thread_us:5.2f} us/event, process {proc_us:5.2f} us/event, broker "
                      f"{broker_us:5.2f} us/event", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    print(f"medians of {args.rounds} rounds, {args.events:,} events in batches of {args.batch:,}:")
    for name, rs in runs.items():
        print(f"  {name:13s} {statistics.median(x[0] for x in rs):10,.0f} events/s; appending "
              f"thread {statistics.median(x[1] for x in rs):5.2f} us/event, process "
              f"{statistics.median(x[2] for x in rs):5.2f} us/event, broker "
              f"{statistics.median(x[3] for x in rs):5.2f} us/event")
    results.write("kafka_writer", {
        "events": args.events, "batch": args.batch, "rounds": args.rounds,
        "broker": "KAFKA_BOOTSTRAP_SERVERS" if broker is None else "apache-kafka",
        "median_broker_us_per_event": {n: round(statistics.median(x[3] for x in rs), 2)
                                       for n, rs in runs.items()},
        "median_events_per_s": {n: round(statistics.median(x[0] for x in rs))
                                for n, rs in runs.items()},
        "median_thread_us_per_event": {n: round(statistics.median(x[1] for x in rs), 2)
                                       for n, rs in runs.items()},
        "median_process_us_per_event": {n: round(statistics.median(x[2] for x in rs), 2)
                                        for n, rs in runs.items()},
    })


if __name__ == "__main__":
    main()
