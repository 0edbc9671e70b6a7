"""The snapshot fast path encodes rows straight from PostgreSQL text to JSON text and
wraps them in an envelope template; these properties pin it to the slow path (map the
value with the stream's converter, build the event, ``orjson.dumps`` the envelope).
"""

from __future__ import annotations

import string
from datetime import date, datetime
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.events import (
    EncodedRow,
    SnapshotKind,
    SnapshotRows,
    encode_event,
    encode_snapshot_rows,
    expand,
)
from pydblog.positions import Lsn, PgPosition, Position
from pydblog.sources.mysql.position import BinlogPosition
from pydblog.sources.postgres import types as t
from pydblog.sources.postgres.relations import compile_encoder, compile_row
from pydblog.sources.postgres.types import PgTypeInfo, TypeRegistry

DOMAIN_NUMERIC, DOMAIN_TEXT, INT_ARRAY, TEXT_ARRAY, MOOD = 90001, 90002, 1007, 1009, 90003

REGISTRY = TypeRegistry(
    [
        PgTypeInfo(t.INT4, "integer", "b", 0, "N", 0),
        PgTypeInfo(t.TEXT, "text", "b", 0, "S", 0),
        PgTypeInfo(DOMAIN_NUMERIC, "public.money2", "d", 0, "N", t.NUMERIC, "public"),
        PgTypeInfo(DOMAIN_TEXT, "public.name2", "d", 0, "S", t.TEXT, "public"),
        PgTypeInfo(INT_ARRAY, "integer[]", "b", t.INT4, "A", 0),
        PgTypeInfo(TEXT_ARRAY, "text[]", "b", t.TEXT, "A", 0),
        PgTypeInfo(MOOD, "public.mood", "e", 0, "E", 0, "public"),
    ]
)

texts = st.text(st.characters(codec="utf-8"), max_size=12)


def _fraction(us: int) -> str:
    return "" if us == 0 else "." + f"{us:06d}".rstrip("0")


def _ts(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S") + _fraction(dt.microsecond)


def _array(values: list[str | None]) -> str:
    def el(v: str | None) -> str:
        if v is None:
            return "NULL"
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "{" + ",".join(el(v) for v in values) + "}"


datetimes = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31))
offsets = st.sampled_from(["+00", "-08", "+05:30", "+13"])

