"""This process's role in the capture pipeline, readable from any thread (``/health``,
``status.json``): ``"leader"`` (capturing; also a process without ``[ha]``),
``"standby"`` (waiting for leadership) or ``"stopped"``."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RoleInfo:
    role: str  # "leader" | "standby" | "stopped"
    epoch: int | None = None  # the leader's term (None without [ha])
    leader: str | None = None  # the current leader's member name, as last seen
    member: str | None = None  # this process's member name (None without [ha])
    ha: bool = False


class _Role:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._info = RoleInfo("stopped")

    def get(self) -> RoleInfo:
        with self._lock:
            return self._info

    def set(self, info: RoleInfo) -> None:
        with self._lock:
            self._info = info


ROLE = _Role()
"""The process-wide role; ``ROLE.get()`` is cheap and thread-safe."""
