"""The range rule of a repair: which keys a sink deletes when a range snapshot ends.

A repair re-reads the source rows of one key range ``(lo, hi]`` through the capture's
window (a *range snapshot*) and then logs a range-end marker carrying the range and
``keep``: every key of the range the range snapshot emitted, and every key of the range
that had a change event while it ran. IO-free.

Why ``keep`` is enough: a key of the range that is not in ``keep`` was not in the source
when its chunk was read, and no event touched it from the range snapshot's start to the
marker, so at the marker's place in the log it does not exist. A mirror row with such a
key is drift (a manual insert, a delete that was lost): the sink deletes it. Events
after the marker still apply, in log order.

In one reduced batch (``reduce``: the last event of each key wins, at ``offset``) the
marker at offset ``m`` means, for each key ``k`` of the range not in ``keep``:

- ``k`` has no event after ``m`` in the batch: ``k`` must be absent; if the batch's net
  change of ``k`` is an upsert (its last event before ``m``), it becomes a delete, and a
  target row with ``k`` is deleted (``Purge.ranges``: the target deletes the keys of
  ``(lo, hi]`` outside ``keep`` and outside the batch's later keys);
- ``k`` has an event after ``m``: that event decides, as for any key.

Several markers in a batch compose: each deletes what it names, and a key's net change
is dropped when any marker after its last event names it.

A marker of a source table merged into a shared target (the Drainer's routes) has a
``scope``: the identity columns of that table's part of the target. Its keys are the
source table's, its deletes touch only the rows of its part, and only the part's keys
of the batch take part in its rule (``plan_purge`` is given the part's keys).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

Key = tuple[Any, ...]
Scope = tuple[tuple[str, str], ...]
"""A merged target's part: (identity column, value) pairs, sorted; () for a table of
its own."""


def freeze(values: Iterable[Any]) -> Key:
    """A key from logged values, hashable: a JSON object or array (a whole-row
    identity of a table without primary key holds any column) as its canonical JSON
    text, keys sorted; everything else as it is."""
    return tuple(orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()
                 if isinstance(v, dict | list) else v for v in values)


@dataclass(frozen=True)
class RangeEnd:
    """A range-end marker: the range ``(lo, hi]`` (``None``: open) of one table, in key
    order, its ``keep`` keys, and the marker's change-log offset."""

    table: str
    offset: int
    lo: Key | None
    hi: Key | None
    keep: frozenset[Key] = field(default_factory=frozenset)
    scope: Scope = ()

    def holds(self, key: Key, less: Callable[[Key, Key], bool] | None = None) -> bool:
        """Whether ``key`` lies in ``(lo, hi]`` (``less``: the key order; default
        Python's, which is the sinks' order for numbers and code-point text)."""
        lt = less or _less
        if self.lo is not None and not lt(self.lo, key):
            return False
        return self.hi is None or not lt(self.hi, key)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "lo": None if self.lo is None else list(self.lo),
            "hi": None if self.hi is None else list(self.hi),
            "keep": [list(k) for k in sorted(self.keep, key=repr)],
        }

    @classmethod
    def from_json(cls, offset: int, data: Mapping[str, Any]) -> RangeEnd:
        lo, hi = data.get("lo"), data.get("hi")
        return cls(
            str(data["table"]),
            offset,
            None if lo is None else tuple(lo),
            None if hi is None else tuple(hi),
            frozenset(tuple(k) for k in data.get("keep") or ()),
        )


def _less(a: Key, b: Key) -> bool:
    return bool(a < b)


@dataclass(frozen=True)
class TargetDelete:
    """Delete the target's rows of ``(lo, hi]`` whose key is not in ``spare`` (and, with
    a ``scope``, only rows whose identity columns hold its values)."""

    lo: Key | None
    hi: Key | None
    spare: frozenset[Key]
    scope: Scope = ()


@dataclass
class Purge:
    """What the markers of one batch make a sink do for one table, besides applying
    the batch's net change: delete these target ranges (minus their spared keys) and
    turn the net change of the ``dropped`` keys into deletes."""

    ranges: list[TargetDelete] = field(default_factory=list)
    dropped: set[Key] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.ranges or self.dropped)


def plan_purge(
    ends: Sequence[RangeEnd],
    last_offsets: Mapping[Key, int],
    less: Callable[[Key, Key], bool] | None = None,
) -> Purge:
    """The purge of one table for a batch: ``ends`` are its range-end markers in the
    batch, ``last_offsets`` the offset of each key's last event in the batch (the
    reduced net change's offsets)."""
    out = Purge()
    for end in sorted(ends, key=lambda e: e.offset):
        later = frozenset(k for k, o in last_offsets.items() if o > end.offset and end.holds(k, less))
        out.ranges.append(TargetDelete(end.lo, end.hi, end.keep | later, end.scope))
        for k, o in last_offsets.items():
            if o < end.offset and k not in end.keep and end.holds(k, less):
                out.dropped.add(k)
    return out


def apply_purge(target: dict[Key, Any], purge: Purge,
                less: Callable[[Key, Key], bool] | None = None) -> None:
    """``purge.ranges`` applied to an in-memory target (key -> row); the reference the
    sinks' SQL and Delta predicates implement."""
    for d in purge.ranges:
        end = RangeEnd("", 0, d.lo, d.hi)
        for k in [k for k in target if end.holds(k, less) and k not in d.spare]:
            del target[k]


def keys_in_range(keys: Iterable[Key], end: RangeEnd) -> set[Key]:
    return {k for k in keys if end.holds(k)}
