"""Raw benchmark results: one JSON file per run under ``bench/results/``.

Every bench script ends its report with ``results.write(name, figures)``. The file
``bench/results/<name>-<UTC timestamp>.json`` holds what a reader needs to judge the figures
without the run's terminal: the exact command line, the machine (cores, CPU model, load
average at the end of the run, memory), the git head (with ``-dirty`` when the work tree had
changes) and the figures themselves. docs/performance.md quotes these files; a figure there
names the file it came from.

The figures are whatever the script measured, as plain JSON values (numbers, strings, lists,
dicts); give each a name that carries its unit (``events_per_s``, ``p99_ms``) and put every
baseline measured in the same run beside it, so a ratio can be recomputed from the file.

Scripts run as ``python bench/<script>.py``, which puts ``bench/`` first on ``sys.path``:
``import results`` finds this module.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"


def write(name: str, figures: Mapping[str, Any], *, directory: Path | None = None) -> Path:
    """Write ``figures`` with the run's command, machine and git head; return the file's path.

    ``name`` is the script's short name (``stream``, ``snapshot``): it starts the file's name,
    so ``ls bench/results/stream-*`` lists every recorded run of one benchmark in time order.
    """
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"results.write: name {name!r} must be a plain file name stem")
    now = dt.datetime.now(dt.UTC)
    record = {
        "name": name,
        "utc": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "command": command_line(),
        "git_head": git_head(),
        "machine": machine(),
        "figures": dict(figures),
    }
    out = directory if directory is not None else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=False, default=str) + "\n")
    print(f"results: {path}")
    return path


def command_line() -> str:
    """The command as a user would retype it from the repository's root."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = script.relative_to(BENCH.parent).as_posix()
    except ValueError:
        shown = script.as_posix()
    return shlex.join(["python", shown, *sys.argv[1:]])


def machine() -> dict[str, Any]:
    """Facts that move a figure: cores, CPU model, load average now, memory, versions."""
    load1, load5, load15 = os.getloadavg()
    return {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "loadavg": [round(load1, 2), round(load5, 2), round(load15, 2)],
        "mem_total_mb": _mem_total_mb(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
    }


def git_head() -> str | None:
    """``HEAD``'s commit, ``-dirty`` appended when tracked files had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=BENCH, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _mem_total_mb() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
