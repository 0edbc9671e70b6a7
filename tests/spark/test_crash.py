"""``kill -9`` the sync job (a subprocess with its own JVM) during batches, including
between a sink's write and Spark's checkpoint commit; after restarts the mirrors equal
the oracle and the history holds every offset exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pydblog.config import load_config
from pydblog.devtools.proc import end_process
from pydblog.devtools.synth import SyntheticLoad
from pydblog.spark.job import FAULT_ENV, run_sync
from tests.spark.helpers import assert_mirrors, history_offsets
from tests.spark.test_sync import build_scenario

pytestmark = pytest.mark.timeout(600)


def write_config(tmp: Path, dsn: str, trigger: str, max_events: int = 1500) -> Path:
    cfg = tmp / f"dblog-{trigger.replace(' ', '')}.toml"
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


def test_kill_9_between_sinks(spark: Any, pg_db: str, tmp_path: Path) -> None:
    """One job killed after the first sink (Delta) of a batch, before the others and
    before Spark's commit; a clean run converges (the default suite's crash test)."""
    kill_9_during_batches(pg_db, tmp_path, ("after-sink:1:0",), stream_kill=False,
                          max_events=5000)  # two batches: the kill is in the second


@pytest.mark.slow
def test_kill_9_during_batches_repeatedly(spark: Any, pg_db: str, tmp_path: Path) -> None:
    kill_9_during_batches(pg_db, tmp_path, ("after-sinks:1", "after-sink:3:0"), stream_kill=True)


def kill_9_during_batches(pg_db: str, tmp_path: Path, faults: tuple[str, ...],
                          stream_kill: bool, max_events: int = 1500) -> None:
    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=61))
    drain = write_config(tmp_path, pg_db, "available-now", max_events)
    stream = write_config(tmp_path, pg_db, "200 ms")

    # "after-sinks:N": killed by the job itself after every sink applied batch N, before
    # Spark's commit; "after-sink:N:0": after the first sink (Delta) of batch N, so the
    # other sinks lag one batch.
    for n, fault in enumerate(faults):
        job = start_job(drain, fault, tmp_path, n)
        try:
            code = job.wait(timeout=240)
        finally:  # not left running (its JVM, its Python workers), whatever happened
            end_process(job, kill=True, group=True)
        assert code == -signal.SIGKILL, (tmp_path / f"job-{n}.log").read_text()

    if stream_kill:  # killed from outside at an arbitrary moment while it streams
        n = len(faults)
        job = start_job(stream, None, tmp_path, n)
        try:
            before = history_version(tmp_path)
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and history_version(tmp_path) == before:
                time.sleep(0.2)
            time.sleep(0.3)
        finally:
            end_process(job, kill=True, group=True)
        assert history_version(tmp_path) != before, (tmp_path / f"job-{n}.log").read_text()

    # A clean run drains the rest (in-process, on the tests' shared SparkSession).
    assert run_sync(load_config(drain), available_now=True) == 0

    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror")
    for t in ("orders", "order_lines"):
        dt = DeltaTable(str(tmp_path / "lake" / "public" / t))
        assert dt.transaction_version("pydblog-sync") == end
