"""The C parser of text-protocol rows (``_mytext``) gives PyMySQL's rows: the same values
of the same types, the same exception classes, for packets of every shape (NULLs, every
length prefix, rows cut short, undecodable text, numbers that do not parse)."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysql import converters
from pymysql.connections import MySQLResult
from pymysql.protocol import MysqlPacket

from pydblog.sources.mysql import textrows

native = textrows.module()
pytestmark = pytest.mark.skipif(native is None, reason="_mytext not built")

CONVERTERS: list[tuple[str | None, Any]] = [
    ("utf8", None), ("ascii", int), ("ascii", float), (None, None), ("ascii", Decimal),
    ("ascii", converters.convert_datetime), ("ascii", converters.convert_date),
    ("ascii", converters.convert_timedelta), (None, converters.convert_bit), ("latin1", None),
    ("utf8", int), (None, int), (None, float),
]


def _lenenc(n: int) -> bytes:
    if n < 251:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + struct.pack("<H", n)
    if n < 1 << 24:
        return b"\xfd" + struct.pack("<I", n)[:3]
    return b"\xfe" + struct.pack("<Q", n)


def _value(v: bytes | None, wide: bool = False) -> bytes:
    if v is None:
        return b"\xfb"
    if wide and len(v) < 251:  # a longer prefix than needed (valid: the server may send it)
        return b"\xfc" + struct.pack("<H", len(v)) + v
    return _lenenc(len(v)) + v


def _pymysql(data: bytes, conv: list[tuple[str | None, Any]]) -> Any:
    res = MySQLResult.__new__(MySQLResult)
    res.unbuffered_active = False
    res.converters = conv
    try:
        return ("ok", res._read_row_from_packet(MysqlPacket(data, "utf8")))
    except Exception as exc:
        return ("error", type(exc))


def _ours(data: bytes, conv: list[tuple[str | None, Any]]) -> Any:
    assert native is not None
    try:
        return ("ok", native.row(data, 0, textrows.plan(conv)))
    except Exception as exc:
        return ("error", type(exc))


def _same(a: Any, b: Any) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert issubclass(b[1], a[1]) or issubclass(a[1], b[1]), (a, b)
        return
    assert len(a[1]) == len(b[1])
    for x, y in zip(a[1], b[1], strict=True):
        assert type(x) is type(y), (x, y)
        if isinstance(x, float | Decimal) and x != x:  # NaN
            assert y != y
        else:
            assert x == y, (x, y)


texts = st.one_of(
    st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()),
    st.floats(allow_nan=True).map(lambda f: repr(f).encode()),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(lambda d: str(d).encode()),
    st.datetimes(min_value=dt.datetime(1, 1, 1)).map(lambda d: d.isoformat(" ").encode()),
    st.sampled_from([b"0000-00-00 00:00:00", b"2024-02-30", b"-838:59:59.5", b"12:00",
                     b"", b"-", b"1_000", b" 7", b"\xff\xfe", "héllo".encode(), b"0x1f",
                     b"\x00\x01", b"1e400", b"nan", b"inf", b"-0"]),
    st.binary(max_size=300),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(CONVERTERS), st.none() | texts, st.booleans()),
                max_size=12), st.integers(0, 3))
def test_rows_equal_pymysql(cols: list[Any], cut: int) -> None:
    conv = [c for c, _, _ in cols]
    data = b"".join(_value(v, wide) for _, v, wide in cols)
    _same(_pymysql(data, conv), _ours(data, conv))
    # a row cut short between values: both end it there
    if cols and cut:
        short = b"".join(_value(v, wide) for _, v, wide in cols[: max(0, len(cols) - cut)])
        _same(_pymysql(short, conv), _ours(short, conv))


def test_long_values_and_prefixes() -> None:
    conv = [("utf8", None), (None, None), ("ascii", int)]
    for n in (250, 251, 65535, 65536, 70000, 1 << 24):
        data = _value(b"x" * n) + _value(b"\x00" * 3) + _value(b"-9223372036854775809")
        _same(_pymysql(data, conv), _ours(data, conv))


def test_a_value_past_the_end_raises() -> None:
    assert native is not None
    with pytest.raises(ValueError):
        native.row(b"\x05abc", 0, textrows.plan([("utf8", None)]))
    with pytest.raises(ValueError):
        native.row(b"\xfc\x01", 0, textrows.plan([("utf8", None)]))


def test_position_is_honoured() -> None:
    assert native is not None
    assert native.row(b"zz\x012\xfb", 2, textrows.plan([("ascii", int), ("utf8", None)])) == (2, None)


def _packet(body: bytes, seq: int) -> bytes:
    return struct.pack("<I", len(body))[:3] + bytes([seq & 0xFF]) + body


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.none() | st.binary(max_size=40), min_size=2, max_size=2), max_size=8),
       st.integers(0, 255), st.sampled_from(["none", "eof", "error", "seq", "cut"]),
       st.integers(0, 30))
def test_buffered_rows_stop_where_pymysql_must_read(rows: list[list[bytes | None]], seq: int,
                                                    tail: str, cut: int) -> None:
    """``_mytext.rows`` takes the complete row packets in sequence at the start of the
    buffer and stops before the first one PyMySQL must read (the result's end, an error,
    a wrong sequence id, one not complete yet)."""
    assert native is not None
    conv: list[tuple[str | None, Any]] = [(None, None), (None, None)]
    bodies = [b"".join(_value(v) for v in r) for r in rows]
    packets = [_packet(b, seq + i) for i, b in enumerate(bodies)]
    n = seq + len(packets)
    extra = {"none": b"", "eof": _packet(b"\xfe\x00\x00\x02\x00", n),
             "error": _packet(b"\xff\x15\x04#28000denied", n),
             "seq": _packet(_value(b"x") + _value(b"y"), n + 1),
             "cut": _packet(_value(b"x" * 40) + _value(b"y"), n)[: 4 + cut]}[tail]
    buf = b"".join(packets) + extra
    out: list[Any] = []
    used, after = native.rows(buf, seq & 0xFF, textrows.plan(conv), out)
    assert used == sum(len(p) for p in packets)
    assert after == n & 0xFF
    assert out == [_pymysql(b, conv)[1] for b in bodies]


def test_buffered_rows_leave_a_large_row_to_pymysql() -> None:
    assert native is not None
    big = b"\xff\xff\xff\x00" + b"\x00" * 16
    out: list[Any] = []
    assert native.rows(big, 0, textrows.plan([(None, None)]), out) == (0, 0) and out == []
