"""`dblog sync` from a Kafka change log (the dblog Spark source over the backend's
stream, ``changelog.kafka_spark``) into Delta, the change history and PostgreSQL, with
kill -9 of the job between a sink's write and Spark's commit: the mirrors equal the
oracle and every offset is applied exactly once. The kill points a kill -9 of the job
cannot aim at (in the planner, inside a sink, a reset Spark checkpoint) are taken one
per batch, deterministically, in process (``test_every_kill_point_of_a_batch_replays_exactly``).

The Kafka log holds the same events as an embedded log built by the sync tests'
scenario (copied append by append), so the embedded log is the oracle. A failure names
what differs (offsets missing or applied twice; key, column, source and mirror value)
and what every sink and Spark's checkpoint recorded (``tests.spark.helpers.sync_state``)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from deltalake import DeltaTable

from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.config import LogConfig, load_config
from pydblog.devtools.synth import SyntheticLoad
from pydblog.errors import SinkError
from pydblog.events import EncodedEvent
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.job import FAULT_ENV, run_sync
from tests.chaos import Kills, kill_and_restart, kill_group, kill_seed, killed_at_faults
from tests.helpers import dblog, wait_for
from tests.spark.conftest import spark  # noqa: F401 - fixture
from tests.spark.helpers import (
    assert_delta_batches_once,
    assert_mirrors,
    assert_offsets_once,
    history_offsets,
    sync_state,
)
from tests.spark.test_sync import build_scenario

pytestmark = pytest.mark.timeout(600)


def copy_to_kafka(log_dir: Path, cfg: LogConfig, batch: int = 700) -> int:
    """Append the embedded log's events to Kafka in batches (a schema goes with the
    batch that starts at its offset)."""
    reader = SqliteChangeLogReader(log_dir)
    records = reader.read(0, 10**9)
    schemas = reader.schemas()
    reader.close()
    cuts = sorted({o for o, _ in schemas} | set(range(0, len(records), batch)) | {len(records)})
    kf = KafkaChangeLog(cfg)
    for a, b in itertools.pairwise(cuts):
        events = [EncodedEvent(r.table, r.op, r.ts_ms, r.body.decode()) for r in records[a:b]]
        kf.append(events, Checkpoint(PgPosition(Lsn(b), 0)), [s for o, s in schemas if o == a])
    kf.close()
    return len(records)


def write_config(tmp: Path, log: LogConfig, dsn: str, trigger: str = "available-now",
                 max_events: int = 1500) -> Path:
    path = tmp / ("dblog.toml" if trigger == "available-now" else "dblog-stream.toml")
    path.write_text(f"""
