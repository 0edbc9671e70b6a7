"""Benchmark: capture into Kafka against capture into the embedded log, same load, one run.

One throwaway PostgreSQL, one Apache Kafka broker (``pydblog.devtools.kafka``: one KRaft
node, default settings, 512 MB heap; or KAFKA_BOOTSTRAP_SERVERS):
 (a) `dblog run` with the embedded log drains N inserts from its own slot (from its
     first event in the log to its last);
 (b) `dblog run` with [log] type = "kafka" drains the same N inserts from another slot
     (until the checkpoint topic's last valid commit covers them);
     (a) and (b) run in ``--rounds`` alternating rounds (single runs on a 2-core shared
     VM swing 1.5 x): round k loads N new rows once, then (a) and (b) each drain them
     (each `dblog run` reads its own slot), (a) first in even rounds, (b) first in odd
     ones; each drain is timed from the first event of the round in its log to the
     last. Printed per round, then the medians of (a), (b) and of the per-round ratios
     (b)/(a), with the ratios' min and max;
 (c) commit -> log latency at a steady ~5k events/s (10-row transactions): (c0) a bare
     transactional confluent-kafka loop on the same broker (the raw baseline: stamp ->
     its commit returned), then `dblog run` into the embedded log and into Kafka: the
     capture's own commit -> log histogram (from its /metrics; for Kafka: until the
     transaction holding the event committed) and CPU per process; then Kafka again with
     `dblog tail -f`'s reader (``KafkaChangeLogReader.follow``) following the log
     (``--no-followers``: not; ``--plain-follower``: and a plain consumer, see
     ``steady``);
 (d) `dblog sync --available-now` from the Kafka log into Delta, one cold process: the
     drain rate (first batch planned -> last batch committed, from the Spark
     checkpoint's offsets/commits files: the sync's throughput), the start-up before it
     (Spark session, from the job's log; query start and first plan) and the wall time
     with process start and exit (``sync_timing``).
(c) and (d) run once, after the rounds.

How the end of a drain is seen: both sides are polled every 10 ms with a probe that
costs next to nothing in this process. (a): ``SqliteChangeLogReader.next_offset()``, a
local SQLite read (~0.01 ms). (b): NOT ``KafkaChangeLogReader.next_offset()``, which is
a broker read (two list-offsets requests, then a fetch to the checkpoint topic's end):
on Tansu it took 12 ms with the captures idle and p50 18 / p90 32 / max 51 ms while a
capture wrote (measured 2026-11-27 on this VM), so polled every 10 ms it saw the end
one 28-40 ms period late on average instead of 5 ms (biased against Kafka, ~0.5 % of
a 4 s drain) and kept the broker busy with ~30 probes/s. Instead a read_committed
consumer follows the checkpoint topic (librdkafka fetches in the background,
fetch.wait.max.ms 5; paused outside (b)'s drains) and each poll applies the commit
messages it queued to a ``CommitLog``, as the reader does: a commit is seen within
~5 ms of its transaction's end plus the 10 ms poll. After each (b) drain
``KafkaChangeLogReader.next_offset()`` must agree (not timed); the run prints what
both probes and one reader call cost.

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/kafka.py [--rows 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg

from pydblog.changelog.kafka.protocol import CommitLog, CommitRecord
from pydblog.changelog.kafka.reader import KafkaChangeLogReader
from pydblog.changelog.kafka.topics import checkpoint_topic
from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.config import LogConfig
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.proc import thread_cpu


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
        f'publication = "benchpub"\n[api]\nlisten = "127.0.0.1:0"\n'
        f'[log]\npath = "{d / "data"}"\n{log}\n'
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


class Probe:
    """A drain's end probe: ``count()`` is the events the log holds (see the module
    docstring); ``costs`` the seconds each call took."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count
        self.costs: list[float] = []

    def count(self) -> int:
        t = time.perf_counter()
        n = self._count()
        self.costs.append(time.perf_counter() - t)
        return n

    def active(self, on: bool) -> None:
        """Follow the log (True) or stop (False) between drains."""


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads they start later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cpus)


KAFKA_OTHERS = "PostgreSQL, both captures and this bench"


