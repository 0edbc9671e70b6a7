"""The Python executable Spark starts its Python processes with (``PYSPARK_PYTHON``).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and the py4j zip (and the spark-core
jar) at the *front* of every Python process's ``PYTHONPATH``. A zip holds no bytecode
and Python cannot cache any for it, so each of these processes compiles pyspark's
sources again: 0.6-0.9 s per process on the 2-core machine, against 0.13 s for the
same modules precompiled in site-packages. A streaming query over the ``dblog`` source
starts five of them one after the other (data source lookup, ``create_data_source``, the
streaming planner, ``plan_data_source_read``, the executors' worker daemon), so this is
~3-4 s of a fresh query's start-up.

For a local master, where every Python process runs this interpreter, ``worker_python``
returns a tiny ``sh`` launcher that drops those entries from ``PYTHONPATH`` and
``exec``s this interpreter: the processes import the same pyspark from site-packages.
Only when the zip's pyspark is the version this interpreter imports (a pip install of
pyspark ships both); otherwise, and for cluster masters, it returns ``sys.executable``.
The launcher lives in the user's cache directory, named by a hash of its content, so a
stale or foreign file is never used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shlex
import sys
import tempfile
import zipfile
from pathlib import Path

LAUNCHER_PREFIX = "spark-python-"


def cache_dir() -> Path:
    """pydblog's cache directory (``$XDG_CACHE_HOME/pydblog``, else ``~/.cache/pydblog``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pydblog"


def _zip_version(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            text = z.read("pyspark/version.py").decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    m = re.search(r"""__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", text)
    return m.group(1) if m else None


def launcher_script(python: str) -> str:
    """The ``sh`` launcher's text: ``PYTHONPATH`` without the pyspark and py4j zips
    and the spark-core jar Spark puts there, then ``exec python "$@"``."""
    return (
        "#!/bin/sh\n"
        "# Written by pydblog (pydblog.spark.pyexec): Spark's Python processes import\n"
        "# pyspark from site-packages (precompiled) instead of SPARK_HOME's zip.\n"
        "set -f\n"
        "p=\n"
        "IFS=:\n"
        "for e in $PYTHONPATH; do\n"
        "  case $e in\n"
        "    */pyspark.zip|*/py4j-*-src.zip|*/spark-core_*.jar) ;;\n"
        '    *) p="${p:+$p:}$e" ;;\n'
        "  esac\n"
        "done\n"
        "unset IFS\n"
        'if [ -n "$p" ]; then export PYTHONPATH="$p"; else unset PYTHONPATH; fi\n'
        f'exec {shlex.quote(python)} "$@"\n'
    )


def worker_python(master: str) -> str:
    """What ``PYSPARK_PYTHON`` should be for a session with ``master``: the launcher
    described above when it applies and can be written, else ``sys.executable``."""
    if not master.startswith("local"):
        return sys.executable
    try:
        import pyspark
        from pyspark.find_spark_home import _find_spark_home

        spark_home = _find_spark_home()
    except (ImportError, StopIteration, SystemExit):
        return sys.executable
    pyspark_zip = Path(spark_home) / "python" / "lib" / "pyspark.zip"
    if (
        not pyspark_zip.is_file()
        or ".zip" in (pyspark.__file__ or ".zip")
        or _zip_version(pyspark_zip) != pyspark.__version__
    ):
        return sys.executable
    py4j = importlib.util.find_spec("py4j")
    if py4j is None or ".zip" in (py4j.origin or ".zip"):
        return sys.executable
    text = launcher_script(sys.executable)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    target = cache_dir() / f"{LAUNCHER_PREFIX}{digest}"
    try:
        if target.is_file() and os.access(target, os.X_OK) and target.read_text() == text:
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".launcher-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return sys.executable
    return str(target)
