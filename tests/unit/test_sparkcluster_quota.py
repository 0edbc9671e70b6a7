"""``devtools.sparkcluster.limit_cpu``: a process put in a cgroup of its own with a CPU
quota, which its children inherit (what the standalone cluster's ``cpu_quota`` does to
each worker). Needs root and the cgroup ``cpu`` controller."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pydblog.devtools.sparkcluster import PERIOD_US, limit_cpu

V1 = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
V2 = Path("/sys/fs/cgroup/cgroup.controllers")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (V1.exists() or V2.exists()),
    reason="needs root and the cgroup cpu controller")


PARENT = """
import subprocess, sys
sys.stdin.readline()
out = subprocess.run(["cat", "/proc/self/cgroup"], capture_output=True, text=True).stdout
print(out.replace(chr(10), " "), flush=True)
"""


def test_a_limited_process_and_its_children_share_the_quota() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    cg = limit_cpu(parent.pid, f"dblog-test-{os.getpid()}", 0.25)
    try:
        assert str(parent.pid) in (cg / "cgroup.procs").read_text().split()
        quota = ((cg / "cpu.cfs_quota_us").read_text() if V1.exists()
                 else (cg / "cpu.max").read_text().split()[0])
        assert int(quota) == PERIOD_US // 4
        out, _ = parent.communicate("go\n", timeout=30)
        assert f"/{cg.name}" in out  # the child it started after the move is in it too
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert not cg.exists()


def test_an_unusable_quota_names_what_it_needs(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="cgroup"):
        limit_cpu(os.getpid(), "../../no/such/dir/x", 0.5)