def add_broker_cpus(ap: argparse.ArgumentParser, others: str) -> None:
    """``--broker-cpus N[,N...]``: the broker on those CPUs, ``others`` on the rest
    (``isolate_broker``)."""
    ap.add_argument("--broker-cpus", type=lambda v: {int(c) for c in v.split(",")},
                    metavar="N[,N...]",
                    help=f"run the broker on these CPUs and {others} on the others (a broker "
                         "on machines of its own, as in production)")


def isolate_broker(broker_cpus: set[int], others: str) -> None:
    """Keep this process, and so the databases and every `dblog run` it starts
    (``others``, as printed), off ``broker_cpus`` (the broker's, ``started_broker``): a
    broker on machines of its own, as in production, on one machine."""
    mine = os.sched_getaffinity(0)
    capture = mine - broker_cpus
    if not capture or not broker_cpus <= mine:
        raise SystemExit(f"--broker-cpus {sorted(broker_cpus)}: must be some, not all, of this "
                         f"machine's CPUs {sorted(mine)}")
    os.sched_setaffinity(0, capture)
    print(f"broker on CPUs {sorted(broker_cpus)}; {others} on {sorted(capture)}", flush=True)


@contextlib.contextmanager
def bench_broker(cpus: set[int] | None = None) -> Iterator[tuple[str, int | None]]:
    """The bootstrap servers of ``KAFKA_BOOTSTRAP_SERVERS`` (and no pid), else those and
    the pid of an Apache Kafka broker started for the run (``started_broker``: warm, as a
    user's broker runs) and stopped after it."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
    if bootstrap:
        yield bootstrap, None
        return
    broker = started_broker(cpus)
    try:
        yield broker.bootstrap, broker.pid
    finally:
        broker.stop()


def started_broker(cpus: set[int] | None = None) -> Any:
    """A ``KafkaBroker`` (one KRaft node, the optimizing JIT on; on ``cpus`` only if
    given: ``isolate_broker``) after ``warm``: a broker
    that users run has compiled its hot paths long ago; a fresh one spends most of a core
    of the first minute of load in its JIT compiler threads (a bare transactional loop
    measured 8.7 ms of broker CPU per transaction in its first 10 s, 1.4 ms after 60 s),
    which would be charged to whatever the benchmark measures then."""
    from pydblog.devtools.kafka import KafkaBroker

    broker = KafkaBroker(optimize=True).start()
    try:
        assert broker.pid is not None
        if cpus:
            pin(broker.pid, cpus)
        warm(broker.bootstrap, broker.pid)
    except BaseException:
        broker.stop()
        raise
    return broker


def warm(bootstrap: str, pid: int, min_s: float = 30.0, max_s: float = 180.0) -> None:
    """Run a capture-shaped load through the broker until its JIT compiler threads are
    quiet: transactions of 10 to 5,000 lz4-compressed records with the session-tag header
    over four partitions, a checkpoint record each, followed by a read_committed consumer; at least
    ``min_s``, then until the compiler threads used under 3 % of a core over 5 s (at most
    ``max_s``). Prints how long it took."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    t0 = time.monotonic()
    topic = f"warm{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, 4, 1), NewTopic(topic + ".cp", 1, 1)]).values():
        f.result()
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic,
                         "enable.idempotence": True, "acks": "all", "linger.ms": 2,
                         "compression.type": "lz4", "partitioner": "murmur2_random"})
    producer.init_transactions()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    consumer.subscribe([topic, topic + ".cp"])
    stop = threading.Event()

    def follow() -> None:
        while not stop.is_set():
            consumer.consume(10_000, 0.05)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    headers: list[tuple[str, str | bytes | None]] = [("dblog.writer", b"w" * 12)]

    def jit() -> float:
        return sum(v for k, v in thread_cpu(pid).items() if "Compiler" in k)

    mark, mark_t, n, sizes = jit(), time.monotonic(), 0, (10, 10, 10, 200, 5_000)
    quiet = False
    try:
        while time.monotonic() - t0 < max_s:
            producer.begin_transaction()
            for i in range(sizes[n % len(sizes)]):
                value = orjson.dumps({"offset": n * 10_000 + i, "op": "c", "after": {
                    "id": i, "a": i % 1000, "b": f"text-{i}", "c": i * 1.5}})
                producer.produce(topic, value, str(i).encode(), headers=headers)
            producer.flush()
            producer.produce(topic + ".cp", b"{}", b"cp")
            producer.flush()
            producer.commit_transaction()
            n += 1
            now = time.monotonic()
            if now - mark_t >= 5.0:
                used = jit()
                share = (used - mark) / (now - mark_t)
                mark, mark_t = used, now
                if now - t0 >= min_s and share < 0.03:
                    quiet = True
                    break
    finally:
        stop.set()
        follower.join()
        consumer.close()
        admin.delete_topics([topic, topic + ".cp"])
    print(f"broker warm-up: {n} transactions in {time.monotonic() - t0:.0f} s, JIT compiler "
          f"threads {'quiet' if quiet else 'still busy'}", flush=True)