# (oid, strategy of that type's text as PostgreSQL prints it under SESSION_SETTINGS)
VALUES: list[tuple[int, st.SearchStrategy[str]]] = [
    (t.INT2, st.integers(-(2**15), 2**15 - 1).map(str)),
    (t.INT4, st.integers(-(2**31), 2**31 - 1).map(str)),
    (t.INT8, st.integers(-(2**63), 2**63 - 1).map(str)),
    (t.OID, st.integers(0, 2**32 - 1).map(str)),
    (t.NUMERIC, st.one_of(st.decimals(allow_nan=False, allow_infinity=False, places=4).map(str),
                          st.sampled_from(["NaN", "Infinity", "-Infinity"]))),
    # (PostgreSQL prints infinities as "Infinity"; Python's repr "inf" never comes)
    (t.FLOAT4, st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr),
                         st.sampled_from(["NaN", "Infinity", "-Infinity"]))),
    (t.FLOAT8, st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr),
                         st.sampled_from(["NaN", "Infinity", "-Infinity", "1e+308"]))),
    (t.BOOL, st.sampled_from(["t", "f", "true", "false"])),
    (t.TEXT, texts),
    (t.VARCHAR, texts),
    (t.NAME, texts),
    (t.CHAR, st.characters(codec="utf-8")),
    (t.BPCHAR, texts.map(lambda s: s + "   ")),
    (t.BYTEA, st.binary(max_size=20).map(lambda b: "\\x" + b.hex())),
    (t.UUID, st.uuids().map(str)),
    (t.DATE, st.one_of(st.dates().map(date.isoformat), st.sampled_from(["infinity", "0044-03-15 BC"]))),
    (t.TIME, st.times().map(lambda x: x.strftime("%H:%M:%S") + _fraction(x.microsecond))),
    (t.TIMETZ, st.tuples(st.times(), offsets).map(
        lambda p: p[0].strftime("%H:%M:%S") + _fraction(p[0].microsecond) + p[1])),
    (t.TIMESTAMP, st.one_of(datetimes.map(_ts), st.sampled_from(["infinity", "0044-03-15 10:00:00 BC"]))),
    (t.TIMESTAMPTZ, st.one_of(
        st.tuples(datetimes, offsets).map(lambda p: _ts(p[0]) + p[1]),
        st.sampled_from(["-infinity", "0044-03-15 10:00:00+00 BC", "2024-01-02 03:04:05.5+05:30"]))),
    (t.INTERVAL, st.sampled_from(["P1Y2M3DT4H5M6.5S", "PT0S", "P-1D", "PT-0.000001S"])),
    (t.JSON, st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | texts,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
        max_leaves=8).map(lambda v: orjson.dumps(v).decode())),
    (t.JSONB, st.just('{"a": [1, {"b": null}], "c": "x"}')),
    (t.INET, st.sampled_from(["10.0.0.1/32", "10.0.0.1", "::1/128", "10.0.0.0/8"])),
    (DOMAIN_NUMERIC, st.decimals(allow_nan=False, allow_infinity=False, places=2).map(str)),
    (DOMAIN_TEXT, texts),
    (INT_ARRAY, st.lists(st.one_of(st.none(), st.integers(-99, 99).map(str))).map(_array)),
    (TEXT_ARRAY, st.lists(st.one_of(st.none(), texts)).map(_array)),
    (MOOD, st.sampled_from(["happy", "sad", "o'k \"x\""])),
    (424242, texts),  # an OID the registry does not know
]


def slow(oid: int, text: str) -> str:
    return orjson.dumps(REGISTRY.converter(oid)(text)).decode()


@st.composite
def typed_rows(draw: st.DrawFn) -> tuple[tuple[str, ...], tuple[int, ...], list[tuple[str | None, ...]]]:
    picks = draw(st.lists(st.sampled_from(range(len(VALUES))), min_size=1, max_size=6))
    names = tuple(draw(st.lists(texts, min_size=len(picks), max_size=len(picks), unique=True)))
    oids = tuple(VALUES[i][0] for i in picks)
    rows = draw(st.lists(
        st.tuples(*(st.one_of(st.none(), VALUES[i][1]) for i in picks)), min_size=1, max_size=4))
    return names, oids, rows


@given(st.data())
@settings(max_examples=150)
def test_fragment_equals_dumps_of_the_converted_value(data: st.DataObject) -> None:
    oid, strategy = data.draw(st.sampled_from(VALUES))
    text = data.draw(strategy)
    how, conv = REGISTRY.fragment(oid)
    value = conv(text)
    if how == "raw":
        fast = text
    elif how == "bool":
        fast = "true" if value else "false"
    elif how == "quote":
        fast = '"' + value + '"'
    else:  # escape (encode_basestring, shown equal to orjson for every code point) / dumps
        fast = orjson.dumps(value).decode()
    assert fast == slow(oid, text)


@given(typed_rows(), st.data())
@settings(max_examples=60)
def test_encoder_equals_the_row_mapper(case: Any, data: st.DataObject) -> None:
    names, oids, rows = case
    n = len(names)
    key = tuple(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)))
    ident = tuple(data.draw(st.lists(st.integers(0, n - 1), max_size=n, unique=True)))
    encode = compile_encoder(names, tuple(REGISTRY.fragment(o) for o in oids), key, ident)
    mapper = compile_row(names, tuple(REGISTRY.converter(o) for o in oids))
    for values in rows:
        row = mapper(values)
        got = encode(values)
        assert got.after_json == orjson.dumps(row).decode()
        assert got.key_json == orjson.dumps({names[i]: row[names[i]] for i in ident}).decode()
        assert got.chunk_key == tuple(row[names[i]] for i in key)


