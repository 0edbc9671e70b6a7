"""sources.mysql.xa: xids as the servers print them, and the held rows' round trip
through the checkpoint (JSON)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydblog.errors import SourceError
from pydblog.events import ChangeEvent, Op
from pydblog.sources.mysql import xa as xa_mod
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


def _row(n: int) -> ChangeEvent:
    pos = BinlogPosition("binlog.000001", 100, n)
    return ChangeEvent(Op.CREATE, "db", "t", pos, 1000, {"id": n}, None, {"id": n})


def test_commit_logs_the_held_rows_rollback_forgets_them() -> None:
    xa = PreparedXa()
    xa.hold((1, b"c", b""), "binlog.000001:100", [_row(1), _row(2)])
    xa.hold((1, b"r", b""), "binlog.000001:200", [_row(3)])
    rows, changed = xa.resolve("COMMIT", (1, b"c", b""), "binlog.000001:300")
    assert [r.key for r in rows] == [{"id": 1}, {"id": 2}] and changed
    assert xa.resolve("ROLLBACK", (1, b"r", b""), "binlog.000001:400") == ([], True)
    assert xa.prepared == {}
    # an XA transaction without captured rows (never held): nothing changes
    assert xa.resolve("COMMIT", (1, b"other", b""), "binlog.000001:500") == ([], False)


def test_commit_of_one_prepared_before_start_is_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    xa = PreparedXa()
    assert xa.recovered([(1, 2, 0, b"x1")], "mysql://h/db")
    assert not xa.recovered([], "mysql://h/db")
    assert "1 prepared XA transaction(s)" in caplog.text
    assert xa.resolve("ROLLBACK", (1, b"x1", b""), "binlog.000001:100") == ([], False)
    xa.note_before_start([(1, b"x1", b"")])
    assert xa.resolve("COMMIT", (1, b"x1", b""), "binlog.000001:100") == ([], True)
    assert "prepared before capture started, committed at binlog.000001:100" in caplog.text
    assert xa.resolve("COMMIT", (1, b"x1", b""), "binlog.000001:100") == ([], False)


def test_held_rows_over_the_limit_stop_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xa_mod, "MAX_HELD_BYTES", 200)
    xa = PreparedXa()
    xa.hold((1, b"a", b""), "binlog.000001:100", [_row(1)])
    with pytest.raises(SourceError, match="over the limit of 200 bytes"):
        xa.hold((1, b"b", b""), "binlog.000001:200", [_row(n) for n in range(10)])


def test_unreadable_checkpoint_names_the_fix() -> None:
    with pytest.raises(SourceError, match="cannot be read") as info:
        PreparedXa.load({"prepared": {"not-a-key": {"at": "x", "rows": []}}}, None)
    assert info.value.hint is not None and "fresh [log] path" in info.value.hint
