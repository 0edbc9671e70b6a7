"""The native binlog rows decoder (``_myrow``) against the Python path, without a server:
for arbitrary row images of every column kind it decodes natively, its values equal
``fastrows``' readers followed by ``BinlogRowMapper.map`` (types included), or it gives
the body back (None) and the Python path decides. Real servers' events:
``tests/mysql/test_types.py``."""

from __future__ import annotations

import datetime as dt
import json
import logging
import struct
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysqlreplication.constants import FIELD_TYPE

from pydblog.sources.mysql import fastrows, native
from pydblog.sources.mysql.types import BinlogRowMapper

mod: Any = native.module()
needs_decoder = pytest.mark.skipif(mod is None, reason="native binlog decoder not built")


def col(name: str, type_: int, **kw: Any) -> Any:
    base: dict[str, Any] = dict(name=name, type=type_, unsigned=False, max_length=0,
                                character_set_name=None, length_size=0, fsp=0, precision=0,
                                decimals=0, size=0, enum_values=None, set_values=None)
    base.update(kw)
    return SimpleNamespace(**base)


# Every column kind the native decoder reads, with a strategy for a valid stored value.
def _int(width: int, unsigned: bool) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=width, max_size=width)


def _str(prefix: int, text: bool, limit: int = 60) -> st.SearchStrategy[bytes]:
    content = (st.text(max_size=limit).map(lambda s: s.encode()) if text
               else st.binary(max_size=limit))
    return content.map(lambda b: len(b).to_bytes(prefix, "little") + b)


def _latin(prefix: int) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=30).filter(lambda b: all(x not in (0x81, 0x8D, 0x8F, 0x90, 0x9D) for x in b)) \
        .map(lambda b: len(b).to_bytes(prefix, "little") + b)


def _json(prefix: int) -> st.SearchStrategy[bytes]:
    values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                          max_leaves=6)
    return values.map(lambda v: json.dumps(v).encode()).map(lambda b: len(b).to_bytes(prefix, "little") + b)


def _fraction(fsp: int) -> st.SearchStrategy[bytes]:
    n = fastrows._FSP_BYTES[fsp]
    if not n:
        return st.just(b"")
    top = 10 ** fsp
    return st.integers(0, top - 1).map(lambda v: (v * (10 if fsp % 2 else 1)).to_bytes(n, "big"))


def _datetime2(fsp: int) -> st.SearchStrategy[bytes]:
    def pack(d: dt.datetime) -> bytes:
        ym = d.year * 13 + d.month
        v = (1 << 39) | (ym << 22) | (d.day << 17) | (d.hour << 12) | (d.minute << 6) | d.second
        return v.to_bytes(5, "big")

    return st.tuples(st.datetimes(dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31)).map(pack),
                     _fraction(fsp)).map(lambda t: t[0] + t[1])


def _timestamp2(fsp: int) -> st.SearchStrategy[bytes]:
    return st.tuples(st.integers(0, 2**31 - 1).map(lambda s: s.to_bytes(4, "big")),
                     _fraction(fsp)).map(lambda t: t[0] + t[1])


def _date() -> st.SearchStrategy[bytes]:
    return st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)).map(
        lambda d: ((d.year << 9) | (d.month << 5) | d.day).to_bytes(3, "little"))


def _decimal(precision: int, scale: int) -> st.SearchStrategy[bytes]:
    def pack(value: tuple[bool, int, int]) -> bytes:
        negative, whole, frac = value
        digits = ((f"{whole:0{precision - scale}d}" if precision > scale else "")
                  + (f"{frac:0{scale}d}" if scale else ""))
        out = bytearray()
        ints, fracs = digits[:precision - scale], digits[precision - scale:]
        lead = len(ints) % 9
        if lead:
            out += int(ints[:lead]).to_bytes(fastrows._DIG2BYTES[lead], "big")
        for i in range(lead, len(ints), 9):
            out += int(ints[i:i + 9]).to_bytes(4, "big")
        for i in range(0, len(fracs) - len(fracs) % 9, 9):
            out += int(fracs[i:i + 9]).to_bytes(4, "big")
        rest = len(fracs) % 9
        if rest:
            out += int(fracs[-rest:]).to_bytes(fastrows._DIG2BYTES[rest], "big")
        out[0] |= 0x80
        if negative:
            out = bytearray(b ^ 0xFF for b in out)
        return bytes(out)

    return st.tuples(st.booleans(), st.integers(0, 10 ** (precision - scale) - 1),
                     st.integers(0, 10 ** scale - 1)).map(pack)


