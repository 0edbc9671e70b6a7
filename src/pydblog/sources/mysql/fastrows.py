"""A faster row decoder for mysql-replication (the capture's CPU ceiling).

mysql-replication decodes every value through one long ``if/elif`` chain with per-column
metadata lookups. Here each column type has one reader over a buffer and an offset
(``_codec``: the one table of types: integers, FLOAT/DOUBLE, VARCHAR/CHAR/BINARY,
BLOB/TEXT, DATE, DATETIME2, TIMESTAMP2, DECIMAL, YEAR and ENUM), built once per
TABLE_MAP. ``install()`` replaces

- ``RowsEvent._fetch_rows``: for a table whose every column has a reader, the event's
  body is read from the packet once and its rows are decoded from it by offset;
- ``RowsEvent._read_column_data`` (the row-by-row path, for the other tables): each
  value's bytes are taken from the packet (its width, or its length prefix and what
  it counts) and handed to the same reader; a column without one goes to the library's
  own decoder.

Invariants: the values are exactly the library's for every type, and so are the
``none_sources`` it records, except that an out-of-range DATE/DATETIME (a zero date) is
reported as plain ``"null"``; partial JSON updates, ``ignore_decode_errors`` and tables
whose TABLE_MAP lacks column names go through the library's original code.
``tests/mysql/test_types.py`` checks every type against SELECT and against the library
with this decoder installed.
"""

from __future__ import annotations

import codecs
import datetime as dt
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NamedTuple

from pymysqlreplication.bitmap import BitCount
from pymysqlreplication.constants import BINLOG, FIELD_TYPE, NONE_SOURCE
from pymysqlreplication.row_event import RowsEvent

Reader = Callable[[bytes, int], tuple[Any, int]]
"""Decodes the value at ``off`` in ``buf``: ``(value, the offset after it)``."""

_ORIGINAL: Any = RowsEvent._read_column_data
_ORIGINAL_FETCH: Any = RowsEvent._fetch_rows
_INSTALLED = False

_INTS: dict[int, tuple[str, str]] = {
    FIELD_TYPE.TINY: ("<b", "<B"),
    FIELD_TYPE.SHORT: ("<h", "<H"),
    FIELD_TYPE.LONG: ("<i", "<I"),
    FIELD_TYPE.LONGLONG: ("<q", "<Q"),
}
_FSP_BYTES = {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3}
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_EPOCH = dt.datetime(1970, 1, 1)  # naive UTC, as utcfromtimestamp (deprecated in 3.12)
_SECOND = dt.timedelta(seconds=1)


def install() -> None:
    """Use the fast decoder (idempotent; process-wide)."""
    global _INSTALLED
    if not _INSTALLED:
        RowsEvent._read_column_data = _read_column_data
        RowsEvent._fetch_rows = _fetch_rows
        _INSTALLED = True


# -- readers ------------------------------------------------------------------------------
def _unpacker(fmt: str) -> Reader:
    st = struct.Struct(fmt)
    size, unpack_from = st.size, st.unpack_from

    def read(buf: bytes, off: int) -> tuple[Any, int]:
        return unpack_from(buf, off)[0], off + size

    return read


def _int24(signed: bool) -> Reader:
    def read(buf: bytes, off: int) -> tuple[Any, int]:
        return int.from_bytes(buf[off:off + 3], "little", signed=signed), off + 3

    return read


def _encoding(column: Any) -> str | None:
    """The Python codec for a text column, or None where the library returns bytes."""
    name = column.character_set_name
    if name is None:
        return "utf-8"
    encoding = RowsEvent.charset_to_encoding(name)
    try:
        codecs.lookup(encoding)
    except LookupError:
        return None
    return str(encoding)


def _string(length_size: int, encoding: str | None) -> Reader:
    def read(buf: bytes, off: int) -> tuple[Any, int]:
        n = int.from_bytes(buf[off:off + length_size], "little")
        start = off + length_size
        raw = buf[start:start + n]
        if len(raw) != n:
            raise ValueError("rows event shorter than its values")
        if encoding is None:
            # The library's b"".decode("binary") succeeds (empty input is not decoded).
            return (raw if raw else ""), start + n
        return raw.decode(encoding), start + n

    return read


