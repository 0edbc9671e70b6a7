"""Signals handed straight to the running capture (read-only snapshots).

With ``[snapshot] watermark = "read-only"`` pydblog writes nothing to the source, so
the signals that otherwise become a row in the source's signal table (``POST
/snapshots``, the Kafka signal channel, ``dblog snapshot``) are handed to the capture
process instead: ``INBOX.offer`` queues one, the capture loop takes it at the next
transaction boundary of the stream, applies it to the snapshot core as if the signal
row had been read there, and writes a checkpoint (with the core's new state) before
the offer is answered. In every watermark mode the Kafka signal channel also hands
over the messages it rejects (``Offer.problem``: not JSON, no ``type``, an invalid
signal): the capture logs their REJECTED notification, as it does for a bad signal row.

Invariants:
- an offer is answered ``applied`` only once the checkpoint holding its effect is
  durable in the change log (a crash after that keeps the snapshot request);
- every signal id is applied at most once: the ids of the last ``REMEMBER`` direct
  signals are kept in the checkpoint, and an id seen again is answered ``duplicate``
  without effect (the Kafka channel forwards at least once; its ids are stable);
- an offer that no capture took can be withdrawn (``withdraw``) and then never
  applies.

The inbox lives as long as the process (a capture restarted after a retriable error
takes what is queued); ``dblog run`` has one capture, so one inbox.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REMEMBER = 256
"""How many direct signal ids a checkpoint remembers, to drop a signal offered twice."""


@dataclass
class Offer:
    """One signal waiting for the capture: ``done`` is set once it is answered."""

    id: str
    kind: str
    data: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    outcome: str = ""  # "applied" | "duplicate" | "rejected"
    error: str | None = None
    notification: dict[str, Any] | None = None  # the core's answer (STARTED, SKIPPED, ...)
    problem: str | None = None
    """Set for a message that is no signal at all (the Kafka channel's malformed
    values): the capture only logs a REJECTED notification with this reason."""

    def answer(self, outcome: str, error: str | None = None,
               notification: dict[str, Any] | None = None) -> None:
        self.outcome, self.error, self.notification = outcome, error, notification
        self.done.set()


class SignalInbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[Offer] = []
        self.waiting = False  # read without the lock by the capture loop (a hint)
        self.wake: Callable[[], None] = lambda: None

    def offer(self, signal_id: str, kind: str, data: dict[str, Any],
              problem: str | None = None) -> Offer:
        item = Offer(signal_id, kind, data, problem=problem)
        with self._lock:
            self._queue.append(item)
            self.waiting = True
        self.wake()
        return item

    def withdraw(self, item: Offer) -> bool:
        """Take back an offer no capture has taken yet; False once it was taken."""
        with self._lock:
            if item in self._queue:
                self._queue.remove(item)
                self.waiting = bool(self._queue)
                return True
            return False

    def take(self) -> list[Offer]:
        with self._lock:
            items, self._queue = self._queue, []
            self.waiting = False
            return items

    def put_back(self, items: list[Offer]) -> None:
        """Offers taken but not applied (the capture could not yet): first in line again."""
        if not items:
            return
        with self._lock:
            self._queue[:0] = items
            self.waiting = True


INBOX = SignalInbox()
"""The process's inbox (see the module docstring)."""


def deliver(
    signal_id: str, kind: str, data: dict[str, Any], timeout_s: float,
    stop: threading.Event | None = None, inbox: SignalInbox = INBOX,
    problem: str | None = None,
) -> Offer | None:
    """Offer a signal and wait for its answer.

    None: no capture took it within ``timeout_s`` (or before ``stop``); it was withdrawn
    and never applies. Otherwise the offer: answered (``done`` set), or, rarely, taken
    and unanswered (``done`` not set; its outcome is unknown: still being applied after
    ``TAKEN_WAIT_S`` more, or put back by a capture that failed and withdrawn). With
    ``problem`` the offer is a rejection: the capture logs its REJECTED notification."""
    item = inbox.offer(signal_id, kind, data, problem)
    deadline = time.monotonic() + timeout_s
    while not item.done.wait(0.1):
        if time.monotonic() > deadline or (stop is not None and stop.is_set()):
            if inbox.withdraw(item):
                return None
            item.done.wait(TAKEN_WAIT_S)
            if not item.done.is_set() and inbox.withdraw(item):
                # Put back by a capture that failed while applying it: its checkpoint
                # may or may not have become durable. Outcome unknown (a retry with the
                # same id is answered "duplicate" if it applied).
                item.outcome = "unknown"
            break
    return item


TAKEN_WAIT_S = 30.0
"""How long an offer the capture has taken may take to be answered (a checkpoint)."""
