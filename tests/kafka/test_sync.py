"""`dblog sync` from a Kafka change log (the dblog Spark source over the backend's
stream, ``changelog.kafka_spark``) into Delta, the change history and PostgreSQL, with
kill -9 of the job between a sink's write and Spark's commit: the mirrors equal the
oracle and every offset is applied exactly once.

The Kafka log holds the same events as an embedded log built by the sync tests'
scenario (copied append by append), so the embedded log is the oracle."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from deltalake import DeltaTable

from pydblog.changelog.kafka import KafkaChangeLog
from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.config import LogConfig, load_config
from pydblog.events import EncodedEvent
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.job import FAULT_ENV, run_sync
from pydblog.spark.synth import SyntheticLoad
from tests.helpers import dblog
from tests.spark.conftest import spark  # noqa: F401 - fixture
from tests.spark.helpers import assert_mirrors, history_offsets
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


def write_config(tmp: Path, log: LogConfig, dsn: str) -> Path:
    path = tmp / "dblog.toml"
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
trigger = "available-now"
master = "local[1]"
max_events_per_trigger = 1500
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


def run_job(cfg: Path, fault: str, log: Path) -> int:
    """``python -m pydblog.spark.job`` in its own process group, killed by ``fault``.
    Spark's Python processes are left to the job (``PYSPARK_PYTHON``: the launcher that
    imports pyspark precompiled, ``spark.pyexec``): with ``sys.executable`` each compiled
    pyspark's zip (3-5 s at a load of 10 against 0.6-1.1 s), and the streaming planner's
    process must connect back to the JVM within Spark's fixed 10 s: at a load of 12-15
    it did not once in five runs ("Python worker failed to connect back", the job
    failed before its kill)."""
    env = {**os.environ, "DBLOG_SPARK_DRIVER_MEMORY": "1g", FAULT_ENV: fault}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pydblog.spark.job", "--config", str(cfg)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return proc.wait(timeout=240)


@pytest.mark.usefixtures("spark")
def test_sync_from_kafka_with_kill9(pg_db: str, tmp_path: Path, kafka_log: LogConfig) -> None:
    """Killed after the first sink of batch 3 (the other sinks one batch behind): the
    restart replays the batch from Kafka by the offsets Spark logged for it. (What each
    sink does on a replay is the embedded log's tests/spark/test_crash.py's, with both
    kill points; ``test_sync_from_kafka_with_two_kill9s`` runs both here too.)"""
    sync_after_kills(pg_db, tmp_path, kafka_log, ("after-sink:3:0",))


@pytest.mark.slow
@pytest.mark.usefixtures("spark")
def test_sync_from_kafka_with_two_kill9s(pg_db: str, tmp_path: Path, kafka_log: LogConfig) -> None:
    """Also killed after every sink applied batch 1, before Spark's commit."""
    sync_after_kills(pg_db, tmp_path, kafka_log, ("after-sinks:1", "after-sink:3:0"))


def sync_after_kills(pg_db: str, tmp_path: Path, kafka_log: LogConfig, faults: tuple[str, ...]) -> None:
    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=77))
    assert copy_to_kafka(tmp_path / "log", kafka_log) == end
    config = write_config(tmp_path, kafka_log, pg_db)
    assert "sync_lag_messages" not in status(config)["changelog"]  # no sync yet
    for n, fault in enumerate(faults):
        code = run_job(config, fault, tmp_path / f"job-{n}.log")
        assert code == -signal.SIGKILL, (tmp_path / f"job-{n}.log").read_text()
    assert run_sync(load_config(config), available_now=True) == 0
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror")
    dt = DeltaTable(str(tmp_path / "lake" / "public" / "orders"))
    assert dt.transaction_version("pydblog-sync") == end
    # `dblog status`: the sync's consumer group has applied everything; new events are lag.
    info = status(config)["changelog"]
    assert info["sync_lag_messages"] == 0 and info["last_offset"] == end - 1
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
