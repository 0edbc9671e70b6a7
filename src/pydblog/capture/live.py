"""What the API threads read of the running capture: one ``LiveCapture`` per process,
updated by ``capture.service.run_capture`` (never by the capture loop itself). The API
sees the runner only as a ``ports.RunnerView``.

Reads from other threads are of single attributes (atomic under the GIL); nothing here
is written by the API.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pydblog.ha.role import ROLE
from pydblog.ports import RunnerView


@dataclass
class LiveCapture:
    state: str = "starting"
    """``starting`` | ``running`` | ``retrying`` (after a retriable error) | ``stopped``
    | ``failed``."""
    runner: RunnerView | None = None
    error: str | None = None
    started_at: float = field(default_factory=time.time)

    @property
    def role(self) -> str:
        """``leader`` | ``standby`` | ``stopped`` (``ha.role``; a process without
        ``[ha]`` is the leader while it captures)."""
        return ROLE.get().role

    def view(self) -> tuple[str, str | None, RunnerView | None]:
        """``(state, error, runner)`` as one consistent reading: ``run_capture`` sets
        the runner before it sets ``running`` (one statement, assigned left to right), so
        reading ``state`` first never pairs ``running`` with the runner of before (None
        at the first start: /health called that "stuck opening the source")."""
        state, error = self.state, self.error
        return state, error, self.runner

    def status(self) -> dict[str, Any] | None:
        """The runner's last status (position, rate, snapshot), at most ~1 s old."""
        runner = self.runner
        return None if runner is None else runner.status.latest

    def writer_error(self) -> str | None:
        runner = self.runner
        if runner is None:
            return None
        exc = runner.writer.error
        return None if exc is None else str(exc)

    def backlog(self) -> int:
        runner = self.runner
        return 0 if runner is None else runner.writer.backlog()


LIVE = LiveCapture()
"""The process's capture, as the API sees it."""