class KafkaEnd(Probe):
    """The events covered by the Kafka log's last valid commit, from a read_committed
    consumer of the checkpoint topic: its queued messages applied to a ``CommitLog``
    (as ``KafkaChangeLogReader`` applies them), no broker request in ``count()``."""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        super().__init__(self._applied)
        self.commits = CommitLog(track=False)
        self.tp = TopicPartition(checkpoint_topic(prefix), 0, 0)
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False, "isolation.level": "read_committed",
            "fetch.wait.max.ms": 5})
        self.consumer.assign([self.tp])
        self.consumer.pause([self.tp])

    def _applied(self) -> int:
        for m in self.consumer.consume(10_000, 0):
            value = m.value() if m.error() is None else None
            if value is not None:
                self.commits.apply(CommitRecord.from_bytes(value, m.offset() or 0))
        return self.commits.next_offset

    def active(self, on: bool) -> None:
        (self.consumer.resume if on else self.consumer.pause)([self.tp])

    def close(self) -> None:
        self.consumer.close()


def drain(cfg: Path, done: int, target: int, probe: Probe) -> float:
    """Events/s of a `dblog run` draining its log from ``done`` to ``target`` events,
    from the first poll past ``done`` to the first at ``target``."""
    probe.active(True)
    deadline = time.monotonic() + 60
    while (n := probe.count()) < done:  # the probe caught up with the earlier drains
        assert time.monotonic() < deadline, f"{cfg}: the probe sees {n} of {done} events"
        time.sleep(0.01)
    proc = start(cfg)
    first: tuple[float, int] | None = None
    try:
        while True:
            time.sleep(0.01)
            n = probe.count()
            if first is None and n > done:
                first = (time.perf_counter(), n)
            if n >= target:
                break
            if proc.poll() is not None:
                raise SystemExit(f"dblog run --config {cfg} exited ({proc.returncode}) at "
                                 f"{n} of {target} events")
        assert first is not None
        return (target - first[1]) / (time.perf_counter() - first[0])
    finally:
        proc.terminate()
        proc.wait()
        probe.active(False)


def ms(xs: list[float]) -> str:
    """p50 / p90 / max of durations in seconds, in ms."""
    xs = sorted(xs)
    return (f"p50 {statistics.median(xs) * 1000:.2f} / p90 {xs[int(len(xs) * 0.9)] * 1000:.2f} / "
            f"max {xs[-1] * 1000:.2f} ms")


