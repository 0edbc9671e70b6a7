"""The Drainer's rules (``core.drainer``): routing, merged identities, one schema
across shards, the merge's low watermark, the consistent cut and the lockstep rounds."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.core.drainer import (
    DB_COLUMN,
    IDENTITY_COLUMNS,
    SCHEMA_COLUMN,
    SOURCE_COLUMN,
    KeyMode,
    Rounds,
    Route,
    RouteCollision,
    Router,
    SchemaConflict,
    Target,
    Watermarks,
    consistent_cut,
    plan_round,
    rounds_settled,
    union_schema,
    widen,
)
from pydblog.errors import ConfigError
from pydblog.ports import ColumnSchema, TableSchema

SOURCES = ("a", "b", "c")


def _schema(table: str, cols: list[tuple[str, str]], key: tuple[str, ...] = ("id",),
            nullable: bool = True) -> TableSchema:
    return TableSchema("s", table, tuple(ColumnSchema(n, n + "_t", lg, nullable)
                                          for n, lg in cols), key)


# -- routing ---------------------------------------------------------------------------

def test_a_route_merges_shards_and_the_first_matching_route_wins() -> None:
    router = Router([
        Route.parse(r"shard_\d+\.orders", "public.orders"),
        Route.parse(r".*\.orders", "public.all_orders"),
    ])
    t1 = router.target("a", "app", "shard_1", "orders")
    t2 = router.target("b", "app", "shard_22", "orders")
    assert t1 == t2 == Target("public", "orders", True, KeyMode.SOURCE)
    assert router.target("a", "app", "legacy", "orders").qualified == "public.all_orders"


def test_a_pattern_with_a_slash_matches_the_database_too() -> None:
    router = Router([Route.parse(r"tenant_\d+/public\.t", "public.t")])
    assert router.target("a", "tenant_7", "public", "t").merged
    assert not router.target("a", "other", "public", "t").merged


def test_a_route_for_named_sources_leaves_the_others_alone() -> None:
    router = Router([Route.parse(r"public\.t", "public.merged", sources=["a"])])
    assert router.target("a", "db", "public", "t").qualified == "public.merged"
    assert router.target("b", "db", "public", "t").qualified == "public.t"


def test_two_unrouted_tables_with_one_name_are_refused_naming_both_sources() -> None:
    router = Router()
    assert router.target("a", "db", "public", "t") == Target("public", "t")
    assert router.target("a", "db", "public", "t") == Target("public", "t")  # again: fine
    with pytest.raises(RouteCollision, match=r"'a' and 'b'.*public\.t") as err:
        router.target("b", "db2", "public", "t")
    assert "[[sync.routes]]" in str(err.value)


@pytest.mark.parametrize(("tables", "target", "key", "message"), [
    ("(", "public.t", "source", "not a valid regex"),
    ("x", "t", "source", "must be schema.table"),
    ("x", "a.b.c", "source", "must be schema.table"),
    ("x", "public.t", "shard", 'must be "source" or "row"'),
])
def test_bad_routes_are_named(tables: str, target: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Route.parse(tables, target, key)


# -- merged identities -----------------------------------------------------------------

_rows = st.dictionaries(st.integers(0, 5), st.integers(0, 100), max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(SOURCES), st.lists(_rows, min_size=1, max_size=2),
                       min_size=1))
def test_merging_shards_keeps_every_row_of_every_shard(
        shards: dict[str, list[dict[int, int]]]) -> None:
    """Materialized by the merged identity, the target equals the union of the shards'
    tables, each row with its source columns, however equal the shards' keys are."""
    target = Target("public", "t", True, KeyMode.SOURCE)
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    expected: list[dict[str, Any]] = []
    for source, schemas in shards.items():
        for i, table in enumerate(schemas):
            schema = f"shard_{i}"
            for key, value in table.items():
                row = target.stamp({"id": key, "v": value}, source, "db", schema)
                assert row is not None
                ident = tuple(row[c] for c in target.identity(("id",)))
                assert ident not in merged
                merged[ident] = row
                expected.append({SOURCE_COLUMN: source, DB_COLUMN: "db",
                                 SCHEMA_COLUMN: schema, "id": key, "v": value})
    def order(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r[SOURCE_COLUMN], r[SCHEMA_COLUMN], r["id"])

    assert sorted(merged.values(), key=order) == sorted(expected, key=order)


