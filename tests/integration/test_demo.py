"""The README's main command: `dblog demo` runs the whole pipeline and proves it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_end_to_end(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pydblog", "demo", "--rows", "600", "--dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "all mirrors equal the source" in res.stdout
    assert res.stdout.count(" OK ") == 4, res.stdout
    assert "Traceback" not in res.stderr
    # clean output: pydblog's own lines only; Spark's went to the log directory
    for noise in ("log4j", " WARN ", "FutureWarning", "py4j", "[cds]", "incubator"):
        assert noise not in res.stdout and noise not in res.stderr, noise
    assert "log4j" in (tmp_path / "demo" / "dblog-data" / "spark.log").read_text()
