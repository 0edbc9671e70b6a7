"""The leader's side of fencing: claim the change log with the lease's epoch, and a
state store that saves only while the lease holds.

Why the epoch and not only the lease: a lease is a promise about time (``ha.lease``);
a process can be frozen between its check and its write. The change log's own commit
compares the epoch (``FencedChangeLog``), so the check and the write are one atomic step.
The state file cannot take part in that commit: a frozen ex-leader may still replace it
with its last checkpoint when it wakes, but that checkpoint was already in the change
log, which at start wins over the state file when it is as new or newer (``Runner.recover``).
"""

from __future__ import annotations

import logging
import threading
import time

from pydblog.errors import ChangeLogError
from pydblog.ha.stonith import GRACE_S, kill_frozen_holder
from pydblog.ports import Checkpoint, FencedChangeLog, Lease, StateStore

log = logging.getLogger(__name__)


def claim(changelog: FencedChangeLog, lease: Lease, stop: threading.Event) -> None:
    """Claim ``changelog`` for ``lease.epoch``. A frozen ex-leader in the middle of a
    commit holds the embedded log's write lock until it is killed or resumes (its commit
    then lands before the claim, which is consistent): keep trying while the lease holds,
    and kill such a holder if it is a stopped process of this host and the log's
    recorded owner (``ha.stonith``)."""
    warned = False
    started = time.monotonic()
    owner_of = getattr(changelog, "fence_owner", None)
    owner = owner_of() if owner_of is not None else None  # read before our claim
    while True:
        lease.check()
        try:
            changelog.claim(lease.epoch)
            return
        except ChangeLogError as exc:
            if stop.is_set():
                raise
            if not warned:
                log.warning("waiting to claim the change log (%s)", exc.message)
                warned = True
        path = getattr(changelog, "path", None)
        if path is not None and time.monotonic() - started > GRACE_S:
            kill_frozen_holder(path, owner)
        stop.wait(0.1)


class GuardedStateStore:
    def __init__(self, inner: StateStore, lease: Lease) -> None:
        self.inner = inner
        self.lease = lease

    def load(self) -> Checkpoint | None:
        return self.inner.load()

    def save(self, checkpoint: Checkpoint) -> None:
        self.lease.check()
        self.inner.save(checkpoint)
