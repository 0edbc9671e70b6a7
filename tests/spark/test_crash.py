"""``kill -9`` the sync job (a subprocess with its own JVM) during batches, including
between a sink's write and Spark's checkpoint commit; after restarts the mirrors equal
the oracle and the history holds every offset exactly once."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pydblog.config import load_config
from pydblog.devtools.synth import SyntheticLoad
from pydblog.spark.job import FAULT_ENV, run_sync
from tests.chaos import (
    Kills,
    kill_and_restart,
    kill_group,
    kill_seed,
    killed_at_faults,
    reporting,
)
from tests.helpers import wait_for
from tests.spark.helpers import assert_mirrors, history_offsets
from tests.spark.test_sync import build_scenario

pytestmark = pytest.mark.timeout(600)


def write_config(tmp: Path, dsn: str, trigger: str, max_events: int = 1500) -> Path:
    cfg = tmp / f"dblog-{trigger.replace(' ', '')}-{max_events}.toml"
    cfg.write_text(
        f"""
[source]
dsn = "postgresql://unused@127.0.0.1/x"
[log]
path = "{tmp / "log"}"
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
parallelism = 2
"""
    )
    return cfg


def start_job(cfg: Path, fault: str | None, tmp: Path, n: int) -> subprocess.Popen[bytes]:
    # Spark's Python processes are left to the job (PYSPARK_PYTHON: spark.pyexec's
    # launcher, precompiled pyspark): with sys.executable each compiled pyspark's zip,
    # slow enough under load to miss Spark's fixed 10 s to connect back (b174d6a).
    env = {**os.environ, "DBLOG_SPARK_DRIVER_MEMORY": "1g"}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    with open(tmp / f"job-{n}.log", "wb") as out:  # (the job has its own copy)
        return subprocess.Popen(
            [sys.executable, "-m", "pydblog.spark.job", "--config", str(cfg)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def history_version(tmp: Path) -> int | None:
    path = str(tmp / "lake" / "_changes")
    if not DeltaTable.is_deltatable(path):
        return None
    return DeltaTable(path).transaction_version("pydblog-history")


@pytest.mark.slow
def test_kill_9_between_sinks(spark: Any, pg_db: str, tmp_path: Path) -> None:
    """One job killed after the first sink (Delta) of a batch, before the others and
    before Spark's commit; a clean run replays the batch (the Delta mirrors skip it, the
    sinks behind apply it), drains the rest and converges. (The default suite kills the
    sync the same way over a Kafka log: ``tests/kafka/test_sync.py``.) The scenario at a quarter of its size (1,906 events, its added column and
    truncate); the killed batch is its first 150 events, snapshot rows: what the killed
    job does on its own JVM is kept small, the clean run (on the tests' shared session)
    drains the other steps in one batch. Kills in a batch after committed ones, after
    every sink, and at a random moment of a stream, at full size:
    ``test_kill_9_during_batches_repeatedly`` (and ``tests/kafka/test_sync.py``'s
    default kill, after the first sink of a second batch)."""
    kill_9_during_batches(pg_db, tmp_path, ("after-sink:0:0",), stream_kill=False,
                          max_events=150, size=0.25, drain_max_events=10_000)


@pytest.mark.slow
def test_kill_9_during_batches_repeatedly(spark: Any, pg_db: str, tmp_path: Path) -> None:
    kill_9_during_batches(pg_db, tmp_path, ("after-sinks:1", "after-sink:3:0"), stream_kill=True)


def kill_9_during_batches(pg_db: str, tmp_path: Path, faults: tuple[str, ...],
                          stream_kill: bool, max_events: int = 1500, size: float = 1.0,
                          drain_max_events: int | None = None) -> None:
    """The jobs killed at ``faults`` read batches of ``max_events``; the clean run that
    drains the rest, of ``drain_max_events`` (default the same) once it replayed the
    batch killed last (its offsets are in Spark's log)."""
    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=61), size)
    killed = write_config(tmp_path, pg_db, "available-now", max_events)
    drain = write_config(tmp_path, pg_db, "available-now", drain_max_events or max_events)
    stream = write_config(tmp_path, pg_db, "200 ms")

    # "after-sinks:N": killed by the job itself after every sink applied batch N, before
    # Spark's commit; "after-sink:N:0": after the first sink (Delta) of batch N, so the
    # other sinks lag one batch.
    killed_at_faults(lambda fault, n: start_job(killed, fault, tmp_path, n), faults,
                     lambda n: tmp_path / f"job-{n}.log")

    kills: Kills | None = None
    if stream_kill:  # killed from outside at an arbitrary moment while it streams
        n = len(faults)
        job = start_job(stream, None, tmp_path, n)
        before = history_version(tmp_path)

        def batch_applied(_round: int, _rng: object) -> None:
            wait_for(lambda: history_version(tmp_path) != before or job.poll() is not None,
                     180, "a streamed batch")

        try:
            kills = kill_and_restart(lambda: kill_group(job), lambda: None, 1, kill_seed(62),
                                     delay=(0.0, 0.6), each_round=batch_applied,
                                     restart_last=False,
                                     note=lambda: f"history version {history_version(tmp_path)}")
        finally:
            kill_group(job)
        assert history_version(tmp_path) != before, (
            f"{kills}\n" + (tmp_path / f"job-{n}.log").read_text(errors="replace")[-5000:])

    # A clean run drains the rest (in-process, on the tests' shared SparkSession).
    assert run_sync(load_config(drain), available_now=True) == 0

    with contextlib.nullcontext() if kills is None else reporting(kills):
        assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))
        assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db,
                       pg_schema="mirror")
        for t in ("orders", "order_lines"):
            dt = DeltaTable(str(tmp_path / "lake" / "public" / t))
            assert dt.transaction_version("pydblog-sync") == end
