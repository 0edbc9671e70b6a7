"""PostgreSQL text-format values to JSON-compatible Python values: the one mapping used
by both the stream (pgoutput sends text) and snapshots (chunk reads select text).

Invariants:

- Both paths map a value to the same JSON value when both connections run with
  ``SESSION_SETTINGS``. Snapshots may select ``col::text``: where that cast differs
  from the output function pgoutput uses (bool 'true' vs 't', char(n) without its
  padding, inet with '/32'), the converters accept both spellings and agree.
  ``TypeRegistry.text_expr`` gives the output function's exact text if ever needed.
- A converter never receives NULL (the caller maps NULL to ``None``) and never the
  pgoutput ``UNCHANGED`` marker.
- A converter is a pure function of the text; the registry caches one per type OID.
  Unknown OIDs convert to the text unchanged (``str``), logical type ``unknown``.

The full table, with examples, is in ``docs/types.md``.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

import orjson
import psycopg
from psycopg.rows import tuple_row

__all__ = [
    "SESSION_SETTINGS",
    "Converter",
    "PgTypeInfo",
    "TypeRegistry",
    "parse_array",
]

SESSION_SETTINGS: Final[dict[str, str]] = {
    "DateStyle": "ISO",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
}
"""GUCs every source connection sets (replication and chunk reads alike), e.g. as
libpq ``options='-c DateStyle=ISO ...'``. Values contain no spaces, so they can be
passed that way unquoted."""

Converter = Callable[[str], Any]

# Built-in type OIDs (fixed in PostgreSQL's catalog since forever).
BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, FLOAT4, FLOAT8, INET, CIDR, BPCHAR, VARCHAR = 114, 700, 701, 869, 650, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1082, 1083, 1114, 1184, 1186, 1266
BIT, VARBIT, NUMERIC, UUID, JSONB = 1560, 1562, 1700, 2950, 3802


@dataclass(frozen=True, slots=True)
class PgTypeInfo:
    """One row of ``pg_type``, as far as the mapping needs it.

    ``name`` is ``format_type(oid, NULL)`` for ``pg_catalog`` types (``integer``,
    ``character varying``) and the quoted, schema-qualified name otherwise
    (``public.mood``); array names are their element's name plus ``[]``.
    ``elem_oid`` is non-zero only for true array types (not for ``int2vector``,
    ``name`` or ``point``, which have a ``typelem`` but no ``{...}`` text format).
    """

    oid: int
    name: str
    typtype: str
    elem_oid: int
    category: str
    base_oid: int
    namespace: str = "pg_catalog"
    typname: str = ""
    delimiter: str = ","
    output_func: str = ""
    base_typmod: int = -1
    array_oid: int = 0


# -- scalar converters ---------------------------------------------------------------

_BOOL: Final = {"t": True, "f": False, "true": True, "false": False}
_FLOAT_SPECIAL: Final = frozenset({"NaN", "Infinity", "-Infinity"})


def _float(text: str) -> float | str:
    """Finite floats as ``float``; NaN and the infinities stay strings (JSON has none)."""
    return text if text in _FLOAT_SPECIAL else float(text)


def _bpchar(text: str) -> str:
    """char(n) without its padding: PostgreSQL treats trailing spaces of char(n) as
    insignificant, and ``col::text`` drops them while pgoutput sends them."""
    return text.rstrip(" ")


def _inet(text: str) -> str:
    """inet as its output function prints it: no netmask for a single host (``::text``
    says ``10.0.0.1/32`` where pgoutput says ``10.0.0.1``)."""
    if text.endswith("/32") and ":" not in text:
        return text[:-3]
    if text.endswith("/128"):
        return text[:-4]
    return text


def _bytea(text: str) -> str:
    """Hex bytea (``\\x0aff``) to base64."""
    if not text.startswith("\\x"):
        raise ValueError(f"bytea value not in hex format: {text[:20]!r} (set bytea_output=hex)")
    return binascii.b2a_base64(bytes.fromhex(text[2:]), newline=False).decode("ascii")


def _json(text: str) -> Any:
    return orjson.loads(text)


def _pad_fraction(text: str) -> str:
    """Seconds fraction padded to 6 digits (as ``datetime.isoformat``); none stays none."""
    dot = text.find(".")
    if dot < 0:
        return text
    return text + "0" * (7 - (len(text) - dot))


def _time(text: str) -> str:
    return _pad_fraction(text)


def _timetz(text: str) -> str:
    """``HH:MM:SS[.ffffff]+HH:MM``: the value keeps its own offset, written ``+HH:MM``."""
    sign = max(text.rfind("+"), text.rfind("-"))
    offset = text[sign:]
    if len(offset) == 3:
        offset += ":00"
    return _pad_fraction(text[:sign]) + offset


def _timestamp(text: str) -> str:
    """``YYYY-MM-DDTHH:MM:SS[.ffffff]``; infinity and BC values stay as PostgreSQL
    prints them."""
    if len(text) < 19 or text.endswith(" BC"):
        return text
    return _pad_fraction(text.replace(" ", "T", 1))


def _timestamptz(text: str) -> str:
    """``YYYY-MM-DDTHH:MM:SS[.ffffff]Z`` in UTC; infinity and BC values stay as printed.

    With TimeZone=UTC PostgreSQL prints ``+00``; any other offset is converted.
    """
    if text.endswith("+00"):
        if len(text) < 22:
            return text
        return _pad_fraction(text[:-3].replace(" ", "T", 1)) + "Z"
    if len(text) < 22 or text.endswith(" BC"):
        return text
    try:
        moment = datetime.fromisoformat(text).astimezone(UTC)
    except ValueError:  # year > 9999 or an offset with seconds: keep PostgreSQL's text
        return text
    return moment.replace(tzinfo=None).isoformat() + "Z"


# -- arrays --------------------------------------------------------------------------

_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_UNQUOTED: dict[str, re.Pattern[str]] = {}


def _unquoted(delimiter: str) -> re.Pattern[str]:
    pattern = _UNQUOTED.get(delimiter)
    if pattern is None:
        pattern = re.compile(f"[^{re.escape(delimiter)}}}]*")
        _UNQUOTED[delimiter] = pattern
    return pattern


def parse_array(text: str, convert: Converter = str, delimiter: str = ",") -> list[Any]:
    """Parse ``array_out`` text (``{1,NULL,"a,b"}``, ``{{1,2},{3,4}}``) into nested lists.

    Unquoted ``NULL`` is None; every other element goes through ``convert``, quoted
    ones after unescaping. Explicit bounds (``[0:1]={a,b}``) are dropped: JSON lists
    start at 0 whatever the array's lower bound.
    """
    if text[0] == "[":
        text = text[text.index("=") + 1 :]
    if text[0] != "{":
        raise ValueError(f"not an array literal: {text[:40]!r}")
    inner = text[1:-1]
    if text[-1] == "}" and '"' not in inner and "{" not in inner and "}" not in inner:
        if not inner:
            return []
        return [None if e == "NULL" else convert(e) for e in inner.split(delimiter)]
    return _parse_nested(text, convert, delimiter)


def _parse_nested(text: str, convert: Converter, delimiter: str) -> list[Any]:
    unquoted = _unquoted(delimiter)
    stack: list[list[Any]] = []
    pos, size = 0, len(text)
    while pos < size:
        char = text[pos]
        if char == "{":
            nested: list[Any] = []
            if stack:
                stack[-1].append(nested)
            stack.append(nested)
            pos += 1
        elif char == "}":
            done = stack.pop()
            pos += 1
            if not stack:
                if pos != size:
                    raise ValueError(f"trailing text after array literal: {text[pos : pos + 20]!r}")
                return done
        elif char == delimiter:
            pos += 1
        elif char == '"':
            match = _QUOTED.match(text, pos)
            if match is None:
                raise ValueError(f"unterminated quoted array element at {pos}")
            value = match.group(1)
            stack[-1].append(convert(_ESCAPE.sub(r"\1", value) if "\\" in value else value))
            pos = match.end()
        else:
            match = unquoted.match(text, pos)
            assert match is not None  # the pattern matches the empty string
            token = match.group()
            stack[-1].append(None if token == "NULL" else convert(token))
            pos = match.end()
    raise ValueError(f"unterminated array literal: {text[:40]!r}")


def _array_converter(element: Converter, delimiter: str) -> Converter:
    def convert(text: str) -> list[Any]:
        return parse_array(text, element, delimiter)

    return convert


# -- per-OID tables ------------------------------------------------------------------

_BUILTIN: Final[dict[int, tuple[str, Converter]]] = {
    INT2: ("int16", int),
    INT4: ("int32", int),
    INT8: ("int64", int),
    OID: ("int64", int),
    NUMERIC: ("decimal", str),
    FLOAT4: ("float32", _float),
    FLOAT8: ("float64", _float),
    BOOL: ("bool", _BOOL.__getitem__),
    TEXT: ("string", str),
    VARCHAR: ("string", str),
    BPCHAR: ("string", _bpchar),
    CHAR: ("string", str),
    INET: ("string", _inet),
    NAME: ("string", str),
    BYTEA: ("bytes", _bytea),
    UUID: ("uuid", str),
    DATE: ("date", str),
    TIME: ("time", _time),
    TIMETZ: ("timetz", _timetz),
    TIMESTAMP: ("timestamp", _timestamp),
    TIMESTAMPTZ: ("timestamptz", _timestamptz),
    INTERVAL: ("interval", str),
    JSON: ("json", _json),
    JSONB: ("json", _json),
}

_QUOTE_SAFE: Final[frozenset[Converter]] = frozenset(
    {_inet, _bytea, _time, _timetz, _timestamp, _timestamptz}
)
"""Converters whose result is a string of characters JSON never escapes."""

_QUOTE_SAFE_STR_OIDS: Final = frozenset({NUMERIC, UUID, DATE, INTERVAL})
"""Types converted by ``str`` whose text holds only characters JSON never escapes."""

_TEXT_CAST_DIFFERS: Final = frozenset({"boolout", "bpcharout", "inet_out", "cidr_out"})
"""Output functions whose type has its own cast to text (``true::text`` is 'true', the
output function says 't'); ``text_expr`` calls these functions instead of casting."""

_INTERVAL_FIELDS: Final = {
    1 << 2: " year",
    1 << 1: " month",
    1 << 3: " day",
    1 << 10: " hour",
    1 << 11: " minute",
    1 << 12: " second",
    (1 << 2) | (1 << 1): " year to month",
    (1 << 3) | (1 << 10): " day to hour",
    (1 << 3) | (1 << 10) | (1 << 11): " day to minute",
    (1 << 3) | (1 << 10) | (1 << 11) | (1 << 12): " day to second",
    (1 << 10) | (1 << 11): " hour to minute",
    (1 << 10) | (1 << 11) | (1 << 12): " hour to second",
    (1 << 11) | (1 << 12): " minute to second",
}
_INTERVAL_FULL_PRECISION: Final = 0xFFFF

_LOAD_SQL: Final = """
SELECT t.oid, t.typname, n.nspname, t.typtype, t.typcategory, t.typbasetype,
       t.typtypmod, t.typdelim, p.proname, t.typarray,
       CASE WHEN e.typarray = t.oid THEN t.typelem ELSE 0 END,
       CASE WHEN n.nspname = 'pg_catalog' THEN format_type(t.oid, NULL)
            ELSE quote_ident(n.nspname) || '.' || quote_ident(t.typname) END