def _float() -> st.SearchStrategy[bytes]:
    return st.floats(width=32, allow_nan=False, allow_infinity=False).map(lambda f: struct.pack("<f", f))


def _double() -> st.SearchStrategy[bytes]:
    return st.floats(allow_nan=False, allow_infinity=False).map(lambda f: struct.pack("<d", f))


KINDS: list[tuple[Any, st.SearchStrategy[bytes], bool]] = []  # (column, valid value, is_json)
for t, w in ((FIELD_TYPE.TINY, 1), (FIELD_TYPE.SHORT, 2), (FIELD_TYPE.LONG, 4), (FIELD_TYPE.LONGLONG, 8)):
    for u in (False, True):
        KINDS.append((col("", t, unsigned=u), _int(w, u), False))
KINDS += [
    (col("", FIELD_TYPE.INT24), _int(3, False), False),
    (col("", FIELD_TYPE.INT24, unsigned=True), _int(3, True), False),
    (col("", FIELD_TYPE.FLOAT), _float(), False),
    (col("", FIELD_TYPE.DOUBLE), _double(), False),
    (col("", FIELD_TYPE.VARCHAR, max_length=160, character_set_name="utf8mb4"), _str(1, True), False),
    (col("", FIELD_TYPE.VARCHAR, max_length=1200, character_set_name="utf8mb4"), _str(2, True), False),
    (col("", FIELD_TYPE.VARCHAR, max_length=40, character_set_name="latin1"), _latin(1), False),
    (col("", FIELD_TYPE.VARCHAR, max_length=40, character_set_name="binary"), _str(1, False), False),
    (col("", FIELD_TYPE.STRING, max_length=40, character_set_name="utf8mb4"), _str(1, True), False),
    (col("", FIELD_TYPE.STRING, max_length=8, character_set_name="binary"), _str(1, False, 8), False),
    (col("", FIELD_TYPE.BLOB, length_size=2, character_set_name="utf8mb4"), _str(2, True), False),
    (col("", FIELD_TYPE.BLOB, length_size=4, character_set_name="binary"), _str(4, False), False),
    (col("", FIELD_TYPE.BLOB, length_size=3, character_set_name="binary"), _str(3, False), False),
    (col("", FIELD_TYPE.BLOB, length_size=4, character_set_name="utf8mb4"), _json(4), True),
    (col("", FIELD_TYPE.DATE), _date(), False),
    (col("", FIELD_TYPE.YEAR), st.binary(min_size=1, max_size=1), False),
    (col("", FIELD_TYPE.ENUM, size=1, enum_values=["", "a", "bé"]), st.sampled_from([b"\0", b"\1", b"\2"]), False),
    (col("", FIELD_TYPE.ENUM, size=2, enum_values=["", "x"]), st.sampled_from([b"\0\0", b"\1\0"]), False),
]
for fsp in range(7):
    KINDS.append((col("", FIELD_TYPE.DATETIME2, fsp=fsp), _datetime2(fsp), False))
    KINDS.append((col("", FIELD_TYPE.TIMESTAMP2, fsp=fsp), _timestamp2(fsp), False))
for p, s in ((12, 2), (10, 0), (2, 2), (30, 10), (65, 30), (18, 9), (9, 9), (1, 0), (20, 19)):
    KINDS.append((col("", FIELD_TYPE.NEWDECIMAL, precision=p, decimals=s), _decimal(p, s), False))


