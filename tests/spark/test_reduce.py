"""The per-batch reduce (IO-free): last event per key wins, deletes, truncates,
unchanged TOAST columns, notifications ignored."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.events import UNCHANGED_TOAST, ChangeEvent, Op, encode_event
from pydblog.ports import LogRecord
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.decode import records_to_arrow
from pydblog.spark.reduce import reduce_events


def ev(
    op: Op,
    key: int | None,
    after: dict[str, Any] | None = None,
    *,
    table: str = "t",
    unchanged: tuple[str, ...] = (),
) -> ChangeEvent:
    return ChangeEvent(
        op,
        "public",
        table,
        PgPosition(Lsn(1)),
        0,
        key={"id": key} if key is not None else None,
        after=after,
        unchanged=unchanged,
        notification={"x": 1} if op is Op.NOTIFICATION else None,
    )


def random_events(max_key: int, *, whole_table: bool = True) -> st.SearchStrategy[ChangeEvent]:
    """Row events of two tables over keys ``0..max_key`` (inserts, updates with and
    without an unchanged-TOAST column, deletes); with ``whole_table`` also truncates and
    notifications."""
    keys = st.integers(0, max_key)
    rows = [
        st.builds(lambda k, v: ev(Op.CREATE, k, {"id": k, "big": f"B{v}", "v": v}), keys,
                  st.integers(0, 99)),
        st.builds(lambda k, v: ev(Op.UPDATE, k, {"id": k, "big": UNCHANGED_TOAST, "v": v},
                                  unchanged=("big",)), keys, st.integers(0, 99)),
        st.builds(lambda k, v: ev(Op.UPDATE, k, {"id": k, "big": f"U{v}", "v": v}), keys,
                  st.integers(0, 99)),
        st.builds(lambda k: ev(Op.DELETE, k), keys),
        st.builds(lambda k: ev(Op.CREATE, k, {"id": k}, table="other"), keys),
        st.builds(lambda k: ev(Op.DELETE, k, table="other"), keys),
    ]
    if whole_table:
        rows += [st.just(ev(Op.TRUNCATE, None)), st.just(ev(Op.NOTIFICATION, None))]
    return st.one_of(*rows)


def batch(*events: ChangeEvent) -> pa.Table:
    recs = []
    for i, e in enumerate(events):
        enc = encode_event(e, "postgresql", "db", 0)
        body = enc.body if isinstance(enc.body, bytes) else enc.body.encode()
        recs.append(LogRecord(100 + i, enc.table, enc.op, enc.ts_ms, body))
    return pa.Table.from_batches([records_to_arrow(recs)])


def net(tbl: pa.Table, q: str = "public.t") -> dict[Any, tuple[str, dict[str, Any], list[str]]]:
    ch = reduce_events(tbl)[q]
    return {
        r["id"]: (op, r, list(u)) for op, r, u in zip(ch.ops, ch.rows, ch.unchanged, strict=True)
    }


def test_last_event_per_key_wins() -> None:
    t = batch(
        ev(Op.CREATE, 1, {"id": 1, "v": "a"}),
        ev(Op.UPDATE, 1, {"id": 1, "v": "b"}),
        ev(Op.CREATE, 2, {"id": 2, "v": "x"}),
        ev(Op.DELETE, 2),
        ev(Op.READ, 3, {"id": 3, "v": "snap"}),
        ev(Op.DELETE, 4),
        ev(Op.CREATE, 5, {"id": 5, "v": "y"}, table="other"),
    )
    out = net(t)
    assert out == {
        1: ("u", {"id": 1, "v": "b"}, []),
        2: ("d", {"id": 2}, []),
        3: ("u", {"id": 3, "v": "snap"}, []),
        4: ("d", {"id": 4}, []),
    }
    ch = reduce_events(t)["public.t"]
    assert ch.offsets == sorted(ch.offsets) and not ch.truncated
    assert net(t, "public.other") == {5: ("u", {"id": 5, "v": "y"}, [])}


def test_delete_then_insert_is_an_upsert() -> None:
    out = net(batch(ev(Op.DELETE, 1), ev(Op.CREATE, 1, {"id": 1, "v": "new"})))
    assert out == {1: ("u", {"id": 1, "v": "new"}, [])}


def test_truncate_drops_earlier_events_of_its_table_only() -> None:
    t = batch(
        ev(Op.CREATE, 1, {"id": 1}),
        ev(Op.CREATE, 9, {"id": 9}, table="other"),
        ev(Op.TRUNCATE, None),
        ev(Op.CREATE, 2, {"id": 2}),
    )
    red = reduce_events(t)
    assert red["public.t"].truncated
    assert net(t) == {2: ("u", {"id": 2}, [])}
    assert not red["public.other"].truncated and len(red["public.other"]) == 1


def test_truncate_alone_still_empties() -> None:
    red = reduce_events(batch(ev(Op.CREATE, 1, {"id": 1}), ev(Op.TRUNCATE, None)))
    assert red["public.t"].truncated and len(red["public.t"]) == 0


def test_notifications_are_ignored() -> None:
    assert reduce_events(batch(ev(Op.NOTIFICATION, None))) == {}


def test_unchanged_toast_taken_from_earlier_event_or_kept() -> None:
    t = batch(
        ev(Op.CREATE, 1, {"id": 1, "big": "B1", "v": 0}),
        ev(Op.UPDATE, 1, {"id": 1, "big": UNCHANGED_TOAST, "v": 1}, unchanged=("big",)),
        ev(Op.UPDATE, 1, {"id": 1, "big": UNCHANGED_TOAST, "v": 2}, unchanged=("big",)),
        ev(Op.UPDATE, 2, {"id": 2, "big": UNCHANGED_TOAST, "v": 3}, unchanged=("big",)),
    )
    out = net(t)
    assert out[1] == ("u", {"id": 1, "big": "B1", "v": 2}, [])
    assert out[2] == ("u", {"id": 2, "big": None, "v": 3}, ["big"])
    assert reduce_events(t)["public.t"].has_unchanged()


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_any_row_order_gives_the_same_net_change(data: st.DataObject) -> None:
    """A Kafka log's batch arrives with its partitions interleaved: the reduce of the
    rows in any order equals the reduce of the rows in offset order (last event per key
    by offset, truncates, unchanged columns filled from earlier events)."""
    keys = st.integers(0, 5)
    one = st.one_of(
        st.builds(lambda k, v: ev(Op.CREATE, k, {"id": k, "big": f"B{v}", "v": v}), keys, st.integers(0, 99)),
        st.builds(lambda k, v: ev(Op.UPDATE, k, {"id": k, "big": UNCHANGED_TOAST, "v": v},
                                  unchanged=("big",)), keys, st.integers(0, 99)),
        st.builds(lambda k: ev(Op.DELETE, k), keys),
        st.builds(lambda k: ev(Op.CREATE, k, {"id": k}, table="other"), keys),
        st.just(ev(Op.TRUNCATE, None)),
    )
    events = data.draw(st.lists(one, min_size=1, max_size=30))
    t = batch(*events)
    order = data.draw(st.permutations(range(t.num_rows)))
    shuffled = t.take(pa.array(order, pa.int64()))

    def flat(red: dict[str, Any]) -> dict[str, Any]:
        return {q: (c.truncated, c.keys, c.ops, c.offsets, c.texts, [list(u) for u in c.unchanged])
                for q, c in red.items()}

    assert flat(reduce_events(shuffled)) == flat(reduce_events(t))


def test_fresh_keys_are_those_whose_first_event_is_an_insert() -> None:
    """``fresh`` (the Delta sink's insert-only writes): the key's first event of the
    batch is a ``c``; a delete or snapshot row first, or an update, is not fresh."""
    t = batch(
        ev(Op.CREATE, 1, {"id": 1, "v": "a", "big": "B"}),
        ev(Op.UPDATE, 1, {"id": 1, "v": "b", "big": UNCHANGED_TOAST}, unchanged=("big",)),
        ev(Op.UPDATE, 2, {"id": 2, "v": "x"}),
        ev(Op.DELETE, 3), ev(Op.CREATE, 3, {"id": 3, "v": "y"}),  # deleted, inserted again
        ev(Op.CREATE, 4, {"id": 4}), ev(Op.DELETE, 4),  # inserted and deleted
        ev(Op.READ, 5, {"id": 5}),  # a snapshot row may re-read a held row
        ev(Op.CREATE, 6, {"id": 6}), ev(Op.DELETE, 6), ev(Op.CREATE, 6, {"id": 6, "v": "z"}),
    )
    for rows in (t, t.take(pa.array(list(reversed(range(t.num_rows))), pa.int64()))):
        ch = reduce_events(rows)["public.t"]
        fresh = {r["id"]: f for r, f in zip(ch.rows, ch.fresh, strict=True)}
        assert fresh == {1: True, 2: False, 3: False, 4: True, 5: False, 6: True}
        assert net(rows)[1] == ("u", {"id": 1, "v": "b", "big": "B"}, [])