[source]
dsn = "postgresql://unused@127.0.0.1/x"
[log]
path = "{tmp / "data"}"
type = "kafka"
bootstrap_servers = "{log.bootstrap_servers}"
topic_prefix = "{log.topic_prefix}"
[sync]
checkpoint = "{tmp / "cp"}"
trigger = "{trigger}"
master = "local[1]"
max_events_per_trigger = {max_events}
sink_retries = 0
[[sync.sinks]]
type = "delta"
path = "{tmp / "lake"}"
[[sync.sinks]]
type = "history"
path = "{tmp / "lake" / "_changes"}"
[[sync.sinks]]
type = "postgres"
dsn = "{dsn}"
schema = "mirror"
""")
    return path


def start_job(cfg: Path, log: Path, fault: str | None = None) -> subprocess.Popen[bytes]:
    """``python -m pydblog.spark.job`` in its own process group (``kill_group`` ends it
    with its JVM and workers), killing itself at ``fault`` if given. Spark's Python
    processes are left to the job (``PYSPARK_PYTHON``: the launcher that imports pyspark
    precompiled, ``spark.pyexec``): with ``sys.executable`` each compiled pyspark's zip
    (3-5 s at a load of 10 against 0.6-1.1 s), and the streaming planner's process must
    connect back to the JVM within Spark's fixed 10 s: at a load of 12-15 it did not
    once in five runs ("Python worker failed to connect back", the job failed before
    its kill)."""
    env = {**os.environ, "DBLOG_SPARK_DRIVER_MEMORY": "1g"}
    env.pop(FAULT_ENV, None)
    if fault is not None:
        env[FAULT_ENV] = fault
    with log.open("wb") as out:  # (the job has its own copy)
        return subprocess.Popen([sys.executable, "-m", "pydblog.spark.job", "--config", str(cfg)],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


@pytest.mark.slow
@pytest.mark.usefixtures("spark")
def test_sync_from_kafka_with_kill9(pg_db: str, tmp_path: Path, kafka_log: LogConfig) -> None:
    """Killed after the first sink of batch 1 (the other sinks one batch behind): the
    restart replays the batch from Kafka by the offsets Spark logged for it. With
    ``max_events_per_trigger = 3000`` (batches end at the log's appends: 3,500 events),
    batch 1 holds the scenario's added column and its truncate: the replay redoes them
    in the sinks behind and skips them in the Delta mirrors. (What
    each sink does on a replay is the embedded log's tests/spark/test_crash.py's, with
    both kill points; ``test_sync_from_kafka_with_two_kill9s`` runs both here too, in
    smaller batches: four batches before its second kill instead of two.) Slow: the
    default run kills a sync in tests/spark/test_mysql_crash.py and
    tests/spark/test_drainer_progress.py, and reads Kafka into the sinks in
    tests/kafka/test_consistent.py; the replay's offsets from Kafka are this test's alone."""
    sync_after_kills(pg_db, tmp_path, kafka_log, ("after-sink:1:0",), max_events=3000)


@pytest.mark.slow
@pytest.mark.usefixtures("spark")
def test_sync_from_kafka_with_two_kill9s(pg_db: str, tmp_path: Path, kafka_log: LogConfig) -> None:
    """Killed after every sink applied batch 1, before Spark's commit, then after the
    first sink of batch 3 (the batch with the truncate)."""
    sync_after_kills(pg_db, tmp_path, kafka_log, ("after-sinks:1", "after-sink:3:0"))


def sync_after_kills(pg_db: str, tmp_path: Path, kafka_log: LogConfig, faults: tuple[str, ...],
                     max_events: int = 1500) -> None:
    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=77))
    assert copy_to_kafka(tmp_path / "log", kafka_log) == end
    config = write_config(tmp_path, kafka_log, pg_db, max_events=max_events)
    assert "sync_lag_messages" not in status(config)["changelog"]  # no sync yet
    killed_at_faults(lambda fault, n: start_job(config, tmp_path / f"job-{n}.log", fault),
                     faults, lambda n: tmp_path / f"job-{n}.log")
    assert run_sync(load_config(config), available_now=True) == 0

    def state() -> str:  # what a failure message adds: what each sink and Spark recorded
        return f"kept in {tmp_path}\n" + sync_state(
            lake=tmp_path / "lake", history=tmp_path / "lake" / "_changes", pg_dsn=pg_db,
            pg_schema="mirror", checkpoint=tmp_path / "cp",
            logs=[tmp_path / f"job-{n}.log" for n in range(len(faults))])

    assert_offsets_once(history_offsets(tmp_path / "lake" / "_changes"), end, state)
    assert_delta_batches_once(tmp_path / "lake", state)
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror",
                   state=state)
    dt = DeltaTable(str(tmp_path / "lake" / "public" / "orders"))
    assert dt.transaction_version("pydblog-sync") == end, state()
    # `dblog status`: the sync's consumer group has applied everything; new events are lag.
    info = status(config)["changelog"]
    assert info["sync_lag_messages"] == 0 and info["last_offset"] == end - 1, (info, state())
    kf = KafkaChangeLog(kafka_log)
    kf.append([EncodedEvent("public.orders", "c", 1, '{"op":"c","ts_ms":1,"source":{"connector":'
                            '"postgresql","db":"x","schema":"public","table":"orders","ts_ms":1},'
                            f'"key":{{"id":{10**9 + i}}},"before":null,"after":{{"id":{10**9 + i}}}}}')
               for i in range(7)], Checkpoint(PgPosition(Lsn(end + 7), 0)))
    kf.close()
    assert status(config)["changelog"]["sync_lag_messages"] == 7


def status(config: Path) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(dblog("status", "--config", str(config), "--json").stdout)
    return out


class Killed(Exception):
    """A kill -9 at a chosen point of a batch (the applier is then dropped, as the job)."""


def read_batch(log: LogConfig, start: Any, end: Any, parts: int) -> Any:
    """What ``foreachBatch`` gets for the batch ``(start, end]`` planned afresh (a
    restarted job's planner: nothing kept from the first plan), its partitions read one
    after another and unpacked (the job's columns: every one, for the history)."""
    import pyarrow as pa

    from pydblog.spark import decode
    from pydblog.spark.eventschema import EVENT_COLUMNS
    from pydblog.spark.source import DblogStreamReader

    reader = DblogStreamReader({"log": log.model_dump_json(), "numpartitions": str(parts),
                                "packed": "true", "columns": ",".join(EVENT_COLUMNS)})
    try:
        batches = [b for p in reader.partitions(start, end) for b in reader.read(p)]
    finally:
        reader.stop()
    return decode.unpack(pa.Table.from_batches(batches), decode.ARROW_SCHEMA, dense=False)


DELTA = ("delta public.order_lines", "delta public.orders", "delta shop.accounts")
KILL_POINTS = {  # batch: (kill point, what has applied the batch when it dies)
    0: ("latest-offset", ()),  # in the planner, before Spark's offset log holds the batch
    1: ("before-sinks", ()),  # the offset log holds it, no sink applied it
    2: ("after-sink-0", DELTA),  # Delta applied it, the history and PostgreSQL not
    3: ("after-sink-1", (*DELTA, "history")),  # PostgreSQL not
    4: ("pg-partition-1", (*DELTA, "history", "pg -1", "pg 0")),  # inside PostgreSQL
    # inside Delta (a column added): the tables go two at a time, so the first and the
    # third commit while the second dies
    5: ("delta-second-table", (DELTA[0], DELTA[2])),
    6: ("after-sinks", (*DELTA, "history", "pg -1", "pg 0", "pg 1")),  # not Spark's commit
    7: ("pg-after-table-step", (*DELTA, "history", "pg -1")),  # the batch's TRUNCATE only
}
"""The kill point of each batch (of one or two commits, 700 events or more) in
``test_every_kill_point_of_a_batch_replays_exactly``."""


@pytest.mark.slow
@pytest.mark.usefixtures("spark")
def test_every_kill_point_of_a_batch_replays_exactly(
        pg_db: str, tmp_path: Path, kafka_log: LogConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kill points the kill -9 tests above cannot aim at, deterministically
    (``KILL_POINTS``: one per batch; inside a sink too), each followed by what a
    restarted job does: a fresh planner, given the offsets as Spark's offset log holds
    them (JSON), plans exactly the same input partitions as the first plan (and, killed
    in ``latestOffset``, the same end), reads exactly the batch's events again (in Kafka
    order, partitions interleaved), and a fresh applier (new sinks: no cached table state)
    applies the batch again, then the next ones. Last, a reset Spark checkpoint: one
    batch from an earlier batch's start to the log's end, straddling what the sinks
    applied (a truncate and an added column among the events they already have).

    The mirrors then equal the oracle, the history holds each offset once, each Delta
    table committed each batch once (a mirror applied twice would still be equal: the
    application transactions show it), and each sink recorded the log's end."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from pydblog.spark import job
    from pydblog.spark.batch import Batch
    from pydblog.spark.job import BatchApplier
    from pydblog.spark.sinks import build_sink
    from pydblog.spark.sinks.delta import DeltaSink
    from pydblog.spark.sinks.postgres import PostgresSink
    from pydblog.spark.source import DblogStreamReader

    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=78))
    assert copy_to_kafka(tmp_path / "log", kafka_log) == end
    cfg = load_config(write_config(tmp_path, kafka_log, pg_db))
    assert [s.workers() for s in cfg.sync.sinks] == [3, 2, 2]

    point = [""]  # where the current batch dies
    real_table, real_prepare = DeltaSink._apply_table, PostgresSink._prepare
    from pydblog.spark.sinks import postgres

    real_parts = postgres.pg_parts_fn

    def delta_table(self: DeltaSink, batch: Any, qualified: str, *args: Any) -> None:
        if point[0] == "delta-second-table" and qualified == sorted(batch.tables)[1]:
            raise Killed(point[0])  # the first table commits (its thread runs to its end)
        real_table(self, batch, qualified, *args)

    def pg_prepare(self: PostgresSink, *args: Any) -> None:
        real_prepare(self, *args)
        if point[0] == "pg-after-table-step":
            raise Killed(point[0])

    def pg_parts(*args: Any) -> Any:  # the function of the sink's Spark tasks
        run = real_parts(*args)
        fail = point[0] == "pg-partition-1"

        def task(batches: Any) -> Any:
            from pydblog.spark.sinks import postgres

            real = postgres.PostgresSink._apply_part

            def part1(self: Any, batch: Any, part: int, *a: Any) -> None:
                if part == 1:
                    raise SinkError("pg-partition-1")
                real(self, batch, part, *a)

            if fail:  # partition 1 fails before it applies (0 commits)
                postgres.PostgresSink._apply_part = part1  # type: ignore[method-assign,assignment]
            try:
                yield from run(batches)
            finally:  # the task's Python worker is reused
                postgres.PostgresSink._apply_part = real  # type: ignore[method-assign]

        return task

    def fault(batch_id: int, after: int | None) -> None:  # job._fault's points, raising
        if point[0] == f"after-sink-{after}" or (point[0] == "after-sinks" and after is None):
            raise Killed(point[0])

    monkeypatch.setattr(DeltaSink, "_apply_table", delta_table)
    monkeypatch.setattr(PostgresSink, "_prepare", pg_prepare)
    monkeypatch.setattr(postgres, "pg_parts_fn", pg_parts)
    monkeypatch.setattr(job, "_fault", fault)

    def applier() -> BatchApplier:
        return BatchApplier(cfg.log, [build_sink(s) for s in cfg.sync.sinks], retries=0, backoff_s=0)

    def planner() -> DblogStreamReader:
        reader = DblogStreamReader({"log": kafka_log.model_dump_json(), "maxeventspertrigger": "700"})
        reader.prepareForTriggerAvailableNow()
        return reader

    def roundtrip(offset: Any) -> Any:
        return json.loads(json.dumps(offset))  # as Spark's offset log holds it

    def applied() -> dict[str, int]:
        """Where each sink (Delta per table, PostgreSQL per step) recorded it applied to."""
        out = {}
        for d in DELTA:
            path = tmp_path / "lake" / Path(*d.split()[1].split("."))
            out[d] = DeltaTable(str(path)).transaction_version("pydblog-sync") or 0 \
                if DeltaTable.is_deltatable(str(path)) else 0
        path = tmp_path / "lake" / "_changes"
        out["history"] = DeltaTable(str(path)).transaction_version("pydblog-history") or 0 \
            if DeltaTable.is_deltatable(str(path)) else 0
        with psycopg.connect(pg_db) as conn:
            if conn.execute("SELECT to_regclass('mirror.dblog_sync_progress')").fetchone() != (None,):
                out |= {f"pg {part}": int(e) for part, e in conn.execute(
                    "SELECT part, applied_end FROM mirror.dblog_sync_progress").fetchall()}
        return out

    first = planner()
    start = roundtrip(first.initialOffset())
    starts = []
    running = applier()
    for batch_id in range(max(KILL_POINTS) + 1):
        starts.append(start)
        stop = roundtrip(first.latestOffset(start, ReadMaxRows(700)))
        assert stop != start, f"batch {batch_id}: the log ended before every kill point"
        first_plan = [p.value for p in first.partitions(start, stop)]
        kill, dead = KILL_POINTS.get(batch_id, ("", ()))
        again = planner()
        if kill == "latest-offset":  # a restarted planner plans the same batch
            assert roundtrip(again.latestOffset(start, ReadMaxRows(700))) == stop
        assert [p.value for p in again.partitions(start, stop)] == first_plan
        again.stop()
        events = read_batch(kafka_log, start, stop, 2)
        assert sorted(events["offset"].to_pylist()) == list(range(start["seq"], stop["seq"])), batch_id
        if kill == "pg-after-table-step":
            assert "t" in events["op"].to_pylist(), "the batch that truncates"
        if kill == "delta-second-table":
            assert len(Batch.of(0, events, []).changes()) == 3, "three tables"  # type: ignore[union-attr]
        if kill and kill != "latest-offset":
            point[0] = kill
            with pytest.raises((Killed, SinkError), match=kill):
                if kill == "before-sinks":
                    raise Killed(kill)
                running.apply(events, batch_id)
            point[0] = ""
            # It died where it should: what applied the batch, and nothing else.
            assert {k for k, v in applied().items() if v >= stop["seq"]} == set(dead), applied()
            running.close()  # the job is gone: the restarted one has fresh sinks
            running = applier()
            events = read_batch(kafka_log, start, stop, 1)  # the replay reads it again
        running.apply(events, batch_id)
        start = stop
    first.stop()

    # The Spark checkpoint reset: everything from batch 5's start in one batch.
    last = planner()
    stop = roundtrip(last.latestOffset(starts[5], ReadAllAvailable()))
    last.stop()
    assert stop["seq"] == end
    running.apply(read_batch(kafka_log, starts[5], stop, 2), 100)
    running.close()

    def state() -> str:
        return sync_state(lake=tmp_path / "lake", history=tmp_path / "lake" / "_changes",
                          pg_dsn=pg_db, pg_schema="mirror")

    assert_offsets_once(history_offsets(tmp_path / "lake" / "_changes"), end, state)
    assert_delta_batches_once(tmp_path / "lake", state)
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror",
                   state=state)
    for t in ("orders", "order_lines"):
        dt = DeltaTable(str(tmp_path / "lake" / "public" / t))
        assert dt.transaction_version("pydblog-sync") == end, state()
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT part, nparts, applied_end FROM mirror.dblog_sync_progress "
                            "ORDER BY part").fetchall()
    assert rows == [(-1, 2, end), (0, 2, end), (1, 2, end)], state()


