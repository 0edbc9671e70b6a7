"""Arithmetic key ranges of integer keys (``core.intsplit``), against a simulated table.

The simulation plans and reads one table's ranges as ``core.flight`` does for an
integer key: a first bounds query (the key of every ``step``-th row), then ranges cut
by ``Density.plan``; each range is read with its ``LIMIT`` (``cap`` of its planned rows;
``step`` for a range between bounds), several ranges are planned ahead and read in any
order, and a read that fills its LIMIT below its upper covers ``(after, last]`` only, its
rest cut again by ``Density.rest``. Rows are inserted and deleted anywhere between reads
(also inside ranges already planned). Keys are sparse, skewed (dense clusters in wide
gaps), negative, and at the limits of bigint and of MySQL's unsigned bigint.

Oracles: no key is read twice; every key present from start to end is read; the
ranges partition ``(start, top]`` without gap or overlap; every bound lies inside the
key type's domain; no read returns more than its LIMIT; the plan ends.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pydblog.core.intsplit import HISTORY, Density, as_planned, cap

DOMAINS = {
    "bigint": (-(2**63), 2**63 - 1),
    "unsigned bigint": (0, 2**64 - 1),
    "int": (-(2**31), 2**31 - 1),
    "smallint": (-(2**15), 2**15 - 1),
    "tiny": (-50, 50),
}


@dataclass
class Rng:
    after: int | None
    upper: int
    limit: int
    planned: int  # 0: a range between bounds
    read: bool = False


@st.composite
def tables(draw: st.DrawFn) -> tuple[str, int, int, set[int]]:
    """(domain name, lo, hi, keys): clusters of keys, each dense or sparse, anywhere in
    the domain, maybe the domain's extremes themselves."""
    name = draw(st.sampled_from(sorted(DOMAINS)))
    lo, hi = DOMAINS[name]
    keys: set[int] = set()
    for _ in range(draw(st.integers(1, 5), label="clusters")):
        start = draw(st.integers(lo, hi), label="cluster at")
        gap = draw(st.sampled_from([1, 1, 2, 7, 1000, 2**20, 2**40]), label="spacing")
        n = draw(st.integers(1, 60), label="cluster rows")
        keys.update(k for k in range(start, start + gap * n, gap) if lo <= k <= hi)
    if draw(st.booleans(), label="extremes"):
        keys.update({lo, hi})
    return name, lo, hi, keys


class Sim:
    def __init__(self, data: st.DataObject, lo: int, hi: int, keys: set[int]) -> None:
        self.data = data
        self.lo, self.hi = lo, hi
        self.keys = sorted(keys)
        self.top = self.keys[-1]
        self.target = data.draw(st.integers(1, 16), label="target rows")
        self.parallel = data.draw(st.integers(1, 4), label="ranges read at once")
        self.density = Density()
        self.ranges: list[Rng] = []
        self.planned_all = False
        self.read: list[int] = []
        self.reads = 0
        self.splits = 0

    # -- the table ---------------------------------------------------------------------
    def rows(self, after: int | None, upper: int, limit: int) -> list[int]:
        i = 0 if after is None else bisect.bisect_right(self.keys, after)
        j = bisect.bisect_right(self.keys, upper)
        return self.keys[i:j][:limit]

    def mutate(self) -> None:
        """Insert or delete a row anywhere (often inside a range planned, not read)."""
        if self.data.draw(st.booleans(), label="insert"):
            pending = [r for r in self.ranges if not r.read]
            into: bool = self.data.draw(st.booleans(), label="into a planned range")
            if pending and into:
                r = self.data.draw(st.sampled_from(pending))
                low = self.lo if r.after is None else r.after + 1
                key = self.data.draw(st.integers(low, r.upper), label="inserted")
            else:
                key = self.data.draw(st.integers(self.lo, self.hi), label="inserted")
            if key not in self.keys:
                bisect.insort(self.keys, key)
        elif self.keys:
            self.keys.remove(self.data.draw(st.sampled_from(self.keys), label="deleted"))

    # -- the planner (as core.flight) ------------------------------------------------------
    def planned_end(self) -> int | None:
        return self.ranges[-1].upper if self.ranges else None

    def bounds(self, step: int, count: int) -> None:
        """The first bounds query: the key of every ``step``-th row."""
        after = self.planned_end()
        found = self.rows(after, self.top, step * count)
        keys = found[step - 1 :: step][:count]
        self.density.calibrate(after, keys, step)
        low = after
        for k in keys:
            self.ranges.append(Rng(low, k, step, 0))
            low = k
            if k == self.top:
                self.planned_all = True
                return
        if len(keys) < count:
            self.ranges.append(Rng(low, self.top, step, 0))
            self.planned_all = True

    def plan(self) -> None:
        start = self.planned_end()
        if start is None or not self.density.calibrated:
            self.bounds(self.target, 2)
            return
        uppers = self.density.plan(start, self.top, self.target, self.parallel)
        assert uppers and uppers[-1] <= self.top and all(a < b for a, b in zip([start, *uppers], uppers, strict=False))
        low = start
        for u in uppers:
            self.ranges.append(Rng(low, u, cap(self.target), self.target))
            low = u
        self.planned_all = uppers[-1] == self.top

    def read_one(self) -> None:
        pending = [i for i, r in enumerate(self.ranges) if not r.read][: self.parallel]
        i = self.data.draw(st.sampled_from(pending), label="range read")
        r = self.ranges[i]
        got = self.rows(r.after, r.upper, r.limit)
        assert len(got) <= r.limit
        self.reads += 1
        r.read = True
        self.read.extend(got)
        last = got[-1] if got else None
        first = got[0] if got else None
        if self.density.after_read(r.after, r.upper, len(got), first, last, r.limit):
            assert last is not None and (r.after is None or r.after < last < r.upper)
            self.splits += 1
            rest = self.density.rest(last, r.upper, self.target, self.parallel)
            assert rest[-1] == r.upper and all(a < b for a, b in zip([last, *rest], rest, strict=False))
            new, low = [], last
            for u in rest:
                new.append(Rng(low, u, cap(self.target), self.target))
                low = u
            r.upper = last
            self.ranges[i + 1 : i + 1] = new

    def run(self) -> None:
        first = set(self.keys)
        gone: set[int] = set()
        for _ in range(20_000):
            if self.data.draw(st.integers(0, 3), label="mutate?") == 0:
                before = set(self.keys)
                self.mutate()
                gone |= before ^ set(self.keys)
            unread = sum(not r.read for r in self.ranges)
            if not self.planned_all and unread < self.parallel:
                self.plan()
            elif unread:
                self.read_one()
            else:
                break
        else:
            raise AssertionError("the plan does not end")
        # no key twice; every key present throughout (and not above top) read
        assert len(self.read) == len(set(self.read)), "a key was read twice"
        stable = {k for k in first - gone if k <= self.top}
        assert stable <= set(self.read), sorted(stable - set(self.read))[:5]
        # the ranges partition (start, top]
        assert self.ranges[0].after is None and self.ranges[-1].upper == self.top
        for a, b in zip(self.ranges, self.ranges[1:], strict=False):
            assert a.upper == b.after
        assert all(r.after is None or r.after < r.upper for r in self.ranges)
        assert all(self.lo <= r.upper <= self.hi for r in self.ranges)