def pct(xs: list[float], what: str = "events") -> str:
    if not xs:
        return f"no {what}"
    xs = sorted(xs)
    return (f"p50 {statistics.median(xs):.1f} ms, p90 {xs[int(len(xs) * 0.9)]:.1f} ms, "
            f"p99 {xs[int(len(xs) * 0.99)]:.1f} ms, max {xs[-1]:.1f} ms ({len(xs)} {what})")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> dict[str, float]:
    """The capture's /metrics: histogram buckets of commit -> log and append time."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("dblog_commit_to_log_seconds_", "dblog_changelog_append_seconds_",
                            "dblog_changelog_next_offset")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def histogram(before: dict[str, float], after: dict[str, float], metric: str) -> str:
    """Observations in the window: share within 100 ms and the buckets of p50/p99."""
    buckets = sorted(
        (float(k.split('le="')[1].split('"')[0]), after[k] - before.get(k, 0.0))
        for k in after if k.startswith(metric + "_bucket"))
    total = buckets[-1][1] if buckets else 0.0
    if not total:
        return "no observations"
    within = next(n for le, n in buckets if le >= 0.1)

    def at(q: float) -> str:
        le = next(le for le, n in buckets if n >= q * total)
        return f"<= {le * 1000:g} ms"

    return (f"{within / total:.1%} of {total:.0f} batches within 100 ms; p50 {at(0.5)}, "
            f"p99 {at(0.99)}")


def bare_loop(bootstrap: str, seconds: float, rate: int, consumer: bool) -> str:
    """The raw Kafka path on this broker: one transactional producer commits whatever
    accumulated (group commit, as the capture does: data, flush, a checkpoint message,
    commit) while a thread stamps 10 messages every 10/rate s. Latency = stamp ->
    commit_transaction returned, of each commit's oldest message (what the capture's
    commit -> log histogram measures); with ``consumer``, a plain consumer follows too
    and stamp -> consumed is printed."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"bare{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, 1, 1), NewTopic(topic + ".cp", 1, 1)]).values():
        fut.result()
    time.sleep(0.5)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic, "linger.ms": 2,
                  "acks": "all", "enable.idempotence": True, "compression.type": "lz4"})
    p.init_transactions(30)
    pending: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()
    lat: list[float] = []

    def follow() -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "fetch.wait.max.ms": 5,
                      "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, 0)])
        while not stop.is_set():
            for m in c.consume(1000, 0.01):
                if m.error() is None:
                    lat.append(time.time() * 1000 - float(m.value() or b"0"))
        c.close()

    def stamp() -> None:
        nxt = time.perf_counter()
        while not stop.is_set():
            now = str(time.time() * 1000).encode()
            with lock:
                pending.extend([now] * 10)
            nxt += 10 / rate
            time.sleep(max(0.0, nxt - time.perf_counter()))

    threads = [threading.Thread(target=stamp)] + ([threading.Thread(target=follow)] if consumer else [])
    for t in threads:
        t.start()
    t_end = time.perf_counter() + seconds
    committed: list[float] = []
    while time.perf_counter() < t_end:
        with lock:
            batch = pending[:]
            pending.clear()
        if not batch:
            time.sleep(0.001)
            continue
        p.begin_transaction()
        for v in batch:
            p.produce(topic, v, b"k")
        p.flush(30)
        p.produce(topic + ".cp", b"cp")
        p.commit_transaction(30)
        committed.append(time.time() * 1000 - float(batch[0]))
    time.sleep(1)
    stop.set()
    for t in threads:
        t.join()
    out = f"{len(committed)} commits; stamp -> committed (each commit's oldest) {pct(committed, 'commits')}"
    return out + (f"; stamp -> consumed {pct(lat)}" if consumer else "")


