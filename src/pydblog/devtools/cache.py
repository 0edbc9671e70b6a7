"""Where the devtools keep what they download: ``/var/cache/pydblog/maven`` as root (what
``.ci/run`` fills), else ``$XDG_CACHE_HOME/pydblog/maven`` (``~/.cache`` by default)."""

from __future__ import annotations

import os
from pathlib import Path


def maven_cache() -> Path:
    """The directory each Maven-resolved tool keeps its own subdirectory in."""
    if os.geteuid() == 0:
        return Path("/var/cache/pydblog/maven")
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "pydblog" / "maven"
