"""``encode_event`` writes a ``PgPosition`` or ``BinlogPosition`` event from cached
envelope text (the stream's hot path); these properties pin it to the envelope path: ``orjson.dumps`` of
``event.envelope(...)``, byte for byte, for any op, snapshot kind, names, positions,
values and optional fields."""

from __future__ import annotations

import string
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog import events
from pydblog.events import ChangeEvent, EncodedEvent, Op, SnapshotKind, encode_event
from pydblog.positions import Lsn, PgPosition, Position
from pydblog.sources.mysql.position import BinlogPosition

texts = st.text(st.characters(codec="utf-8"), max_size=10)
names = st.one_of(
    st.text(string.ascii_letters + '"\\é {}:,', min_size=1, max_size=8),
    st.sampled_from(["-7306185142901", '"lsn":-7306185142902', 'key":null,"before":null,"after":null}']),
)
values = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), texts,
                   st.floats(allow_nan=False, allow_infinity=False), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3))
rows = st.one_of(st.none(), st.dictionaries(texts, values, max_size=4))
positions: st.SearchStrategy[Position] = st.one_of(
    st.builds(lambda lsn, i, end, tx: PgPosition(Lsn(lsn), i, Lsn(end) if end else None, tx),
              st.integers(0, 2**64 - 1), st.integers(0, 10**9), st.integers(0, 2**40),
              st.one_of(st.none(), st.integers(0, 2**32))),
    st.builds(lambda n, pos, i, g: BinlogPosition(f"bin.{n:06d}", pos, i, g),
              st.integers(1, 999), st.integers(4, 2**32), st.integers(-1, 1000),
              st.one_of(st.none(), st.just("0-1-42"))),
)


def slow(event: ChangeEvent, connector: str, db: str, now_ms: int) -> EncodedEvent:
    return EncodedEvent(f"{event.schema}.{event.table}", event.op, event.ts_ms,
                        orjson.dumps(event.envelope(connector, db, now_ms)).decode())


@given(
    st.sampled_from(list(Op)), names, names, positions, st.integers(0, 2**45), rows, rows, rows,
    st.sampled_from(list(SnapshotKind)), st.lists(texts, max_size=3).map(tuple),
    st.one_of(st.none(), st.dictionaries(texts, values, max_size=2)), names, names,
    st.integers(0, 2**45),
)
@settings(max_examples=200, deadline=None)  # (a loaded machine: never a timed assertion)
def test_encode_event_equals_the_envelope(
    op: Op, schema: str, table: str, pos: Position, ts: int, key: Any, before: Any, after: Any,
    snapshot: SnapshotKind, unchanged: tuple[str, ...], notification: Any, connector: str,
    db: str, now_ms: int,
) -> None:
    event = ChangeEvent(op, schema, table, pos, ts, key, before, after, snapshot, unchanged,
                        notification)
    got = encode_event(event, connector, db, now_ms)
    assert got == slow(event, connector, db, now_ms)
    assert type(got) is EncodedEvent
    orjson.loads(got.body)  # valid JSON whatever the names


def test_odd_values_take_the_envelope_path() -> None:
    """Integers that are not ``int`` (bool, a float ts) are written as orjson writes them."""
    pos = PgPosition(Lsn(7), 1, None, 3)
    for event in (
        ChangeEvent(Op.CREATE, "s", "t", pos, True, {"id": 1}),
        ChangeEvent(Op.CREATE, "s", "t", pos, 12.5, {"id": 1}),  # type: ignore[arg-type]
        ChangeEvent(Op.CREATE, "s", "t", PgPosition(Lsn(7), True, None, False), 5),
    ):
        assert encode_event(event, "postgresql", "db", 9) == slow(event, "postgresql", "db", 9)


def test_template_cache_is_bounded() -> None:
    pos = PgPosition(Lsn(7), 1, None, 3)
    for i in range(events._TEMPLATES_MAX + 10):
        event = ChangeEvent(Op.UPDATE, "s", f"t{i}", pos, 5, {"id": i}, None, {"id": i})
        assert encode_event(event, "c", "d", 1) == slow(event, "c", "d", 1)
    assert len(events._TEMPLATES) <= events._TEMPLATES_MAX


