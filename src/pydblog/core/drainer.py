"""The Drainer's rules: many change logs merged into one set of target tables.

One ``dblog sync`` may read the change logs of several captures (``[[sync.sources]]``,
TiDB-Binlog's Pumps); this module decides, without any IO, where each source table's
events go and what the merged tables look like. The sync job, the sinks and the status
commands only ask it.

Invariants:

- **Routing is a function.** ``Router.target`` gives every ``(source, db, schema,
  table)`` exactly one target, the same every time: the first ``[[sync.routes]]`` entry
  whose pattern matches, else the table's own ``schema.table``. Two different source
  tables never reach one target without a route saying so (``RouteCollision``), so a
  sync without routes keeps one mirror per source table as before.
- **Equal keys from two shards never collide** in a merged target whose route keeps
  ``key = "source"`` (the default): the target's identity is the source's name, its
  database and schema (``IDENTITY_COLUMNS``) followed by the table's own key. With
  ``key = "row"`` the table's key alone is the identity (the user says keys are unique
  across sources); the identity columns are still written.
- **One schema across shards** (``union_schema``): a column is in the target when any
  source table has it; a column's logical type is the widest of the sources' types
  along ``WIDENINGS``; types that do not widen into each other are an error naming the
  column and the source tables, raised before anything is applied.
- **The merge's low watermark** (``Watermarks``): each source's progress time is the
  newest source commit time (or heartbeat) its applied events reached; the merge is
  complete up to ``T = min`` over the sources, which never passes a source's progress
  and never moves back. ``consistent_cut`` applies, of each source's batch, the longest
  prefix whose commit times are at or below ``T``: whole transactions, in log order, so
  the targets are a cut of every source at ``T`` (up to the sources' clock skew).
- **Lockstep rounds** (``consistent = true``, ``Rounds``/``plan_round``): round ``k``
  has one time ``T_k``; every source's batches of round ``k`` end at or below ``T_k``;
  round ``k + 1`` opens only once every source found nothing at or below ``T_k`` left
  to apply, with ``T_{k+1}`` the least completeness time of the logs (never below
  ``T_k``). So no source applies anything newer than ``T_k`` before every source has
  applied everything up to ``T_k``, and whenever every source is done with the current
  round the targets are exactly a cut of every source at its ``T`` (``Rounds.cut``:
  the last such ``T``). Rounds, their times and the cut never move back; planning is a
  function of the state and the start, so a planner that plans again from the same
  start and state plans the same end.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from pydblog.errors import ConfigError
from pydblog.ports import ColumnSchema, TableSchema

SOURCE_COLUMN = "_dblog_source"
"""The name of the ``[[sync.sources]]`` entry a merged row came from."""
DB_COLUMN = "_dblog_db"
"""The source database (PostgreSQL: the database; MySQL/MariaDB: the DSN's database)."""
SCHEMA_COLUMN = "_dblog_schema"
"""The source table's schema (MySQL/MariaDB: its database)."""
IDENTITY_COLUMNS = (SOURCE_COLUMN, DB_COLUMN, SCHEMA_COLUMN)


class KeyMode(StrEnum):
    SOURCE = "source"
    """The target's key is the source identity plus the table's key (the default)."""
    ROW = "row"
    """The target's key is the table's key alone: keys are unique across the sources."""


class RouteCollision(ConfigError):
    """Two source tables would reach one target without a route merging them."""


class SchemaConflict(ConfigError):
    """Source tables merged into one target disagree on a column or on the key."""


@dataclass(frozen=True, slots=True)
class Route:
    """One ``[[sync.routes]]`` entry: source tables whose name full-matches ``pattern``
    (``schema.table``, or ``db/schema.table`` when the pattern holds a ``/``), of the
    sources named in ``sources`` (all when empty), go to ``target`` (``schema.table``)."""

    pattern: re.Pattern[str]
    target: tuple[str, str]
    key: KeyMode = KeyMode.SOURCE
    sources: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, tables: str, target: str, key: str = "source",
              sources: Iterable[str] = ()) -> Route:
        try:
            pattern = re.compile(tables)
        except re.error as exc:
            raise ConfigError(f"route tables {tables!r} is not a valid regex: {exc}") from None
        schema, dot, table = target.partition(".")
        if not dot or not schema or not table or "." in table:
            raise ConfigError(f"route target {target!r} must be schema.table",
                              hint='e.g. target = "public.orders"')
        try:
            mode = KeyMode(key)
        except ValueError:
            raise ConfigError(f'route key {key!r} must be "source" or "row"') from None
        return cls(pattern, (schema, table), mode, frozenset(sources))

    def matches(self, source: str, db: str, schema: str, table: str) -> bool:
        if self.sources and source not in self.sources:
            return False
        name = f"{db}/{schema}.{table}" if "/" in self.pattern.pattern else f"{schema}.{table}"
        return self.pattern.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class Target:
    """Where a source table's events go. ``merged``: the table is routed (it gets the
    identity columns); ``key`` says whether they are part of its identity."""

    schema: str
    table: str
    merged: bool = False
    key: KeyMode = KeyMode.SOURCE

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def identity(self, table_key: Sequence[str]) -> tuple[str, ...]:
        """The columns that name a row of the target, given the source table's key."""
        if self.merged and self.key is KeyMode.SOURCE:
            return (*IDENTITY_COLUMNS, *table_key)
        return tuple(table_key)

    def stamp(self, row: Mapping[str, Any] | None, source: str, db: str,
              schema: str) -> dict[str, Any] | None:
        """``row`` as the target stores it: with the identity columns when merged."""
        if row is None:
            return None
        if not self.merged:
            return dict(row)
        return {SOURCE_COLUMN: source, DB_COLUMN: db, SCHEMA_COLUMN: schema, **row}