positions: st.SearchStrategy[Position] = st.one_of(
    st.builds(lambda lsn, i, tx: PgPosition(Lsn(lsn), i, Lsn(lsn + 8), tx),
              st.integers(1, 2**40), st.integers(0, 1000), st.one_of(st.none(), st.integers(1, 2**31))),
    st.builds(lambda n, pos, i, g: BinlogPosition(f"bin.{n:06d}", pos, i, g),
              st.integers(1, 999), st.integers(4, 2**32), st.integers(-1, 1000),
              st.one_of(st.none(), st.just("0-1-42"))),
)
names_ = st.text(string.ascii_letters + '"\\é ', min_size=1, max_size=8)


@given(
    positions, st.sampled_from([SnapshotKind.INCREMENTAL, SnapshotKind.BLOCKING]), names_, names_,
    st.lists(st.dictionaries(st.sampled_from(["id", "v", 'q"'], ), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), texts),
                             min_size=3), min_size=1, max_size=5),
    st.booleans(), st.booleans(), st.integers(0, 2**41),
)
def test_bulk_rows_encode_like_single_events(
    base: Position, kind: SnapshotKind, schema: str, table: str, dicts: list[dict[str, Any]],
    encoded: bool, identity: bool, now_ms: int,
) -> None:
    key_cols = ("id",)
    ident = ("id", "v") if identity else ()
    rows: list[Any] = dicts
    if encoded:
        rows = [
            EncodedRow((d["id"],), orjson.dumps({c: d.get(c) for c in ident or key_cols}).decode(),
                       orjson.dumps(d).decode())
            for d in dicts
        ]
    batch = SnapshotRows(schema, table, kind, base, 7, 1234, rows, key_cols, ident)
    events = batch.events()
    assert [e.position for e in events] == [base.with_index(7 + i) for i in range(len(rows))]
    assert [e.after for e in events] == dicts
    assert all(e.key == {c: d.get(c) for c in ident or key_cols} for e, d in zip(events, dicts, strict=True))
    assert batch.last_position == events[-1].position
    assert encode_snapshot_rows(batch, "postgresql", "db\"x", now_ms) == [
        encode_event(e, "postgresql", "db\"x", now_ms) for e in events
    ]
    assert expand([batch]) == events


def test_envelope_template_survives_odd_names() -> None:
    base = PgPosition(Lsn(5), 3)
    batch = SnapshotRows('ind"ex', '"index":-7306185142913', SnapshotKind.INCREMENTAL, base, 4, 1,
                         [{"id": 1}], ("id",))
    assert encode_snapshot_rows(batch, "c", "d", 9) == [
        encode_event(e, "c", "d", 9) for e in batch.events()
    ]


def test_fragment_kinds() -> None:
    """The fast kinds are chosen where they apply (the properties above only prove
    whichever kind was chosen is right)."""
    kinds = {oid: REGISTRY.fragment(oid)[0] for oid, _ in VALUES}
    assert {kinds[o] for o in (t.INT2, t.INT4, t.INT8, t.OID)} == {"raw"}
    assert {kinds[o] for o in (t.NUMERIC, t.UUID, t.DATE, t.TIMESTAMPTZ, t.BYTEA, DOMAIN_NUMERIC)} == {"quote"}
    assert {kinds[o] for o in (t.TEXT, t.VARCHAR, t.BPCHAR, MOOD, DOMAIN_TEXT, 424242)} == {"escape"}
    assert kinds[t.BOOL] == "bool"
    assert {kinds[o] for o in (t.FLOAT8, t.JSON, INT_ARRAY)} == {"dumps"}


@given(st.text(st.characters(codec="utf-8")))
def test_escape_equals_orjson(text: str) -> None:
    """The encoder escapes strings with the stdlib's C ``encode_basestring``."""
    from json.encoder import encode_basestring

    assert encode_basestring(text) == orjson.dumps(text).decode()
