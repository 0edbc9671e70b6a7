"""MySQL/MariaDB values -> pydblog's JSON values, identically from the binlog and from SELECT.

The mapping (docs/mysql.md has the table):

- integers (signed/unsigned, any width), YEAR -> int; BIT(n) -> int
- DECIMAL -> str, exact, with the column's scale (``"-123.450000"``)
- DOUBLE -> float; FLOAT -> the shortest decimal that reads back as the same 32-bit float
  (``1.1``, not ``1.100000023841858``)
- DATE -> ``"YYYY-MM-DD"``; DATETIME -> ``"YYYY-MM-DDTHH:MM:SS[.ffffff]"``;
  TIMESTAMP -> UTC ``"YYYY-MM-DDTHH:MM:SS[.ffffff]Z"``; TIME -> ``"[-]HH:MM:SS[.ffffff]"``
  (hours may exceed 24); zero dates (``0000-00-00``) -> null
- CHAR/VARCHAR/TEXT (any charset), ENUM -> str; BINARY/VARBINARY/BLOB, GEOMETRY -> base64 str
  (BINARY(n) keeps its trailing zero bytes, as SELECT returns them)
- SET -> list of its members in definition order (``[]`` for the empty set)
- JSON (MySQL's binary JSON, MariaDB's JSON alias of LONGTEXT) -> the parsed JSON value
- NULL -> null

Invariant: for one stored row, ``BinlogRowMapper`` and ``SelectMapper`` produce equal dicts
(tested for every type). The chunk reader's SELECT list casts where the wire forms differ
(FLOAT via DOUBLE: ``+ 0e0``, BIT via ``+0``) and reads TIMESTAMPs in a ``+00:00`` session.
"""

from __future__ import annotations

import base64
import datetime as dt
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson
from pymysqlreplication.constants import FIELD_TYPE, NONE_SOURCE
from pymysqlreplication.row_event import RowsEvent

Conv = Callable[[Any], Any]
_F32 = struct.Struct("<f")


# -- scalar formatting (shared by both paths) -------------------------------------------
def float32(value: float) -> float:
    """The shortest decimal float that rounds to the same IEEE single as ``value``."""
    target = _F32.pack(value)
    for digits in range(6, 10):
        candidate = float(f"{value:.{digits}g}")
        if _F32.pack(candidate) == target:
            return candidate
    return value


def decimal_text(value: Decimal) -> str:
    return format(value, "f")


def date_text(value: dt.date) -> str:
    return value.isoformat()


def datetime_text(value: dt.datetime) -> str:
    return value.isoformat()


def timestamp_text(value: dt.datetime) -> str:
    """A naive UTC datetime as ISO with ``Z``."""
    return value.isoformat() + "Z"


def time_text(value: dt.timedelta) -> str:
    micros = value // dt.timedelta(microseconds=1)
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    secs, us = divmod(micros, 1_000_000)
    hours, rem = divmod(secs, 3600)
    minutes, seconds = divmod(rem, 60)
    frac = f".{us:06d}" if us else ""
    return f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}{frac}"


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def json_value(value: Any) -> Any:
    """A JSON column's value: parsed from text, or MySQL binary JSON made plain."""
    if isinstance(value, str | bytes):
        return orjson.loads(value)
    return _plain_json(value)


def _plain_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_plain_json(k): _plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_json(v) for v in value]
    return value


def bit_from_text(value: str) -> int:
    return int(value, 2) if value else 0


# -- TIME2: mysql-replication 1.0.17 decodes negative fractional TIMEs wrongly ----------
_FRAC_BYTES = {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3}


def decode_time2(data: bytes, fsp: int) -> dt.timedelta:
    """MySQL's TIME2 binary form (my_time_packed_from_binary + TIME_from_longlong_time_packed)."""
    intpart = int.from_bytes(data[:3], "big") - 0x800000
    if fsp in (5, 6):
        packed = int.from_bytes(data[:6], "big") - 0x800000000000
    elif fsp in (1, 2, 3, 4):
        nbytes = _FRAC_BYTES[fsp]
        frac = int.from_bytes(data[3 : 3 + nbytes], "big")
        if intpart < 0 and frac:
            intpart += 1
            frac -= 1 << (8 * nbytes)
        packed = (intpart << 24) + frac * (10_000 if nbytes == 1 else 100)
    else:
        packed = intpart << 24
    neg = packed < 0
    packed = abs(packed)
    hms, micros = packed >> 24, packed % (1 << 24)
    hours, minutes, seconds = (hms >> 12) % (1 << 10), (hms >> 6) % (1 << 6), hms % (1 << 6)
    value = dt.timedelta(hours=hours, minutes=minutes, seconds=seconds, microseconds=micros)
    return -value if neg else value


