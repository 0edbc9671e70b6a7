"""The native row decoder (``_pgrow``, ``rowdecode``) against the Python path: the same
pgoutput messages through ``PgLogSource.stream`` with the decoder and without it give
the same events and, byte for byte, the same change-log bodies; a malformed message
raises the same error. Values of every supported type (``VALUES`` of
test_fast_encoding), NULLs, unchanged TOAST values, key-only and whole (REPLICA
IDENTITY FULL) old tuples, key changes."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydblog.config import parse_config
from pydblog.events import (
    TAIL_SEP,
    ChangeEvent,
    EncodedBlock,
    InsertRun,
    encode_event,
    encode_insert_run,
)
from pydblog.sources.postgres import pgoutput as po
from pydblog.sources.postgres import rowdecode
from pydblog.sources.postgres import types as t
from pydblog.sources.postgres.relations import build_relation
from pydblog.sources.postgres.source import PgLogSource
from tests.property.test_fast_encoding import REGISTRY, VALUES, texts

NATIVE = rowdecode.decoder()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="native stream decoder not built")

OID = 16400
U = po.UNCHANGED
CFG = parse_config({"source": {"dsn": "postgresql://u@127.0.0.1/db", "tables": [".*"]},
                    "log": {"path": "/nonexistent"}})


class End(Exception):
    pass


class Msg:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.data_start = 0
        self.wal_end = 0


class Cursor:
    def __init__(self, payloads: list[bytes]) -> None:
        self._it: Iterator[bytes] = iter(payloads)
        self.wal_end = 0

    def read_message(self) -> Msg:
        payload = next(self._it, None)
        if payload is None:
            raise End
        return Msg(payload)


def tuple_bytes(values: list[str | po.Unchanged | None]) -> bytes:
    out = [struct.pack("!H", len(values))]
    for v in values:
        if v is None:
            out.append(b"n")
        elif v is U:
            out.append(b"u")
        else:
            raw = v.encode() if isinstance(v, str) else v
            out.append(b"t" + struct.pack("!I", len(raw)) + raw)
    return b"".join(out)


def source(names: tuple[str, ...], oids: tuple[int, ...], pk: list[str], identity: str) -> PgLogSource:
    src = PgLogSource(CFG)
    cols = tuple(po.Column(n in pk, n, o, -1) for n, o in zip(names, oids, strict=True))
    rel = build_relation(po.Relation(OID, "public", "t", po.ReplicaIdentity(identity), cols),
                         REGISTRY, pk, True)
    src._relations[OID] = rel
    src._specs[OID] = rowdecode.spec(rel)
    src._fast_specs[OID] = rowdecode.fast_spec(rel)
    src._report = False
    src._last_hb = float("inf")
    src._cur = Cursor([])
    src._repl = type("Repl", (), {"fileno": lambda self: 0})()  # never selected on
    src._wake = (0, 0)
    return src


def run(src: PgLogSource, payloads: list[bytes], native: bool) -> Any:
    """The events (and their encoded bodies) the stream gives, or the error it raises."""
    real = rowdecode.decoder
    rowdecode.decoder = lambda: NATIVE if native else None
    try:
        return _run(src, payloads)
    finally:
        rowdecode.decoder = real


def _run(src: PgLogSource, payloads: list[bytes]) -> Any:
    src._cur = Cursor(payloads)
    items: list[Any] = []
    try:
        for got in src.stream():
            # An InsertRun (native path) as the events it stands for, each with the body
            # its block gives: byte for byte the Python path's, event by event.
            if type(got) is InsertRun:
                (block,) = encode_insert_run(got, "postgresql", "db", 1234)
                assert type(block) is EncodedBlock
                evs: list[Any] = got.events()
                bodies: list[Any] = block.bodies()
            else:
                evs, bodies = [got], [None]
            for item, body in zip(evs, bodies, strict=True):
                _item(items, item, body)
    except End:
        return items
    except Exception as exc:  # the error is what is compared
        return (type(exc), str(exc))
    return items


def _item(items: list[Any], item: Any, body: str | None) -> None:
    items.append(item)
    if type(item) is ChangeEvent:
        encoded = encode_event(item, "postgresql", "db", 1234).body
        items.append(encoded if body is None or body == encoded else ("differs", body, encoded))
        items.append((repr(item), item.position.to_json(), hash(item.position)))
        items.append([(k, type(v)) for k, v in (item.after or {}).items()])
        items.append([(k, type(v)) for k, v in (item.before or {}).items()])


@st.composite
def relations(draw: st.DrawFn) -> tuple[tuple[str, ...], tuple[int, ...], list[int], list[str], str]:
    picks = draw(st.lists(st.sampled_from(range(len(VALUES))), min_size=1, max_size=6))
    names = tuple(draw(st.lists(texts.filter(bool), min_size=len(picks), max_size=len(picks), unique=True)))
    oids = tuple(VALUES[i][0] for i in picks)
    key = draw(st.lists(st.sampled_from(range(len(names))), max_size=2, unique=True))
    identity = draw(st.sampled_from(["d", "f", "i"]))
    return names, oids, picks, [names[i] for i in key], identity


def row(draw: st.DrawFn, picks: list[int], toast: bool) -> list[str | po.Unchanged | None]:
    extra = [st.none()] + ([st.just(U)] if toast else [])
    return [draw(st.one_of(*extra, VALUES[i][1])) for i in picks]


@st.composite
def changes(draw: st.DrawFn, picks: list[int], key: list[int]) -> bytes:
    oid = struct.pack("!I", OID)
    kind = draw(st.sampled_from("IUD"))
    if kind == "I":
        return b"I" + oid + b"N" + tuple_bytes(row(draw, picks, False))
    old_kind = draw(st.sampled_from(["K", "O"] + (["N"] if kind == "U" else [])))
    old = b""
    if old_kind == "K":
        values = row(draw, picks, False)
        old = b"K" + tuple_bytes([v if i in key else None for i, v in enumerate(values)])
    elif old_kind == "O":
        old = b"O" + tuple_bytes(row(draw, picks, True))
    if kind == "D":
        return b"D" + oid + (old or b"K" + tuple_bytes([None] * len(picks)))
    return b"U" + oid + old + b"N" + tuple_bytes(row(draw, picks, True))


def begin(lsn: int) -> bytes:
    return b"B" + struct.pack("!QqI", lsn, 10**15, 7)


def commit(lsn: int) -> bytes:
    return b"C" + struct.pack("!BQQq", 0, lsn, lsn + 8, 10**15)


@given(case=relations(), data=st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_native_rows_equal_the_python_path(case: Any, data: st.DataObject) -> None:
    names, oids, picks, pk, identity = case
    key = [names.index(k) for k in pk]
    msgs = data.draw(st.lists(changes(picks, key), min_size=1, max_size=5))
    payloads = [begin(100), *msgs, commit(100)]
    fast = run(source(names, oids, pk, identity), payloads, True)
    slow = run(source(names, oids, pk, identity), payloads, False)
    assert fast == slow
    assert isinstance(slow, list)  # generated messages are well formed


@given(case=relations(), data=st.data())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_malformed_messages_fail_as_in_python(case: Any, data: st.DataObject) -> None:
    """Cut, lengthened or corrupted messages, invalid UTF-8, values a converter rejects:
    the same error (or the same events) either way."""
    names, oids, picks, pk, identity = case
    key = [names.index(k) for k in pk]
    msg = bytearray(data.draw(changes(picks, key)))
    how = data.draw(st.sampled_from(["cut", "extra", "flip", "utf8", "count"]))
    if how == "cut":
        del msg[data.draw(st.integers(1, len(msg) - 1)):]
    elif how == "extra":
        msg += b"\x00"
    elif how == "flip":
        at = data.draw(st.integers(5, len(msg) - 1))
        msg[at] = data.draw(st.integers(0, 255))
    elif how == "utf8":
        at = msg.find(b"t", 6)
        if at > 0 and at + 5 < len(msg):
            msg[at + 5 : at + 5] = b""  # keep the form; corrupt a text byte below if any
            size = struct.unpack_from("!I", msg, at + 1)[0]
            if size:
                msg[at + 5] = 0xFF
    else:
        struct.pack_into("!H", msg, 6, len(picks) + 1)
    payloads = [begin(100), bytes(msg), commit(100)]
    fast = run(source(names, oids, pk, identity), payloads, True)
    slow = run(source(names, oids, pk, identity), payloads, False)
    assert fast == slow


@pytest.mark.parametrize("oid, text", [
    (t.INT4, "12x"), (t.BOOL, "maybe"), (t.FLOAT8, "fast"), (t.BYTEA, "zz"), (t.INT8, "9" * 30),
    (t.INT8, "-" + "9" * 18), (t.INT4, "007"), (t.TIMESTAMPTZ, "2024-01-02 03:04:05.5+05:30"),
    (t.TIMESTAMPTZ, "2024-01-02 03:04:05.1234567+00"), (t.TIME, "10:00:00.5"),
    (t.TIMESTAMP, "2024-01-02 03:04:05"), (t.TIMESTAMPTZ, "infinity"), (t.BPCHAR, "ab  "),
    (t.FLOAT8, "Infinity"), (t.FLOAT4, "1e+20"), (t.TIMESTAMPTZ, "2024-01-02 03:04:05é+00"),
])
def test_edge_values(oid: int, text: str) -> None:
    """Values at the edges of the C converters (and ones they leave to Python)."""
    names, pk = ("id", "v"), ["id"]
    msg = b"I" + struct.pack("!I", OID) + b"N" + tuple_bytes(["1", text])
    payloads = [begin(100), msg, commit(100)]
    fast = run(source(names, (t.INT4, oid), pk, "d"), payloads, True)
    slow = run(source(names, (t.INT4, oid), pk, "d"), payloads, False)
    assert fast == slow


def test_codes_cover_the_common_types() -> None:
    """The common types' converters are written in C (the properties above only prove
    whichever way was chosen is right)."""
    codes = {o: rowdecode.CODES.get(REGISTRY.converter(o), rowdecode.CALL) for o, _ in VALUES}
    assert {codes[o] for o in (t.INT2, t.INT4, t.INT8, t.OID)} == {rowdecode.INT}
    assert {codes[o] for o in (t.TEXT, t.VARCHAR, t.NUMERIC, t.UUID, t.DATE, t.INTERVAL)} == {rowdecode.STR}
    assert codes[t.TIMESTAMPTZ] == rowdecode.TSTZ
    assert codes[t.BOOL] == rowdecode.BOOL
    assert codes[t.FLOAT8] == rowdecode.FLOAT


def test_hot_path_position_is_a_pg_position() -> None:
    """The stream's fast ``PgPosition`` (slots set directly) is the class's own object:
    equal fields, order, hash, JSON, and as frozen."""
    import dataclasses

    from pydblog.positions import Lsn, PgPosition
    from pydblog.sources.postgres import source as src_mod

    assert src_mod._position is not PgPosition  # the fast one is in use
    for args in [(Lsn(5), 3, None, 7), (Lsn(2**63), 0, Lsn(9), None)]:
        fast, slow = src_mod._position(*args), PgPosition(*args)
        assert type(fast) is PgPosition
        assert dataclasses.astuple(fast) == dataclasses.astuple(slow)
        assert repr(fast) == repr(slow) and fast == slow and hash(fast) == hash(slow)
        assert fast.to_json() == slow.to_json()
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.index = 4  # type: ignore[misc]
    event = src_mod._new_event(ChangeEvent, ("c", "s", "t", slow, 1, {}, None, {},
                                             *src_mod._EVENT_DEFAULTS))
    assert event == ChangeEvent("c", "s", "t", slow, 1, {}, None, {})  # type: ignore[arg-type]
    assert type(event) is ChangeEvent


def test_decoder_off_missing_or_stale(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``PYDBLOG_NATIVE_STREAM=0``, a missing extension or a stale build: the Python path,
    with one log line saying why."""
    import sys

    from pydblog.sources.postgres import _pgrow  # type: ignore[attr-defined]

    try:
        monkeypatch.setenv(rowdecode.DISABLE_ENV, "0")
        rowdecode.reset()
        assert rowdecode.decoder() is None
        monkeypatch.delenv(rowdecode.DISABLE_ENV)
        rowdecode.reset()
        monkeypatch.setattr(_pgrow, "VERSION", rowdecode.ABI_VERSION + 1)
        assert rowdecode.decoder() is None
        assert "stale build" in caplog.text
        monkeypatch.undo()
        import pydblog.sources.postgres as package

        monkeypatch.setitem(sys.modules, "pydblog.sources.postgres._pgrow", None)
        monkeypatch.delattr(package, "_pgrow")
        rowdecode.reset()
        assert rowdecode.decoder() is None
        assert "not available" in caplog.text
    finally:
        monkeypatch.undo()
        rowdecode.reset()
    assert rowdecode.decoder() is NATIVE


