"""Benchmark of `dblog sync` (see docs/sync.md, "Benchmarks").

1. drain: N change events (inserts/updates/deletes over 3 tables) waiting in an embedded
   change log, applied with ``trigger(availableNow=True)`` into Delta, then (fresh
   checkpoint) into a throwaway PostgreSQL; reports events/s of the drain (Spark session
   start excluded, query start included). The Delta drain runs twice: first as the
   process's first query (it pays Spark's cold start, JVM code
   paths and Python workers), then again into a fresh lake and checkpoint as a second
   query of the same session (a running job draining a backlog).
2. latency: a writer appends at a steady rate (default 5k events/s) while the job runs
   with a 1-second trigger into Delta; for every event, the time from its ``ts_ms``
   (when it was appended to the change log) to the end of the sink commit that applied
   it; reports p50/p99.

    .venv/bin/python bench/sync.py --events 1000000 --master 'local[2]'

4. mysql: the drain into a throwaway MariaDB through the MySQL sink (``--only mysql``),
   next to the PostgreSQL drain of the same events in the same run (``--only postgres``):
   the ratio of the two is printed.

3. kafka: the same events from a Kafka log (``--kafka-partitions``), drained as further
   queries of the warm session, alternating with the warm embedded drain (``--rounds``).
   With ``--max-events-per-trigger`` below ``--events`` every drain takes several batches
   and also prints its rate after the first batch (and that ratio), e.g.

    flock /tmp/pydblog-bench.lock .venv/bin/python -u bench/sync.py --events 1000000 \
        --max-events-per-trigger 250000 --only delta --only kafka --kafka-partitions 1
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydblog.config import Config, SyncConfig, parse_config
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.proc import cpu_seconds, tree_cpu
from pydblog.devtools.synth import SyntheticLoad, write_load
from pydblog.spark.job import BatchApplier, spark_session, start_query
from pydblog.spark.sinks import build_sink


def config(
    work: Path, name: str, sinks: list[dict[str, Any]], trigger: str, master: str, max_events: int,
    log: dict[str, Any] | None = None,
) -> Config:
    return parse_config(
        {
            "source": {"dsn": "postgresql://unused@127.0.0.1/x"},
            "log": log or {"path": str(work / "log")},
            "sync": {
                "checkpoint": str(work / f"cp-{name}"),
                "trigger": trigger,
                "master": master,
                "max_events_per_trigger": max_events,
                "sink_retries": 0,
                "sinks": sinks,
            },
        }
    )


class TimedApplier(BatchApplier):
    """Records when each batch finished and how many events it had."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.ends: list[tuple[float, int]] = []
        self.entered: float | None = None

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.entered is None:
            self.entered = time.monotonic()
        super().__call__(df, batch_id)

    def apply(self, events: Any, batch_id: int, *, dense: bool | None = None) -> None:
        before = self.events
        super().apply(events, batch_id, dense=dense)
        self.ends.append((time.monotonic(), self.events - before))


def drain(spark: Any, cfg: Config, events: int, parallelism: int | None = None) -> tuple[float, float | None]:
    """(seconds from query start to the end, events/s after the first batch). Also
    prints when the first batch reached ``foreachBatch`` (query start-up: the source's
    planner processes, the first plan) and when it was read (the executors' Python
    workers started and the first batch decoded)."""
    applier = TimedApplier(cfg.log, [build_sink(s) for s in cfg.sync.sinks], 0, 0)
    t0 = time.monotonic()
    extra = {"parallelism": parallelism} if parallelism else {}  # older job.py: no such argument
    q = start_query(spark, cfg, applier, available_now=True, **extra)
    q.awaitTermination()
    elapsed = time.monotonic() - t0
    if applier.entered is not None and applier.ends:
        print(
            f"  start-up: first batch in foreachBatch after {applier.entered - t0:.1f}s, "
            f"applied after {applier.ends[0][0] - t0:.1f}s"
        )
    for p in q.recentProgress:
        d = p.durationMs
        print(
            f"  batch {p.batchId}: trigger {d.get('triggerExecution', 0) / 1000:.1f}s "
            f"(latestOffset {d.get('latestOffset', 0) / 1000:.1f}s, planning "
            f"{d.get('queryPlanning', 0) / 1000:.1f}s, addBatch {d.get('addBatch', 0) / 1000:.1f}s)"
        )
    applier.close()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    assert applier.events == events, (applier.events, events)
    ends = applier.ends
    steady = None
    if len(ends) > 1:
        steady = sum(n for _, n in ends[1:]) / (ends[-1][0] - ends[0][0])
    return elapsed, steady