def test_key_row_keeps_the_tables_key_and_an_unrouted_table_is_unchanged() -> None:
    assert Target("p", "t", True, KeyMode.ROW).identity(("id",)) == ("id",)
    assert Target("p", "t", True).identity(("id",)) == (*IDENTITY_COLUMNS, "id")
    plain = Target("p", "t")
    assert plain.identity(("id",)) == ("id",)
    assert plain.stamp({"id": 1}, "a", "db", "p") == {"id": 1}
    assert plain.stamp(None, "a", "db", "p") is None


# -- one schema across shards ----------------------------------------------------------

def test_columns_are_unioned_once_and_a_column_one_shard_lacks_is_nullable() -> None:
    target = Target("public", "t", True)
    one = _schema("t", [("id", "int32"), ("a", "string")], nullable=False)
    two = _schema("t", [("id", "int64"), ("a", "string"), ("b", "bool")], nullable=False)
    got = union_schema(target, {"x/db/s.t": one, "y/db/s.t": two})
    assert [c.name for c in got.columns] == [*IDENTITY_COLUMNS, "id", "a", "b"]
    by = {c.name: c for c in got.columns}
    assert by["id"].logical == "int64" and by["id"].type == "id_t" and not by["id"].nullable
    assert not by["a"].nullable and by["b"].nullable
    assert got.key == (*IDENTITY_COLUMNS, "id")
    assert (got.schema, got.table) == ("public", "t")


def test_incompatible_types_name_the_column_and_both_tables() -> None:
    one = _schema("t", [("id", "int32"), ("v", "timestamp")])
    two = _schema("t", [("id", "int32"), ("v", "date")])
    with pytest.raises(SchemaConflict, match=r"'v'.*timestamp in x/db/s\.t and date in y/db/s\.t"):
        union_schema(Target("p", "t", True), {"x/db/s.t": one, "y/db/s.t": two})


def test_different_keys_and_a_clashing_column_name_are_refused() -> None:
    with pytest.raises(SchemaConflict, match="different keys"):
        union_schema(Target("p", "t", True), {
            "x": _schema("t", [("id", "int32")]),
            "y": _schema("t", [("id", "int32"), ("k", "int32")], key=("id", "k"))})
    with pytest.raises(SchemaConflict, match="_dblog_source"):
        union_schema(Target("p", "t", True),
                     {"x": _schema("t", [("id", "int32"), (SOURCE_COLUMN, "string")])})


_logical = st.sampled_from(["int8", "int16", "int32", "int64", "float32", "float64",
                            "decimal", "string", "enum", "uuid", "bool", "date",
                            "array<int32>", "array<int64>", "array<string>"])


@given(_logical, _logical, _logical)
def test_widening_is_a_join(a: str, b: str, c: str) -> None:
    """Symmetric, idempotent, associative where defined, and the result holds both."""
    assert widen(a, a) == a
    ab = widen(a, b)
    assert ab == widen(b, a)
    if ab is not None:
        assert widen(ab, a) == ab and widen(ab, b) == ab
        abc = widen(ab, c)
        bc = widen(b, c)
        if abc is not None and bc is not None:
            assert widen(a, bc) == abc


def test_int64_never_widens_into_a_float() -> None:
    assert widen("int64", "float64") is None
    assert widen("int32", "float64") == "float64"
    assert widen("int64", "decimal") == "decimal"


# -- the low watermark and the consistent cut ------------------------------------------

def test_the_low_watermark_waits_for_every_source_and_names_the_stalled_one() -> None:
    wm = Watermarks(SOURCES)
    wm.advance("a", 100)
    wm.advance("b", 300)
    assert wm.low is None and wm.holding_back() == ["c"] and wm.lag_ms() is None
    wm.advance("c", 200)
    assert wm.low == 100 and wm.holding_back() == ["a"] and wm.lag_ms() == 200
    wm.advance("a", 50)  # a replayed batch: progress never moves back
    assert wm.low == 100
    with pytest.raises(KeyError):
        wm.advance("zz", 1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(SOURCES), st.integers(0, 10**6)), max_size=40))
