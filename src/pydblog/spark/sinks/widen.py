"""Column types a sink widens in place when a source column widens after the target
column was created (a source ``ALTER COLUMN ... TYPE bigint``, or a shard merged into a
target whose union type is wider than the first shard's).

Invariant: a target column is only ever changed to a type that holds every value of its
current type: an integer to a wider integer or to a decimal, a small integer or a float
to a double, a decimal to one with at least as many integer and fraction digits.
Anything else (a narrower type, another family, unsigned integers) is left as it is,
and values that do not fit stop the sink as before.
"""

from __future__ import annotations

import re

_INTS = ("tinyint", "smallint", "mediumint", "integer", "bigint")
_HOLDS: dict[str, frozenset[str]] = {
    "smallint": frozenset(_INTS[:1]),
    "mediumint": frozenset(_INTS[:2]),
    "integer": frozenset(_INTS[:3]),
    "bigint": frozenset(_INTS[:4]),
    "numeric": frozenset(_INTS),
    "double": frozenset({"real", *_INTS[:4]}),
}
_ALIASES = {
    "int": "integer", "int2": "smallint", "int4": "integer", "int8": "bigint",
    "decimal": "numeric", "double precision": "double", "float8": "double",
    "float4": "real", "float": "real",
}
_TYPE = re.compile(r"^\s*([a-z ]+?)\s*(?:\((\d+)(?:\s*,\s*(\d+))?\))?\s*(unsigned)?\s*$")


def _parse(sql_type: str) -> tuple[str, int | None, int] | None:
    """``(base, precision, scale)`` of a signed numeric SQL type; None for any other."""
    m = _TYPE.match(sql_type.lower())
    if m is None or m.group(4):
        return None
    base = _ALIASES.get(m.group(1), m.group(1))
    if base not in _HOLDS and base not in _INTS and base != "real":
        return None
    if base != "numeric":
        return base, None, 0
    precision = int(m.group(2)) if m.group(2) else None
    return base, precision, int(m.group(3) or 0)


def widens(have: str, want: str) -> bool:
    """Whether a column of SQL type ``have`` becomes ``want`` without losing a value
    (and ``want`` differs from it)."""
    a, b = _parse(have), _parse(want)
    if a is None or b is None or a == b:
        return False
    if a[0] == b[0] == "numeric":
        if b[1] is None:  # unconstrained numeric holds every numeric
            return True
        if a[1] is None:
            return False
        return b[1] - b[2] >= a[1] - a[2] and b[2] >= a[2]
    if b[0] == "numeric" and b[1] is not None:
        digits = {"tinyint": 3, "smallint": 5, "mediumint": 8, "integer": 10, "bigint": 19}
        return a[0] in digits and b[1] - b[2] >= digits[a[0]]
    return a[0] in _HOLDS.get(b[0], frozenset())
