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

from pydblog.devtools.synth import SyntheticLoad
from pydblog.errors import SinkError
from pydblog.events import UNCHANGED_TOAST, ChangeEvent, Op, encode_event
from pydblog.ports import LogRecord
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.decode import (
    ARROW_SCHEMA,
    FAST_COLUMNS,
    decode_bodies,
    decode_fast,
    records_to_arrow,
)
from pydblog.spark.reduce import reduce_events
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
        assert _bulk_texts_to_arrow(texts, SCHEMA, lambda: rows, {"s"}) is None
        with pytest.raises(SinkError):
            texts_to_arrow("t", texts, SCHEMA, lambda: rows)
        return
    if bulk is not None:
        assert same(bulk, simple), (bulk.to_pylist(), simple.to_pylist())
    assert same(texts_to_arrow("t", texts, SCHEMA, lambda: rows), simple)
    # A text column that may hold any JSON value (json/array sources), converted per value.
    hybrid = _bulk_texts_to_arrow(texts, SCHEMA, lambda: rows, {"s"})
    if hybrid is not None:
        assert same(hybrid, simple), (hybrid.to_pylist(), simple.to_pylist())
    assert same(texts_to_arrow("t", texts, SCHEMA, lambda: rows, {"s"}), simple)


def test_bulk_text_conversion_takes_the_common_case() -> None:
    rows = [{"id": 1, "s": "a", "d": "1.50", "ts": "2026-11-26T06:06:31.029724Z",
             "day": "2017-10-04", "f": 2}]
    bulk = _bulk_texts_to_arrow([orjson.dumps(r).decode() for r in rows], SCHEMA)
    assert bulk is not None
    assert bulk["d"].to_pylist() == [Decimal("1.50")] and bulk["f"].to_pylist() == [2.0]


# -- the fast decode of the mirror columns against the full decode ---------------------

_tricky_text = st.one_of(
    st.text(max_size=6),
    st.sampled_from(['},"key":', ',"after":', '","before":null', ']}', '"unchanged":["a"]', "\\",
                     '"', "{}", "[]", "é", "\u2028", "\x00", "a.b", "\U0001f600"]),
)
_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), _tricky_text,
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["12345678901234567890.123", "NaN", "2026-11-26T06:06:31.029724Z",
                     "2017-10-04", "3 days 04:05:06", "AAEC/w==", "__debezium_unavailable_value"]),
)
_json = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(_tricky_text, inner, max_size=3)),
    max_leaves=6,
)
_names = st.one_of(st.sampled_from(["id", "after", "before", "key", "unchanged", "line", "Z"]),
                   _tricky_text)


class _Pos:
    """A position with arbitrary source fields (flat or nested)."""

    kind = "test"

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def source_fields(self) -> dict[str, Any]:
        return self.fields


@st.composite
def envelopes(draw: st.DrawFn) -> tuple[str, str]:
    """One change-log entry (meta, body) as the capture writes it."""
    op = draw(st.sampled_from(list(Op)))
    schema = draw(st.one_of(st.just("public"), _tricky_text))
    table = draw(st.one_of(st.just("orders"), _tricky_text))
    pos: Any = draw(st.one_of(
        st.builds(lambda lsn, i: PgPosition(Lsn(lsn), i), st.integers(0, 2**40), st.integers(0, 9)),
        st.builds(_Pos, st.dictionaries(_names, st.one_of(_scalar, _json), max_size=3)),
    ))
    key: dict[str, Any] | None = None
    before = after = None
    unchanged: tuple[str, ...] = ()
    notification = None
    if op is Op.NOTIFICATION:
        notification = draw(st.dictionaries(_tricky_text, _json, max_size=2))
    elif op is not Op.TRUNCATE:
        key = draw(st.one_of(
            st.dictionaries(_names, st.one_of(_scalar, _json, st.integers(0, 9)),
                            min_size=1, max_size=3),
            st.dictionaries(st.sampled_from(["id", "line", "a", "Z", "é", "order_id"]),
                            st.one_of(st.integers(-(2**63), 2**63 - 1), _tricky_text),
                            min_size=1, max_size=2),
        ))
        if op is Op.DELETE or draw(st.booleans()):
            before = draw(st.one_of(st.just(dict(key)),
                                    st.dictionaries(_names, _json, max_size=3)))
        if op is not Op.DELETE:
            after = {**key, **draw(st.dictionaries(_names, _json, max_size=4))}
            if op is Op.UPDATE and draw(st.booleans()):
                unchanged = tuple(draw(st.lists(_names, min_size=1, max_size=2, unique=True)))
                for c in unchanged:
                    after[c] = UNCHANGED_TOAST
    event = ChangeEvent(op, schema, table, pos, draw(st.integers(0, 2**41)), key=key,
                        before=before, after=after, unchanged=unchanged,
                        notification=notification)
    enc = encode_event(event, draw(st.sampled_from(["postgresql", "mysql", 'a"b'])), "db",
                       draw(st.integers(-5, 2**41)))
    body = enc.body if isinstance(enc.body, str) else enc.body.decode()
    return f"{enc.table}\x1f{enc.op}\x1f{enc.ts_ms}", body


FAST_DECODE_CASES = (st.lists(envelopes(), max_size=12), st.integers(0, 10**6),
                     st.sampled_from(sorted(FAST_COLUMNS)))


# A third of the examples by default (they took ~20 s); the slow run takes ten times more.
@settings(max_examples=130, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*FAST_DECODE_CASES)
def test_fast_decode_equals_the_full_decode(
    entries: list[tuple[str, str]], first: int, drop: str
) -> None:
    fast_decode_equals_the_full_decode(entries, first, drop)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@settings(max_examples=1300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*FAST_DECODE_CASES)