def _read_time2(self: Any, column: Any) -> dt.timedelta:
    fsp = int(getattr(column, "fsp", 0) or 0)
    return decode_time2(self.packet.read(3 + _FRAC_BYTES.get(fsp, 0)), fsp)


setattr(RowsEvent, "_RowsEvent__read_time2", _read_time2)  # noqa: B010 (name-mangled)


# -- the binlog path ----------------------------------------------------------------------
_IDENTITY_TYPES = {
    FIELD_TYPE.TINY,
    FIELD_TYPE.SHORT,
    FIELD_TYPE.INT24,
    FIELD_TYPE.LONG,
    FIELD_TYPE.LONGLONG,
    FIELD_TYPE.YEAR,
    FIELD_TYPE.DOUBLE,
    FIELD_TYPE.ENUM,
}
_DATETIME = {FIELD_TYPE.DATETIME, FIELD_TYPE.DATETIME2}
_TIMESTAMP = {FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2}
_TIME = {FIELD_TYPE.TIME, FIELD_TYPE.TIME2}
_STRINGS = {
    FIELD_TYPE.VARCHAR,
    FIELD_TYPE.VAR_STRING,
    FIELD_TYPE.STRING,
    FIELD_TYPE.BLOB,
    FIELD_TYPE.GEOMETRY,
}


def _is_binary(column: Any) -> bool:
    """BINARY/VARBINARY/BLOB: the binlog metadata's charset is ``binary`` (or absent)."""
    return getattr(column, "character_set_name", None) in (None, "binary")


def _str_or_b64(value: Any) -> Any:
    return b64(value) if isinstance(value, bytes) else value


def _padded_b64(length: int) -> Conv:
    def conv(value: Any) -> Any:
        if isinstance(value, str):  # the library hands an all-zero BINARY(n) over as ""
            value = value.encode()
        return b64(value.ljust(length, b"\0"))

    return conv


def _set_list(members: Sequence[str]) -> Conv:
    order = list(members)

    def conv(value: Any) -> list[str]:
        return [m for m in order if m in value]

    return conv


def binlog_converter(column: Any, is_json: bool) -> Conv | None:
    """How one column's mysql-replication value becomes pydblog's value (None: as is)."""
    t = column.type
    if is_json or t == FIELD_TYPE.JSON:
        return json_value
    if t in _IDENTITY_TYPES:
        return None
    if t == FIELD_TYPE.FLOAT:
        return float32
    if t == FIELD_TYPE.NEWDECIMAL:
        return decimal_text
    if t == FIELD_TYPE.BIT:
        return bit_from_text
    if t == FIELD_TYPE.DATE:
        return date_text
    if t in _DATETIME:
        return datetime_text
    if t in _TIMESTAMP:
        return timestamp_text
    if t in _TIME:
        return time_text
    if t == FIELD_TYPE.SET:
        return _set_list(column.set_values or ())
    if t == FIELD_TYPE.STRING and _is_binary(column):
        # BINARY(n): the binlog strips trailing zero bytes, SELECT does not.
        length = int(getattr(column, "max_length", 0) or 0)
        return _padded_b64(length) if length else _str_or_b64
    if t in _STRINGS:
        return _str_or_b64
    return _str_or_b64