def driver_rss_mib() -> tuple[float, float]:
    """Peak RSS (VmHWM) of this Python driver and of its driver JVM (spark-submit's
    java, a child of this process), MiB."""
    def hwm(pid: int) -> float:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    jvm = 0.0
    for kid in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split():
        try:
            # the driver JVM only (a --cluster-workers master and its workers are
            # children too)
            if ("java" in Path(f"/proc/{kid}/comm").read_text()
                    and b"SparkSubmit" in Path(f"/proc/{kid}/cmdline").read_bytes()):
                jvm = max(jvm, hwm(int(kid)))
        except OSError:
            continue
    return hwm(os.getpid()), jvm


class CpuMeter:
    """CPU of the driver (this process and its driver JVM, which in local mode runs the
    executors and their Python workers too) and, on a standalone cluster, of the
    executors (the workers' processes and everything they started)."""

    def __init__(self, cluster: Any = None) -> None:
        self.cluster = cluster

    def sample(self) -> tuple[float, float]:
        me = os.getpid()
        driver = 0.0
        for kid in Path(f"/proc/{me}/task/{me}/children").read_text().split():
            try:
                if b"SparkSubmit" in Path(f"/proc/{kid}/cmdline").read_bytes():
                    driver += tree_cpu(int(kid))
            except OSError:
                continue
        driver += cpu_seconds(me)
        executors = 0.0
        if self.cluster is not None:
            executors = sum(tree_cpu(w.pid) for w in self.cluster.worker_procs)
        return driver, executors


def report(target: str, events: int, result: tuple[float, float | None]) -> None:
    s, steady = result
    extra = f"; after the first batch {steady:,.0f} events/s" if steady else ""
    py, jvm = driver_rss_mib()
    print(f"drain into {target}: {events} events in {s:.1f}s = {events / s:,.0f} events/s{extra}; "
          f"driver peak RSS: Python {py:.0f} MiB, JVM {jvm:.0f} MiB")


class LatencyApplier(BatchApplier):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.latencies: list[float] = []

    def _apply(self, packed: Any, batch_id: int, dense: bool) -> None:
        from pydblog.spark.decode import columns_schema
        from pydblog.spark.plan import events_fn, spark_schema

        schema = columns_schema(self.columns)
        ts = packed.mapInArrow(events_fn(schema), spark_schema(schema)).select("ts_ms").toArrow()
        super()._apply(packed, batch_id, dense)
        done = time.time() * 1000
        self.latencies.extend(done - t for t in ts["ts_ms"].to_pylist())


def steady_writer(log_dir: Path, rate: int, seconds: float, stop: threading.Event) -> int:
    load = SyntheticLoad(seed=99)
    load.next_id = 10**8
    tick = 0.1
    per_tick = max(1, int(rate * tick))
    start = time.monotonic()
    written = 0
    while not stop.is_set() and time.monotonic() - start < seconds:
        write_load(log_dir, load, per_tick, chunk=per_tick, first=False)
        written += per_tick
        next_at = start + written / rate
        time.sleep(max(0.0, next_at - time.monotonic()))
    return written


def latency(spark: Any, work: Path, master: str, rate: int, seconds: float) -> list[float]:
    cfg = config(
        work,
        "latency",
        [{"type": "delta", "path": str(work / "lake-latency")}],
        "1 second",
        master,
        500_000,
    )
    # Start at the end of the log: only the steady load is measured.
    from pydblog.changelog.sqlite import SqliteChangeLogReader

    reader = SqliteChangeLogReader(work / "log")
    start = reader.next_offset()
    reader.close()
    applier = LatencyApplier(cfg.log, [build_sink(s) for s in cfg.sync.sinks], 0, 0)
    spark.dataSource.register(__import__("pydblog.spark.source").spark.source.DblogDataSource)
    q = (
        spark.readStream.format("dblog")
        .option("path", cfg.log.path)
        .option("startingOffset", str(start))
        .option("packed", "true")
        .option("columns", ",".join(applier.columns))
        .load()
        .writeStream.foreachBatch(applier)
        .option("checkpointLocation", str(work / "cp-latency"))
        .trigger(processingTime="1 second")
        .start()
    )
    time.sleep(8)  # let the query warm up (first batch planning, Python workers)
    applier.latencies.clear()
    stop = threading.Event()
    written = steady_writer(work / "log", rate, seconds, stop)
    deadline = time.monotonic() + 30
    while len(applier.latencies) < written and time.monotonic() < deadline:
        time.sleep(0.2)
    q.stop()
    applier.close()
    return applier.latencies


