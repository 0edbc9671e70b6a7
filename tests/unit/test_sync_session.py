"""``dblog sync`` starts the driver JVM from ``spark.session`` while a background thread
imports the rest of the job (``session.preload``): the module must stay light, or its
own imports would run before the JVM's start again."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pyarrow", "pandas", "numba", "deltalake", "psycopg", "pydblog.spark.job",
         "pydblog.spark.batch", "pydblog.spark.sinks")


def test_the_session_module_imports_none_of_the_job() -> None:
    code = ("import sys\nimport pydblog.spark.session\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "", out.stdout


def test_preload_imports_the_job() -> None:
    code = ("import sys\nfrom pydblog.spark.session import preload\npreload().join(60)\n"
            "print('pydblog.spark.job' in sys.modules, 'delta.tables' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=90, check=True)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr
