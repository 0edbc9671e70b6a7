"""The ``dblog sync`` job: the change log -> Spark Structured Streaming -> sinks.

Per micro-batch (``foreachBatch``): collect the batch's events (offsets
``[start, end)``) as Arrow, reduce them to the net change per ``(table, key)`` and apply
that to every sink in turn; Spark records the batch in its checkpoint's commit log only
after ``foreachBatch`` returned.

Exactly once (the argument; docs/sync.md has the long form):
1. Spark's offset log fixes a batch's range before it runs, and the ``dblog`` source
   re-reads a range exactly (dense offsets, checked), so a replayed batch is the same
   batch;
2. a batch whose commit Spark did not record is replayed at restart: every event
   reaches every sink *at least once*;
3. every sink stores which part of the log it applied in the same atomic commit as the
   data (Delta application transactions, the PostgreSQL progress table) and skips it on
   replay: *at most once*.
A crash anywhere (``kill -9`` between a sink's write and Spark's commit included) thus
leaves every target equal to the materialization of the log up to some batch boundary,
and the next run converges.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pydblog.api.sync import SYNC, start_sync_api
from pydblog.changelog import open_reader, open_stream
from pydblog.config import DEFAULT_SOURCE, Config, LogConfig, SyncSourceConfig, load_config
from pydblog.errors import ChangeLogError, DblogError, SinkError
from pydblog.ports import TableSchema
from pydblog.spark.decode import ARROW_SCHEMA, pass_through_for
from pydblog.spark.drain import Drain, _most
from pydblog.spark.plan import SparkBatch
from pydblog.spark.session import DEFAULT_DRIVER_JAVA_OPTIONS as DEFAULT_DRIVER_JAVA_OPTIONS
from pydblog.spark.session import DRIVER_JAVA_OPTIONS_ENV as DRIVER_JAVA_OPTIONS_ENV
from pydblog.spark.session import check_config
from pydblog.spark.session import driver_java_options as driver_java_options
from pydblog.spark.session import spark_home as spark_home
from pydblog.spark.session import spark_session as spark_session
from pydblog.spark.sinks import Sink, apply_with_retry, build_sink
from pydblog.spark.sinks.history import HistorySink
from pydblog.spark.source import NAME, WARM_UP_NAME, DblogDataSource, WarmUpDataSource
from pydblog.spark.typemap import merge_schemas
from pydblog.ui import SyncProgress

log = logging.getLogger("pydblog.sync")

MIRROR_COLUMNS = ("offset", "op", "schema", "table", "key", "after", "unchanged", "ts_ms",
                  "source_ts_ms")

FAULT_ENV = "DBLOG_SYNC_FAULT"
"""Fault injection for tests: ``after-sinks:N`` kills the job's process group with
SIGKILL once the sinks applied batch N and before Spark commits it;
``after-sink:N:I`` after the I-th sink (0-based) of batch N."""


def _fault(batch_id: int, after_sink: int | None) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    parts = spec.split(":")
    want_sink = int(parts[2]) if parts[0] == "after-sink" and len(parts) > 2 else None
    if int(parts[1]) != batch_id or want_sink != after_sink:
        return
    log.warning("fault injection: killing the sync job after batch %d", batch_id)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def check_whole(batch: SparkBatch, last_end: int | None,
                after: str = "the last batch ended") -> None:
    """Raise ``ChangeLogError`` unless ``batch`` holds every offset of
    ``[batch.start, batch.end)`` exactly once and starts no later than ``last_end``
    (``after`` says what ended there: this query's last applied batch, or, for a
    process's first batch, what the history sinks hold); a batch may start earlier: a
    replay, which the sinks skip. The sources check what they can (the
    embedded log's ranges, a Kafka log's runs); this is the job's own check, before any
    sink, of what a history sink needs (a Kafka log's spans read by header, and the
    edges between batches, are checked nowhere else). Counted on the executors: the
    driver gets the counts."""
    width = batch.end - batch.start
    twice = batch.duplicates() if batch.n >= width else 0
    if batch.n != width or twice:
        what = (f"{twice} offset(s) missing and as many read twice" if batch.n == width
                else f"{batch.n} events for {width} offsets")
        raise ChangeLogError(
            f"batch {batch.batch_id}: the change log's offsets {batch.start}..{batch.end - 1} "
            f"were read incompletely or twice ({what}): the batch fails before any sink "
            f"applies it (a history sink needs every event exactly once)",
            hint="a change log whose records were removed (a compacted Kafka topic: use "
                 "cleanup.policy=delete for a history sink) or a bug of the read: report it "
                 "with this job's log; running the sync again re-reads the batch",
        )
    if last_end is not None and batch.start > last_end:
        raise ChangeLogError(
            f"batch {batch.batch_id} starts at offset {batch.start}, {after} at "
            f"{last_end}: offsets {last_end}..{batch.start - 1} were never read; the batch "
            f"fails before any sink applies it (a history sink needs every event)",
            hint="a change log whose records were removed (retention or compaction) or a bug "
                 "of the read: report it with this job's log",
        )


def packed_frame(spark: Any, events: pa.Table) -> Any:
    """``events`` (Arrow, the source's columns) as a DataFrame of packed rows, as the
    source gives them (tests and tools that hold a batch in Arrow)."""
    from pydblog.spark.decode import ARROW_BATCH_EVENTS, PACKED_SCHEMA, pack
    from pydblog.spark.plan import spark_schema

    rows: dict[str, list[Any]] = {"first_offset": [], "end_offset": [], "events": []}
    for i in range(0, max(events.num_rows, 1), ARROW_BATCH_EVENTS):
        part = events.slice(i, ARROW_BATCH_EVENTS)
        if part.num_rows == 0:
            continue
        offsets = part["offset"]
        rows["first_offset"].append(pc.min(offsets).as_py())
        rows["end_offset"].append(pc.max(offsets).as_py() + 1)
        rows["events"].append(pack(part.combine_chunks().to_batches()[0]))
    return spark.createDataFrame(pa.table(rows, schema=PACKED_SCHEMA),
                                 schema=spark_schema(PACKED_SCHEMA))


class BatchApplier:
    """The ``foreachBatch`` function. Runs in the driver, which only plans: the batch's
    events stay on the executors (``plan.SparkBatch``); keeps the sinks across batches;
    remembers the first sink error for ``run_sync``."""

    def __init__(self, log: LogConfig, sinks: list[Sink], retries: int, backoff_s: float,
                 parts: int = 2, source: str = DEFAULT_SOURCE, drain: Drain | None = None) -> None:
        self.log = log
        self.source = source
        self.drain = drain or Drain([SyncSourceConfig(name=source, log=log)], [])
        self.sinks = sinks
        # A history sink needs every event: its batches are checked to be whole
        # (``check_whole``); mirrors accept a compacted log's gaps (``allowGaps``).
        self.whole = any(isinstance(s, HistorySink) for s in sinks)
        # Mirrors need only these columns; decoding fewer is faster (the history sink
        # needs every column).
        self.columns: list[str] = list(ARROW_SCHEMA.names) if self.whole else list(MIRROR_COLUMNS)
        self.schema = pa.schema([ARROW_SCHEMA.field(n) for n in self.columns])
        # Whether the packed payloads of a batch tile one dense offset range (checked).
        self.dense = open_stream(log.model_dump_json()).dense
        self.retries = retries
        self.backoff_s = backoff_s
        self.parts = parts  # shuffle partitions of a batch's reduce
        self.error: DblogError | None = None
        self.batches = 0
        self.events = 0
        self.last_end: int | None = None
        self.read_s = 0.0  # the current batch's summary job (Spark's read included)
        self._schemas: Future[list[tuple[int, TableSchema]]] | None = None
        self._schemas_pool: ThreadPoolExecutor | None = None

    def _read_schemas(self) -> list[tuple[int, TableSchema]]:
        reader = open_reader(self.log)
        try:
            found = reader.schemas()
        finally:
            reader.close()
        self.drain.set_schemas(self.source, found)
        for name in self.drain.sources:  # routing needs each source's database (cached)
            self.drain.db(name)
        return found

    def __call__(self, df: Any, batch_id: int) -> None:
        try:
            # The table schemas are read while Spark reads the batch (a Kafka log's
            # schemas topic: 0.04-0.14 s a batch), and so are the sources' databases
            # the first time (a Kafka reader: ~1 s). Read after Spark planned the batch,
            # as before: every schema of its events was committed with them (the same
            # transaction or SQLite commit) and is seen.
            if self._schemas_pool is None:
                self._schemas_pool = ThreadPoolExecutor(1, thread_name_prefix="dblog-schemas")
            self._schemas = self._schemas_pool.submit(self._read_schemas)
            self.apply(df, batch_id)
        except DblogError as exc:
            self.error = exc
            raise

    def apply(self, events: Any, batch_id: int, *, dense: bool | None = None) -> None:
        """Apply one batch: ``events`` is the source's packed DataFrame, or an Arrow table
        of events (packed here; its offsets are then checked as a non-dense log's)."""
        if isinstance(events, pa.Table):
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
            assert spark is not None, "a Spark session must be active"
            events = packed_frame(spark, events)
            dense = False if dense is None else dense
        from pyspark import StorageLevel

        packed = events.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self._apply(packed, batch_id, self.dense if dense is None else dense)
        finally:
            packed.unpersist()

    def _apply(self, packed: Any, batch_id: int, dense: bool) -> None:
        t0 = time.monotonic()
        batch = SparkBatch.of(batch_id, packed, self.columns, [], dense=dense, parts=self.parts)
        self.read_s = time.monotonic() - t0
        t1 = time.monotonic()
        pending, self._schemas = self._schemas, None
        schemas = pending.result() if pending is not None else self._read_schemas()
        schemas_s = time.monotonic() - t1  # waited for (read while Spark read the batch)
        if batch is None:
            return
        batch.source = self.source
        routed = self._targets(batch, schemas)
        try:
            if self.whole:
                if self.last_end is not None:
                    check_whole(batch, self.last_end)
                else:  # this process's first batch: after what the history sinks hold
                    check_whole(batch, self._history_end(packed.sparkSession),
                                "the history sink holds offsets up to and ending")
            timings = [f"read {self.read_s:.2f}s", f"schemas {schemas_s:.2f}s"]
            self.read_s = 0.0
            sink_s: dict[str, float] = {}
            progress = self.drain.progress_after(self.source, batch.end, batch.newest_ms)
            batch.cut_ms = self.drain.cut_ms()
            with self.drain.lock:
                batch.watermarks = self.drain.marks()
                batch.watermarks[self.source] = _most(batch.watermarks.get(self.source),
                                                      progress)
                for i, sink in enumerate(self.sinks):
                    t1 = time.monotonic()
                    apply_with_retry(sink, batch, retries=self.retries, backoff_s=self.backoff_s)
                    sink_s[sink.name.split(":")[0]] = time.monotonic() - t1
                    timings.append(f"{sink.name.split(':')[0]} {time.monotonic() - t1:.2f}s")
                    _fault(batch_id, i)
                _fault(batch_id, None)
                self.drain.advance(self.source, progress)
        finally:
            batch.release()
        del routed
        self.batches += 1
        self.events += batch.n
        self.last_end = batch.end
        SYNC.observe_batch(batch.n, time.monotonic() - t0, sink_s, batch.end)
        log.info(
            "%sbatch %d: offsets %d..%d, %d events, %d tables, %.2fs (%s)",
            "" if self.source == DEFAULT_SOURCE else f"source {self.source}: ",
            batch_id,
            batch.start,
            batch.end - 1,
            batch.n,
            len(batch.tables),
            time.monotonic() - t0,
            ", ".join(timings),
        )

    def _targets(self, batch: SparkBatch, schemas: list[tuple[int, TableSchema]]) -> dict[str, Any]:
        """The batch's tables' schemas as targets (``Drain.target_schemas``: routed,
        merged tables unioned across the sources). A truncate of a merged table's part
        is scoped to that part (``plan.SparkBatch.scoped``)."""
        self.drain.set_schemas(self.source, schemas)
        targets = self.drain.target_schemas(self.source, batch.end)
        for q, (schema, target) in targets.items():
            if q in batch.tables or not target.merged:
                batch.recorded[q] = schema
            if target.merged:
                batch.merged.add(q)
        for q in batch.tables:
            if q not in batch.recorded:
                for from_offset, s in schemas:  # a table no schema routes (inferred types)
                    if from_offset < batch.end and s.qualified == q:
                        batch.recorded[q] = merge_schemas(batch.recorded.get(q), s)
        return targets

    def _history_end(self, spark: Any) -> int | None:
        """The lowest end offset the history sinks recorded (None: none has any), so a
        batch the last process applied without its last events shows as a gap."""
        ends = [e for s in self.sinks if isinstance(s, HistorySink)
                if (e := s.applied_end(spark, self.source)) is not None]
        return min(ends) if ends else None

    def close(self) -> None:
        if self._schemas_pool is not None:
            self._schemas_pool.shutdown(wait=True)
            self._schemas_pool = None
        for sink in self.sinks:
            sink.close()


def checkpoint_dir(cfg: Config) -> str:
    return cfg.sync.checkpoint or str(Path(cfg.log.path) / "sync-checkpoint")


def warm_up_workers(spark: Any, log_json: str) -> threading.Thread:
    """Start the executors' Python workers in the background while Spark plans the
    query, instead of on the first batch's critical path (a fresh worker daemon imports
    pyspark, pandas and pyarrow, each forked worker then the decoder): a tiny
    ``mapInArrow`` job of ``decode.pass_through_for(log_json)`` over one row per core.
    It runs in the same kind of worker as the source's reads (the same worker factory),
    and workers are reused, so the first batch's tasks find them ready (first query of a
    1M-event drain, 5 alternating runs each: median 8.21 s against 8.59 s without;
    docs/sync.md, "Start-up"). The workers also load what the change log's reads need
    (``ChangeLogStream.warm_up``). Best effort: a failure only costs the head start."""
    fn = pass_through_for(log_json)

    def run() -> None:
        try:
            spark.sparkContext.setJobDescription("dblog sync: start the Python workers")
            n = max(1, spark.sparkContext.defaultParallelism)
            spark.range(0, n, 1, n).mapInArrow(fn, "id long").collect()
        except Exception as exc:  # e.g. the session stopping under it
            log.debug("Python worker warm-up failed: %s", exc)

    def plan() -> None:
        try:
            spark.dataSource.register(WarmUpDataSource)
            spark.read.format(WARM_UP_NAME).load().collect()
        except Exception as exc:
            log.debug("Python read planner warm-up failed: %s", exc)

    threading.Thread(target=plan, name="dblog-warm-up-planner", daemon=True).start()
    thread = threading.Thread(target=run, name="dblog-warm-up", daemon=True)
    thread.start()
    return thread


def source_checkpoint(cfg: Config, source: str) -> str:
    """A source's Spark checkpoint: ``[sync] checkpoint`` for the single-source sync's
    source, ``<checkpoint>/by-source/<name>`` for any other."""
    root = checkpoint_dir(cfg)
    if source == DEFAULT_SOURCE:
        return root
    return str(Path(root) / "by-source" / source) if "://" not in root \
        else f"{root.rstrip('/')}/by-source/{source}"


def clear_unlogged_start(checkpoint: str) -> None:
    """Remove what a process killed while Spark logged a fresh checkpoint's first
    batch left behind: with no batch in ``offsets/`` yet, the hidden files there and in
    ``commits/`` (a write's temporary file: Spark writes each entry to one and renames
    it) make Spark refuse the directory ("should be empty on batch 0"). Nothing was
    logged, so nothing is lost; a checkpoint with a logged batch is left alone. Local
    checkpoints only."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        return
    root = Path(checkpoint.removeprefix("file://").removeprefix("file:"))
    offsets = root / "offsets"
    if not offsets.is_dir() or any(p.name.isdigit() for p in offsets.iterdir()):
        return
    for d in (offsets, root / "commits"):
        if d.is_dir():
            for p in d.iterdir():
                if p.name.startswith(".") and p.is_file():
                    log.warning("removing %s: left by a sync killed while Spark logged its "
                                "first batch (no batch was logged)", p)
                    p.unlink()


def start_query(spark: Any, cfg: Config, applier: BatchApplier, *, available_now: bool,
                parallelism: int | None = None) -> Any:
    """Start the sync's streaming query of ``applier``'s source. ``parallelism``: the
    source's ``numPartitions`` (the cores its tasks share; default Spark's default
    parallelism; benchmarks vary it)."""
    log_json = applier.log.model_dump_json()
    warm_up_workers(spark, log_json)
    spark.dataSource.register(DblogDataSource)
    # Mirrors apply each key's newest event: a compacted topic's gaps are fine for them;
    # a history sink needs every event (docs/kafka.md, "Compacted topics").
    reader = (
        spark.readStream.format(NAME)
        .option("log", log_json)
        .option("allowGaps", "false" if applier.whole else "true")
        .option("numPartitions", str(parallelism or spark.sparkContext.defaultParallelism))
        .option("maxEventsPerTrigger", str(cfg.sync.max_events_per_trigger))
        .option("packed", "true")
        .option("columns", ",".join(applier.columns))
    )
    route = applier.drain.route_option(applier.source)
    if route is not None:
        reader = reader.option("route", route)
    if cfg.sync.consistent:
        reader = reader.option("bound", applier.drain.bound_option(applier.source))
    stream = reader.load()
    name = "dblog_sync" if applier.source == DEFAULT_SOURCE else f"dblog_sync_{applier.source}"
    writer = (
        stream.writeStream.queryName(name)
        .foreachBatch(applier)
        .option("checkpointLocation", source_checkpoint(cfg, applier.source))
    )
    clear_unlogged_start(source_checkpoint(cfg, applier.source))
    interval = cfg.sync.trigger_interval()
    if available_now or interval is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=interval)
    return writer.start()


def _progress_end(cfg: Config) -> Callable[[], int]:
    """How ``--available-now``'s progress bar reads the change log's end: the stream's
    ``events_end`` (for Kafka a bulk read of the checkpoint topic, not a fresh reader's)."""
    log_json = cfg.log.model_dump_json()
    return lambda: open_stream(log_json).events_end()


START_RETRIES = 3
"""Restarts in a row (no batch applied in between) of a query that failed because a
Python process Spark started did not connect back in time (``_late_python``)."""


def _late_python(query: Any, applier: BatchApplier) -> bool:
    """Whether the query failed only because a Python process Spark started (the
    streaming planner, a read planner: ``PythonWorkerFactory.createSimpleWorker``, a
    fixed 10 s) did not connect back: a machine too loaded to start Python in time
    (seen at a load of 20 on 2 cores). Such a process plans; a batch it fails has applied
    nothing, and like any restart the new query resumes after the last batch Spark
    committed, the sinks skipping what they hold: exact."""
    if applier.error is not None:
        return False
    exc = query.exception()
    return exc is not None and "Python worker failed to connect back" in str(exc)


def _query_error(query: Any, applier: BatchApplier) -> DblogError | None:
    if applier.error is not None:
        return applier.error
    exc = query.exception()
    if exc is None:
        return None
    # Errors of the data source (executors, planner worker) reach us only as the text
    # of a Java exception: recover our own error's class and message from it.
    lines = str(exc).splitlines() or ["unknown error"]
    marker = "pydblog.errors.ChangeLogError: "
    for i, ln in enumerate(lines):
        if marker in ln:
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            hint = nxt[len("hint: "):] if nxt.startswith("hint: ") else None
            return ChangeLogError(ln.split(marker, 1)[1].strip(), hint=hint)
    first = next((ln for ln in lines if "Error" in ln), lines[0])
    return SinkError(f"the sync query failed: {first.strip()}", hint="see the log above")


def _uses_s3(cfg: Config) -> bool:
    return any((s.path or "").startswith(("s3a://", "s3://")) for s in cfg.sync.sinks)


def run_sync(
    cfg: Config, *, available_now: bool = False, stop_event: threading.Event | None = None
) -> int:
    """Run ``dblog sync`` until ``stop_event`` is set (or, with ``available_now`` /
    ``trigger = "available-now"``, until every source's change log as it was at start is
    applied). One streaming query per source (``[[sync.sources]]``, or ``[log]`` as the
    one source), all applying to the same sinks (``drain.Drain``). Returns 0; raises
    ``ConfigError``/``ChangeLogError``/``SinkError`` on bad input or a sink that keeps
    failing."""
    check_config(cfg)
    sources = cfg.sync.effective_sources(cfg.log)
    sinks = [build_sink(s) for s in cfg.sync.sinks]
    spark = spark_session(cfg.sync.master, s3=_uses_s3(cfg))
    if cfg.sync.sources:  # a sync-only config's [log] path holds only the sync's files
        cfg.log_dir.mkdir(parents=True, exist_ok=True)
    api = start_sync_api(cfg)
    drain = Drain(sources, cfg.sync.routes, cfg.log_dir)
    drain.consistent = cfg.sync.consistent
    if cfg.sync.consistent and available_now:
        # the rounds end at the logs' least completeness now: every source applies up
        # to the same time, whatever its log holds beyond it
        from pydblog.spark.rounds import least_complete

        drain.cap = least_complete({s.name: s.log.model_dump_json() for s in sources})
    parts = max(2, spark.sparkContext.defaultParallelism)
    appliers = [BatchApplier(s.log, sinks, cfg.sync.sink_retries, cfg.sync.sink_retry_backoff_s,
                             parts=parts, source=s.name, drain=drain) for s in sources]
    err: DblogError | None = None
    try:
        restarts = 0  # in a row, without a batch applied in between
        reruns, rounds_before = 0, drain.read_rounds()
        while True:
            applied = sum(a.batches for a in appliers)
            queries = [start_query(spark, cfg, a, available_now=available_now) for a in appliers]
            SYNC.state = "running"
            try:
                with SyncProgress(cfg, appliers[0], enabled=available_now and len(appliers) == 1,
                                  end=_progress_end(cfg)) as progress:
                    last_poll = last_flush = 0.0
                    while any(q.isActive for q in queries):
                        if stop_event is not None and stop_event.is_set():
                            for q in queries:
                                q.stop()
                            break
                        if any(_query_error(q, a) is not None
                               for q, a in zip(queries, appliers, strict=True)):
                            for q in queries:
                                q.stop()
                            break
                        queries[0].awaitTermination(0.5 / len(queries))
                        progress.update()
                        if time.monotonic() - last_poll > 1.0:
                            last_poll = time.monotonic()
                            _poll_heartbeats(drain, queries, appliers)
                            if cfg.sync.consistent:
                                drain.poll_rounds()
                            if time.monotonic() - last_flush > 10.0:
                                last_flush = time.monotonic()
                                try:
                                    _flush_watermarks(drain, sinks, spark)
                                except DblogError as exc:
                                    log.warning("watermarks not written: %s", exc.message)
            except Exception:
                pass
            errs = [(q, a, e) for q, a in zip(queries, appliers, strict=True)
                    if (e := _query_error(q, a)) is not None]
            if stop_event is not None and stop_event.is_set():
                # a batch that query.stop() interrupted is not committed and is redone at
                # the next start: not an error of the stop
                errs = [x for x in errs if "InterruptedException" not in x[2].message]
            err = errs[0][2] if errs else None
            if err is None and _rounds_left(cfg, drain, available_now, stop_event):
                # a source's query that waited for the others' round ended its
                # available-now run (a plan with nothing new ends it): run them again
                rounds_now = drain.read_rounds()
                reruns = 0 if rounds_now != rounds_before else reruns + 1
                rounds_before = rounds_now
                if reruns < ROUND_RERUNS:
                    log.info("consistent sync: round %s not finished by every source "
                             "(%s); running the sources' queries again",
                             None if rounds_now is None else rounds_now.round,
                             None if rounds_now is None else sorted(rounds_now.done))
                    continue
                log.warning("consistent sync: the rounds did not reach the change logs' "
                            "time at start after %d runs without progress", reruns)
            if err is None or not all(_late_python(q, a) for q, a, _ in errs) \
                    or (stop_event is not None and stop_event.is_set()):
                break
            now = sum(a.batches for a in appliers)
            restarts = 1 if now > applied else restarts + 1
            if restarts > START_RETRIES:
                break
            for q in queries:
                if q.isActive:
                    q.stop()
            log.warning("the sync query failed: %s (a Python process Spark started did not "
                        "connect back within Spark's fixed 10 s: the machine is loaded); "
                        "restarting the query (%d of %d in a row): it resumes after the last "
                        "batch Spark committed", err.message, restarts, START_RETRIES)
        if err is not None:
            SYNC.state, SYNC.error = "failed", err.message
            raise err
        if cfg.sync.consistent:
            drain.poll_rounds()
        _flush_watermarks(drain, sinks, spark)
        SYNC.state = "stopped"
        log.info("sync stopped: %d batches, %d events", sum(a.batches for a in appliers),
                 sum(a.events for a in appliers))
        return 0
    finally:
        for a in appliers:
            a.close()
        if api is not None:
            api.close()


ROUND_RERUNS = 3
"""``--available-now`` with ``consistent = true``: runs in a row of the sources' queries
that moved no round (``_rounds_left``) before the sync gives up waiting."""


def _rounds_left(cfg: Config, drain: Drain, available_now: bool,
                 stop_event: threading.Event | None) -> bool:
    """Whether an ``--available-now`` consistent sync has rounds left up to its cap."""
    if not (cfg.sync.consistent and available_now) or (stop_event is not None
                                                       and stop_event.is_set()):
        return False
    from pydblog.core.drainer import Rounds, rounds_settled

    drain.poll_rounds()
    return not rounds_settled(drain.read_rounds() or Rounds(), drain.sources, drain.cap)


def _flush_watermarks(drain: Drain, sinks: list[Sink], spark: Any) -> None:
    """Write the sources' progress times (moved by heartbeats, or by other sources'
    batches since a sink last wrote them) into the sinks' watermark tables."""
    from pydblog.spark.sinks.delta import DeltaSink

    with drain.lock:
        marks = drain.marks()
        cut = drain.cut_ms()
        if (marks, cut) == (drain.flushed, drain.flushed_cut):
            return
        for sink in sinks:
            if isinstance(sink, DeltaSink):
                sink.write_marks(spark, marks, "", None, cut)
            elif hasattr(sink, "write_watermarks"):  # the PostgreSQL and MySQL sinks
                sink.write_watermarks(marks, "", None, cut)
        drain.flushed, drain.flushed_cut = marks, cut


def _poll_heartbeats(drain: Drain, queries: list[Any], appliers: list[BatchApplier]) -> None:
    """Move an idle source's progress time: once its query has applied the whole log,
    the capture's last checkpoint outside a transaction (its heartbeat) says how far the
    source is complete (``Drain.progress_after``). Best effort."""
    for q, a in zip(queries, appliers, strict=True):
        try:
            end = a.last_end
            if end is None:
                prog = q.lastProgress
                srcs = (prog or {}).get("sources") or []
                raw = srcs[0].get("endOffset") if srcs else None
                parsed = json.loads(raw) if isinstance(raw, str) else raw
                if isinstance(parsed, dict) and isinstance(parsed.get("offset"), int):
                    end = int(parsed["offset"])
            if end is None:
                continue
            drain.advance(a.source, drain.progress_after(a.source, end, None))
        except Exception as exc:  # a log being written, a stopping query
            log.debug("heartbeat poll of source %s: %s", a.source, exc)


def main(argv: list[str] | None = None) -> int:
    """``python -m pydblog.spark.job --config F [--available-now]`` (tests, benchmarks)."""
    ap = argparse.ArgumentParser(prog="python -m pydblog.spark.job")
    ap.add_argument("--config", required=True)
    ap.add_argument("--available-now", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        return run_sync(load_config(args.config), available_now=args.available_now, stop_event=stop)
    except DblogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
