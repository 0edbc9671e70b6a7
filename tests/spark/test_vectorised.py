"""Property tests of the bulk paths against the simple ones: the Arrow reduce against
a per-event replay of the reduce rules, and the bulk JSON-text conversion against the
per-value conversion of ``rows_to_arrow``."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydblog.errors import SinkError
from pydblog.events import UNCHANGED_TOAST, ChangeEvent, Op, encode_event
from pydblog.ports import LogRecord
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.reduce import reduce_events
from pydblog.spark.source import records_to_arrow
from pydblog.spark.typemap import _bulk_texts_to_arrow, rows_to_arrow, texts_to_arrow

Net = dict[str, tuple[bool, dict[str, tuple[str, dict[str, Any], list[str]]]]]


def _key(k: dict[str, Any]) -> str:
    return orjson.dumps(k, option=orjson.OPT_SORT_KEYS).decode()


def simple_reduce(events: list[ChangeEvent]) -> Net:
    """The reduce rules (docs/sync.md) replayed event by event."""
    out: Net = {}
    for e in events:
        q = f"{e.schema}.{e.table}"
        if e.op is Op.TRUNCATE:
            out[q] = (True, {})
            continue
        if e.op not in (Op.CREATE, Op.UPDATE, Op.DELETE, Op.READ):
            continue
        _, net = out.setdefault(q, (False, {}))
        assert e.key is not None
        k = _key(e.key)
        if e.op is Op.DELETE or e.after is None:
            net[k] = ("d", dict(e.key), [])
            continue
        row = dict(e.after)
        prev = net.get(k)
        kept = []
        for c in e.unchanged:
            if c not in row:
                continue
            if prev is not None and prev[0] == "u" and c in prev[1] and c not in prev[2]:
                row[c] = prev[1][c]
            else:
                row[c] = None
                kept.append(c)
        net[k] = ("u", row, kept)
    return out


def arrow_net(events: list[ChangeEvent]) -> Net:
    recs = []
    for i, e in enumerate(events):
        enc = encode_event(e, "postgresql", "db", 0)
        body = enc.body if isinstance(enc.body, bytes) else enc.body.encode()
        recs.append(LogRecord(10 + i, enc.table, enc.op, enc.ts_ms, body))
    table = pa.Table.from_batches([records_to_arrow(recs)])
    out: Net = {}
    for q, ch in reduce_events(table).items():
        assert ch.offsets == sorted(ch.offsets) and len(set(ch.keys)) == len(ch.keys)
        rows = {
            k: (op, row, list(u))
            for k, op, row, u in zip(ch.keys, ch.ops, ch.rows, ch.unchanged, strict=True)
        }
        # the texts are the rows
        assert [orjson.loads(t) for t in ch.texts] == ch.rows
        out[q] = (ch.truncated, rows)
    return out


@st.composite
def event_lists(draw: st.DrawFn) -> list[ChangeEvent]:
    n = draw(st.integers(0, 30))
    out = []
    for i in range(n):
        table = draw(st.sampled_from(["a", "b"]))
        op = draw(st.sampled_from([Op.CREATE, Op.UPDATE, Op.UPDATE, Op.DELETE, Op.READ,
                                   Op.TRUNCATE, Op.NOTIFICATION]))
        pos = PgPosition(Lsn(100 + i))
        if op is Op.TRUNCATE:
            out.append(ChangeEvent(op, "public", table, pos, 0))
            continue
        if op is Op.NOTIFICATION:
            out.append(ChangeEvent(op, "public", table, pos, 0, notification={"n": i}))
            continue
        k = draw(st.integers(0, 3))
        key = {"id": k, "part": k % 2}
        if op is Op.DELETE:
            out.append(ChangeEvent(op, "public", table, pos, 0, key=key, before=dict(key)))
            continue
        after: dict[str, Any] = {**key, "v": draw(st.integers(0, 9)),
                                 "big": draw(st.sampled_from(["x", "y", None]))}
        unchanged: tuple[str, ...] = ()
        if op is Op.UPDATE and draw(st.booleans()):
            unchanged = ("big",)
            after["big"] = UNCHANGED_TOAST
        out.append(ChangeEvent(op, "public", table, pos, 0, key=key, after=after,
                               unchanged=unchanged))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_lists())
def test_arrow_reduce_equals_the_simple_reduce(events: list[ChangeEvent]) -> None:
    expected = {q: v for q, v in simple_reduce(events).items() if v[0] or v[1]}
    assert arrow_net(events) == expected


SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("s", pa.string()),
        ("i16", pa.int16()),
        ("f", pa.float64()),
        ("b", pa.bool_()),
        ("d", pa.decimal128(12, 2)),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("nts", pa.timestamp("us")),
        ("day", pa.date32()),
    ]
)

_values = {
    "s": st.one_of(st.none(), st.text(max_size=5), st.integers(-3, 3), st.just({"x": [1]})),
    "i16": st.one_of(st.none(), st.integers(-40_000, 40_000), st.just(1.5)),
    "f": st.one_of(st.none(), st.integers(-5, 5), st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from(["NaN", "Infinity"])),
    "b": st.one_of(st.none(), st.booleans(), st.just(1)),
    "d": st.one_of(st.none(), st.sampled_from(["1.50", "-3", "12345678901.99", "x", "1e2"]),
                   st.integers(-99, 99)),
    "ts": st.one_of(st.none(), st.sampled_from(
        ["2026-11-26T06:06:31.029724Z", "2026-01-02T03:04:05+02:00", "2026-01-02T03:04:05",
         "2026-01-02 03:04:05.5Z", "infinity"])),
    "nts": st.one_of(st.none(), st.sampled_from(
        ["2026-01-02T03:04:05", "2026-01-02T03:04:05.123456", "2026-01-02T03:04:05Z", "bad"])),
    "day": st.one_of(st.none(), st.sampled_from(["2017-10-04", "2017-13-01", "20171004"])),
}


@st.composite
def row_lists(draw: st.DrawFn) -> list[dict[str, Any]]:
    rows = []
    for i in range(draw(st.integers(0, 6))):
        row: dict[str, Any] = {"id": i}
        for name, strat in _values.items():
            if draw(st.booleans()):
                row[name] = draw(strat)
        if draw(st.booleans()):
            row["extra"] = {"ignored": True}
        rows.append(row)
    return rows


def same(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas and values (NaN equal to NaN)."""
    return a.schema == b.schema and all(
        [repr(v) for v in a[n].to_pylist()] == [repr(v) for v in b[n].to_pylist()]
        for n in a.column_names
    )