FROM pg_catalog.pg_type t
JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
JOIN pg_catalog.pg_proc p ON p.oid = t.typoutput
LEFT JOIN pg_catalog.pg_type e ON e.oid = t.typelem
"""


def _info(row: tuple[Any, ...]) -> PgTypeInfo:
    oid, typname, nsp, typtype, cat, base, base_typmod, delim, out, arr, elem, name = row
    return PgTypeInfo(
        oid=oid,
        name=name,
        typtype=typtype,
        elem_oid=elem,
        category=cat,
        base_oid=base,
        namespace=nsp,
        typname=typname,
        delimiter=delim,
        output_func=out,
        base_typmod=base_typmod,
        array_oid=arr,
    )


class TypeRegistry:
    """The source database's types, and a cached converter per type OID.

    Load once per connection target (``load``); types created later (a new enum, seen
    in a pgoutput ``Type`` message or a ``Relation`` with an unknown OID) are added
    with ``refresh``. Not thread-safe for concurrent ``refresh``; lookups are.
    """

    def __init__(self, types: Iterable[PgTypeInfo] = ()) -> None:
        self._types: dict[int, PgTypeInfo] = {t.oid: t for t in types}
        self._converters: dict[int, Converter] = {}
        self._fix_array_names(self._types)

    @classmethod
    def load(cls, conn: psycopg.Connection[Any]) -> TypeRegistry:
        """Every type of the database, in one query."""
        with conn.cursor(row_factory=tuple_row) as cur:
            rows = cur.execute(_LOAD_SQL).fetchall()
        return cls(_info(r) for r in rows)

    def refresh(self, conn: psycopg.Connection[Any], oids: Iterable[int]) -> None:
        """(Re)load ``oids`` with their array types, element types and domain bases."""
        wanted = set(oids)
        fresh: dict[int, PgTypeInfo] = {}
        while wanted:
            with conn.cursor(row_factory=tuple_row) as cur:
                rows = cur.execute(_LOAD_SQL + " WHERE t.oid = ANY(%s)", (list(wanted),)).fetchall()
            for row in rows:
                info = _info(row)
                fresh[info.oid] = info
            linked = {o for t in fresh.values() for o in (t.elem_oid, t.base_oid, t.array_oid)}
            wanted = {o for o in linked if o and o not in fresh and o not in self._types}
        self._types.update(fresh)
        self._fix_array_names(self._types)
        self._converters.clear()

    def _fix_array_names(self, types: dict[int, PgTypeInfo]) -> None:
        for oid, info in list(types.items()):
            elem = types.get(info.elem_oid)
            if elem is not None and info.namespace != "pg_catalog":
                types[oid] = replace(info, name=elem.name + "[]")

    def __contains__(self, oid: int) -> bool:
        return oid in self._types

    def known(self, oid: int) -> bool:
        """Whether ``oid`` was loaded (if not, ``refresh`` it before mapping its values)."""
        return oid in self._types

    def info(self, oid: int) -> PgTypeInfo | None:
        return self._types.get(oid)

    def converter(self, oid: int) -> Converter:
        """The text-to-JSON-value function for ``oid`` (``str`` if unknown)."""
        try:
            return self._converters[oid]
        except KeyError:
            conv = self._converters[oid] = self._build(oid, 0)
            return conv

    def _build(self, oid: int, depth: int) -> Converter:
        builtin = _BUILTIN.get(oid)
        if builtin is not None:
            return builtin[1]
        info = self._types.get(oid)
        if info is None or depth > 32:
            return str
        if info.typtype == "d":
            return self._build(info.base_oid, depth + 1)
        if info.elem_oid:
            elem = self._types.get(info.elem_oid)
            delim = elem.delimiter if elem is not None else ","
            return _array_converter(self._build(info.elem_oid, depth + 1), delim)
        return str

    def fragment(self, oid: int) -> tuple[str, Converter]:
        """How to write a value of ``oid`` as JSON text straight from its PostgreSQL
        text, without building the Python value first (the snapshot reader's fast
        path). Returns ``(how, convert)``:

        - ``"raw"``: the text is already the JSON (integers);
        - ``"quote"``: ``'"' + convert(text) + '"'`` (the converted string never holds
          a character JSON escapes: numbers, dates, times, UUIDs, base64);
        - ``"escape"``: ``encode_basestring(convert(text))`` (any string);
        - ``"bool"``: ``true``/``false``;
        - ``"dumps"``: ``orjson.dumps(convert(text))`` (floats, json, arrays, ...).

        Invariant: each gives exactly ``orjson.dumps(self.converter(oid)(text))``.
        """
        conv = self.converter(oid)
        if conv is int:
            return "raw", conv
        if conv == _BOOL.__getitem__:
            return "bool", conv
        if conv in _QUOTE_SAFE or (conv is str and self.base_oid(oid) in _QUOTE_SAFE_STR_OIDS):
            return "quote", conv
        if conv is str or conv is _bpchar:
            return "escape", conv
        return "dumps", conv

    def json_text_expr(self, column_sql: str, oid: int) -> str | None:
        """A SELECT expression giving the JSON text of the column's value as
        ``self.converter(oid)`` maps it (NULL for NULL), so PostgreSQL can write a
        snapshot row's JSON itself (the fast chunk path); None for types it cannot
        write that way (arrays, ``timetz``), whose tables take the Python path.

        Invariant (checked against real PostgreSQL by tests/integration/test_pg_types):
        ``orjson.loads`` of the text equals the converter's value, for every value, under
        ``SESSION_SETTINGS``; the text never holds a raw newline. Equal values, not always equal bytes: PostgreSQL may print
        a float or escape a character differently than ``orjson``.
        """
        base = self.base_oid(oid)
        conv = self.converter(oid)
        c = column_sql
        info = self._types.get(base)
        if info is not None and info.elem_oid:
            return None
        if conv is int:
            return f"{c}::text"  # integers (and oid) print as JSON numbers
        if conv is _json:
            # json keeps its input text verbatim; a raw newline there can only be
            # whitespace between tokens (JSON escapes it inside strings), and the change
            # log separates bodies by newlines: make it a space. jsonb never prints one.
            return f"{c}::text" if base == JSONB else f"translate({c}::text, E'\\n\\r', '  ')"
        if conv == _BOOL.__getitem__:
            return f"CASE WHEN {c} THEN 'true' WHEN NOT {c} THEN 'false' END"
        if conv is _float:
            return f"to_json({c})::text"  # NaN and the infinities become strings
        quoted: str | None = None  # an expression whose text JSON never escapes
        if conv is _bytea:
            quoted = f"translate(encode({c}, 'base64'), E'\\n', '')"
        elif conv is _timestamptz:
            # Whole seconds without a fraction: ".000000Z" can only be the fraction of
            # such a value (no other "." in the text), so one to_char and a replace.
            quoted = (
                f"CASE WHEN isfinite({c}) AND {c} >= '0001-01-01 00:00:00+00' THEN "
                f"replace(to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), "
                f"'.000000Z', 'Z') ELSE {c}::text END"
            )
        elif conv is _timestamp:
            quoted = (
                f"CASE WHEN isfinite({c}) AND {c} >= '0001-01-01 00:00:00' THEN "
                f"replace(to_char({c}, 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), '.000000', '') "
                f"ELSE {c}::text END"
            )
        elif conv is _time:
            quoted = (
                f"CASE WHEN strpos({c}::text, '.') > 0 "
                f"THEN rpad({c}::text, strpos({c}::text, '.') + 6, '0') ELSE {c}::text END"
            )
        elif conv is str and base in _QUOTE_SAFE_STR_OIDS:
            quoted = f"{c}::text"
        if quoted is not None:
            return f"('\"' || {quoted} || '\"')"
        if conv is _inet:  # the output function's text: no /32 for a host
            return f"to_json({self.text_expr(c, base)})::text"
        if conv is str or conv is _bpchar:  # ::text drops char(n)'s padding
            return f"to_json({c}::text)::text"
        return None

    def base_oid(self, oid: int) -> int:
        """``oid`` with domains resolved to their base type."""
        for _ in range(33):
            info = self._types.get(oid)
            if info is None or info.typtype != "d":
                return oid
            oid = info.base_oid
        return oid

    def logical_type(self, oid: int) -> str:
        """pydblog's source-independent type of ``oid`` (see docs/types.md)."""
        return self._logical(oid, 0)

    def _logical(self, oid: int, depth: int) -> str:
        builtin = _BUILTIN.get(oid)
        if builtin is not None:
            return builtin[0]
        info = self._types.get(oid)
        if info is None or depth > 32:
            return "unknown"
        if info.typtype == "d":
            return self._logical(info.base_oid, depth + 1)
        if info.elem_oid:
            return f"array<{self._logical(info.elem_oid, depth + 1)}>"
        if info.typtype == "e":
            return "enum"
        return "string"

    def sql_type(self, oid: int, typmod: int) -> str:
        """The column type as PostgreSQL's ``format_type(oid, typmod)`` prints it, for
        CREATE TABLE downstream and casts. Domains give their base type (with the
        domain's own modifier), unknown OIDs ``text``."""
        return self._sql(oid, typmod, 0)

    def _sql(self, oid: int, typmod: int, depth: int) -> str:
        info = self._types.get(oid)
        if info is None or depth > 32:
            return "text"
        if info.typtype == "d":
            return self._sql(info.base_oid, info.base_typmod, depth + 1)
        if info.elem_oid:
            return self._sql(info.elem_oid, typmod, depth + 1) + "[]"
        return _with_typmod(info, typmod)

    def text_expr(self, column_sql: str, oid: int) -> str:
        """A SELECT expression giving exactly the text pgoutput sends for this column
        (``column_sql`` is an already quoted identifier)."""
        info = self._types.get(oid)
        if info is not None and info.output_func in _TEXT_CAST_DIFFERS:
            return f"pg_catalog.{info.output_func}({column_sql})::text"
        return f"{column_sql}::text"