def copy_to_kafka(log_dir: Path, log: dict[str, Any], batch: int) -> int:
    """The embedded log's events appended to a Kafka log (``batch`` events a commit, a
    schema with the commit that starts at its offset): the same events for both drains."""
    import itertools

    from pydblog.changelog.kafka.writer import KafkaChangeLog
    from pydblog.changelog.sqlite import SqliteChangeLogReader
    from pydblog.config import LogConfig
    from pydblog.events import EncodedEvent
    from pydblog.ports import Checkpoint
    from pydblog.positions import Lsn, PgPosition

    reader = SqliteChangeLogReader(log_dir)
    end = reader.next_offset()
    schemas = reader.schemas()
    cuts = sorted({o for o, _ in schemas} | set(range(0, end, batch)) | {end})
    kf = KafkaChangeLog(LogConfig.model_validate(log))
    for a, b in itertools.pairwise(cuts):
        events = [EncodedEvent(r.table, r.op, r.ts_ms, r.body.decode())
                  for r in reader.read(a, b - a)]
        kf.append(events, Checkpoint(PgPosition(Lsn(b), 0)), [s for o, s in schemas if o == a])
    kf.close()
    reader.close()
    return end


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def _log_events(log_dir: Path) -> int | None:
    from pydblog.changelog.sqlite import SqliteChangeLogReader, log_path

    if not log_path(log_dir).exists():
        return None
    reader = SqliteChangeLogReader(log_dir)
    try:
        return reader.next_offset() if reader.first_offset() == 0 else None
    finally:
        reader.close()