def test_the_low_watermark_never_passes_a_source_and_never_moves_back(
        reports: list[tuple[str, int]]) -> None:
    wm = Watermarks(SOURCES)
    best: dict[str, int] = {}
    last: int | None = None
    for source, t in reports:
        wm.advance(source, t)
        best[source] = max(best.get(source, t), t)
        low = wm.low
        if low is None:
            assert set(best) != set(SOURCES)
            continue
        assert all(low <= best[s] for s in SOURCES)
        assert low in best.values()
        assert last is None or low >= last
        last = low


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(
    st.sampled_from(SOURCES),
    st.lists(st.tuples(st.integers(0, 50), st.integers(1, 3)), max_size=10), min_size=1),
    st.integers(0, 60) | st.none())
def test_the_consistent_cut_is_whole_transactions_at_or_below_t(
        logs: dict[str, list[tuple[int, int]]], low: int | None) -> None:
    """Each source's log is transactions (commit time, events) in commit order; the cut
    takes exactly the transactions committed at or before T, never part of one."""
    for txs in logs.values():
        txs.sort()
        times = [t for t, n in txs for _ in range(n)]
        cut = consistent_cut(times, low)
        if low is None:
            assert cut == 0
            continue
        assert cut == sum(n for t, n in txs if t <= low)
        assert all(t <= low for t in times[:cut]) and all(t > low for t in times[cut:])


def test_a_clock_that_went_back_stops_the_cut_at_the_first_later_commit() -> None:
    """A prefix, not a filter: the source's position must stay a single offset."""
    assert consistent_cut([1, 5, 2, 3], 3) == 1


# -- lockstep rounds ---------------------------------------------------------------------

class _Logs:
    """A model of the sources' change logs and of what each source applied: commit
    times in log order (never decreasing), each log's completeness time (no later event
    is at or below it: the newest time minus one, or a later heartbeat), and each
    query's start (everything before it applied)."""

    def __init__(self) -> None:
        self.times: dict[str, list[int]] = {s: [] for s in SOURCES}
        self.complete: dict[str, int | None] = {s: None for s in SOURCES}
        self.start: dict[str, int] = {s: 0 for s in SOURCES}
        self.state = Rounds()

    def append(self, source: str, gap: int, events: int) -> None:
        times = self.times[source]
        floor = max([*times[-1:], (self.complete[source] or 0) + 1])
        t = floor + gap
        times.extend([t] * events)
        self.complete[source] = max(self.complete[source] or 0, t - 1)

    def beat(self, source: str, step: int) -> None:
        times = self.times[source]
        newest = times[-1] if times else 0
        self.complete[source] = max(self.complete[source] or 0, newest) + step

    def low(self) -> int | None:
        values = list(self.complete.values())
        return None if any(v is None for v in values) else min(v for v in values if v is not None)

    def plan(self, source: str, limit: int, state: Rounds | None = None) -> tuple[Rounds, int]:
        start = self.start[source]
        times = self.times[source][start:start + limit]
        return plan_round(self.state if state is None else state, source, SOURCES, start,
                          lambda t: start + consistent_cut(times, t), self.low())

    def check(self) -> None:
        st = self.state
        for s in SOURCES:
            times, start = self.times[s], self.start[s]
            if start:  # nothing applied past the current round
                assert st.t is not None and max(times[:start]) <= st.t
            if st.cut is not None:  # everything up to the last complete cut applied
                assert all(t > st.cut for t in times[start:])
            if st.finished(SOURCES):  # exactly a cut of every source at T
                assert st.t is not None
                assert all(t <= st.t for t in times[:start])
                assert all(t > st.t for t in times[start:])


_STEPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.sampled_from(SOURCES), st.integers(0, 5), st.integers(1, 4)),
    st.tuples(st.just("beat"), st.sampled_from(SOURCES), st.integers(1, 5), st.just(0)),
    st.tuples(st.just("plan"), st.sampled_from(SOURCES), st.integers(1, 6), st.just(0)),
    st.tuples(st.just("lost"), st.sampled_from(SOURCES), st.integers(1, 6), st.just(0)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(_STEPS)
def test_rounds_apply_every_source_in_lockstep(steps: list[tuple[str, str, int, int]]) -> None:
    """Sources written, beating, planning and crashing in any order: no source applies
    past a round before every source finished the one before it; a finished round is
    exactly a cut of every source at its time; rounds, their times and the cut only move
    forward; a plan made again from the same start and state (a planner that crashed
    before Spark logged its batch) plans the same end; once the writes stop, planning
    ends with every source done at the logs' least completeness time."""
    logs = _Logs()
    for kind, source, a, b in steps:
        before = logs.state
        if kind == "append":
            logs.append(source, a, b)
        elif kind == "beat":
            logs.beat(source, a)
        else:
            state, end = logs.plan(source, a)
            assert logs.plan(source, a, before) == (state, end)  # deterministic
            assert logs.plan(source, a, state)[1] == end  # planned again after a crash
            batch = logs.times[source][logs.start[source]:end]
            assert state.t is not None or not batch
            assert all(t <= (state.t or 0) for t in batch)
            logs.state = state
            if kind == "plan":  # "lost": Spark never logged the batch
                logs.start[source] = end
        st_ = logs.state
        assert st_.round >= before.round
        assert before.t is None or (st_.t is not None and st_.t >= before.t)
        assert before.cut is None or (st_.cut is not None and st_.cut >= before.cut)
        assert st_.round == before.round or before.t is None or before.finished(SOURCES) \
            or (st_.round == before.round + 1 and _finished_by(before, source))
        logs.check()
    # the writes stop: planning in turn settles at the logs' least completeness time
    for _ in range(200):
        for s in SOURCES:
            logs.state, logs.start[s] = logs.plan(s, 3)
            logs.check()
    low = logs.low()
    assert rounds_settled(logs.state, SOURCES, low)
    if low is not None:
        assert logs.state.t == low == logs.state.cut


def _finished_by(state: Rounds, source: str) -> bool:
    """Whether ``source`` was the last one missing from ``state``'s round."""
    return set(SOURCES) - state.done <= {source}


def test_a_round_waits_for_the_slowest_source() -> None:
    logs = _Logs()
    logs.append("a", 10, 3)  # a: 11 11 11 (complete 10)
    logs.append("b", 20, 2)  # b: 21 21 (complete 20)
    logs.beat("c", 30)  # c: no events, complete 30
    logs.state, logs.start["a"] = logs.plan("a", 10)
    assert logs.state == Rounds(1, 10, frozenset({"a"})) and logs.start["a"] == 0
    logs.beat("a", 100)  # a complete 111: T_1 stays 10 until everyone is done with it
    for s in SOURCES:
        logs.state, logs.start[s] = logs.plan(s, 10)
    # c finished round 1 and opened round 2 at the least completeness, b's 20
    assert logs.state == Rounds(2, 20, frozenset({"c"}), 10)
    assert logs.start == {"a": 0, "b": 0, "c": 0}
    logs.state, logs.start["b"] = logs.plan("b", 10)
    assert logs.start["b"] == 0 and logs.state.done == {"c", "b"}
    logs.state, logs.start["a"] = logs.plan("a", 10)
    assert logs.start["a"] == 3 and logs.state.cut == 10  # a applies round 2's events
    logs.state, logs.start["a"] = logs.plan("a", 10)
    assert logs.state == Rounds(2, 20, frozenset(SOURCES), 20)


def test_a_round_never_opens_past_the_cap() -> None:
    state, end = plan_round(Rounds(), "a", ["a"], 0, lambda t: 5 if t >= 50 else 0, 100, cap=40)
    assert state == Rounds(1, 40, frozenset({"a"}), 40) and end == 0
    assert rounds_settled(state, ["a"], 40) and not rounds_settled(state, ["a"], 41)
    assert rounds_settled(Rounds(), ["a"], None)
    assert Rounds.from_json(state.to_json()) == state
