"""The sync on a real Spark standalone cluster (a master and two one-core workers on
loopback, ``devtools.sparkcluster``) and into Delta tables on S3 (``s3a://`` against a
``moto`` server): the job runs in its own process (``python -m pydblog.spark.job``), is
killed with SIGKILL (the driver, or an executor in the middle of a batch), runs again,
and the mirrors equal the oracle. Slow: each job starts a Spark session of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pydblog.devtools.sparkcluster import SparkCluster
from pydblog.devtools.synth import SyntheticLoad, write_load
from pydblog.spark.job import FAULT_ENV
from tests.spark.helpers import assert_mirrors, history_offsets, latest_schemas, oracle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkCluster]:
    with SparkCluster(workers=2, cores=1, memory="1g") as c:
        yield c


def write_config(tmp: Path, master: str, lake: str, history: str | None = None,
                 max_events: int = 2_000) -> Path:
    sinks = f'[[sync.sinks]]\ntype = "delta"\npath = "{lake}"\n'
    if history:
        sinks += f'[[sync.sinks]]\ntype = "history"\npath = "{history}"\n'
    path = tmp / "dblog.toml"
    path.write_text(f"""
[source]
dsn = "postgresql://unused@127.0.0.1/x"
[log]
path = "{tmp / 'log'}"
[sync]
checkpoint = "{tmp / 'cp'}"
trigger = "available-now"
master = "{master}"
max_events_per_trigger = {max_events}
{sinks}""")
    return path


def run_job(cfg: Path, env: dict[str, str] | None = None, fault: str = "",
            kill_executor_after: float | None = None, cluster: SparkCluster | None = None,
            timeout: float = 600) -> int:
    full = {**os.environ, "DBLOG_SPARK_DRIVER_MEMORY": "1g", **(env or {})}
    if fault:
        full[FAULT_ENV] = fault
    log = cfg.parent / "job.log"
    before = log.stat().st_size if log.exists() else 0  # earlier runs' lines
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pydblog.spark.job", "--config", str(cfg)],
                                env=full, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        killer = None
        killed: list[int] = []
        if kill_executor_after is not None and cluster is not None:
            def kill() -> None:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline and proc.poll() is None:
                    with log.open("rb") as f:  # this run's first batch applied:
                        f.seek(before)  # kill an executor inside the next one
                        if b"pydblog.sync batch " in f.read():
                            time.sleep(kill_executor_after)
                            pids = cluster.executor_pids()
                            assert pids, "no executor to kill"
                            os.kill(pids[0], signal.SIGKILL)
                            killed.append(pids[0])
                            return
                    time.sleep(0.2)
            killer = threading.Thread(target=kill, daemon=True)
            killer.start()
        try:
            code = proc.wait(timeout=timeout)
            if kill_executor_after is not None:
                assert killed, "the job ended before an executor was killed"
            return code
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(log.read_text(errors="replace")[-5000:]) from None


def test_standalone_cluster_driver_and_executor_killed(cluster: SparkCluster,
                                                      tmp_path: Path) -> None:
    end = write_load(tmp_path / "log", SyntheticLoad(seed=41), 9_000)
    cfg = write_config(tmp_path, cluster.url, str(tmp_path / "lake"),
                       str(tmp_path / "lake" / "_changes"))
    # The driver dies (SIGKILL of its process group) after batch 1's sinks, before
    # Spark's commit; then an executor dies in the middle of a batch (Spark retries its
    # tasks on the other worker, the worker starts a new executor).
    assert run_job(cfg, fault="after-sinks:1") == -signal.SIGKILL
    assert run_job(cfg, kill_executor_after=0.5, cluster=cluster) == 0, \
        (cfg.parent / "job.log").read_text()[-5000:]
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake")
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))


def test_delta_on_s3(tmp_path: Path) -> None:
    import socket

    from deltalake import DeltaTable

    from pydblog.devtools.synth import key_json
    from pydblog.verify import norm

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    moto = str(Path(sys.executable).parent / "moto_server")
    server = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/lake", method="PUT"), timeout=10).close()
        env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
               "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
        write_load(tmp_path / "log", SyntheticLoad(seed=43), 4_000)
        cfg = write_config(tmp_path, "local[2]", "s3a://lake/mirror")
        assert run_job(cfg, env=env, fault="after-sinks:0") == -signal.SIGKILL
        assert run_job(cfg, env=env) == 0, (cfg.parent / "job.log").read_text()[-5000:]
        options = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                   "AWS_ALLOW_HTTP": "true"}
        schemas = latest_schemas(tmp_path / "log")
        for q, want in oracle(tmp_path / "log").items():
            s = schemas[q]
            rows: list[dict[str, Any]] = DeltaTable(
                f"s3://lake/mirror/{s.schema}/{s.table}", storage_options=options
            ).to_pyarrow_table().to_pylist()
            got = {key_json({k: r[k] for k in s.key}):
                   tuple(norm(c.logical, r.get(c.name)) for c in s.columns) for r in rows}
            assert got == want, q
    finally:
        server.kill()
        server.wait()
