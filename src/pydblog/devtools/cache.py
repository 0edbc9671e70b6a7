"""Where the devtools keep what they download: ``$PYDBLOG_CACHE_DIR`` when set, else
``/var/cache/pydblog`` as root (what ``.ci/run`` fills), else ``$XDG_CACHE_HOME/pydblog``
(``~/.cache/pydblog`` by default). Each tool keeps its own subdirectory there (Maven-resolved
ones under ``maven/``)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "PYDBLOG_CACHE_DIR"


def cache_root() -> Path:
    """The directory every downloaded tool keeps its own subdirectory in."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/pydblog")
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "pydblog"


def maven_cache() -> Path:
    """The directory each Maven-resolved tool keeps its own subdirectory in."""
    return cache_root() / "maven"
