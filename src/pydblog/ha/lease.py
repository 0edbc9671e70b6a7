"""A term of leadership kept alive by the election backend's confirmations.

Invariant: ``check`` passes only while ``monotonic() < deadline``, and a confirmation
that started at ``t0`` moves the deadline to ``t0 + ttl`` at most, where ``ttl`` is
shorter than the time the backend takes to give leadership to someone else after it
last heard from this member (its session timeout). So when ``check`` passes, no other
member can have been elected yet, unless clocks run at very different rates; and a
process that was frozen (``SIGSTOP``, a long pause) fails ``check`` when it wakes up.
The change log's epoch check (``FencedChangeLog``) guards every write regardless.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pydblog.errors import LeadershipLost

TTL_SHARE = 0.75
"""The share of the session timeout a confirmation keeps the lease for."""


class DeadlineLease:
    def __init__(self, epoch: int, ttl_s: float, what: str, release: Callable[[], None],
                 confirmed_at: float | None = None) -> None:
        """``confirmed_at``: when the round trip that made this member leader started
        (``time.monotonic()``; default now)."""
        self.epoch = epoch
        self._ttl = ttl_s
        self._what = what
        self._release = release
        self._lock = threading.Lock()
        self._deadline = (time.monotonic() if confirmed_at is None else confirmed_at) + ttl_s
        self._lost: str | None = None
        self._released = False

    def renew(self, started: float) -> None:
        """The backend confirmed leadership in a round trip that started at ``started``
        (``time.monotonic()``)."""
        with self._lock:
            if self._lost is None:
                self._deadline = max(self._deadline, started + self._ttl)

    def lose(self, why: str) -> None:
        with self._lock:
            if self._lost is None:
                self._lost = why

    @property
    def lost(self) -> bool:
        try:
            self.check()
        except LeadershipLost:
            return True
        return False

    def check(self) -> None:
        with self._lock:
            if self._lost is None and time.monotonic() >= self._deadline:
                self._lost = f"{self._what} did not confirm leadership for {self._ttl:.1f} s"
            if self._lost is not None:
                raise LeadershipLost(
                    f"lost leadership (epoch {self.epoch}): {self._lost}",
                    hint="a standby takes over; this process goes back to standby",
                )

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
            if self._lost is None:
                self._lost = "released"
        self._release()