@settings(max_examples=400, deadline=None)
@given(row_lists())
def test_bulk_text_conversion_equals_the_per_value_conversion(rows: list[dict[str, Any]]) -> None:
    texts = [orjson.dumps(r).decode() for r in rows]
    bulk = _bulk_texts_to_arrow(texts, SCHEMA)
    try:
        simple = rows_to_arrow("t", rows, SCHEMA)
    except SinkError:
        assert bulk is None  # the bulk path never accepts what the simple one refuses
        with pytest.raises(SinkError):
            texts_to_arrow("t", texts, SCHEMA, lambda: rows)
        return
    if bulk is not None:
        assert same(bulk, simple), (bulk.to_pylist(), simple.to_pylist())
    assert same(texts_to_arrow("t", texts, SCHEMA, lambda: rows), simple)


def test_bulk_text_conversion_takes_the_common_case() -> None:
    rows = [{"id": 1, "s": "a", "d": "1.50", "ts": "2026-11-26T06:06:31.029724Z",
             "day": "2017-10-04", "f": 2}]
    bulk = _bulk_texts_to_arrow([orjson.dumps(r).decode() for r in rows], SCHEMA)
    assert bulk is not None
    assert bulk["d"].to_pylist() == [Decimal("1.50")] and bulk["f"].to_pylist() == [2.0]