def steady(dsn: str, cfg: Path, d: Path, args: argparse.Namespace, base: int,
           kreader: KafkaChangeLogReader | None, bootstrap: str, prefix: str,
           broker: object, followers: tuple[str, ...] = ()) -> list[str]:
    """`dblog run` under ``steady_rate`` events/s (10-row transactions): the capture's
    own commit -> log histogram (per batch, its oldest event: a source commit until the
    change-log commit that holds it returned), CPU per process, and for Kafka the
    ``followers``: "tail", ``KafkaChangeLogReader.follow`` (checkpoint-validated, as
    `dblog tail -f` reads), and "plain", a read_committed consumer of the data topic
    with a 5 ms fetch wait (on Tansu a pathological one: its last stable offset is 0
    while a transaction is open, and the capture's transactions follow each other, so
    most fetches come back empty at once and the consumer asks again)."""
    from confluent_kafka import Consumer, TopicPartition

    from pydblog.api.capture import read_api_address
    from pydblog.changelog.kafka.topics import data_topic

    proc = start(cfg)
    deadline = time.monotonic() + 60
    while (url := read_api_address(d / "data")) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert url is not None, "dblog run did not start its API"
    last, still = -1.0, 0
    while still < 10:  # caught up (the other capture's steady load is in this slot too)
        time.sleep(0.2)
        now = scrape(url).get("dblog_changelog_next_offset", 0.0)
        still = still + 1 if now == last else 0
        last = now
    stop = threading.Event()
    plain: list[tuple[float, float]] = []
    validated: list[tuple[float, float]] = []

    def follow_plain() -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 5})
        topic = data_topic(prefix, "public.bench")
        c.assign([TopicPartition(topic, 0, -1)])  # from the end
        while not stop.is_set():
            for m in c.consume(1000, 0.01):
                if m.error() is None and m.value() is not None:
                    ts = orjson.loads(m.value() or b"{}")["source"]["ts_ms"]
                    plain.append((time.time() * 1000 - ts, ts))
        c.close()

    # Where the follower starts: the log's end before the load (read here, not in the
    # thread: a reader far behind reads thousands of checkpoint messages first, and a
    # follower starting after the load would wait for a row that came before it).
    tail = KafkaChangeLogReader(kreader.cfg) if kreader is not None and "tail" in followers else None
    first = tail.next_offset() if tail is not None else 0

    def follow_reader() -> None:  # as `dblog tail -f` follows (its poll: 0.1 s)
        assert tail is not None
        for r in tail.follow(first, 0.1):
            validated.append((time.time() * 1000 - r.ts_ms, r.ts_ms))
            if stop.is_set():  # (the row inserted after the load wakes it)
                return

    threads = [threading.Thread(target=f, daemon=True)
               for name, f in (("plain", follow_plain), ("tail", follow_reader))
               if kreader is not None and name in followers]
    for t in threads:
        t.start()
    time.sleep(1)
    pids = {"dblog run": proc.pid, "bench (load + followers)": os.getpid()}
    broker_pid = getattr(broker, "pid", None)
    if kreader is not None and broker_pid is not None:
        pids["kafka broker"] = broker_pid
    before = scrape(url)
    cpu0 = {k: cpu_s(p) for k, p in pids.items()}
    t0 = time.time()
    per_tx = 10
    interval = per_tx / args.steady_rate
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
    time.sleep(1)
    after = scrape(url)
    wall = time.time() - t0
    cpu = {k: round(100 * (cpu_s(p) - cpu0[k]) / wall) for k, p in pids.items()}
    time.sleep(1)
    stop.set()
    with psycopg.connect(dsn, autocommit=True) as conn:  # wakes the follower
        conn.execute("INSERT INTO bench SELECT %s, 1, 'x', 1, now()", (base + i,))
    for t in threads:
        t.join(60)
        if t.is_alive():  # (a daemon thread: left as it is)
            print(f"    (a follower did not stop within 60 s: {len(validated)} events so far)")
    if tail is not None and not any(t.is_alive() for t in threads):
        tail.close()
    proc.terminate()
    proc.wait()
    load = os.getloadavg()
    out = [f"commit -> {d.name} log (capture's histogram): "
           f"{histogram(before, after, 'dblog_commit_to_log_seconds')}",
           f"append (one change-log commit): {histogram(before, after, 'dblog_changelog_append_seconds')}",
           f"CPU % of one core: {cpu}; load average {load[0]:.1f}"]
    late = t0 * 1000 + 2000  # the first 2 s of load excluded
    if "plain" in followers:
        out.append(f"commit -> plain consumer: {pct([x for x, t in plain if t > late])}")
    if "tail" in followers:
        out.append(f"commit -> KafkaChangeLogReader.follow: {pct([x for x, t in validated if t > late])}")
    return out


