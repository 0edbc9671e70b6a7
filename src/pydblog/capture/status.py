"""The capture process's status file (``status.json`` in the log directory).

Written at most once a second by the capturing ``dblog run`` (with ``[ha]``: the
leader only; standbys write member files, see ``ha.members``) and read by
``dblog status``: pid, role, source position, events per second (over the last
interval), snapshot progress.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol

import orjson

from pydblog.ha.role import ROLE
from pydblog.metrics import CAPTURE as METRICS
from pydblog.ports import WriterView
from pydblog.positions import Position

STATUS_FILE = "status.json"


class Progress(Protocol):
    """What a status reads of the capture (``capture.runner.Runner``)."""

    @property
    def logged_position(self) -> Position | None:
        """The position of the last event handed to the change log writer."""
        ...

    @property
    def writer(self) -> WriterView: ...

    def snapshot_status(self) -> dict[str, Any] | None:
        """The snapshot core's progress, None when no snapshot driver runs."""
        ...


class StatusWriter:
    def __init__(self, directory: Path) -> None:
        self.path = directory / STATUS_FILE
        self._events = 0
        self._window_start = time.monotonic()
        self._last_write = 0.0
        self._rate = 0.0
        self._started = time.time()
        self.started_at = self._started
        """When this runner was created (``api.health``: a start is not a stuck loop)."""
        self.latest: dict[str, Any] | None = None
        """The last status written (read by the HTTP API's threads)."""

    def count(self, n: int) -> None:
        self._events += n

    def maybe_write(self, runner: Progress, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_write < 1.0:
            return
        elapsed = now - self._window_start
        if elapsed > 0:
            self._rate = self._events / elapsed
        self._events = 0
        self._window_start = now
        self._last_write = now
        pos = runner.logged_position
        data: dict[str, Any] = {
            "pid": os.getpid(),
            "started_at": self._started,
            "updated_at": time.time(),
            "position": pos.to_json() if pos is not None else None,
            "events_per_second": round(self._rate, 1),
            "snapshot": runner.snapshot_status(),
            **_role(),
        }
        self.latest = data
        METRICS.observe_status(data["snapshot"], runner.writer.backlog())
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")  # one per process ([ha])
        tmp.write_bytes(orjson.dumps(data))
        os.replace(tmp, self.path)


def _role() -> dict[str, Any]:
    """``role`` (``leader``: this process captures), ``epoch`` and ``member`` ([ha])."""
    info = ROLE.get()
    return {"role": "leader", "epoch": info.epoch, "member": info.member}


def read_status(directory: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = orjson.loads((directory / STATUS_FILE).read_bytes())
        return data
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