@dataclass
class Router:
    """Maps source tables to targets (first matching route, else the table itself) and
    refuses two unrouted source tables that would share a target."""

    routes: Sequence[Route] = ()
    _owners: dict[str, tuple[str, str, str, str]] = field(default_factory=dict)

    def target(self, source: str, db: str, schema: str, table: str) -> Target:
        for route in self.routes:
            if route.matches(source, db, schema, table):
                return Target(route.target[0], route.target[1], True, route.key)
        own = Target(schema, table)
        here = (source, db, schema, table)
        first = self._owners.setdefault(own.qualified, here)
        if first[0] != source:
            raise RouteCollision(
                f"{schema}.{table} of sources {first[0]!r} and {source!r} would both be "
                f"mirrored as {own.qualified}",
                hint=f'merge them with a [[sync.routes]] entry whose tables regex matches '
                     f'{schema}.{table} (e.g. target = "{own.qualified}"), or capture only '
                     "one of them")
        return own


# -- one schema across shards -------------------------------------------------------

_INTEGERS = ("int8", "int16", "int32", "int64")
WIDENINGS: dict[str, frozenset[str]] = {
    "int16": frozenset({"int8"}),
    "int32": frozenset({"int8", "int16"}),
    "int64": frozenset({"int8", "int16", "int32"}),
    "float64": frozenset({"float32", "int8", "int16", "int32"}),
    "decimal": frozenset(_INTEGERS),
    "string": frozenset({"enum", "uuid"}),
}
"""``wider: {narrower, ...}``: a column of a narrower logical type merges into a target
column of the wider one without losing a value (int64 does not widen to float64: not
every int64 is a float64)."""


def widen(a: str, b: str) -> str | None:
    """The logical type that holds every value of both, or None when none does."""
    if a == b:
        return a
    if a.startswith("array<") and b.startswith("array<"):
        inner = widen(a[6:-1], b[6:-1])
        return None if inner is None else f"array<{inner}>"
    if a in WIDENINGS.get(b, ()):
        return b
    if b in WIDENINGS.get(a, ()):
        return a
    return None


_IDENTITY_SCHEMA = tuple(ColumnSchema(name, "text", "string", False) for name in IDENTITY_COLUMNS)