def test_converter_errors() -> None:
    """A converter's Exception sends the message to the Python path (None); anything else
    (KeyboardInterrupt, MemoryError) propagates."""
    import dataclasses

    src = source(("id", "v"), (t.INT4, t.TEXT), ["id"], "d")
    rel = src._relations[OID]
    msg = b"I" + struct.pack("!I", OID) + b"N" + tuple_bytes(["1", "x"])
    assert NATIVE is not None
    for exc, propagates in [(ValueError, False), (KeyError, False), (KeyboardInterrupt, True),
                            (MemoryError, True)]:
        def conv(text: str, exc: type[BaseException] = exc) -> Any:
            raise exc("no")

        broken = dataclasses.replace(rel, converters=(int, conv))
        specs = {OID: rowdecode.spec(broken)}
        if propagates:
            with pytest.raises(exc):
                NATIVE(msg, specs, U)
        else:
            assert NATIVE(msg, specs, U) is None
    assert NATIVE(msg, {OID: rowdecode.spec(rel)}, U) is not None


def test_insert_runs_are_cut_and_ordered() -> None:
    """Inserts become ``InsertRun``s of at most ``run_rows`` rows of one relation, each
    taken before any other item; positions continue across runs; the signal and
    watermark tables' Inserts stay events (the runner routes them)."""
    src = source(("id", "v"), (t.INT4, t.TEXT), ["id"], "d")
    other = 16401
    rel = src._relations[OID]
    import dataclasses

    src._relations[other] = dataclasses.replace(rel, table="u")
    src._specs[other] = rowdecode.spec(src._relations[other])
    src._fast_specs[other] = rowdecode.fast_spec(src._relations[other])
    src.run_rows = 2

    def ins(oid: int, i: int) -> bytes:
        return b"I" + struct.pack("!I", oid) + b"N" + tuple_bytes([str(i), f"v{i}"])

    def raw(payloads: list[bytes]) -> list[Any]:
        src._cur = Cursor(payloads)
        items: list[Any] = []
        with pytest.raises(End):
            for item in src.stream():
                items.append(item)
        return items

    msgs = [ins(OID, 0), ins(OID, 1), ins(OID, 2), ins(other, 3), ins(OID, 4)]
    items = raw([begin(100), *msgs, commit(100)])
    runs = [(i.table, i.first, i.size) for i in items if type(i) is InsertRun]
    assert runs == [("t", 0, 2), ("t", 2, 1), ("u", 3, 1), ("t", 4, 1)]
    assert [(e.after or {})["id"] for i in items if type(i) is InsertRun for e in i.events()] == [0, 1, 2, 3, 4]
    del src._fast_specs[other]  # e.g. the watermark table: an event, in its place
    items = raw([begin(100), *msgs, commit(100)])
    kinds = [(type(i).__name__, i.table) for i in items if type(i) in (InsertRun, ChangeEvent)]
    assert kinds == [("InsertRun", "t"), ("InsertRun", "t"), ("ChangeEvent", "u"), ("InsertRun", "t")]


