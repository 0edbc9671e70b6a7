"""A Spark standalone cluster on loopback for tests and benchmarks: one master and
``workers`` workers (``spark-class org.apache.spark.deploy.master.Master`` /
``...worker.Worker``, from the PyPI ``pyspark`` package's own jars), each its own
process group, stopped by PID.

    with SparkCluster(workers=2, cores=1) as cluster:
        run_sync(cfg with master = cluster.url)

``cpu_quota``: each worker, and every process it starts (its executors and their Python
workers), is limited to that many CPUs by a cgroup of its own (Linux, as root; cgroup v1
``cpu`` or v2 ``cpu.max``). On a machine with few cores this stands in for workers on
machines of their own: the executors' share is fixed, whatever the driver uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PERIOD_US = 100_000


def limit_cpu(pid: int, name: str, cpus: float) -> Path:
    """A new cgroup ``name`` limited to ``cpus`` CPUs, holding ``pid`` (and so its
    future children)."""
    quota = max(1000, int(cpus * PERIOD_US))
    v1 = Path("/sys/fs/cgroup/cpu")
    v2 = Path("/sys/fs/cgroup")
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            cg = v1 / name
            cg.mkdir()
            (cg / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (cg / "cpu.cfs_quota_us").write_text(str(quota))
        elif (v2 / "cgroup.controllers").exists():
            cg = v2 / name
            cg.mkdir()
            (cg / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            raise OSError("no cgroup cpu controller under /sys/fs/cgroup")
        (cg / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        raise RuntimeError(f"cannot limit a Spark worker to {cpus} CPUs with a cgroup ({exc}): "
                           "this needs Linux cgroups and root") from None
    return cg


class SparkCluster:
    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "2g",
                 workdir: str | Path | None = None, cpu_quota: float | None = None) -> None:
        self.workers = workers
        self.cpu_quota = cpu_quota
        self.cgroups: list[Path] = []
        self.cores = cores
        self.memory = memory
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="dblog-spark-")
        self.dir = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.port = _free_port()
        self.ui_port = _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.master: subprocess.Popen[bytes] | None = None
        self.worker_procs: list[subprocess.Popen[bytes]] = []

    def _spark_class(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        from pydblog.spark.session import spark_home

        home = spark_home()
        env = dict(os.environ, SPARK_HOME=home, SPARK_LOG_DIR=str(self.dir),
                   SPARK_WORKER_DIR=str(self.dir / "work"), SPARK_LOCAL_IP="127.0.0.1")
        out = open(self.dir / log, "wb")  # noqa: SIM115 - the child holds it
        return subprocess.Popen([f"{home}/bin/spark-class", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout: float = 120.0) -> SparkCluster:
        self.master = self._spark_class(
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port), log="master.log")
        for i in range(self.workers):
            self.start_worker(i)
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.workers} Spark workers did not register in {timeout} s "
                                   f"(logs in {self.dir})")
            time.sleep(0.5)
        return self

    def start_worker(self, i: int) -> subprocess.Popen[bytes]:
        proc = self._spark_class(
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
            "--cores", str(self.cores), "--memory", self.memory,
            "--webui-port", str(_free_port()), self.url, log=f"worker-{i}.log")
        self.worker_procs.append(proc)
        if self.cpu_quota is not None:
            # Before the launcher execs the worker's JVM: every later child inherits it.
            self.cgroups.append(limit_cpu(proc.pid, f"dblog-spark-{self.port}-{i}",
                                           self.cpu_quota))
        return proc

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                state = json.loads(r.read())
        except OSError:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def executor_pids(self) -> list[int]:
        """PIDs of the executors' JVMs the workers started (children of the workers)."""
        pids: list[int] = []
        for w in self.worker_procs:
            for children in Path(f"/proc/{w.pid}/task").glob("*/children"):
                try:  # a thread's children (the worker starts executors from threads)
                    pids.extend(int(k) for k in children.read_text().split())
                except OSError:
                    continue
        return sorted(set(pids))

    def stop(self) -> None:
        for p in [*self.worker_procs, *([self.master] if self.master else [])]:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.worker_procs.clear()
        self.master = None
        for cg in self.cgroups:
            for _ in range(50):  # the killed processes leave it as they are reaped
                try:
                    cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        self.cgroups.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
