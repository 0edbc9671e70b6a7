"""Fencing of the embedded change log: an append of an epoch that no longer owns the
log commits nothing, in the same transaction that would have written it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pydblog.changelog.sqlite import SqliteChangeLog, SqliteChangeLogReader
from pydblog.errors import Fenced, LeadershipLost
from pydblog.events import EncodedEvent
from pydblog.ha.lease import DeadlineLease
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition


def ev(i: int) -> EncodedEvent:
    return EncodedEvent("public.t", "c", 1, f'{{"i":{i}}}')


def cp(i: int) -> Checkpoint:
    return Checkpoint(PgPosition(Lsn(i), 0, Lsn(i)))


def test_newer_epoch_fences_the_old_writer(tmp_path: Path) -> None:
    old = SqliteChangeLog(tmp_path)
    old.claim(1)
    old.append([ev(0), ev(1)], cp(1))
    new = SqliteChangeLog(tmp_path)
    new.claim(2)
    with pytest.raises(Fenced, match="epoch 2"):
        old.append([ev(2)], cp(2))
    assert new.append([ev(3)], cp(3)) == 3  # the new leader continues at the next offset
    with pytest.raises(Fenced):
        old.claim(1)  # an older epoch cannot take the log back
    reader = SqliteChangeLogReader(tmp_path)
    try:
        assert [r.body for r in reader.read(0, 10)] == [b'{"i":0}', b'{"i":1}', b'{"i":3}']
        got = reader.last_checkpoint()
        assert got is not None and got.position == cp(3).position
    finally:
        reader.close()
    old.close()
    new.close()


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
