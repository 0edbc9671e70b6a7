"""The launcher Spark's Python processes start with (pydblog.spark.pyexec)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pydblog.spark.pyexec import LAUNCHER_PREFIX, launcher_script, worker_python


def test_cluster_master_gets_the_interpreter() -> None:
    assert worker_python("spark://host:7077") == sys.executable
    assert worker_python("yarn") == sys.executable


def test_launcher_drops_spark_zips_and_runs_this_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = worker_python("local[2]")
    assert Path(path).parent == tmp_path / "pydblog"
    assert Path(path).name.startswith(LAUNCHER_PREFIX)
    assert os.access(path, os.X_OK)
    pythonpath = ":".join(
        [
            "/spark/python/lib/pyspark.zip",
            "/x/a b",
            "/spark/python/lib/py4j-0.10.9.9-src.zip",
            "/y/*",
            "/spark/jars/spark-core_2.13-4.3.0.jar",
        ]
    )
    out = subprocess.run(
        [
            path,
            "-c",
            "import os, sys, pyspark; print(os.environ['PYTHONPATH']); "
            "print(sys.executable); print('.zip' in pyspark.__file__)",
        ],
        env={**os.environ, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == ["/x/a b:/y/*", sys.executable, "False"]
    # nothing left: PYTHONPATH unset (not empty)
    out = subprocess.run(
        [path, "-c", "import os; print('PYTHONPATH' in os.environ)"],
        env={**os.environ, "PYTHONPATH": "/spark/python/lib/pyspark.zip"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["False"]


def test_launcher_is_reused_and_a_tampered_one_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = Path(worker_python("local[*]"))
    assert worker_python("local[*]") == str(path)
    path.write_text("#!/bin/sh\nexit 1\n")
    assert worker_python("local") == str(path)
    assert path.read_text() == launcher_script(sys.executable)


def test_unwritable_cache_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert worker_python("local[2]") == sys.executable
