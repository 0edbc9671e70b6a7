"""``pydblog.failpoints``: a named point exits the process at its n-th visit, and only
there; an unknown point is an error naming the known ones."""

from __future__ import annotations

import subprocess
import sys

import pytest

_VISIT = """
from pydblog import failpoints
for i in range(5):
    print(i, flush=True)
    failpoints.hit("after-state")
    failpoints.hit("after-log")
    failpoints.hit("kafka-after-data", i)
"""


def _run(spec: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _VISIT], env={"DBLOG_CRASH_AT": spec},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("spec", "printed"), [
    ("after-log", "0"), ("after-log:2", "0 1 2"), ("kafka-after-data:3", "0 1 2 3")])
def test_a_point_exits_at_its_nth_visit(spec: str, printed: str) -> None:
    done = _run(spec)
    assert done.returncode == 137, done.stderr
    assert done.stdout.split() == printed.split()


def test_unset_or_another_count_never_exits_and_an_unknown_point_is_named() -> None:
    assert _run("").returncode == 0
    assert _run("after-log:9").returncode == 0
    bad = _run("after-everything")
    assert bad.returncode == 1 and "unknown point" in bad.stderr and "after-log" in bad.stderr