def _fraction(fsp: int) -> Callable[[bytes, int], tuple[int, int]]:
    nbytes = _FSP_BYTES[fsp]
    scale = int(10 ** (6 - fsp))

    def read(buf: bytes, off: int) -> tuple[int, int]:
        if not nbytes:
            return 0, off
        raw = int.from_bytes(buf[off:off + nbytes], "big", signed=True)
        if fsp % 2:
            raw = int(raw / 10)
        return raw * scale, off + nbytes

    return read


def _datetime2(fsp: int) -> Reader:
    frac = _fraction(fsp)

    def read(buf: bytes, off: int) -> tuple[Any, int]:
        data = int.from_bytes(buf[off:off + 5], "big")
        year_month = (data >> 22) & 0x1FFFF
        micros, end = frac(buf, off + 5)
        try:
            value = dt.datetime(year_month // 13, year_month % 13, (data >> 17) & 0x1F,
                                (data >> 12) & 0x1F, (data >> 6) & 0x3F, data & 0x3F)
        except ValueError:
            return None, end
        return (value.replace(microsecond=micros) if micros > 0 else value), end

    return read


def _timestamp2(fsp: int) -> Reader:
    frac = _fraction(fsp)

    def read(buf: bytes, off: int) -> tuple[Any, int]:
        value = _EPOCH + int.from_bytes(buf[off:off + 4], "big", signed=True) * _SECOND
        micros, end = frac(buf, off + 4)
        return (value.replace(microsecond=micros) if micros > 0 else value), end

    return read


def _date(buf: bytes, off: int) -> tuple[Any, int]:
    raw = int.from_bytes(buf[off:off + 3], "little")
    year, month, day = (raw & (0x7FFF << 9)) >> 9, (raw >> 5) & 0xF, raw & 0x1F
    if not (raw and year and month and day):
        return None, off + 3
    return dt.date(year, month, day), off + 3


def _decimal_size(precision: int, scale: int) -> int:
    uncomp_int, comp_int = divmod(precision - scale, 9)
    uncomp_frac, comp_frac = divmod(scale, 9)
    return _DIG2BYTES[comp_int] + 4 * uncomp_int + 4 * uncomp_frac + _DIG2BYTES[comp_frac]


def _decimal(precision: int, scale: int) -> Reader:
    """MySQL's binary DECIMAL, as the library decodes it (a ``Decimal`` of the same
    text: sign, integral digits, ``.``, ``scale`` fractional digits)."""
    uncomp_int, comp_int = divmod(precision - scale, 9)
    uncomp_frac, comp_frac = divmod(scale, 9)
    size = _decimal_size(precision, scale)
    first = _DIG2BYTES[comp_int]
    last = _DIG2BYTES[comp_frac]

    def read(buf: bytes, off: int) -> tuple[Any, int]:
        raw = bytearray(buf[off:off + size])
        if len(raw) != size:
            raise ValueError("rows event shorter than its values")
        negative = not raw[0] & 0x80
        raw[0] ^= 0x80
        if negative:
            for i in range(size):
                raw[i] ^= 0xFF
        pos = 0
        parts = ["-" if negative else ""]
        if first:
            parts.append(str(int.from_bytes(raw[:first], "big")))
            pos = first
        for _ in range(uncomp_int):
            parts.append(f"{int.from_bytes(raw[pos:pos + 4], 'big'):09d}")
            pos += 4
        parts.append(".")
        for _ in range(uncomp_frac):
            parts.append(f"{int.from_bytes(raw[pos:pos + 4], 'big'):09d}")
            pos += 4
        if last:
            parts.append(f"{int.from_bytes(raw[pos:pos + last], 'big'):0{comp_frac}d}")
        return Decimal("".join(parts)), off + size

    return read


def _year(buf: bytes, off: int) -> tuple[Any, int]:
    return buf[off] + 1900, off + 1  # (the library's: YEAR 0 reads 1900)