@given(st.lists(st.tuples(st.sampled_from(["t1", "t2"]), st.sampled_from([Op.CREATE, Op.UPDATE]),
                          st.integers(0, 3), st.sampled_from([None, 0, 1]), st.integers(0, 2),
                          st.integers(0, 2), st.integers(0, 5), rows, st.booleans()),
                min_size=1, max_size=30))
@settings(max_examples=100, deadline=None)
def test_consecutive_events_of_a_transaction(events_: list[Any]) -> None:
    """Runs of events sharing table, op, commit and times (the per-transaction text is
    kept from the last event) interleaved with others, PostgreSQL's and MySQL's
    positions mixed: each equals the envelope path."""
    for table, op, lsn, tx, ts, now, index, after, binlog in events_:
        pos: Position = (BinlogPosition(f"bin.{lsn:06d}", 4 + lsn, index,
                                        None if tx is None else f"0-1-{tx}") if binlog
                         else PgPosition(Lsn(lsn), index, None, tx))
        event = ChangeEvent(op, "s", table, pos, ts, {"id": index}, None, after)
        assert encode_event(event, "c", "d", now) == slow(event, "c", "d", now)


@given(st.integers(1, 999), st.integers(4, 2**32), st.integers(0, 10**6),
       st.one_of(st.none(), st.just("0-1-42")), st.integers(0, 2**45),
       st.lists(st.tuples(st.dictionaries(texts, values, min_size=1, max_size=2),
                          st.dictionaries(texts, values, max_size=4)), min_size=1, max_size=6),
       names, names, st.integers(0, 2**45), st.integers(0, 8),
       st.sampled_from([Op.CREATE, Op.UPDATE, Op.DELETE]))
@settings(max_examples=200, deadline=None)
def test_a_row_run_is_its_events(n: int, offset: int, first: int, gtid: str | None, ts: int,
                                 rows_: list[Any], connector: str, db: str, now_ms: int,
                                 cut: int, op: Op) -> None:
    """A ``RowRun`` (MySQL inserts, updates and deletes encoded by the source) stores as
    ``encode_event`` of each of its events, byte for byte; ``events()`` gives them
    back; ``past`` drops exactly the events at or below a position."""
    from pydblog.events import TAIL_SEP, RowRun, encode_row_run

    base = BinlogPosition(f"bin.{n:06d}", offset, first, gtid)
    dumps = orjson.dumps

    def tail(k: Any, r: Any) -> str:
        if op is Op.CREATE:
            return dumps(k).decode() + TAIL_SEP + dumps(r).decode() + "}"
        before = {**r, "was": 1}  # an update's before row differs from its after row
        after = "null" if op is Op.DELETE else dumps(r).decode()
        return f'{dumps(k).decode()},"before":{dumps(before).decode()},"after":{after}}}'

    tails = "\n".join(tail(k, r) for k, r in rows_)
    run = RowRun("s", "t", base, ts, len(rows_), tails, op)
    want = [ChangeEvent(op, "s", "t", base.with_index(first + i), ts, k,
                        None if op is Op.CREATE else {**r, "was": 1},
                        None if op is Op.DELETE else r)
            for i, (k, r) in enumerate(rows_)]
    assert [(e.op, e.position, e.key, e.before, e.after, e.ts_ms) for e in run.events()] == [
        (e.op, e.position, e.key, e.before, e.after, e.ts_ms) for e in want]
    assert run.last_position == want[-1].position
    from pydblog.events import EncodedBlock

    bodies = [b for block in encode_row_run(run, connector, db, now_ms)
              for b in (block.bodies() if isinstance(block, EncodedBlock) else [block.body])]
    assert bodies == [slow(e, connector, db, now_ms).body for e in want]
    rest = run.past(base.with_index(first + cut - 1))
    kept = [e for e in want if not e.position <= base.with_index(first + cut - 1)]
    assert [(e.position, e.key, e.after) for e in (rest.events() if rest is not None else [])] == [
        (e.position, e.key, e.after) for e in kept]