def clean(work: Path, *names: str) -> None:
    for name in names:
        shutil.rmtree(work / name, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--max-events-per-trigger", type=int, default=SyncConfig().max_events_per_trigger,
                    help="default: the product's ([sync] max_events_per_trigger)")
    ap.add_argument("--rate", type=int, default=5_000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--only", choices=["delta", "postgres", "mysql", "latency", "kafka"],
                    action="append")
    ap.add_argument("--kafka-partitions", type=int, action="append",
                    help="kafka: drain the same events from a Kafka log with this many "
                         "partitions per topic (repeatable; default 1 and 4)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="drain the warm embedded log and each Kafka log this many times, "
                         "alternately (ratios per round)")
    ap.add_argument("--kafka-parallelism", type=int, action="append",
                    help="kafka: drain each Kafka log once per value (repeatable, in turn each "
                         "round) with the source's numPartitions set to it instead of the "
                         "cores (a Kafka batch is cut into TASKS_PER_CORE tasks per unit)")
    ap.add_argument("--cluster-workers", type=int, default=0,
                    help="run on a standalone cluster of this many one-core workers on "
                         "loopback (devtools.sparkcluster) instead of --master")
    ap.add_argument("--worker-cpu", type=float,
                    help="with --cluster-workers: limit each worker and its executors to this "
                         "many CPUs (a cgroup each; root), standing in for workers on machines "
                         "of their own: the driver keeps the rest of the machine")
    ap.add_argument("--workdir")
    ap.add_argument(
        "--reuse-log",
        action="store_true",
        help="keep the workdir's change log if it already holds --events events",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pydblog.sync").setLevel(logging.DEBUG)
    only = set(args.only or ["delta", "postgres", "latency", "kafka"])
    work = Path(args.workdir or tempfile.mkdtemp(prefix="dblog-bench-sync-"))
    reuse = args.reuse_log and _log_events(work / "log") == args.events
    for old in (
        "log",
        "lake",
        "lake2",
        "lake-latency",
        "cp-delta",
        "cp-delta2",
        "cp-pg",
        "cp-latency",
        *(f"{d}{n}" for d in ("lake-kafka", "cp-kafka", "kafka-") for n in (1, 2, 3, 4, 8)),
    ):
        if not (reuse and old == "log"):
            shutil.rmtree(work / old, ignore_errors=True)
    t0 = time.monotonic()
    if reuse:
        end = args.events
        print(f"change log: reusing {end} events ({work})")
    else:
        end = write_load(work / "log", SyntheticLoad(seed=1), args.events, chunk=50_000)
        print(f"change log: {end} events written in {time.monotonic() - t0:.1f}s ({work})")
    # The log's writeback would otherwise run (kernel flusher threads, disk) during the
    # first drain, a cost of generating the load, not of draining it.
    t0 = time.monotonic()
    os.sync()
    print(f"sync(): {time.monotonic() - t0:.1f}s")
    t0 = time.monotonic()
    cluster = None
    if args.cluster_workers:
        from pydblog.devtools.sparkcluster import SparkCluster

        cluster = SparkCluster(workers=args.cluster_workers, cores=1,
                               cpu_quota=args.worker_cpu).start()
        args.master = cluster.url
        limit = f", each limited to {args.worker_cpu} CPUs" if args.worker_cpu else ""
        print(f"standalone cluster: {args.cluster_workers} one-core workers{limit} at {cluster.url}")
    spark = spark_session(args.master)
    print(
        f"Spark session in {time.monotonic() - t0:.1f}s (not timed below); Python processes: "
        f"{os.environ.get('PYSPARK_PYTHON')}; driver JVM options: "
        f"{spark.conf.get('spark.driver.extraJavaOptions', '') or '(none)'}"
    )
    delta_cfg = {
        name: config(
            work,
            name,
            [{"type": "delta", "path": str(work / name.replace("delta", "lake"))}],
            "available-now",
            args.master,
            args.max_events_per_trigger,
        )
        for name in ("delta", "delta2")
    }
    figures: dict[str, Any] = {"events": end, "master": args.master,
                               "max_events_per_trigger": args.max_events_per_trigger,
                               **({"cluster_workers": args.cluster_workers,
                                   "worker_cpu": args.worker_cpu} if args.cluster_workers else {})}
    meter = CpuMeter(cluster)

    def record(name: str, result: tuple[float, float | None]) -> None:
        figures[f"{name}_events_per_s"] = end / result[0]
        figures[f"{name}_after_first_batch_events_per_s"] = result[1]
        figures[f"{name}_load_1min"] = os.getloadavg()[0]

    if "delta" in only:
        # As the process's first query (cold JVM paths and Python workers), then again
        # as a second query of the same Spark session (what a running job sees when a
        # backlog builds up): into a fresh lake and checkpoint each time.
        res = drain(spark, delta_cfg["delta"], end)
        report("Delta (first query of the process: cold JVM paths and Python workers)", end, res)
        record("delta_first_query", res)
    broker = None
    kafka_logs: dict[int, dict[str, Any]] = {}
    if "kafka" in only:
        # The same events from a Kafka log (one Apache Kafka broker, or KAFKA_BOOTSTRAP_SERVERS), as
        # further queries of the warm session: compare with the warm embedded drain.
        from kafka import started_broker  # bench/kafka.py

        broker = None if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") else started_broker()
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or (broker.bootstrap if broker else "")
        for parts in args.kafka_partitions or [1, 4]:
            log = {"type": "kafka", "path": str(work / f"kafka-{parts}"),
                   "bootstrap_servers": bootstrap, "partitions": parts,
                   "topic_prefix": f"bench{parts}x{int(time.time())}"}
            t0 = time.monotonic()
            copy_to_kafka(work / "log", log, 20_000)
            print(f"copied {end} events into Kafka ({parts} partitions a topic) in "
                  f"{time.monotonic() - t0:.1f}s")
            kafka_logs[parts] = log
    try:
        # ``--rounds``: the warm embedded drain and each Kafka drain in turn, so that each
        # round's ratios compare drains taken seconds apart (the machine's load drifts).
        # With --max-events-per-trigger below --events a drain takes several batches: each
        # also reports its sustained rate after the first batch (no query start-up, no
        # first-batch costs), for the embedded log and each Kafka log alike.
        kafka_runs = {(p, par): log for p, log in kafka_logs.items()
                      for par in (args.kafka_parallelism or [None])}
        ratios: dict[tuple[int, int | None], list[float]] = {k: [] for k in kafka_runs}
        steady_ratios: dict[tuple[int, int | None], list[float]] = {k: [] for k in kafka_runs}
        for r in range(args.rounds):
            suffix = f" #{r + 1}" if args.rounds > 1 else ""
            base = None
            base_steady = None
            if "delta" in only:
                clean(work, "lake2", "cp-delta2")
                d0, e0 = meter.sample()
                s, base_steady = drain(spark, delta_cfg["delta2"], end)
                d1, e1 = meter.sample()
                base = end / s
                report(f"Delta (second query, warm session){suffix}", end, (s, base_steady))
                record(f"delta_warm{r + 1}", (s, base_steady))
                cpu = {"driver": (d1 - d0) / end * 1e6, "executors": (e1 - e0) / end * 1e6}
                figures[f"delta_warm{r + 1}_cpu_us_per_event"] = cpu
                print("  CPU per event: driver (Python and JVM"
                      + (") " if cluster is not None else ", with local mode's executors) ")
                      + f"{cpu['driver']:.2f} us"
                      + (f", executors {cpu['executors']:.2f} us" if cluster is not None else ""))
            for (parts, par), log in kafka_runs.items():
                clean(work, f"lake-kafka{parts}", f"cp-kafka{parts}")
                cfg = config(work, f"kafka{parts}",
                             [{"type": "delta", "path": str(work / f"lake-kafka{parts}")}],
                             "available-now", args.master, args.max_events_per_trigger, log)
                s, steady = drain(spark, cfg, end, par)
                label = f"{parts} partition(s) a topic" + (f", numPartitions {par}" if par else "")
                report(f"Delta from Kafka, {label} (warm session){suffix}", end, (s, steady))
                record(f"kafka_p{parts}_par{par or 'default'}_round{r + 1}", (s, steady))
                if base is not None:
                    ratios[(parts, par)].append(end / s / base)
                    extra = ""
                    if steady and base_steady:
                        steady_ratios[(parts, par)].append(steady / base_steady)
                        extra = f"; after the first batch {steady_ratios[(parts, par)][-1]:.2f} x"
                    print(f"  = {ratios[(parts, par)][-1]:.2f} x the warm embedded drain{suffix}"
                          f"{extra} (load {os.getloadavg()[0]:.1f})")
        for what, table in (("", ratios), (" after the first batch", steady_ratios)):
            for (parts, par), rs in table.items():
                if len(rs) > 1:
                    label = f"{parts} partition(s) a topic" + (f", numPartitions {par}" if par else "")
                    print(f"Kafka, {label} / warm embedded{what}, {len(rs)} "
                          f"rounds: median {statistics.median(rs):.2f} "
                          f"({', '.join(f'{x:.2f}' for x in rs)})")
    finally:
        if broker is not None:
            broker.stop()
    pg_rate = None
    if "postgres" in only:
        with PgCluster() as pg:
            cfg = config(
                work,
                "pg",
                [{"type": "postgres", "dsn": pg.dsn(), "parallelism": 2}],
                "available-now",
                args.master,
                args.max_events_per_trigger,
            )
            res = drain(spark, cfg, end)
            pg_rate = end / res[0]
            report("PostgreSQL", end, res)
            record("postgres", res)
    if "mysql" in only:
        from pydblog.devtools.mariadb import MariaDB

        shutil.rmtree(work / "cp-mysql", ignore_errors=True)
        with MariaDB(server_id=1) as my:
            cfg = config(work, "mysql",
                         [{"type": "mysql", "dsn": my.dsn("replica"), "parallelism": 2}],
                         "available-now", args.master, args.max_events_per_trigger)
            res = drain(spark, cfg, end)
            report("MySQL (MariaDB)", end, res)
            my_figures: dict[str, Any] = {"events": end, "mysql_events_per_s": end / res[0],
                                       "mysql_after_first_batch_events_per_s": res[1],
                                       "postgres_events_per_s": pg_rate}
            if pg_rate is not None:
                my_figures["mysql_x_postgres"] = end / res[0] / pg_rate
                print(f"  = {my_figures['mysql_x_postgres']:.2f} x the PostgreSQL drain of this run "
                      f"(load {os.getloadavg()[0]:.1f})")
            import results

            print(f"results: {results.write('sync_mysql', my_figures)}")
    if "latency" in only:
        lat = latency(spark, work, args.master, args.rate, args.seconds)
        print(
            f"latency at {args.rate} events/s, 1 s trigger, Delta: {len(lat)} events, "
            f"p50 {pct(lat, 0.5) / 1000:.2f}s p99 {pct(lat, 0.99) / 1000:.2f}s "
            f"mean {statistics.fmean(lat) / 1000:.2f}s"
        )
        figures.update({"latency_rate_events_per_s": args.rate, "latency_seconds": args.seconds,
                        "latency_events": len(lat), "latency_p50_s": pct(lat, 0.5) / 1000,
                        "latency_p99_s": pct(lat, 0.99) / 1000,
                        "latency_mean_s": statistics.fmean(lat) / 1000})
    if len(figures) > 3:  # a Delta, Kafka or latency run (the MySQL figures have their file)
        import results

        print(f"results: {results.write('sync', figures)}")
    spark.stop()
    if cluster is not None:
        cluster.stop()
    if not args.workdir:  # a temporary workdir (~0.4 GB for 1M events) goes with the run
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