def test_commits_removed_from_the_checkpoint_topic_stop_the_plan(
        kafka_log: LogConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch is planned from the checkpoint topic's commits after Spark's last offset:
    when retention removed some of them (a topic made with a retention, the sync stopped
    longer than it), their events cannot be told from aborted records, and a plan that
    went on from the first kept message skipped them: the sinks got the later commits'
    events and recorded their end (silent loss). The plan fails instead, naming the
    topic; so does the replay of a batch Spark logged before they were removed. (Tansu
    has no retention: its low watermark is faked.)"""
    from pydblog.changelog.kafka.client import Client
    from pydblog.changelog.kafka.protocol import CommitRecord
    from pydblog.changelog.kafka.topics import checkpoint_topic
    from pydblog.changelog.kafka_spark import KafkaRange, KafkaStream, read_events
    from pydblog.errors import ChangeLogError

    writer = KafkaChangeLog(kafka_log)
    for c in range(4):
        writer.append([EncodedEvent("public.t", "c", 1, '{"op":"c","ts_ms":1,"source":{"connector":'
                                    '"postgresql","db":"d","schema":"public","table":"t"},'
                                    f'"key":{{"id":{i}}},"before":null,"after":{{"id":{i}}}}}')
                       for i in range(10 * c, 10 * c + 10)], Checkpoint(PgPosition(Lsn(10 * c + 10), 0)))
    writer.close()
    topic = checkpoint_topic(kafka_log.topic_prefix or "")
    stream = KafkaStream(kafka_log.model_dump_json())
    start = stream.initial_offset("earliest")
    end1 = stream.latest_offset(start, 10)  # the first commit
    end3 = stream.latest_offset(end1, 20)  # the next two: logged by Spark, not yet run
    assert (end1["seq"], end3["seq"]) == (10, 30)
    client = stream._planning()
    commits = {CommitRecord.from_bytes(m.value(), m.offset()).end: m.offset()
               for m in client.read_range({(topic, 0): (0, None)}) if m.value() is not None}
    real = Client.watermarks
    gone = [commits[20] + 1]  # the second commit's message is gone

    def retention(self: Client, tps: Any, committed: bool = False) -> Any:
        return {tp: (max(lo, gone[0]) if tp[0] == topic else lo, hi)
                for tp, (lo, hi) in real(self, tps, committed).items()}

    def batch(s: KafkaStream, start: Any, end: Any) -> list[int]:
        got: list[int] = []
        for part in s.partitions(start, end, 2):
            assert isinstance(part, KafkaRange)
            got.extend(orjson.loads(v)["offset"] for v in read_events(part).to_pylist())
        return sorted(got)

    try:
        monkeypatch.setattr(Client, "watermarks", retention)
        with pytest.raises(ChangeLogError, match=topic) as info:
            end = stream.latest_offset(end1, None)
            raise AssertionError(f"planned {end['seq'] - 10} events, read {batch(stream, end1, end)}")
        assert "10..19" in str(info.value), info.value
        restarted = KafkaStream(kafka_log.model_dump_json())  # Spark replays (end1, end3]
        with pytest.raises(ChangeLogError, match=topic) as info:
            raise AssertionError(f"replayed {batch(restarted, end1, end3)}")
        assert "10..19" in str(info.value), info.value
        gone[0] = commits[30] + 1  # both commits of the logged batch are gone
        with pytest.raises(ChangeLogError, match="plans differently"):
            raise AssertionError(f"replayed {batch(restarted, end1, end3)}")
        restarted.close()
        gone[0] = 0  # the messages are all there: the same batches as before
        assert batch(stream, end1, end3) == list(range(10, 30))
        assert stream.latest_offset(end1, None)["seq"] == 40
    finally:
        stream.close()


@pytest.mark.slow
def test_a_spark_python_process_that_connects_back_late_restarts_the_query(
        pg_db: str, tmp_path: Path, kafka_log: LogConfig) -> None:
    """Spark gives each planning Python process it starts a fixed 10 s to connect back
    (``PythonWorkerFactory.createSimpleWorker``); on a machine loaded to 20 the streaming
    planner's did not, and the sync stopped ("Python worker failed to connect back": the
    kill -9 test's final run failed so, 1 of 18 runs). Nothing was applied then, so the
    job starts the query again: here the first streaming planner is held 12 s (a
    ``PYSPARK_PYTHON`` wrapper), the job warns, restarts and drains the log exactly."""
    from pydblog.spark.pyexec import worker_python

    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=79))
    assert copy_to_kafka(tmp_path / "log", kafka_log) == end
    config = write_config(tmp_path, kafka_log, pg_db)
    wrapper = tmp_path / "slow-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *python_streaming_source_runner*)\n'
        f'  if mkdir {tmp_path / "held"} 2>/dev/null; then sleep 12; fi ;;\n'
        "esac\n"
        f'exec {worker_python("local[1]")} "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "DBLOG_SPARK_DRIVER_MEMORY": "1g", "PYSPARK_PYTHON": str(wrapper)}
    env.pop(FAULT_ENV, None)
    out = subprocess.run([sys.executable, "-m", "pydblog.spark.job", "--config", str(config)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
                         start_new_session=True)
    text = out.stdout.decode(errors="replace")
    assert (tmp_path / "held").is_dir(), "the wrapper held no planner"
    assert out.returncode == 0, text[-5000:]
    assert "restarting the query" in text, text[-5000:]

    def state() -> str:
        return sync_state(lake=tmp_path / "lake", history=tmp_path / "lake" / "_changes",
                          pg_dsn=pg_db, pg_schema="mirror", checkpoint=tmp_path / "cp")

    assert_offsets_once(history_offsets(tmp_path / "lake" / "_changes"), end, state)
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror",
                   state=state)


@pytest.mark.slow
@pytest.mark.usefixtures("spark")
def test_sync_from_kafka_killed_at_random_moments(pg_db: str, tmp_path: Path, kafka_log: LogConfig) -> None:
    """kill -9 of a streaming job (200 ms trigger, 700-event batches) at random moments
    0-4 s after it applied a batch, four times: the kills land anywhere (planning, reading,
    inside a sink's commit, between sinks, before Spark's commit), then a clean run
    drains the rest. The seed of the delays is printed and in every failure message;
    ``DBLOG_KILL_SEED=<seed>`` runs the same delays again (where they land still
    depends on the machine's speed: the message has what every sink recorded at each
    kill)."""
    import random

    seed = kill_seed(random.randrange(10**6))  # a new one each run, unless given
    print(f"kill delays from seed {seed} (DBLOG_KILL_SEED={seed} runs them again)")
    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=80))
    assert copy_to_kafka(tmp_path / "log", kafka_log) == end
    drain = write_config(tmp_path, kafka_log, pg_db)
    stream = write_config(tmp_path, kafka_log, pg_db, trigger="200 ms", max_events=700)
    history = tmp_path / "lake" / "_changes"

    def version() -> int | None:
        return DeltaTable(str(history)).version() if DeltaTable.is_deltatable(str(history)) else None

    jobs: list[subprocess.Popen[bytes]] = []
    kills = Kills(seed)  # (filled in by the loop when it returns)

    def state() -> str:
        return (f"{kills}; kept in {tmp_path}\n" + sync_state(
            lake=tmp_path / "lake", history=history, pg_dsn=pg_db, pg_schema="mirror",
            checkpoint=tmp_path / "cp", logs=[tmp_path / f"job-{n}.log" for n in range(len(jobs))]))

    def start() -> None:
        jobs.append(start_job(stream, tmp_path / f"job-{len(jobs)}.log"))

    def batch_applied(n: int, rng: object) -> None:  # the delay counts from there
        before = version()
        wait_for(lambda: version() != before or jobs[-1].poll() is not None, 240,
                 f"job {n} to apply a batch", interval=0.1)
        assert version() != before, state()

    start()
    try:
        kills = kill_and_restart(lambda: kill_group(jobs[-1]), start, 4, seed, delay=(0.0, 4.0),
                                 each_round=batch_applied, restart_last=False,
                                 note=lambda: f"history version {version()}")
    finally:  # killed (its JVM, its Python workers), whatever happened
        kill_group(jobs[-1])
    print(kills)
    assert run_sync(load_config(drain), available_now=True) == 0
    assert_offsets_once(history_offsets(history), end, state)
    assert_delta_batches_once(tmp_path / "lake", state)
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror",
                   state=state)
    for t in ("orders", "order_lines"):
        assert DeltaTable(str(tmp_path / "lake" / "public" / t)).transaction_version("pydblog-sync") == end, state()
