"""sources.mysql.xa: xids as the servers print them, and the held rows' round trip
through the checkpoint (JSON)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydblog.events import ChangeEvent, Op
from pydblog.sources.mysql.position import BinlogPosition
from pydblog.sources.mysql.xa import (
    PreparedXa,
    parse_statement,
    recover_xids,
    xid_key,
    xid_text,
)


@pytest.mark.parametrize(
    ("query", "want"),
    [
        # as MariaDB 10.11 and MySQL 5.7 write them into the binlog
        ("XA COMMIT X'7831',X'',1", ("COMMIT", (1, b"x1", b""), "")),
        ("XA ROLLBACK X'7832',X'622071',7", ("ROLLBACK", (7, b"x2", b"b q"), "")),
        ("XA START X'0102',X'',1", ("START", (1, b"\x01\x02", b""), "")),
        # as users type them
        ("xa commit 'x1'", ("COMMIT", (1, b"x1", b""), "")),
        ("XA COMMIT 'a''b', \"c\", 3 ONE PHASE", ("COMMIT", (3, b"a'b", b"c"), "ONE PHASE")),
        ("XA COMMIT 0x0a0b", ("COMMIT", (1, b"\n\x0b", b""), "")),
    ],
)
def test_parse_statement(query: str, want: object) -> None:
    assert parse_statement(query) == want


def test_not_an_xa_statement() -> None:
    assert parse_statement("COMMIT") is None
    assert parse_statement("XA RECOVER") is None


xids = st.tuples(st.integers(0, 2**31 - 1), st.binary(min_size=1, max_size=64),
                 st.binary(max_size=64))


@given(xids)
def test_printed_xid_parses_back(xid: tuple[int, bytes, bytes]) -> None:
    assert parse_statement(f"XA COMMIT {xid_text(xid)}") == ("COMMIT", xid, "")


def test_recover_rows() -> None:
    assert recover_xids([(7, 2, 3, b"x2b q")]) == [(7, b"x2", b"b q")]


def test_held_rows_round_trip_through_the_checkpoint() -> None:
    at = BinlogPosition("b.000001", 400, 0, "0-1-5")
    rows = [
        ChangeEvent(Op.UPDATE, "d", "t", at.with_index(0), 1000, {"id": 1},
                    {"id": 1, "v": "a", "f": 0.1, "j": {"k": [1, None]}},
                    {"id": 1, "v": "b", "f": 1e300, "j": None}),
        ChangeEvent(Op.DELETE, "d", "t", at.with_index(1), 1000, {"id": 2}, {"id": 2}, None),
    ]
    held = PreparedXa()
    held.prepare((1, b"x1", b""), str(at), rows)
    held.note_before_start([(1, b"early", b"")])
    back = PreparedXa.from_json(json.loads(json.dumps(held.to_json())), at)
    got = back.take((1, b"x1", b""))
    assert got is not None
    assert [e[:3] + e[4:] for e in got] == [e[:3] + e[4:] for e in rows]
    assert back.take((1, b"x1", b"")) is None
    assert back.prepared_before_start((1, b"early", b""))
    assert not back.prepared_before_start((1, b"early", b""))
    assert xid_key((1, b"x1", b"")) == "1:7831:"