@dataclass(frozen=True, slots=True)
class BinlogRowMapper:
    """Maps the rows of one TABLE_MAP (one table version) in place."""

    names: tuple[str, ...]
    convs: tuple[tuple[str, Conv], ...]
    sets: tuple[str, ...]

    @classmethod
    def build(cls, columns: Sequence[Any], json_columns: frozenset[str]) -> BinlogRowMapper:
        convs: list[tuple[str, Conv]] = []
        sets: list[str] = []
        for col in columns:
            conv = binlog_converter(col, col.name in json_columns)
            if conv is not None:
                convs.append((col.name, conv))
            if col.type == FIELD_TYPE.SET:
                sets.append(col.name)
        return cls(tuple(c.name for c in columns), tuple(convs), tuple(sets))

    def map(self, values: dict[str, Any], none_sources: dict[str, str]) -> dict[str, Any]:
        for name, conv in self.convs:
            v = values[name]
            if v is not None:
                values[name] = conv(v)
        for name in self.sets:
            if values[name] is None and none_sources.get(name) == NONE_SOURCE.EMPTY_SET:
                values[name] = []
        return values

    def map_rows(self, rows: list[dict[str, Any]], update: bool) -> list[Any]:
        """The library's rows of one rows event mapped: a dict per row, a (before,
        after) pair per row of an update."""
        m = self.map
        if update:
            return [(m(r["before_values"], r["before_none_sources"]),
                     m(r["after_values"], r["after_none_sources"])) for r in rows]
        return [m(r["values"], r["none_sources"]) for r in rows]


# -- the SELECT path ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ColumnType:
    """A column as information_schema describes it."""

    name: str
    data_type: str  # DATA_TYPE, lower case: int, varchar, json, ...
    column_type: str  # COLUMN_TYPE: int(10) unsigned, enum('a','b'), ...
    nullable: bool
    is_json: bool  # MySQL JSON, or MariaDB's JSON alias (LONGTEXT CHECK json_valid)


def quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


_BINARY_TYPES = {
    "binary",
    "varbinary",
    "tinyblob",
    "blob",
    "mediumblob",
    "longblob",
    "geometry",
    "point",
    "linestring",
    "polygon",
    "multipoint",
    "multilinestring",
    "multipolygon",
    "geometrycollection",
}


def _set_from_text(value: Any) -> list[str]:
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text.split(",") if text else []


def _zero_date_or(conv: Conv) -> Conv:
    def wrapped(value: Any) -> Any:
        if isinstance(value, str | bytes):  # pymysql's fallback for '0000-00-00'
            return None
        return conv(value)

    return wrapped


# -- chunk values read as text (``connect(text_values=True)``) ----------------------------
# A chunk reader's connection leaves DATE, DATETIME, TIMESTAMP and DECIMAL values as the
# server's text; these map that text straight to pydblog's values. Invariant: each gives
# exactly what the object path gives (pymysql's converter, then the ``*_text`` above, a
# zero or invalid date None) for every text, and takes objects too (other connections).
# The fast path only takes text in the server's own plain shape (a real date); anything
# else goes through pymysql's converter and the object path.
_DIGITS = frozenset("0123456789")


_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _plain_date(text: str) -> bool:
    """``YYYY-MM-DD``, a real date of years 1-9999."""
    if not (len(text) == 10 and text[4] == "-" and text[7] == "-"
            and _DIGITS.issuperset(text[:4]) and _DIGITS.issuperset(text[5:7])
            and _DIGITS.issuperset(text[8:]) and text[:4] != "0000"
            and "01" <= text[5:7] <= "12" and "01" <= text[8:] <= "31"):
        return False
    if text[8:] <= "28":
        return True
    year, month, day = int(text[:4]), int(text[5:7]), int(text[8:])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return day <= _MONTH_DAYS[month - 1] + (month == 2 and leap)


def _plain_datetime(text: str) -> str | None:
    """ISO form of ``YYYY-MM-DD hh:mm:ss[.f{1,6}]`` in the plain shape (``_plain_date``,
    hours 00-23, minutes and seconds 00-59), else None."""
    n = len(text)
    if not (n == 19 or 21 <= n <= 26) or not _plain_date(text[:10]):
        return None
    if not (text[10] == " " and text[13] == ":" and text[16] == ":"
            and _DIGITS.issuperset(text[11:13]) and _DIGITS.issuperset(text[14:16])
            and _DIGITS.issuperset(text[17:19]) and text[11:13] <= "23"
            and text[14:16] <= "59" and text[17:19] <= "59"):
        return None
    out = text[:10] + "T" + text[11:19]
    if n > 19:
        frac = text[20:]
        if text[19] != "." or not _DIGITS.issuperset(frac):
            return None
        if frac.strip("0"):
            out += "." + frac.ljust(6, "0")
    return out


