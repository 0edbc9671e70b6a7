"""Key ranges and the row-level difference of one range.

A table's key space is cut into consecutive ranges ``(lo, hi]`` by the source's own
key order (the keyset chunks of a snapshot): ``lo = None`` is the start of the key
space, ``hi = None`` its end, so the ranges cover every key a mirror may hold, including
keys below the source's first or above its last. Bounds are kept twice: as the source's
text of each key column (``lo_text``, for SQL casts) and normalized (``lo``, for
comparisons and output).

Values are compared after ``norm`` by logical type (``pydblog.verify.norm``), so the
text a source gives, the JSON of the change log, and what a mirror returns compare
equal when they mean the same value.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

from pydblog.core.repair import freeze
from pydblog.ports import TableSchema
from pydblog.verify import norm

Key = tuple[Any, ...]
Row = tuple[Any, ...]


NAN = float("nan")
"""Every NaN normalizes to this one object: rows (tuples) holding it compare equal, as
tuple comparison takes identical items as equal, where two NaN objects never are."""


def value(logical: str, v: Any) -> Any:
    """``norm`` plus: a float32 rounds to float32 (a mirror may widen it to float64, a
    text parses as float64), so ``0.1`` from the source and ``0.1f`` compare equal; a
    NaN is ``NAN``."""
    out = norm(logical, v)
    if isinstance(out, float):
        if out != out:
            return NAN
        if logical.lower() == "float32":
            out = struct.unpack("f", struct.pack("f", out))[0]
    return out


_AS_IS = frozenset({"string", "bool", "enum", "time", "timetz", "interval"})
_INTS = frozenset({"int16", "int32", "int64"})


def normalizer(logical: str) -> Callable[[Any], Any]:
    """``value`` for one logical type, resolved once (a column's values all share it)."""
    lg = logical.lower()
    if lg in _AS_IS:
        return _same
    if lg in _INTS:
        return _int
    if lg == "decimal":
        return _decimal
    return lambda v: value(logical, v)


def _same(v: Any) -> Any:
    return v


def _int(v: Any) -> Any:
    """An integer as int: a mirror may widen it (a MySQL ``BIGINT UNSIGNED`` is
    ``numeric(20,0)`` in PostgreSQL, read as its text, or a Decimal)."""
    if v is None or type(v) is int:
        return v
    if isinstance(v, str | Decimal):
        return int(v)
    return v


def _decimal(v: Any) -> Any:
    if v is None or isinstance(v, Decimal):
        return v
    return Decimal(str(v))


def key_columns(schema: TableSchema) -> list[str]:
    """The columns that identify a row: the key, or every column (in column order, as
    a row holds them) for a table without primary key."""
    if is_keyless(schema):
        return [c.name for c in schema.columns]
    return list(schema.key)


def is_keyless(schema: TableSchema) -> bool:
    """Whether a row's identity is the whole row (no primary key: MySQL/MariaDB log no
    key, PostgreSQL's ``REPLICA IDENTITY FULL`` names every column). Such a table is
    compared whole, as a set of distinct rows, and repaired whole."""
    return not schema.key or set(schema.key) >= {c.name for c in schema.columns}


def row_of(schema: TableSchema, get: Mapping[str, Any]) -> tuple[Key, Row]:
    """(normalized key, normalized row) of a row given as column -> value; the key is
    hashable (``frozen``)."""
    norms = _norms(schema)
    row = tuple(f(get.get(c.name)) for c, f in zip(schema.columns, norms, strict=True))
    pos = _key_pos(schema)
    return frozen(tuple(row[i] for i in pos)), row


@functools.lru_cache(maxsize=256)
def _norms(schema: TableSchema) -> tuple[Callable[[Any], Any], ...]:
    return tuple(normalizer(c.logical) for c in schema.columns)


@functools.lru_cache(maxsize=256)
def _key_pos(schema: TableSchema) -> tuple[int, ...]:
    names = [c.name for c in schema.columns]
    return tuple(names.index(k) for k in key_columns(schema))


def show(v: Any) -> Any:
    """A JSON-able form of a normalized value (for the report)."""
    return orjson.loads(orjson.dumps(v, default=str))


@dataclass(frozen=True)
class Range:
    """``(lo, hi]`` in the source's key order; ``None`` is open."""

    index: int
    lo_text: tuple[str, ...] | None
    hi_text: tuple[str, ...] | None
    lo: Key | None
    hi: Key | None

    def holds(self, key: Key) -> bool:
        """Whether ``key`` lies in the range (Python order of normalized keys: the
        source's order for numbers, dates, times, uuids, bytes and text compared by
        code point, which the source's range reads use)."""
        try:
            return (self.lo is None or key > self.lo) and (self.hi is None or key <= self.hi)
        except TypeError:
            return False

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "lo": None if self.lo is None else [show(v) for v in self.lo],
            "hi": None if self.hi is None else [show(v) for v in self.hi],
        }

    def label(self) -> str:
        def one(k: Key | None, open_: str) -> str:
            if k is None:
                return open_
            inner = ", ".join(str(show(v)) for v in k)
            return f"({inner})" if len(k) > 1 else inner

        return f"({one(self.lo, '-inf')}, {one(self.hi, '+inf')}]"


@dataclass
class RowDiff:
    """Keys of one range present only in the source (``missing`` from the mirror),
    only in the mirror (``extra``), or in both with other values (``different``)."""

    missing: list[Key] = field(default_factory=list)
    extra: list[Key] = field(default_factory=list)
    different: list[Key] = field(default_factory=list)

    def keys(self) -> set[Key]:
        return {*self.missing, *self.extra, *self.different}

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra or self.different)

    def without(self, keys: set[Key]) -> RowDiff:
        return RowDiff(
            [k for k in self.missing if k not in keys],
            [k for k in self.extra if k not in keys],
            [k for k in self.different if k not in keys],
        )

    def only(self, keys: set[Key]) -> RowDiff:
        return RowDiff(
            [k for k in self.missing if k in keys],
            [k for k in self.extra if k in keys],
            [k for k in self.different if k in keys],
        )


def diff_rows(source: Mapping[Key, Row], mirror: Mapping[Key, Row]) -> RowDiff:
    """The row-level difference of a range read from both sides (keyed tables)."""
    out = RowDiff()
    for k, row in source.items():
        got = mirror.get(k)
        if got is None and k not in mirror:
            out.missing.append(k)
        elif got != row:
            out.different.append(k)
    out.extra = [k for k in mirror if k not in source]
    for part in (out.missing, out.extra, out.different):
        part.sort(key=_sortable)
    return out


def diff_distinct(source: Iterable[Row], mirror: Iterable[Row]) -> RowDiff:
    """The difference of a table without primary key: its distinct rows only in the
    source are ``missing``, only in the mirror ``extra``; the row is its own key. Rows
    equal in every column cannot be told apart, so a mirror holds one of them (the sinks
    match such rows by their values): their number is not compared."""
    src, got = {frozen(r) for r in source}, {frozen(r) for r in mirror}
    return RowDiff(sorted(src - got, key=_sortable), sorted(got - src, key=_sortable), [])


def frozen(row: Row) -> Row:
    """``row`` hashable: JSON and array values as their canonical JSON text."""
    if not any(isinstance(v, dict | list) for v in row):
        return row
    return freeze(row)


def _sortable(key: Key) -> str:
    return orjson.dumps([show(v) for v in key]).decode()


def sample(keys: Sequence[Key], n: int = 10) -> list[list[Any]]:
    return [[show(v) for v in k] for k in keys[:n]]