def test_fast_decode_equals_the_full_decode_long(
    entries: list[tuple[str, str]], first: int, drop: str
) -> None:
    fast_decode_equals_the_full_decode(entries, first, drop)


def fast_decode_equals_the_full_decode(
    entries: list[tuple[str, str]], first: int, drop: str
) -> None:
    metas = [m for m, _ in entries]
    bodies = [b for _, b in entries]
    for names in (sorted(FAST_COLUMNS), [n for n in ARROW_SCHEMA.names if n in FAST_COLUMNS
                                         and n != drop]):
        schema = pa.schema([ARROW_SCHEMA.field(n) for n in names])
        full = decode_bodies(first, metas, bodies, schema)
        fast = decode_fast(first, metas, bodies, schema)
        assert fast.schema == full.schema
        assert fast.to_pylist() == full.to_pylist()
        if len(names) < len(FAST_COLUMNS):
            continue
        # A Kafka log's values carry their offset (``{"offset":N,...``): the fast decode
        # takes it from there, everything else as from the body without it.
        offsets = [first * 10**9 + 7 * i for i in range(len(bodies))]
        values = [f'{{"offset":{o},{b[1:]}' for b, o in zip(bodies, offsets, strict=True)]
        own = decode_fast(0, metas, values, schema, own_offsets=True)
        full = full.set_column(names.index("offset"), "offset", pa.array(offsets, pa.int64()))
        assert own.schema == full.schema
        assert own.to_pylist() == full.to_pylist()


def test_fast_decode_takes_the_common_case() -> None:
    """The synthetic load's events (one- and two-field keys, unchanged TOAST, deletes)
    are all cut out by the fast path, none decoded in full."""
    from pydblog.spark import decode as source

    events = list(SyntheticLoad(seed=3).events(400))
    encoded = [encode_event(e, "postgresql", "app", 1) for e in events]
    metas = [f"{e.table}\x1f{e.op}\x1f{e.ts_ms}" for e in encoded]
    bodies = [e.body if isinstance(e.body, str) else e.body.decode() for e in encoded]
    schema = pa.schema([ARROW_SCHEMA.field(n) for n in sorted(FAST_COLUMNS)])
    calls = []
    real = source.decode_bodies

    def spy(*args: Any) -> pa.RecordBatch:
        calls.append(len(args[2]))
        return real(*args)

    source.decode_bodies = spy  # type: ignore[assignment]
    try:
        fast = decode_fast(7, metas, bodies, schema)
    finally:
        source.decode_bodies = real
    assert calls == []
    assert fast.to_pylist() == real(7, metas, bodies, schema).to_pylist()


def test_two_field_keys_sort_by_name_not_by_quoted_name() -> None:
    """A key whose field names sort differently with their quotes (``"a!"`` before
    ``"a"``, but ``a`` before ``a!``) gets the full decode's sorted form: the grouping
    key must not depend on which decode took the event."""
    bodies = [
        '{"op":"c","ts_ms":1,"source":{"connector":"postgresql","db":"d","schema":"public",'
        f'"table":"t"}},"key":{key},"before":null,"after":{key}}}'
        for key in ('{"a!":1,"a":2}', '{"a":2,"a!":1}', '{"a b":"x","a":"y"}', '{"b":1,"a":2}')
    ]
    metas = ["public.t\x1fc\x1f1"] * len(bodies)
    schema = pa.schema([ARROW_SCHEMA.field(n) for n in ("offset", "key")])
    full = decode_bodies(0, metas, bodies, schema)
    assert decode_fast(0, metas, bodies, schema).to_pylist() == full.to_pylist()
    assert [r["key"] for r in full.to_pylist()] == [
        '{"a":2,"a!":1}', '{"a":2,"a!":1}', '{"a":"y","a b":"x"}', '{"a":2,"b":1}']


def test_the_scanner_has_one_machine_code_version_for_every_input() -> None:
    """Bodies in a writable Arrow buffer (``pa.array``: the embedded log, the start-up
    warm-up) and in a read-only one (over ``bytes``: the Kafka source's values) run the
    same compiled version of each kernel: numba types the two as different arrays, and
    a second version was loaded (or compiled, ~30 s on a busy machine) on the first
    Kafka batch of every Python worker although the warm-up had loaded the first."""
    from pydblog.spark import scan

    events = list(SyntheticLoad(seed=5).events(50))
    bodies = [e.body if isinstance(e.body, str) else e.body.decode()
              for e in (encode_event(ev, "postgresql", "app", 1) for ev in events)]
    joined = "".join(bodies).encode()
    offsets = [0]
    for b in bodies:
        offsets.append(offsets[-1] + len(b.encode()))
    readonly = pa.StringArray.from_buffers(
        len(bodies), pa.py_buffer(pa.array(offsets, pa.int32()).buffers()[1]), pa.py_buffer(joined))
    writable = pa.array(bodies, pa.string())
    assert not np_view(readonly).flags.writeable and np_view(writable).flags.writeable
    schema = pa.schema([ARROW_SCHEMA.field(n) for n in sorted(FAST_COLUMNS)])
    metas = ["\x1f\x1f0"] * len(bodies)
    a = decode_fast(0, metas, writable, schema)
    b = decode_fast(0, metas, readonly, schema)
    assert a.to_pylist() == b.to_pylist()
    kernels: list[Any] = [scan._scan, scan._keys, scan._gather]
    for kernel in kernels:
        assert kernel.signatures, kernel
        assert all(not sig[0].mutable for sig in kernel.signatures), kernel.signatures


def np_view(arr: pa.Array) -> Any:
    import numpy as np

    return np.frombuffer(arr.buffers()[2], np.uint8)