def _slow(convert: Callable[[str], Any], conv: Conv) -> Conv:
    zero = _zero_date_or(conv)
    return lambda text: zero(convert(text))


def _temporal(fast: Callable[[str], str | None], convert: Callable[[str], Any],
              conv: Conv) -> Conv:
    slow = _slow(convert, conv)
    zero = _zero_date_or(conv)

    def mapped(value: Any) -> Any:
        if type(value) is str:
            got = fast(value)
            return got if got is not None else slow(value)
        return zero(value)

    return mapped


def _date_fast(text: str) -> str | None:
    return text if _plain_date(text) else None


def _timestamp_fast(text: str) -> str | None:
    got = _plain_datetime(text)
    return None if got is None else got + "Z"


def _decimal_of(value: Any) -> str:
    if type(value) is str:
        body = value[1:] if value[:1] == "-" else value
        whole, dot, frac = body.partition(".")
        if whole and _DIGITS.issuperset(whole) and (not dot or (frac and _DIGITS.issuperset(frac))):
            return value
        return decimal_text(Decimal(value))
    return decimal_text(value)


def _text_convs() -> dict[str, Conv]:
    from pymysql import converters

    return {
        "date": _temporal(_date_fast, converters.convert_date, date_text),
        "datetime": _temporal(_plain_datetime, converters.convert_datetime, datetime_text),
        "timestamp": _temporal(_timestamp_fast, converters.convert_datetime, timestamp_text),
    }


_TEXT_CONVS = _text_convs()
_KINDS: dict[Conv, int] = {_TEXT_CONVS["datetime"]: 2, _TEXT_CONVS["timestamp"]: 3,
                           _TEXT_CONVS["date"]: 4, _decimal_of: 5}
"""``_mytext.map_rows``'s kind of the converters whose plain text it maps in C."""


def select_column(col: ColumnType) -> tuple[str, Conv | None]:
    """The SELECT-list expression for ``col`` and how its pymysql value is mapped."""
    q = quote_ident(col.name)
    t = col.data_type
    if col.is_json or t == "json":
        return q, json_value
    if t == "float":
        return f"({q} + 0e0)", float32  # MySQL 5.7 has no CAST(... AS DOUBLE)
    if t == "bit":
        return f"{q}+0", int
    if t == "decimal":
        return q, _decimal_of
    if t in ("date", "datetime", "timestamp"):
        return q, _TEXT_CONVS[t]
    if t == "time":
        return q, time_text
    if t == "set":
        return q, _set_from_text
    if t in _BINARY_TYPES:
        return q, _str_or_b64
    return q, None


