"""The range rule of a repair (``core.repair``): a drifted mirror that applies the
change log with a range snapshot in it (chunk rows read at some moment, a range-end
marker whose ``keep`` holds the emitted keys and the keys changed while it ran), cut
into arbitrary batches, each reduced to its net change per key as the sinks do, ends
equal to the source, whatever the drift (rows added, removed, changed in the range),
the concurrent writes (inserts, updates, deletes, key-changing updates) and the cuts.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pydblog.core.repair import RangeEnd, apply_purge, plan_purge

Key = tuple[Any, ...]
KEYS = st.integers(0, 15)
VALUES = st.integers(0, 3)

# One source write: upsert k=v, delete k, or move k1 -> k2 (a key-changing update).
WRITE = st.one_of(
    st.tuples(st.just("put"), KEYS, VALUES),
    st.tuples(st.just("del"), KEYS, st.just(0)),
    st.tuples(st.just("move"), KEYS, KEYS),
)


def _events(state: dict[Key, int], write: tuple[str, int, int]) -> list[tuple[Key, int | None]]:
    """Apply ``write`` to the source ``state``; its change events ``(key, value|None)``."""
    kind, a, b = write
    if kind == "put":
        state[(a,)] = b
        return [((a,), b)]
    if kind == "del":
        if (a,) not in state:
            return []
        del state[(a,)]
        return [((a,), None)]
    if (a,) not in state or a == b or (b,) in state:
        return []
    v = state.pop((a,))
    state[(b,)] = v
    return [((a,), None), ((b,), v)]  # pgoutput: an update whose before has the old key


@given(
    initial=st.dictionaries(KEYS, VALUES),
    drift=st.lists(st.tuples(KEYS, st.one_of(st.none(), VALUES)), max_size=8),
    before=st.lists(WRITE, max_size=6),
    during=st.lists(WRITE, max_size=8),
    after=st.lists(WRITE, max_size=6),
    read_at=st.integers(0, 8),
    bounds=st.tuples(st.one_of(st.none(), st.integers(-1, 15)), st.one_of(st.none(), st.integers(0, 16))),
    cuts=st.lists(st.integers(0, 40), max_size=6),
)
def test_range_snapshot_heals_the_range(
    initial: dict[int, int],
    drift: list[tuple[int, int | None]],
    before: list[tuple[str, int, int]],
    during: list[tuple[str, int, int]],
    after: list[tuple[str, int, int]],
    read_at: int,
    bounds: tuple[int | None, int | None],
    cuts: list[int],
) -> None:
    lo = None if bounds[0] is None else (bounds[0],)
    hi = None if bounds[1] is None else (bounds[1],)
    if lo is not None and hi is not None and hi < lo:
        lo, hi = hi, lo
    rng = RangeEnd("t", 0, lo, hi)
    source: dict[Key, int] = {(k,): v for k, v in initial.items()}
    mirror = dict(source)
    for d, dv in drift:  # drift inside the range: the repair must remove all of it
        if rng.holds((d,)):
            if dv is None:
                mirror.pop((d,), None)
            else:
                mirror[(d,)] = dv + 10

    # The change log: writes before the repair, the writes while it runs (the range's
    # chunk is read after ``read_at`` of them), the chunk rows and the marker, later writes.
    log: list[tuple[str, Key | None, Any]] = []
    for w in before:
        log += [("ev", k, v) for k, v in _events(source, w)]
    read_at = min(read_at, len(during))
    touched: set[Key] = set()
    read: dict[Key, int] = {}
    for i, w in enumerate(during):
        if i == read_at:
            read = {k: v for k, v in source.items() if rng.holds(k)}
        for key, val in _events(source, w):
            log.append(("ev", key, val))
            if rng.holds(key):
                touched.add(key)
    if read_at == len(during):
        read = {k: v for k, v in source.items() if rng.holds(k)}
    emitted = {k: v for k, v in read.items() if k not in touched}  # the window drops the rest
    log += [("ev", k, v) for k, v in sorted(emitted.items())]
    log.append(("end", None, frozenset(emitted) | frozenset(touched)))
    for w in after:
        log += [("ev", k, v) for k, v in _events(source, w)]

    # Apply in batches, each reduced to the last event per key, as a sink does.
    points = sorted({c for c in cuts if 0 < c < len(log)} | {0, len(log)})
    for start, end in itertools.pairwise(points):
        net: dict[Key, tuple[int, int | None]] = {}
        ends = []
        for offset in range(start, end):
            kind, lkey, val = log[offset]
            if kind == "end":
                ends.append(RangeEnd("t", offset, lo, hi, val))
            else:
                assert lkey is not None
                net[lkey] = (offset, val)
        purge = plan_purge(ends, {k: o for k, (o, _) in net.items()})
        apply_purge(mirror, purge)
        for nk, (_, nv) in net.items():
            if nv is None or nk in purge.dropped:
                mirror.pop(nk, None)
            else:
                mirror[nk] = nv
    assert mirror == source


def test_marker_json_round_trip() -> None:
    end = RangeEnd("public.t", 7, (1, "a"), None, frozenset({(1, "b"), (2, "c")}))
    back = RangeEnd.from_json(7, end.to_json())
    assert back == end


def test_keys_changed_after_the_marker_are_spared() -> None:
    end = RangeEnd("t", 10, (0,), (9,), frozenset({(1,)}))
    purge = plan_purge([end], {(2,): 5, (3,): 12, (20,): 1})
    assert purge.dropped == {(2,)}  # absent at the marker, no later event
    [d] = purge.ranges
    assert d.spare == {(1,), (3,)}  # kept by the snapshot, or decided by a later event