def _enum(size: int, values: list[str]) -> Reader:
    """An ENUM's member by its index (index 0, an invalid value, is ``values[0]``);
    None where the TABLE_MAP carried no members, as the library."""

    def read(buf: bytes, off: int) -> tuple[Any, int]:
        index = int.from_bytes(buf[off:off + size], "little")
        return (values[index] if values else None), off + size

    return read


class Codec(NamedTuple):
    """A column's reader and how many bytes its value takes: ``width`` (fixed), or a
    ``prefix``-byte little-endian length and that many bytes (``width`` 0)."""

    read: Reader
    width: int
    prefix: int = 0


def _codec(column: Any) -> Codec | None:
    """The one table of types: ``column``'s reader, or None (the library decodes it)."""
    t = column.type
    if t in _INTS:
        signed, unsigned = _INTS[t]
        fmt = unsigned if column.unsigned else signed
        return Codec(_unpacker(fmt), struct.calcsize(fmt))
    if t == FIELD_TYPE.INT24:
        return Codec(_int24(not column.unsigned), 3)
    if t == FIELD_TYPE.FLOAT:
        return Codec(_unpacker("<f"), 4)
    if t == FIELD_TYPE.DOUBLE:
        return Codec(_unpacker("<d"), 8)
    if t in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING):  # (CHAR and BINARY are STRING)
        prefix = 2 if column.max_length > 255 else 1
        return Codec(_string(prefix, _encoding(column)), 0, prefix)
    if t == FIELD_TYPE.BLOB:
        return Codec(_string(column.length_size, _encoding(column)), 0, column.length_size)
    if t == FIELD_TYPE.DATETIME2:
        return Codec(_datetime2(column.fsp), 5 + _FSP_BYTES[column.fsp])
    if t == FIELD_TYPE.TIMESTAMP2:
        return Codec(_timestamp2(column.fsp), 4 + _FSP_BYTES[column.fsp])
    if t == FIELD_TYPE.DATE:
        return Codec(_date, 3)
    if t == FIELD_TYPE.NEWDECIMAL:
        return Codec(_decimal(column.precision, column.decimals),
                     _decimal_size(column.precision, column.decimals))
    if t == FIELD_TYPE.YEAR:
        return Codec(_year, 1)
    if t == FIELD_TYPE.ENUM:
        return Codec(_enum(column.size, list(column.enum_values or ())), column.size)
    return None


# -- plans --------------------------------------------------------------------------------
class _Plan(NamedTuple):
    """A table's decoding plan: per column ``(name, reader, width, prefix, column)``
    (reader None: the library decodes it, see ``Codec``); ``readers``: every column's
    reader where every column has one (its events then decode from one buffer)."""

    columns: list[tuple[str, Reader | None, int, int, Any]]
    readers: list[tuple[str, Reader]] | None


def _plan(event: Any) -> _Plan | None:
    """The table's plan, built once per TABLE_MAP (once its columns are named); None
    where the library decodes (no column names, or ``ignore_decode_errors``)."""
    if event._ignore_decode_errors:
        return None
    return plan_of(event.table_map[event.table_id])


def plan_of(table: Any) -> _Plan | None:
    """``_plan`` for a TABLE_MAP's ``Table`` (``ignore_decode_errors`` off)."""
    plan: _Plan | None = getattr(table, "_dblog_plan", None)
    if plan is None:
        if any(not c.name for c in table.columns):
            return None
        found = [(c, _codec(c)) for c in table.columns]
        columns: list[tuple[str, Reader | None, int, int, Any]] = [
            (c.name, k.read, k.width, k.prefix, c) if k is not None else (c.name, None, 0, 0, c)
            for c, k in found
        ]
        whole = all(k is not None for _, k in found)
        plan = _Plan(columns, [(c.name, k.read) for c, k in found if k is not None]
                     if whole else None)
        table._dblog_plan = plan
    return plan


