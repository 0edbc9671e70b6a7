"""Backoff between reads whose window could not decide (IO-free; the driver applies it).

A fenced read is inconclusive while its fence does not cover the table's floor or
settle what was lost (a lagging standby, a commit waiting for a synchronous standby, a
transaction in doubt): the core then reads the chunk (or the table's start) again.
Without a pause that is a tight loop of fenced transactions against the source for as
long as the cause lasts. Invariant: after each inconclusive read the
next request waits at least ``base_s``, doubling with every further inconclusive read in
a row, up to ``max_s``; a request submitted without a new inconclusive read since the
last one (its read decided) ends the run of them."""

from __future__ import annotations

BASE_S = 0.05
MAX_S = 2.0
WARN_AFTER = 20
"""Inconclusive reads in a row after which the driver logs, once per run, why."""


class RetryBackoff:
    __slots__ = ("_at_submit", "_seen", "_until", "base_s", "max_s", "streak")

    def __init__(self, base_s: float = BASE_S, max_s: float = MAX_S) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self.streak = 0  # inconclusive reads in a row
        self._seen = 0  # the core's count of inconclusive reads, last looked at
        self._at_submit = 0  # ... when the last request was submitted
        self._until = 0.0

    def note(self, read_again: int, now: float) -> bool:
        """``read_again``: the core's count of inconclusive reads so far. True when a new
        run of them just reached ``WARN_AFTER`` (log it)."""
        if read_again == self._seen:
            if self._seen == self._at_submit:
                self.streak = 0
            return False
        self._seen = read_again
        self.streak += 1
        self._until = now + min(self.max_s, self.base_s * 2 ** min(self.streak - 1, 30))
        return self.streak == WARN_AFTER

    def ready(self, now: float) -> bool:
        """The next request may be submitted now."""
        return self.streak == 0 or now >= self._until

    def submitted(self) -> None:
        self._at_submit = self._seen
