"""``sources.mysql.resume``: where capture resumes after a checkpoint (``plan_resume``)
or a lost connection (``plan_reconnect``), by GTID state or by binlog coordinates
(``position.py``'s resume invariants), and what it drops there (``Delivered``), without
a server. (tests/property/test_mysql_resume_property.py runs them against a model
binlog.)"""

from __future__ import annotations

from typing import Any

import pytest

from pydblog.sources.mysql.dumpstart import DumpStart, record
from pydblog.sources.mysql.gtid import GtidState, MariaGtidPos, MySqlGtidSet
from pydblog.sources.mysql.position import BEFORE_TX, BinlogPosition, OpenTx
from pydblog.sources.mysql.resume import (
    Delivered,
    FileResume,
    GtidResume,
    StreamAt,
    plan_reconnect,
    plan_resume,
)

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


def stream_at(tx: OpenTx | None, *, epoch: int = 3, mariadb: bool = False,
              server_uuid: str | None = UUID,
              last_done: BinlogPosition | None = None) -> StreamAt:
    return StreamAt(
        gtid_mode=True, mariadb=mariadb, epoch=epoch, file="binlog.000007", last_end=2000,
        gtids=MYSQL_STATE.advance(f"{UUID}:42"), tx=tx, last_done=last_done,
        server_uuid=server_uuid,
    )


def open_tx(count: int = 2, epoch: int = 3) -> OpenTx:
    return OpenTx("binlog.000007", 1234, f"{UUID}:42", True, 0, MYSQL_STATE, epoch, count)


def test_reconnect_inside_a_transaction_drops_what_it_delivered() -> None:
    tx = open_tx()
    delivered = Delivered(last=tx.position(1))
    plan = plan_reconnect(stream_at(tx), delivered)
    assert plan == GtidResume(
        state=MYSQL_STATE, epoch=4, skip_tx={f"{UUID}:42": 1}, delivered=None,
        start=DumpStart("binlog.000007", 1234, f"{UUID}:42", UUID),
    )


@pytest.mark.parametrize(
    ("at", "why"),
    [
        (stream_at(open_tx(), mariadb=True), "MariaDB finds the place from the state"),
        (stream_at(open_tx(), server_uuid=None), "the lost dump's server is not known"),
        (stream_at(open_tx(epoch=2)), "the transaction is of another epoch's dump"),
        (stream_at(None, last_done=mysql_pos(4, epoch=2)), "the last one is of another epoch"),
        (stream_at(None, last_done=mysql_pos(BEFORE_TX, gtid=None)), "no GTID to find there"),
    ],
)
def test_reconnect_starts_at_coordinates_only_in_the_lost_dumps_binlog(at: StreamAt, why: str) -> None:
    plan = plan_reconnect(at, Delivered())
    assert isinstance(plan, GtidResume)
    assert plan.start is None, why


def test_reconnect_between_transactions_starts_after_the_last_one() -> None:
    done = mysql_pos(4)
    plan = plan_reconnect(stream_at(None, last_done=done), Delivered(last=done))
    assert plan == GtidResume(
        state=MYSQL_STATE.advance(f"{UUID}:42"), epoch=4, skip_tx={}, delivered=None,
        start=DumpStart("binlog.000007", 1234, f"{UUID}:42", UUID),
    )


def test_reconnect_without_a_state_reads_the_file_again_from_the_transaction() -> None:
    tx = OpenTx("binlog.000007", 1234, None, True, 0, None, 0, 2)
    pending = BinlogPosition("binlog.000007", 1234, 0, None, None, 0)
    at = StreamAt(gtid_mode=False, mariadb=False, epoch=0, file="binlog.000007",
                  last_end=2000, gtids=None, tx=tx, last_done=None, server_uuid=None)
    plan = plan_reconnect(at, Delivered(upto=pending, last=tx.position(1)))
    assert plan == FileResume(
        file="binlog.000007", offset=1234, epoch=0, skip_upto=tx.position(1), state=None,
    )


def test_delivered_drops_up_to_a_file_resume_then_forgets_it() -> None:
    upto = BinlogPosition("binlog.000007", 1234, 1)
    delivered = Delivered(upto=upto)
    assert delivered.drop(upto.with_index(0)) and delivered.drop(upto)
    assert delivered.logged(upto)
    assert not delivered.drop(upto.with_index(2))
    assert delivered.upto is None and delivered.last == upto.with_index(2)
    assert not delivered.drop(None)  # an item without a position


def test_delivered_drops_only_the_resumed_transactions_logged_part() -> None:
    delivered = Delivered(tx={f"{UUID}:42": 1})
    assert delivered.drop(mysql_pos(1)) and delivered.logged(mysql_pos(0))
    assert not delivered.drop(mysql_pos(2))
    assert not delivered.drop(mysql_pos(0, gtid=f"{UUID}:43"))
    assert delivered.pending(MYSQL_STATE)  # not read again yet
    assert not delivered.pending(MYSQL_STATE.advance(f"{UUID}:42"))
    assert delivered.pending(None)