# -- row by row, through the packet --------------------------------------------------------
def _read_column_data(self: Any, cols_bitmap: Any, row_image_type: Any = None) -> Any:
    if self.event_type == BINLOG.PARTIAL_UPDATE_ROWS_EVENT:
        return _ORIGINAL(self, cols_bitmap, row_image_type)
    plan = _plan(self)
    if plan is None:
        return _ORIGINAL(self, cols_bitmap, row_image_type)
    self.is_partial_json_update = False
    packet = self.packet
    null_bitmap = packet.read((BitCount(cols_bitmap) + 7) // 8)
    none_sources = self._RowsEvent__none_sources
    library = self._RowsEvent__read_values_name
    values: dict[str, Any] = {}
    nulls = 0
    for i, (name, read, width, prefix, column) in enumerate(plan.columns):
        if not cols_bitmap[i >> 3] & (1 << (i & 7)):
            none_sources[name] = NONE_SOURCE.COLS_BITMAP
            values[name] = None
            continue
        if null_bitmap[nulls >> 3] & (1 << (nulls & 7)):
            none_sources[name] = NONE_SOURCE.NULL
            values[name] = None
        elif read is None:
            values[name] = library(
                column, null_bitmap, nulls, False, cols_bitmap, column.unsigned, i
            )
        elif prefix:  # the length, then what it counts
            head = packet.read(prefix)
            values[name] = read(head + packet.read(int.from_bytes(head, "little")), 0)[0]
        else:
            values[name] = read(packet.read(width), 0)[0]
        nulls += 1
    return values


# -- whole events, from one buffer ---------------------------------------------------------
def _image(readers: list[tuple[str, Reader]], buf: bytes, off: int, present: bytes,
           none_sources: dict[str, str]) -> tuple[dict[str, Any], dict[str, str], int]:
    """One row image at ``off``: (values, their none sources, the offset after it),
    as ``_read_column_data`` and the library's ``_get_none_sources`` give them."""
    count = sum(bin(b).count("1") for b in present)
    nbytes = (count + 7) // 8
    nulls_map = buf[off:off + nbytes]
    off += nbytes
    values: dict[str, Any] = {}
    nulls = 0
    missing = False
    for i, (name, read) in enumerate(readers):
        if not present[i >> 3] & (1 << (i & 7)):
            none_sources[name] = NONE_SOURCE.COLS_BITMAP
            values[name] = None
            missing = True
            continue
        if nulls_map[nulls >> 3] & (1 << (nulls & 7)):
            none_sources[name] = NONE_SOURCE.NULL
            values[name] = None
            missing = True
        else:
            values[name], off = read(buf, off)
            if values[name] is None:
                missing = True
        nulls += 1
    sources = ({name: none_sources.get(name, "null") for name, v in values.items() if v is None}
               if missing else {})
    return values, sources, off


def _fetch_rows(self: Any) -> None:
    if self.event_type == BINLOG.PARTIAL_UPDATE_ROWS_EVENT or not self.complete:
        return _ORIGINAL_FETCH(self)  # type: ignore[no-any-return]
    plan = _plan(self)
    if plan is None or plan.readers is None:
        return _ORIGINAL_FETCH(self)  # type: ignore[no-any-return]
    body = self.packet.read(self.event_size - self.packet.read_bytes)
    self._RowsEvent__rows = decode_body(
        plan.readers, body, self.columns_present_bitmap,
        getattr(self, "columns_present_bitmap2", None), self._RowsEvent__none_sources)
    return None


def decode_body(readers: list[tuple[str, Reader]], body: bytes, first: bytes,
                second: bytes | None, none_sources: dict[str, str]) -> list[dict[str, Any]]:
    """A rows event's rows from its ``body``, as the library gives them: ``values`` and
    ``none_sources`` per row, or ``before_``/``after_`` ones per row of an update
    (``second``: the after image's columns-present bitmap)."""
    rows: list[dict[str, Any]] = []
    off, end = 0, len(body)
    while off < end:
        if second is not None:  # an update: the before image, then the after image
            before, before_none, off = _image(readers, body, off, first, none_sources)
            after, after_none, off = _image(readers, body, off, second, none_sources)
            rows.append({"before_values": before, "before_none_sources": before_none,
                         "after_values": after, "after_none_sources": after_none})
        else:
            values, sources, off = _image(readers, body, off, first, none_sources)
            rows.append({"values": values, "none_sources": sources})
    return rows
