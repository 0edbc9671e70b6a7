"""``sources.mysql.resume.plan_resume``: where capture resumes after a checkpoint, by
GTID state or by binlog coordinates (``position.py``'s resume invariants), without a
server."""

from __future__ import annotations

from typing import Any

import pytest

from pydblog.sources.mysql.dumpstart import DumpStart, record
from pydblog.sources.mysql.gtid import GtidState, MariaGtidPos, MySqlGtidSet
from pydblog.sources.mysql.position import BEFORE_TX, BinlogPosition
from pydblog.sources.mysql.resume import FileResume, GtidResume, plan_resume

UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
MYSQL_STATE = MySqlGtidSet.parse(f"{UUID}:1-41")
MARIA_STATE = MariaGtidPos.parse("0-1-41")


def mysql_pos(index: int, gtid: str | None = f"{UUID}:42", epoch: int = 3) -> BinlogPosition:
    return BinlogPosition("binlog.000007", 1234, index, gtid, MYSQL_STATE, epoch)


def test_gtid_resume_inside_a_transaction_drops_its_logged_part() -> None:
    pos = mysql_pos(5)
    plan = plan_resume(pos, MYSQL_STATE, mariadb=False, dump_record=None)
    assert plan == GtidResume(
        state=MYSQL_STATE, epoch=4, skip_tx={f"{UUID}:42": 5}, delivered=None, start=None,
    )


@pytest.mark.parametrize(
    ("dump_record", "start"),
    [
        # the record of the checkpoint's own epoch: its dump's server and coordinates
        (record(3, UUID), DumpStart("binlog.000007", 1234, f"{UUID}:42", UUID)),
        (record(2, UUID), None),  # another epoch's dump: its coordinates do not apply
        ({"epoch": 3}, None),  # no server recorded
        ("garbage", None),
        (None, None),
    ],
)
def test_mysql_starts_at_the_coordinates_only_with_its_epochs_record(
    dump_record: Any, start: DumpStart | None
) -> None:
    plan = plan_resume(mysql_pos(2), MYSQL_STATE, mariadb=False, dump_record=dump_record)
    assert isinstance(plan, GtidResume)
    assert plan.start == start


def test_mariadb_never_starts_at_coordinates() -> None:
    pos = BinlogPosition("mariadb-bin.000002", 900, 1, "0-1-42", MARIA_STATE, 0)
    plan = plan_resume(pos, MARIA_STATE, mariadb=True, dump_record=record(0, UUID))
    assert plan == GtidResume(
        state=MARIA_STATE, epoch=1, skip_tx={"0-1-42": 1}, delivered=None, start=None,
    )


def test_gtid_resume_between_transactions_rereads_nothing() -> None:
    """A checkpoint with no GTID (a heartbeat between transactions): nothing is dropped,
    and the stream has delivered the checkpoint's state already."""
    pos = mysql_pos(BEFORE_TX, gtid=None)
    plan = plan_resume(pos, MYSQL_STATE, mariadb=False, dump_record=record(3, UUID))
    assert isinstance(plan, GtidResume)
    assert plan.skip_tx == {}
    assert plan.delivered is pos
    assert plan.start is None  # (no GTID to find at the coordinates)
    assert plan.epoch == pos.epoch + 1


@pytest.mark.parametrize(
    ("pos", "state", "offset", "known"),
    [
        # GTIDs off: the state at the offset is not known (the server is asked)
        (BinlogPosition("binlog.000007", 1234, 3, None, None, 2), None, 1234, None),
        # an empty state (nothing executed yet): file resume, with that state
        (BinlogPosition("binlog.000001", 4, BEFORE_TX, None, MySqlGtidSet(), 0),
         MySqlGtidSet(), 4, MySqlGtidSet()),
        # a checkpoint at offset 0 (the file header) reads from the first event
        (BinlogPosition("binlog.000001", 0, BEFORE_TX, None, None, 0), None, 4, None),
    ],
)
def test_file_resume_stays_in_the_epoch_and_drops_up_to_the_checkpoint(
    pos: BinlogPosition, state: GtidState | None, offset: int, known: GtidState | None
) -> None:
    plan = plan_resume(pos, state, mariadb=False, dump_record=record(pos.epoch, UUID))
    assert plan == FileResume(
        file=pos.file, offset=offset, epoch=pos.epoch, skip_upto=pos, state=known,
    )