def sync_timing(cfg: Path, checkpoint: Path, total: int, baseline: float) -> str:
    """(d): one `dblog sync --available-now` process, timed from outside: its wall time;
    the Spark session's start (the job's "Spark session started" log line); the first
    batch planned (Spark writes ``offsets/0`` before it reads the batch) and the last
    batch committed (``commits/N``, written once the sinks applied it). ``baseline``:
    (a)'s median, for the drain as a ratio (a gauge of the machine's load in this run)."""
    import re
    from datetime import datetime

    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "pydblog", "sync", "--config", str(cfg),
                          "--available-now"], capture_output=True, text=True)
    t1 = time.time()
    if res.returncode:
        raise SystemExit(f"dblog sync failed ({res.returncode}):\n{res.stderr[-3000:]}")
    session = None
    for line in res.stderr.splitlines():
        m = re.match(r"(\S+ \S+) INFO pydblog.sync: Spark session started", line)
        if m:
            session = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - t0
    first = checkpoint / "offsets" / "0"
    planned = first.stat().st_mtime
    commits = [f for f in (checkpoint / "commits").iterdir() if f.name.isdigit()]
    committed = max(f.stat().st_mtime for f in commits)
    drain, start = committed - planned, planned - t0
    # after the first batch (a cold process's first read and first Python planning
    # workers): the rate of a running job; the first batch's end is its offset's ``seq``
    first_end = orjson.loads(first.read_text().splitlines()[-1])["seq"]
    rest = committed - (checkpoint / "commits" / "0").stat().st_mtime
    warm = f"; {(total - first_end) / rest:,.0f} after the first batch" if len(commits) > 1 else ""
    ready = f"process and Spark session {session:.1f} s, " if session is not None else ""
    return (f"(d) dblog sync --available-now, Kafka -> Delta, {total:,} events in {len(commits)} "
            f"batches: drain {total / drain:,.0f} events/s = {total / drain / baseline:.2f} x (a) "
            f"({drain:.1f} s from the first batch's "
            f"plan to the last batch's commit: the sync's throughput{warm}); start-up {start:.1f} s "
            f"({ready}query start and first plan {start - (session or 0):.1f} s; once per process: a "
            f"long-running job pays it once); wall {t1 - t0:.1f} s with process start and "
            f"exit = {total / (t1 - t0):,.0f} events/s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000, help="rows loaded per round")
    ap.add_argument("--tx", type=int, default=10, help="transactions per round's load")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of (a) and (b), alternating which goes first")
    ap.add_argument("--steady-seconds", type=float, default=20.0)
    ap.add_argument("--steady-rate", type=int, default=5000)
    ap.add_argument("--sync", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--followers", action=argparse.BooleanOptionalAction, default=True,
                    help="(c): a second Kafka pass with `dblog tail -f`'s reader following the log")
    ap.add_argument("--plain-follower", action="store_true",
                    help="(c): and a plain read_committed consumer (see steady(); on Tansu it "
                         "loads the broker, not only measures it)")
    add_broker_cpus(ap, KAFKA_OTHERS)
    ap.add_argument("--kafka-setting", action="append", default=[], metavar="KEY=VALUE",
                    help="a [log.kafka] setting of the Kafka capture (repeatable), e.g. "
                         "compression.type=none")
    args = ap.parse_args()
    if args.rounds < 1 or args.tx < 1 or args.rows < args.tx or args.rows % args.tx:
        ap.error(f"--rows {args.rows} must be a multiple of --tx {args.tx} (each transaction "
                 f"inserts --rows / --tx rows) and --rounds {args.rounds} at least 1")
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-kafka-"))
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if args.broker_cpus:
        isolate_broker(args.broker_cpus, KAFKA_OTHERS)
    if not bootstrap:
        broker = started_broker(args.broker_cpus)
        bootstrap = broker.bootstrap
    prefix = f"b{uuid.uuid4().hex[:8]}"
    kafka_keys = f'type = "kafka"\nbootstrap_servers = "{bootstrap}"\ntopic_prefix = "{prefix}"'
    if args.kafka_setting:
        kafka_keys += "\n[log.kafka]\n" + "\n".join(
            f'"{k}" = "{v}"' for k, _, v in (kv.partition("=") for kv in args.kafka_setting))
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
            emb_reader = SqliteChangeLogReader(work / "emb" / "data")
            emb_end = Probe(emb_reader.next_offset)
            kaf_end = KafkaEnd(bootstrap, prefix)
            log_cfg = LogConfig(type="kafka", path=str(work / "kaf" / "data"),
                                bootstrap_servers=bootstrap, topic_prefix=prefix)
            kreader = KafkaChangeLogReader(log_cfg)
            print(f"{args.rounds} rounds of {args.rows:,} rows ({args.tx} transactions each)")
            rates: dict[str, list[float]] = {"a": [], "b": []}
            reader_costs: list[float] = []
            for k in range(args.rounds):
                load(dsn, "bench", k * args.rows, args.rows, args.tx)
                done, target = k * args.rows, (k + 1) * args.rows
                order = ("a", "b") if k % 2 == 0 else ("b", "a")
                for side in order:
                    if side == "a":
                        rates["a"].append(drain(emb, done, target, emb_end))
                    else:
                        rates["b"].append(drain(kaf, done, target, kaf_end))
                        t = time.perf_counter()
                        seen = kreader.next_offset()
                        reader_costs.append(time.perf_counter() - t)
                        assert seen >= target, f"KafkaChangeLogReader sees {seen} of {target}"
                a, b = rates["a"][-1], rates["b"][-1]
                print(f"round {k + 1} ({order[0]} first): (a) embedded {a:,.0f} events/s, "
                      f"(b) Kafka {b:,.0f} events/s, (b)/(a) {b / a:.2f}", flush=True)
            ratios = [b / a for a, b in zip(rates["a"], rates["b"], strict=True)]
            print(f"(a) dblog run -> embedded log: median {statistics.median(rates['a']):,.0f} "
                  f"events/s")
            print(f"(b) dblog run -> Kafka: median {statistics.median(rates['b']):,.0f} events/s")
            print(f"(b)/(a): median {statistics.median(ratios):.2f} of {len(ratios)} rounds "
                  f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
            for _ in range(20):
                t = time.perf_counter()
                kreader.next_offset()
                reader_costs.append(time.perf_counter() - t)
            print(f"end probes, per call: (a) SqliteChangeLogReader.next_offset() "
                  f"{ms(emb_end.costs)}; (b) checkpoint-topic consumer {ms(kaf_end.costs)}; "
                  f"KafkaChangeLogReader.next_offset() (not the probe) {ms(reader_costs)}")
            kaf_end.close()

            # (c) commit -> Kafka latency at a steady rate: the raw baseline (a bare
            # transactional producer loop on the same broker), the embedded log, Kafka.
            # The figure is (c) kafka's commit -> log histogram without followers
            # (a source commit until the Kafka transaction holding it committed); the
            # followers' pass shows what a reader adds to the broker's load and sees.
            bare = bare_loop(bootstrap, args.steady_seconds, args.steady_rate, args.plain_follower)
            print(f"(c0) bare confluent-kafka transactional loop, {args.steady_rate} msgs/s: "
                  f"{bare}")
            base = args.rounds * args.rows + 10
            passes: list[tuple[str, Path, tuple[str, ...]]] = [("embedded", emb, ()), ("kafka", kaf, ())]
            if args.followers:
                passes.append(("kafka", kaf, ("tail", "plain") if args.plain_follower else ("tail",)))
            for name, cfg, followers in passes:
                res = steady(dsn, cfg, work / ("emb" if name == "embedded" else "kaf"),
                             args, base, kreader if name == "kafka" else None, bootstrap, prefix,
                             broker, followers)
                base += 10_000_000
                with_ = f", followed by {' and '.join(followers)}" if followers else ""
                print(f"(c) {name}, {args.steady_rate} events/s for {args.steady_seconds:.0f} s{with_}:")
                for line in res:
                    print(f"    {line}")
            total = kreader.next_offset()
            kreader.close()
            emb_reader.close()

            if args.sync:  # (d) dblog sync from Kafka into Delta
                sync_cfg = work / "kaf" / "sync.toml"
                sync_cfg.write_text(kaf.read_text() + (
                    f'\n[sync]\ncheckpoint = "{work / "cp"}"\ntrigger = "available-now"\n'
                    f'[[sync.sinks]]\ntype = "delta"\npath = "{work / "lake"}"\n'))
                print(sync_timing(sync_cfg, work / "cp", total, statistics.median(rates["a"])))
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
