"""Fencing of the embedded change log beyond the shared contract
(``tests/changelog/test_contract.py``: a newer epoch fences the older writer): a claim
sees appends made after open, an unclaimed log is not fenced, a lease without
confirmation runs out."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.errors import LeadershipLost
from pydblog.events import EncodedEvent
from pydblog.ha.lease import DeadlineLease
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition


def ev(i: int) -> EncodedEvent:
    return EncodedEvent("public.t", "c", 1, f'{{"i":{i}}}')


def cp(i: int) -> Checkpoint:
    return Checkpoint(PgPosition(Lsn(i), 0, Lsn(i)))


def test_claim_sees_appends_made_after_open(tmp_path: Path) -> None:
    """A standby opens the log early; the leader appends; the claim re-reads the offset."""
    standby = SqliteChangeLog(tmp_path)
    leader = SqliteChangeLog(tmp_path)
    leader.claim(1)
    leader.append([ev(0), ev(1)], cp(1))
    standby.claim(2)
    assert standby.append([ev(2)], cp(2)) == 3
    assert standby.fence_epoch() == 2
    leader.close()
    standby.close()


def test_unclaimed_log_is_not_fenced(tmp_path: Path) -> None:
    log = SqliteChangeLog(tmp_path)
    assert log.fence_epoch() is None
    assert log.append([ev(0)], cp(0)) == 1
    log.close()


def test_lease_runs_out_without_confirmation() -> None:
    released: list[bool] = []
    lease = DeadlineLease(3, 0.2, "test backend", lambda: released.append(True))
    lease.check()
    lease.renew(time.monotonic())
    lease.check()
    time.sleep(0.25)
    with pytest.raises(LeadershipLost, match="epoch 3"):
        lease.check()
    lease.renew(time.monotonic())  # too late: a lost lease stays lost
    assert lease.lost
    lease.release()
    lease.release()
    assert released == [True]