def test_updates_and_deletes_are_runs_of_their_own() -> None:
    """Updates that carry no old tuple (the key kept, identity not FULL) become runs of
    ``u`` events, Deletes that carry the old key only runs of ``d`` events; with the old
    row (identity FULL) Deletes and Updates that keep the key are runs too, of another
    form (their ``before`` is the old row; an unchanged TOAST value is the old row's);
    runs are cut where the kind or the form
    changes; an Update with its old key (the key changed) or with an old row of another
    key, or of a key whose text is NaN, stays events; each event's body is the Python
    path's."""
    src = source(("id", "v"), (t.INT4, t.TEXT), ["id"], "d")

    def row(kind: bytes, i: int, old: bytes = b"") -> bytes:
        return kind + struct.pack("!I", OID) + old + b"N" + tuple_bytes([str(i), f"v{i}"])

    key_changed = row(b"U", 9, b"K" + tuple_bytes(["8", None]))

    def delete(i: int, old: bytes = b"K") -> bytes:
        values: list[str | po.Unchanged | None] = [str(i), None if old == b"K" else f"v{i}"]
        return b"D" + struct.pack("!I", OID) + old + tuple_bytes(values)

    def full(i: int, was: int) -> bytes:  # an Update with its old row (identity FULL)
        return row(b"U", i, b"O" + tuple_bytes([str(was), f"old{was}"]))

    # an unchanged TOAST value: the old row's
    toast_kept = (b"U" + struct.pack("!I", OID) + b"O" + tuple_bytes(["10", "old10"]) + b"N"
                  + tuple_bytes(["10", U]))

    msgs = [row(b"I", 0), row(b"U", 0), row(b"U", 1), row(b"I", 2), key_changed, row(b"U", 2),
            delete(0), delete(1), delete(2, b"O"), delete(3, b"O"), delete(9),
            full(4, 4), full(5, 5), full(7, 6), full(8, 8), toast_kept]
    payloads = [begin(100), *msgs, commit(100)]
    src._cur = Cursor(payloads)
    items: list[Any] = []
    with pytest.raises(End):
        for item in src.stream():
            items.append(item)
    shape = [(i.op.value, i.first, i.size) if type(i) is InsertRun else (i.op.value, i.position.index)
             for i in items if type(i) in (InsertRun, ChangeEvent)]
    assert shape == [("c", 0, 1), ("u", 1, 2), ("c", 3, 1), ("d", 4), ("c", 5), ("u", 6, 1),
                     ("d", 7, 2), ("d", 9, 2), ("d", 11, 1), ("u", 12, 2), ("d", 14), ("c", 15),
                     ("u", 16, 2)]
    runs = [e for i in items if type(i) is InsertRun and i.op.value != "c" for e in i.events()]
    assert [(e.key, e.before, e.after) for e in runs] == [
        ({"id": 0}, None, {"id": 0, "v": "v0"}), ({"id": 1}, None, {"id": 1, "v": "v1"}),
        ({"id": 2}, None, {"id": 2, "v": "v2"}),
        ({"id": 0}, {"id": 0}, None), ({"id": 1}, {"id": 1}, None),
        ({"id": 2}, {"id": 2, "v": "v2"}, None), ({"id": 3}, {"id": 3, "v": "v3"}, None),
        ({"id": 9}, {"id": 9}, None),
        ({"id": 4}, {"id": 4, "v": "old4"}, {"id": 4, "v": "v4"}),
        ({"id": 5}, {"id": 5, "v": "old5"}, {"id": 5, "v": "v5"}),
        ({"id": 8}, {"id": 8, "v": "old8"}, {"id": 8, "v": "v8"}),
        ({"id": 10}, {"id": 10, "v": "old10"}, {"id": 10, "v": "old10"})]
    for payload in (payloads, [begin(100), row(b"U", 1, b"O" + tuple_bytes(["1", "a"])), commit(100)]):
        fast = run(source(("id", "v"), (t.INT4, t.TEXT), ["id"], "d"), payload, True)
        slow = run(source(("id", "v"), (t.INT4, t.TEXT), ["id"], "d"), payload, False)
        assert fast == slow and isinstance(slow, list)
    # a float key whose text is NaN (NaN is not equal to itself): as the Python path says
    nan = [begin(100), b"U" + struct.pack("!I", OID) + b"O" + tuple_bytes(["NaN", "a"]) + b"N"
           + tuple_bytes(["NaN", "b"]), commit(100)]
    fast = run(source(("id", "v"), (t.FLOAT8, t.TEXT), ["id"], "d"), nan, True)
    slow = run(source(("id", "v"), (t.FLOAT8, t.TEXT), ["id"], "d"), nan, False)
    assert fast == slow and isinstance(slow, list)


def test_insert_run_after_a_position() -> None:
    """``InsertRun.past``: a restart inside a transaction drops what was logged."""
    from pydblog.positions import Lsn, PgPosition

    tails = "\n".join(f'{{"id":{i}}}{TAIL_SEP}{{"id":{i}}}}}' for i in range(4))
    r = InsertRun("public", "t", Lsn(100), 3, 7, 1, 4, tails)
    assert r.past(PgPosition(Lsn(100), 2, None, 7)) == r
    cut = r.past(PgPosition(Lsn(100), 4, None, 7))
    assert cut is not None and (cut.first, cut.size) == (5, 2)
    assert [e.position for e in cut.events()] == [PgPosition(Lsn(100), i, None, 7) for i in (5, 6)]
    assert [e.key for e in cut.events()] == [{"id": 2}, {"id": 3}]
    assert r.past(PgPosition(Lsn(100), 6, None, 7)) is None
    assert r.past(PgPosition(Lsn(99), 9, None, 7)) == r