def _with_typmod(info: PgTypeInfo, typmod: int) -> str:
    """``info.name`` with a column's type modifier, as ``format_type`` writes it."""
    oid = info.oid
    if typmod < 0:
        if oid == BPCHAR:
            return "bpchar"  # plain 'character' would mean character(1)
        if oid == BIT:
            return '"bit"'
        return info.name
    if oid in (BPCHAR, VARCHAR):
        return f"{info.name}({typmod - 4})"
    if oid == NUMERIC:
        mod = typmod - 4
        scale = ((mod & 0x7FF) ^ 1024) - 1024  # an 11-bit signed scale since PostgreSQL 15
        return f"numeric({(mod >> 16) & 0xFFFF},{scale})"
    if oid in (TIME, TIMETZ, TIMESTAMP, TIMESTAMPTZ):
        head, _, zone = info.name.partition(" ")
        return f"{head}({typmod}) {zone}"
    if oid in (BIT, VARBIT):
        return f"{info.name}({typmod})"
    if oid == INTERVAL:
        fields = _INTERVAL_FIELDS.get((typmod >> 16) & 0x7FFF, "")
        precision = typmod & 0xFFFF
        return f"interval{fields}" + (
            f"({precision})" if precision != _INTERVAL_FULL_PRECISION else ""
        )
    return info.name