def union_schema(target: Target, parts: Mapping[str, TableSchema]) -> TableSchema:
    """The target table's schema from the schemas of the source tables routed to it
    (``parts``: a label such as ``source/db/schema.table`` -> its schema, in the order
    they were first seen). Columns keep their first-seen order after the identity
    columns; a column is nullable when any source's is, or when a source lacks it."""
    if not parts:
        raise ValueError("union_schema needs at least one source table")
    labels = list(parts)
    keys = {label: parts[label].key for label in labels}
    first_key = keys[labels[0]]
    for label in labels[1:]:
        if keys[label] != first_key:
            raise SchemaConflict(
                f"tables merged into {target.qualified} have different keys: "
                f"{labels[0]} ({', '.join(first_key) or 'none'}) and {label} "
                f"({', '.join(keys[label]) or 'none'})",
                hint="route only tables with the same key columns to one target")
    merged: dict[str, ColumnSchema] = {}
    seen_in: dict[str, str] = {}
    counts: dict[str, int] = {}
    for label in labels:
        for col in parts[label].columns:
            counts[col.name] = counts.get(col.name, 0) + 1
            have = merged.get(col.name)
            if have is None:
                merged[col.name] = col
                seen_in[col.name] = label
                continue
            logical = widen(have.logical.lower(), col.logical.lower())
            if logical is None:
                raise SchemaConflict(
                    f"column {col.name!r} of {target.qualified} is {have.logical} in "
                    f"{seen_in[col.name]} and {col.logical} in {label}",
                    hint="make the shards agree on the column's type, or route them to "
                         "different targets")
            wider = col if logical == col.logical.lower() and logical != have.logical.lower() \
                else have
            merged[col.name] = ColumnSchema(col.name, wider.type, wider.logical,
                                            have.nullable or col.nullable)
    columns = [
        c if counts[c.name] == len(labels) or c.name in first_key
        else ColumnSchema(c.name, c.type, c.logical, True)
        for c in merged.values()
    ]
    if target.merged:
        clash = [c.name for c in columns if c.name in IDENTITY_COLUMNS]
        if clash:
            raise SchemaConflict(
                f"{target.qualified}: source column {clash[0]!r} has the name of a column "
                "pydblog adds to merged tables", hint="rename the source column")
        columns = [*_IDENTITY_SCHEMA, *columns]
    return TableSchema(target.schema, target.table, tuple(columns),
                       target.identity(first_key))


# -- the merge's low watermark ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SourceProgress:
    """What a sink has applied of one source: its change-log position (backend form)
    and the newest source commit or heartbeat time it covers (ms since the epoch)."""

    source: str
    time_ms: int
    position: Any = None


@dataclass
class Watermarks:
    """Each source's progress time and the merge's low watermark ``T`` (their minimum).

    ``T`` is undefined (None) until every source reported once: a source that never
    reported could still deliver anything. Progress never moves back (a replayed batch
    reports an older time: ignored)."""

    sources: Sequence[str]
    _times: dict[str, int] = field(default_factory=dict)

    def advance(self, source: str, time_ms: int) -> None:
        if source not in self.sources:
            raise KeyError(f"unknown source {source!r}")
        if time_ms > self._times.get(source, -(2**63)):
            self._times[source] = time_ms

    def time(self, source: str) -> int | None:
        return self._times.get(source)

    @property
    def low(self) -> int | None:
        """``T``: the merged targets hold every source's changes committed at or before
        it; None while a source has not reported."""
        if any(s not in self._times for s in self.sources):
            return None
        return min(self._times[s] for s in self.sources)

    def holding_back(self) -> list[str]:
        """The sources whose progress is ``T`` (all sources not yet reported, when
        ``T`` is undefined): the ones a stalled merge waits for."""
        missing = [s for s in self.sources if s not in self._times]
        if missing:
            return missing
        low = self.low
        return [s for s in self.sources if self._times[s] == low]

    def lag_ms(self) -> int | None:
        """How far ``T`` is behind the newest source's progress."""
        low = self.low
        if low is None:
            return None
        return max(self._times.values()) - low


