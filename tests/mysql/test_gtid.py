"""GTID states (both flavours) and binlog positions: parse/format/compare/advance, checked
against plain-Python models with hypothesis. No server needed."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydblog.positions import decode_position, encode_position
from pydblog.sources.mysql.gtid import MariaGtidPos, MySqlGtidSet, parse_gtid_state
from pydblog.sources.mysql.position import BinlogPosition

UUIDS = [
    "3e11fa47-71ca-11e1-9e33-c80aa9429562",
    "00000000-0000-0000-0000-000000000001",
    "ffffffff-aaaa-bbbb-cccc-ddddeeee0000",
]

# -- MariaDB ------------------------------------------------------------------------------
maria_model = st.dictionaries(
    st.integers(0, 5), st.tuples(st.integers(1, 4), st.integers(1, 10**6)), max_size=4
)


def maria_of(model: dict[int, tuple[int, int]]) -> MariaGtidPos:
    return MariaGtidPos.parse(",".join(f"{d}-{s}-{n}" for d, (s, n) in model.items()))


@given(maria_model)
def test_maria_roundtrip_and_normal_form(model: dict[int, tuple[int, int]]) -> None:
    state = maria_of(model)
    assert parse_gtid_state(str(state)) == state
    assert [d for d, _, _ in state.domains] == sorted(model)
    assert {d: (s, n) for d, s, n in state.domains} == model
    assert bool(state) == bool(model)


@given(maria_model, st.integers(0, 5), st.integers(1, 4), st.integers(1, 10**6))
def test_maria_advance_and_covers(
    model: dict[int, tuple[int, int]], d: int, s: int, n: int
) -> None:
    state = maria_of(model)
    after = state.advance(f"{d}-{s}-{n}")
    assert after.covers(f"{d}-{s}-{n}") and after.seq(d) == n
    assert {x[0]: x for x in after.domains if x[0] != d} == {
        x[0]: x for x in state.domains if x[0] != d
    }
    if d not in model or model[d][1] <= n:  # a later GTID of its domain: state grows
        assert state <= after and after >= state
    if d in model and model[d][1] < n:
        assert state < after and not after <= state


@given(maria_model, maria_model)
def test_maria_partial_order_matches_model(
    a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]]
) -> None:
    le = all(d in b and b[d][1] >= n for d, (_, n) in a.items())
    assert (maria_of(a) <= maria_of(b)) == le
    assert (maria_of(a) < maria_of(b)) == (le and maria_of(a) != maria_of(b))


def test_maria_server_spelling() -> None:
    # gtid_binlog_state lists one GTID per (domain, server): the last one per domain wins.
    state = MariaGtidPos.parse("1-2-9,\n0-1-50, 0-3-57")
    assert str(state) == "0-3-57,1-2-9"
    assert str(MariaGtidPos.parse("")) == "" and not MariaGtidPos.parse("")
    for bad in ("0-1", "a-b-c", "0-1-2-3", "0--1-2"):
        with pytest.raises(ValueError, match="not a MariaDB GTID"):
            MariaGtidPos.parse(bad)


# -- MySQL --------------------------------------------------------------------------------
mysql_model = st.sets(st.tuples(st.sampled_from(UUIDS), st.integers(1, 40)), max_size=30)


def mysql_text(model: set[tuple[str, int]], upper: bool = False) -> str:
    """Deliberately unnormalised: one single-GTID interval per member, shuffled order."""
    parts = [f"{u.upper() if upper else u}:{n}" for u, n in sorted(model, key=lambda x: -x[1])]
    return ",\n".join(parts)


def members(state: MySqlGtidSet) -> set[tuple[str, int]]:
    return {(u, n) for u, iv in state.sources for a, b in iv for n in range(a, b + 1)}


@given(mysql_model, st.booleans())
def test_mysql_roundtrip_and_normal_form(model: set[tuple[str, int]], upper: bool) -> None:
    state = MySqlGtidSet.parse(mysql_text(model, upper))
    assert members(state) == model
    if model:  # the empty text reads as MariaDB's empty state (see parse_gtid_state)
        assert parse_gtid_state(str(state)) == state
    else:
        assert not state and not parse_gtid_state(str(state))
    for _, iv in state.sources:  # sorted, disjoint, not adjacent
        assert all(b1 + 1 < a2 for (_, b1), (a2, _) in itertools.pairwise(iv))
        assert all(a <= b for a, b in iv)
    assert [u for u, _ in state.sources] == sorted({u for u, _ in model})


@given(mysql_model, st.sampled_from(UUIDS), st.integers(1, 40))
def test_mysql_advance_and_covers(model: set[tuple[str, int]], uuid: str, n: int) -> None:
    state = MySqlGtidSet.parse(mysql_text(model))
    after = state.advance(f"{uuid.upper()}:{n}")
    assert members(after) == model | {(uuid, n)}
    assert after.covers(f"{uuid}:{n}") and state <= after
    assert state.covers(f"{uuid}:{n}") == ((uuid, n) in model)


@given(mysql_model, mysql_model)
def test_mysql_partial_order_is_subset(a: set[tuple[str, int]], b: set[tuple[str, int]]) -> None:
    sa, sb = MySqlGtidSet.parse(mysql_text(a)), MySqlGtidSet.parse(mysql_text(b))
    assert (sa <= sb) == (a <= b)
    assert (sa < sb) == (a < b)
    assert (sa == sb) == (a == b)


def test_mysql_server_spelling() -> None:
    u = UUIDS[0]
    state = MySqlGtidSet.parse(f"{u.upper()}:1-5:3-9:11,\n{UUIDS[1]}:7")
    assert str(state) == f"{UUIDS[1]}:7,{u}:1-9:11"
    assert str(state.advance(f"{u}:10")) == f"{UUIDS[1]}:7,{u}:1-11"
    for bad in (f"{u}", f"{u}:0", f"{u}:5-3", "nope:1-3", f"{u}:tag:1-3"):
        with pytest.raises(ValueError, match="MySQL GTID"):
            MySqlGtidSet.parse(bad)


def test_flavours_do_not_compare() -> None:
    maria: object = MariaGtidPos.parse("0-1-5")
    mysql: Any = MySqlGtidSet.parse(f"{UUIDS[0]}:1-5")
    assert maria != mysql
    with pytest.raises(TypeError):
        _ = maria <= mysql
    assert parse_gtid_state("0-1-5") == maria and parse_gtid_state(str(mysql)) == mysql


# -- positions ----------------------------------------------------------------------------
def test_position_json_roundtrip_and_old_format() -> None:
    maria = BinlogPosition("b.000003", 900, 2, "0-1-58", MariaGtidPos.parse("0-1-57"), 2)
    mysql = BinlogPosition(
        "b.000003", 900, 2, f"{UUIDS[0]}:58", MySqlGtidSet.parse(f"{UUIDS[0]}:1-57")
    )
    for p in (maria, mysql):
        back = decode_position(encode_position(p))
        assert isinstance(back, BinlogPosition)
        assert (back.file, back.pos, back.index, back.gtid, back.gtids, back.epoch) == (
            p.file,
            p.pos,
            p.index,
            p.gtid,
            p.gtids,
            p.epoch,
        )
    assert str(maria.after_state()) == "0-1-58" and str(mysql.after_state()) == f"{UUIDS[0]}:1-58"
    # A checkpoint written before GTID resume: file + offset only, epoch 0.
    old = decode_position('{"kind":"mysql","file":"b.000002","pos":4,"i":-1,"gtid":"0-1-1"}')
    assert isinstance(old, BinlogPosition)
    assert old.gtids is None and old.epoch == 0 and old.after_state() is None
    assert "e" not in old.to_json() and "gtids" not in old.to_json()
    # with_index keeps the state and the epoch (snapshot rows after a watermark).
    assert maria.with_index(7).gtids == maria.gtids and maria.with_index(7).epoch == 2


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 5), st.integers(4, 10**6), st.integers(-1, 50)),
        min_size=2,
        max_size=2,
    )
)
def test_position_order_epoch_first(keys: list[tuple[int, int, int, int]]) -> None:
    """A later epoch sorts above any coordinates of an earlier one (another server's file
    names and offsets after a GTID resume); within an epoch coordinates decide; the GTID
    fields never take part."""
    (e1, f1, p1, i1), (e2, f2, p2, i2) = keys
    a = BinlogPosition(f"x-bin.{f1:06d}", p1, i1, "0-1-9", MariaGtidPos.parse("0-1-8"), e1)
    b = BinlogPosition(f"other.{f2:06d}", p2, i2, None, None, e2)
    assert (a < b) == ((e1, f1, p1, i1) < (e2, f2, p2, i2))
    assert (a == b) == ((e1, f1, p1, i1) == (e2, f2, p2, i2))
    assert (a <= b) == ((e1, f1, p1, i1) <= (e2, f2, p2, i2))


@given(mysql_model)
def test_mysql_set_is_what_the_library_sends(model: set[tuple[str, int]]) -> None:
    """mysql-replication parses our text for COM_BINLOG_DUMP_GTID (``auto_position``) into
    the same set."""
    from pymysqlreplication.gtid import GtidSet

    state = MySqlGtidSet.parse(mysql_text(model))
    if state:
        assert MySqlGtidSet.parse(str(GtidSet(str(state)))) == state