@st.composite
def tables(draw: st.DrawFn) -> list[tuple[Any, st.SearchStrategy[bytes], bool]]:
    picked = draw(st.lists(st.sampled_from(range(len(KINDS))), min_size=1, max_size=9))
    odd = st.sampled_from(["", "", '"', "é", "\\", "\n", "\x01", " x", "😀"])  # names JSON escapes
    return [(SimpleNamespace(**{**vars(KINDS[i][0]), "name": f"c{n}{draw(odd)}"}), KINDS[i][1],
             KINDS[i][2]) for n, i in enumerate(picked)]


def _bits(flags: list[bool]) -> bytes:
    out = bytearray((len(flags) + 7) // 8)
    for i, f in enumerate(flags):
        if f:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


@st.composite
def images(draw: st.DrawFn, table: list[Any], present: list[bool]) -> bytes:
    shown = [c for c, p in zip(table, present, strict=True) if p]
    nulls = draw(st.lists(st.booleans(), min_size=len(shown), max_size=len(shown)))
    body = _bits(nulls)
    for (_, values, _), null in zip(shown, nulls, strict=True):
        if not null:
            body += draw(values)
    return body


def python_path(columns: list[Any], json_cols: frozenset[str], body: bytes, first: bytes,
                second: bytes | None) -> list[Any]:
    codecs = [(c.name, fastrows._codec(c)) for c in columns]
    readers = [(name, codec.read) for name, codec in codecs if codec is not None]
    assert len(readers) == len(columns)
    mapper = BinlogRowMapper.build(columns, json_cols)
    rows = fastrows.decode_body(readers, body, first, second, {})
    return mapper.map_rows(rows, second is not None)


def typed(value: Any) -> Any:
    """A value with its type spelled out (1 == 1.0 == True must not pass)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [type(value).__name__, [typed(v) for v in value]]
    return (type(value).__name__, repr(value))


def compile_table(table: list[Any]) -> tuple[Any, list[Any], frozenset[str]]:
    columns = [c for c, _, _ in table]
    json_cols = frozenset(c.name for c, _, j in table if j)
    compiled = native.plan(columns, json_cols)
    assert compiled is not None, [native.spec(c, c.name in json_cols) for c in columns]
    return compiled, columns, json_cols


@needs_decoder
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_valid_rows_decode_natively_as_the_python_path_decodes_them(data: st.DataObject) -> None:
    table = data.draw(tables())
    compiled, columns, json_cols = compile_table(table)
    update = data.draw(st.booleans())
    n = len(table)
    first = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    second = data.draw(st.lists(st.booleans(), min_size=n, max_size=n)) if update else None
    body = b""
    for _ in range(data.draw(st.integers(1, 4))):
        body += data.draw(images(table, first))
        if second is not None:
            body += data.draw(images(table, second))
    bits1, bits2 = _bits(first), (_bits(second) if second is not None else None)
    got = mod.rows(compiled, body, bits1, bits2)
    assert got is not None
    assert typed(got) == typed(python_path(columns, json_cols, body, bits1, bits2))


@needs_decoder
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_arbitrary_bytes_decode_as_the_python_path_or_are_handed_back(data: st.DataObject) -> None:
    table = data.draw(tables())
    compiled, columns, json_cols = compile_table(table)
    n = len(table)
    first = _bits([True] * n)
    body = data.draw(st.binary(max_size=200))
    got = mod.rows(compiled, body, first, None)
    if got is None:
        return
    assert typed(got) == typed(python_path(columns, json_cols, body, first, None))


@needs_decoder
def test_values_the_python_path_refuses_are_handed_back() -> None:
    """A date that Python's ``datetime`` refuses, invalid UTF-8, an ENUM index past its
    members and a truncated body: None (the event is decoded in Python)."""
    cases = [
        (col("d", FIELD_TYPE.DATE), ((2023 << 9) | (2 << 5) | 30).to_bytes(3, "little")),
        (col("v", FIELD_TYPE.VARCHAR, max_length=10, character_set_name="utf8mb4"), b"\x02\xff\xfe"),
        (col("e", FIELD_TYPE.ENUM, size=1, enum_values=["", "a"]), b"\x05"),
        (col("i", FIELD_TYPE.LONG), b"\x01\x02"),
    ]
    for column, value in cases:
        compiled = native.plan([column], frozenset())
        assert mod.rows(compiled, b"\0" + value, b"\x01", None) is None, column


def test_zero_dates_are_null_in_both_paths() -> None:
    columns = [col("d", FIELD_TYPE.DATE), col("t", FIELD_TYPE.DATETIME2, fsp=0)]
    body = b"\0" + b"\0\0\0" + b"\x80\0\0\0\0"
    if mod is not None:
        got = mod.rows(native.plan(columns, frozenset()), body, b"\x03", None)
        assert got == [{"d": None, "t": None}]
    assert python_path(columns, frozenset(), body, b"\x03", None) == [{"d": None, "t": None}]


def test_columns_without_a_native_reader_leave_the_table_to_python() -> None:
    for column in (col("s", FIELD_TYPE.SET, set_values=["a"]), col("b", FIELD_TYPE.BIT),
                   col("j", FIELD_TYPE.JSON), col("t", FIELD_TYPE.TIME2),
                   col("", FIELD_TYPE.LONG)):
        assert native.spec(column, False) is None
        assert native.plan([col("id", FIELD_TYPE.LONG), column], frozenset()) is None


def test_switched_off_is_a_log_line_and_the_python_path(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    native.reset()
    try:
        with caplog.at_level(logging.INFO, logger=native.__name__):
            assert native.module() is None
            assert native.plan([col("id", FIELD_TYPE.LONG)], frozenset()) is None
        assert "native binlog decoder off" in caplog.text
    finally:
        monkeypatch.delenv(native.DISABLE_ENV)
        native.reset()


@needs_decoder
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_insert_tails_are_the_envelope_tails_of_the_python_path(data: st.DataObject) -> None:
    """``tails`` of a write rows event: per row ``dumps(key) + TAIL_SEP + dumps(row) +
    "}"`` of the rows the Python path gives, the key in the given column order."""
    import orjson

    from pydblog.events import TAIL_SEP

    table = data.draw(tables())
    compiled, columns, json_cols = compile_table(table)
    n = len(table)
    at = tuple(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True)))
    key = [columns[i].name for i in at]
    present = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    body = b"".join(data.draw(images(table, present)) for _ in range(data.draw(st.integers(0, 4))))
    got = mod.tails(compiled, body, _bits(present), at, orjson.dumps, TAIL_SEP.encode(), None, 0)
    rows = python_path(columns, json_cols, body, _bits(present), None)
    want = "\n".join(orjson.dumps({k: r[k] for k in key}).decode() + TAIL_SEP
                     + orjson.dumps(r).decode() + "}" for r in rows)
    assert got == (len(rows), want)


@needs_decoder
def test_insert_tails_hand_back_what_rows_hands_back() -> None:
    import orjson

    compiled = native.plan([col("d", FIELD_TYPE.DATE)], frozenset())
    bad = b"\0" + ((2023 << 9) | (2 << 5) | 30).to_bytes(3, "little")
    assert mod.tails(compiled, bad, b"\x01", (0,), orjson.dumps, b",", None, 0) is None
    assert mod.tails(compiled, bad, b"\x01", (0,), orjson.dumps, b",", None, 2) is None
    assert mod.tails(compiled, bad + bad, b"\x01", (0,), orjson.dumps, b",", b"\x01", 1) is None
    with pytest.raises(TypeError):
        mod.tails(compiled, b"", b"\x01", [0], orjson.dumps, b",", None, 0)
    with pytest.raises(ValueError, match="key column index"):
        mod.tails(compiled, b"", b"\x01", (1,), orjson.dumps, b",", None, 0)
    with pytest.raises(ValueError, match="kind"):
        mod.tails(compiled, b"", b"\x01", (0,), orjson.dumps, b",", None, 3)
    with pytest.raises(ValueError, match="after image"):
        mod.tails(compiled, b"", b"\x01", (0,), orjson.dumps, b",", None, 1)


@needs_decoder
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_insert_tails_of_arbitrary_bytes_equal_the_python_path_or_are_handed_back(
        data: st.DataObject) -> None:
    import orjson

    from pydblog.events import TAIL_SEP

    table = data.draw(tables())
    compiled, columns, json_cols = compile_table(table)
    n = len(table)
    body = data.draw(st.binary(max_size=200))
    got = mod.tails(compiled, body, _bits([True] * n), (0,), orjson.dumps, TAIL_SEP.encode(),
                    None, 0)
    if got is None:
        return
    rows = python_path(columns, json_cols, body, _bits([True] * n), None)
    name = columns[0].name
    assert got == (len(rows), "\n".join(
        orjson.dumps({name: r[name]}).decode() + TAIL_SEP + orjson.dumps(r).decode() + "}"
        for r in rows))


@needs_decoder
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_update_and_delete_tails_are_the_envelope_tails_of_the_python_path(
        data: st.DataObject) -> None:
    """``tails`` of a delete rows event: per row ``dumps(key) + ',"before":' +
    dumps(row) + ',"after":null}'``; of an update: ``dumps(key) + ',"before":' +
    dumps(before) + ',"after":' + dumps(after) + "}"`` with the after row's key, or None
    when a row's key text changes (the rows then go the event path: a delete and a
    create); rows of the Python path, the key in the given column order."""
    import orjson

    dumps = orjson.dumps
    table = data.draw(tables())
    compiled, columns, json_cols = compile_table(table)
    n = len(table)
    at = tuple(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True)))
    key = [columns[i].name for i in at]
    update = data.draw(st.booleans())
    first = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    second = data.draw(st.lists(st.booleans(), min_size=n, max_size=n)) if update else None
    body = b""
    for _ in range(data.draw(st.integers(0, 4))):
        before = data.draw(images(table, first))
        body += before
        if second is not None:  # often the same key: the after image of the same bytes
            body += before if second == first and data.draw(st.booleans()) else data.draw(
                images(table, second))
    bits1, bits2 = _bits(first), (_bits(second) if second is not None else None)
    got = mod.tails(compiled, body, bits1, at, dumps, b"unused", bits2, 1 if update else 2)
    rows = python_path(columns, json_cols, body, bits1, bits2)

    def key_of(row: dict[str, Any]) -> str:
        return dumps({k: row[k] for k in key}).decode()

    if update:
        if any(key_of(b) != key_of(a) for b, a in rows):
            assert got is None
            return
        want = "\n".join(f'{key_of(a)},"before":{dumps(b).decode()},"after":{dumps(a).decode()}}}'
                         for b, a in rows)
    else:
        want = "\n".join(f'{key_of(r)},"before":{dumps(r).decode()},"after":null}}' for r in rows)
    assert got == (len(rows), want)


_UTF8_EDGES = [b"a", b'"', b"\\", b"\x1f", b"\x7f", b"\xc2\x80", b"\xdf\xbf", b"\xc0\x80", b"\xc1\xbf",
               b"\xe0\xa0\x80", b"\xe0\x9f\xbf", b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xef\xbf\xbf",
               b"\xf0\x90\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80",
               b"\xf5\x80\x80\x80", b"\x80", b"\xc2", b"\xe1\x80", b"\xf1\x80\x80", b"\xff"]


@needs_decoder
@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_UTF8_EDGES), st.binary(max_size=3)), max_size=8))
def test_text_is_written_as_json_exactly_when_python_decodes_it(parts: list[bytes]) -> None:
    """A UTF-8 column's bytes become JSON text in C only where Python's strict decoder
    takes them (then as orjson writes the decoded text); else the event is handed back."""
    import orjson

    from pydblog.events import TAIL_SEP

    column = col("v", FIELD_TYPE.BLOB, length_size=2, character_set_name="utf8mb4")
    compiled = native.plan([column], frozenset())
    raw = b"".join(parts)
    body = b"\0" + len(raw).to_bytes(2, "little") + raw
    got = mod.tails(compiled, body, b"\x01", (0,), orjson.dumps, TAIL_SEP.encode(), None, 2)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        assert got is None
        return
    row = orjson.dumps({"v": text}).decode()
    assert got == (1, f'{row},"before":{row},"after":null}}')
