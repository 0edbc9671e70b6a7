"""Where a running ``dblog run`` serves its HTTP API: ``api.json`` in the log directory,
written by the API when it starts and removed by it when it stops.

A leaf module (it imports nothing of pydblog): the API writes the file, and the
commands that talk to a running capture (``dblog status``, ``dblog snapshot`` of a
read-only snapshot) read it without importing the API.
"""

from __future__ import annotations

from pathlib import Path

import orjson

API_FILE = "api.json"


def read_api_address(log_dir: Path) -> str | None:
    """The URL a running `dblog run` serves its API on (from ``api.json``); None while
    no API is recorded there (or the file is being replaced)."""
    try:
        return str(orjson.loads((log_dir / API_FILE).read_bytes())["url"])
    except (OSError, orjson.JSONDecodeError, KeyError):
        return None