@dataclass(frozen=True, slots=True)
class SelectMapper:
    """The SELECT list of a table and the mapping of its result tuples to row dicts."""

    columns: tuple[str, ...]
    exprs: tuple[str, ...]
    convs: tuple[Conv | None, ...]

    @classmethod
    def build(cls, cols: Sequence[ColumnType]) -> SelectMapper:
        pairs = [select_column(c) for c in cols]
        return cls(
            tuple(c.name for c in cols), tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
        )

    @property
    def select_list(self) -> str:
        return ", ".join(self.exprs)

    def map(self, row: Sequence[Any]) -> dict[str, Any]:
        return {
            name: (conv(v) if conv is not None and v is not None else v)
            for name, conv, v in zip(self.columns, self.convs, row, strict=True)
        }

    def map_rows(self, rows: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """``map`` of each row (in C with ``_mytext``: the same dicts)."""
        from pydblog.sources.mysql import textrows

        native = textrows.module()
        if native is None:
            return [self.map(r) for r in rows]
        kinds = tuple(_KINDS.get(c, 1) if c is not None else 0 for c in self.convs)
        return native.map_rows(rows, self.columns, kinds, self.convs)  # type: ignore[no-any-return]


# -- key values back into SQL parameters ---------------------------------------------------
def key_param(col: ColumnType, value: Any) -> tuple[str, Any]:
    """``(placeholder, parameter)`` comparing ``col`` with a key value as this module maps
    it (the inverse of the mapping, for chunk bounds): base64 back to bytes, ``Z`` dropped
    from TIMESTAMPs (the session is UTC), DECIMAL compared as DECIMAL."""
    t = col.data_type
    if value is None:
        return "NULL", None
    if t in _BINARY_TYPES and isinstance(value, str):
        return "%s", base64.b64decode(value)
    if t == "timestamp" and isinstance(value, str):
        return "%s", value.removesuffix("Z").replace("T", " ")
    if t == "datetime" and isinstance(value, str):
        return "%s", value.replace("T", " ")
    if t == "decimal":
        return "CAST(%s AS DECIMAL(65,30))", str(value)
    return "%s", value


# -- logical types (for ColumnSchema) ------------------------------------------------------
_LOGICAL = {
    "tinyint": "int16",
    "smallint": "int16",
    "mediumint": "int32",
    "int": "int32",
    "bigint": "int64",
    "year": "int16",
    "bit": "int64",
    "decimal": "decimal",
    "float": "float32",
    "double": "float64",
    "date": "date",
    "time": "time",
    "datetime": "timestamp",
    "timestamp": "timestamptz",
    "json": "json",
    "set": "array<string>",
    "enum": "string",
}
_WIDER_UNSIGNED = {"tinyint": "int16", "smallint": "int32", "mediumint": "int32", "int": "int64"}


def logical_type(col: ColumnType) -> str:
    if col.is_json:
        return "json"
    if col.data_type in _BINARY_TYPES:
        return "bytes"
    if "unsigned" in col.column_type and col.data_type in _WIDER_UNSIGNED:
        return _WIDER_UNSIGNED[col.data_type]
    return _LOGICAL.get(col.data_type, "string")


# -- the binlog's own column metadata as a ColumnSchema ------------------------------------
_INT_NAMES = {
    FIELD_TYPE.TINY: ("tinyint", "int16", "int16"),
    FIELD_TYPE.SHORT: ("smallint", "int16", "int32"),
    FIELD_TYPE.INT24: ("mediumint", "int32", "int32"),
    FIELD_TYPE.LONG: ("int", "int32", "int64"),
    FIELD_TYPE.LONGLONG: ("bigint", "int64", "int64"),
}


def _quoted_list(values: Sequence[str]) -> str:
    return ",".join("'" + v.replace("'", "''") + "'" for v in values)


def binlog_column_type(column: Any, is_json: bool) -> tuple[str, str]:
    """``(SQL type, logical type)`` of a TABLE_MAP column (binlog_row_metadata=FULL)."""
    t = column.type
    if is_json or t == FIELD_TYPE.JSON:
        return "json", "json"
    if t in _INT_NAMES:
        name, signed, unsigned = _INT_NAMES[t]
        return (f"{name} unsigned", unsigned) if column.unsigned else (name, signed)
    fsp = getattr(column, "fsp", 0) or 0
    suffix = f"({fsp})" if fsp else ""
    simple: dict[int, tuple[str, str]] = {
        FIELD_TYPE.FLOAT: ("float", "float32"),
        FIELD_TYPE.DOUBLE: ("double", "float64"),
        FIELD_TYPE.YEAR: ("year", "int16"),
        FIELD_TYPE.DATE: ("date", "date"),
        FIELD_TYPE.GEOMETRY: ("geometry", "bytes"),
    }
    if t in simple:
        return simple[t]
    if t == FIELD_TYPE.NEWDECIMAL:
        return f"decimal({column.precision},{column.decimals})", "decimal"
    if t == FIELD_TYPE.BIT:
        return f"bit({column.bits})", "int64"
    if t in _TIME:
        return f"time{suffix}", "time"
    if t in _DATETIME:
        return f"datetime{suffix}", "timestamp"
    if t in _TIMESTAMP:
        return f"timestamp{suffix}", "timestamptz"
    if t == FIELD_TYPE.ENUM:
        return (
            f"enum({_quoted_list(column.enum_values[1:] if column.enum_values else [])})",
            "string",
        )
    if t == FIELD_TYPE.SET:
        return f"set({_quoted_list(column.set_values or [])})", "array<string>"
    binary = _is_binary(column)
    if t == FIELD_TYPE.BLOB:
        return ("blob", "bytes") if binary else ("text", "string")
    length = getattr(column, "max_length", None)
    size = f"({length})" if length else ""
    if t == FIELD_TYPE.STRING:
        return (f"binary{size}", "bytes") if binary else ("char", "string")
    return ("varbinary" + size, "bytes") if binary else ("varchar", "string")