def consistent_cut(times: Sequence[int], low: int | None) -> int:
    """How many of a source's events (commit times in log order) ``consistent = true``
    applies now: the longest prefix whose times are at or below ``low`` (``T``). A
    transaction's events share its commit time, so the cut never splits one; the rest
    waits for ``T`` to pass it. None (``T`` unknown) applies nothing."""
    if low is None:
        return 0
    for i, t in enumerate(times):
        if t > low:
            return i
    return len(times)


# -- lockstep rounds (consistent = true) ---------------------------------------------

@dataclass(frozen=True, slots=True)
class Rounds:
    """The rounds' shared state (one file per sync, ``spark/rounds.py``).

    ``round``: ``k`` (0: none opened yet); ``t``: ``T_k``; ``done``: the sources that
    found nothing at or below ``T_k`` left to apply; ``cut``: the ``T`` of the last
    round every source finished (None before the first), the time the targets were
    last exactly a cut of every source at."""

    round: int = 0
    t: int | None = None
    done: frozenset[str] = frozenset()
    cut: int | None = None

    def finished(self, sources: Iterable[str]) -> bool:
        """Whether every one of ``sources`` is done with the current round."""
        return self.t is not None and set(sources) <= self.done

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "t_ms": self.t, "done": sorted(self.done),
                "cut_ms": self.cut}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> Rounds:
        if not raw:
            return cls()
        t, cut = raw.get("t_ms"), raw.get("cut_ms")
        return cls(int(raw.get("round", 0)), None if t is None else int(t),
                   frozenset(str(s) for s in raw.get("done", ())),
                   None if cut is None else int(cut))


def plan_round(state: Rounds, source: str, sources: Sequence[str], start: Any,
               cut: Callable[[int], Any], low: int | None,
               cap: int | None = None) -> tuple[Rounds, Any]:
    """Plan ``source``'s next batch from ``start`` (everything before it applied):
    returns the new state and the batch's end (``start``: nothing to apply now).

    ``cut(T)``: the end of the longest prefix of what follows ``start`` (as far as the
    batch may reach: the trigger's limit) whose commit times are at or below ``T``,
    whole transactions (``consistent_cut``); ``low``: the least completeness time of
    every source's log now (None: some log has none yet); ``cap``: no round's time
    passes it (``--available-now``: the logs' least completeness at the start).

    A source whose cut at ``T_k`` is empty has applied everything up to ``T_k``: it is
    done with round ``k``. The source that makes every source done records ``T_k`` as
    the cut, opens round ``k + 1`` at ``min(low, cap)`` when that is past ``T_k``, and
    plans its own batch of it. A source already done may still find events at or
    below ``T_k`` (a log that was late, clock skew): they are applied in round ``k``."""
    names = set(sources)
    if source not in names:
        raise KeyError(f"unknown source {source!r}")
    bound = low if cap is None or low is None else min(low, cap)
    if state.t is None:
        if bound is None:
            return state, start
        state = Rounds(1, bound, frozenset(), state.cut)
    while True:
        t = state.t
        assert t is not None
        end = cut(t)
        if end != start:
            return state, end
        state = replace(state, done=state.done | {source})
        if not state.finished(names):
            return state, start
        state = replace(state, cut=t)
        if bound is None or bound <= t:
            return state, start
        state = Rounds(state.round + 1, bound, frozenset(), t)


def rounds_settled(state: Rounds, sources: Iterable[str], cap: int | None) -> bool:
    """Whether nothing is left for the rounds up to ``cap``: every source is done with
    the current round and its time reached ``cap`` (``--available-now`` ends here, with
    every target a cut of every source at ``cap``). ``cap`` None (a log without any
    time yet): no round can open, nothing is left."""
    if cap is None:
        return True
    return state.finished(sources) and state.t is not None and state.t >= cap