PROFILE = settings(
    max_examples=80, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROFILE
@given(table=tables(), data=st.data())
def test_arithmetic_ranges_read_every_key_once(
    table: tuple[str, int, int, set[int]], data: st.DataObject
) -> None:
    check(table, data)


@pytest.mark.slow
@settings(PROFILE, max_examples=2000)
@given(table=tables(), data=st.data())
def test_arithmetic_ranges_read_every_key_once_long(
    table: tuple[str, int, int, set[int]], data: st.DataObject
) -> None:
    """The test above with many more examples (``pytest -m slow``)."""
    check(table, data)


def check(table: tuple[str, int, int, set[int]], data: st.DataObject) -> None:
    name, lo, hi, keys = table
    sim = Sim(data, lo, hi, keys)
    sim.run()
    event(f"domain {name}")
    event(f"full reads split: {'0' if not sim.splits else '1-3' if sim.splits <= 3 else '>3'}")
    event(f"reads: {'1-5' if sim.reads <= 5 else '6-30' if sim.reads <= 30 else '>30'}")


def test_bounds_never_leave_the_domain_at_bigint_limits() -> None:
    """Keys at both ends of bigint, nothing between: the arithmetic stays between them."""
    lo, hi = DOMAINS["bigint"]
    d = Density()
    d.calibrate(None, [lo, lo + 1], 1)  # dense at the start: width 1
    assert d.plan(lo + 1, hi, 4, 3) == [lo + 5, lo + 9, lo + 13]
    for _ in range(40):  # empty reads: the width grows until it reaches the top
        d.observe(0, d.width(4))
    assert d.plan(lo + 1, hi, 4, 3) == [hi]
    d2 = Density()
    d2.calibrate(hi - 10, [hi - 2, hi], 4)  # 8 rows in 10 keys
    assert d2.plan(hi - 1, hi, 1000, 5) == [hi]


def test_a_gap_is_crossed_by_one_keyset_range() -> None:
    """After a range that read no row, the next range reaches the max key (its LIMIT
    stops it at the next keys); the rest after a full read is cut at the density of the
    rows read, not counting the gap before them."""
    d = Density()
    d.calibrate(0, [10, 20], 10)  # dense: 1 row per key
    assert d.plan(20, 10**12, 10, 3) == [30, 40, 50]
    assert not d.after_read(20, 30, 0, None, None, 15)  # a gap begins
    assert d.plan(30, 10**12, 10, 3) == [10**12]
    # that keyset range finds 15 rows (its LIMIT) at 10**9 .. 10**9 + 28, every 2nd key
    assert d.after_read(30, 10**12, 15, 10**9, 10**9 + 28, 15)
    assert d.width(10) == 20
    assert d.rest(10**9 + 28, 10**12, 10, 2) == [10**9 + 48, 10**9 + 68, 10**12]


def test_width_follows_the_last_ranges_density() -> None:
    d = Density()
    d.calibrate(0, [100, 200], 10)  # 20 rows in 200 keys: 0.1 rows per key
    assert d.width(10) == 100
    for _ in range(HISTORY):  # a denser region: 1 row per key
        d.observe(50, 50)
    assert d.width(10) == 10
    d.observe(30, 10, full=True)  # a read that hit its LIMIT: only it counts now
    assert d.width(9) == 3
    assert d.rest(10, 30, 9, 2) == [13, 16, 30]


def test_reads_count_as_full_chunks_for_the_adaptive_size() -> None:
    assert as_planned(100, 100, 10.0) == (100, 10.0)
    assert as_planned(100, 50, 10.0) == (100, 20.0)  # time scaled to the planned rows
    assert as_planned(100, 49, 10.0) == (49, 10.0)  # a short read: no growth
    assert as_planned(100, 0, 10.0) == (0, 10.0)
    assert cap(1) == 2 and cap(8) == 12
