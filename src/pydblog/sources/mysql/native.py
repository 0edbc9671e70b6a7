"""The native rows decoder (``_myrow``, C): a rows event's body straight into pydblog's values.

For a table whose every column has a native reader (integers, FLOAT/DOUBLE, text and
binary strings, DATE, DATETIME2, TIMESTAMP2, DECIMAL, YEAR, ENUM, and MariaDB's JSON
alias of LONGTEXT), ``plan()`` compiles the TABLE_MAP's columns once and ``rows()``
decodes each rows event from one buffer in C, with the values already mapped
(``types.BinlogRowMapper``): no library value, no second pass per row. ``tails()``
goes further: each row's change-log envelope tail (key, before and after JSON, as
``encode_event`` writes them), for ``events.RowRun``.

Invariants: ``rows()`` gives exactly what ``fastrows`` plus ``BinlogRowMapper.map`` give
for the same event (``tests/unit/test_native_binlog.py`` checks every reader against them
on arbitrary bytes; ``tests/mysql/test_types.py`` on real servers). Where the C decoder
cannot be exact (an invalid value the Python path raises on) it hands the body back and
the event is decoded in Python. Without the extension, or with
``PYDBLOG_NATIVE_BINLOG=0``, every event is decoded in Python; one log line says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import orjson
from pymysqlreplication.constants import BINLOG, FIELD_TYPE

from pydblog.events import TAIL_SEP
from pydblog.sources.mysql import fastrows
from pydblog.sources.mysql.rawrows import KINDS, RawRows
from pydblog.sources.mysql.types import (
    BinlogRowMapper,
    _is_binary,
    _str_or_b64,
    binlog_converter,
    date_text,
    datetime_text,
    decimal_text,
    float32,
    json_value,
    timestamp_text,
)

log = logging.getLogger(__name__)

DISABLE_ENV = "PYDBLOG_NATIVE_BINLOG"
"""``PYDBLOG_NATIVE_BINLOG=0`` turns the native decoder off (benchmarks, tests)."""
ABI_VERSION = 4
"""The ``_myrow`` interface this module speaks (its ``VERSION``)."""
_TAIL_SEP = TAIL_SEP.encode()

# How a value is stored (_myrow.c's R_*) and how it becomes pydblog's (O_*).
(R_INT, R_UINT, R_INT24, R_UINT24, R_FLOAT, R_DOUBLE, R_STR, R_DATETIME2, R_TIMESTAMP2,
 R_DATE, R_DECIMAL, R_YEAR, R_ENUM) = range(13)
O_ASIS, O_FLOAT32, O_B64, O_PADDED_B64, O_CALL = range(5)

Spec = tuple[str, int, int, int, str | None, int, Any]
"""``(name, read, a, b, encoding, out, extra)``: one column, as ``_myrow.compile`` takes it."""

_INT_WIDTH = {FIELD_TYPE.TINY: 1, FIELD_TYPE.SHORT: 2, FIELD_TYPE.LONG: 4, FIELD_TYPE.LONGLONG: 8}
# The converters each stored form maps through (types.binlog_converter), written in C.
_TEXT_OUT = {R_DATETIME2: datetime_text, R_TIMESTAMP2: timestamp_text, R_DATE: date_text,
             R_DECIMAL: decimal_text}

_module: Any = None
_state = "unloaded"


def module() -> Any | None:
    """The loaded ``_myrow`` extension, or None (Python path; logged once)."""
    global _module, _state
    if _state == "unloaded":
        _state = "unavailable"
        if os.environ.get(DISABLE_ENV, "1") == "0":
            log.info("native binlog decoder off (%s=0): decoding in Python", DISABLE_ENV)
        else:
            try:
                from pydblog.sources.mysql import _myrow  # type: ignore[attr-defined]
            except ImportError as exc:
                log.warning("native binlog decoder not available (%s): decoding in Python "
                            "(reinstall pydblog with a C compiler and Python's headers)", exc)
            else:
                if getattr(_myrow, "VERSION", None) != ABI_VERSION:
                    log.warning("native binlog decoder is a stale build (version %s, want %s): "
                                "decoding in Python (reinstall pydblog)",
                                getattr(_myrow, "VERSION", None), ABI_VERSION)
                else:
                    _module = _myrow
                    _state = "ready"
                    log.info("native binlog decoder in use")
    return _module


def reset() -> None:
    """Forget the loaded state (tests switch the decoder off and on)."""
    global _module, _state
    _module = None
    _state = "unloaded"


def spec(column: Any, is_json: bool) -> Spec | None:
    """``column``'s spec, or None where it has no native reader (the table is then
    decoded in Python). The reader is ``fastrows._codec``'s, the output
    ``types.binlog_converter``'s."""
    name = column.name
    if not name:
        return None
    conv = binlog_converter(column, is_json)
    t = column.type
    read: int
    a = b = 0
    encoding: str | None = None
    if t in _INT_WIDTH:
        read, a = (R_UINT if column.unsigned else R_INT), _INT_WIDTH[t]
    elif t == FIELD_TYPE.INT24:
        read = R_UINT24 if column.unsigned else R_INT24
    elif t == FIELD_TYPE.FLOAT:
        read = R_FLOAT
    elif t == FIELD_TYPE.DOUBLE:
        read = R_DOUBLE
    elif t in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING, FIELD_TYPE.BLOB):
        read, encoding = R_STR, fastrows._encoding(column)
        a = column.length_size if t == FIELD_TYPE.BLOB else 2 if column.max_length > 255 else 1
    elif t == FIELD_TYPE.DATETIME2:
        read, a = R_DATETIME2, column.fsp
    elif t == FIELD_TYPE.TIMESTAMP2:
        read, a = R_TIMESTAMP2, column.fsp
    elif t == FIELD_TYPE.DATE:
        read = R_DATE
    elif t == FIELD_TYPE.NEWDECIMAL:
        read, a, b = R_DECIMAL, column.precision, column.decimals
    elif t == FIELD_TYPE.YEAR:
        read = R_YEAR
    elif t == FIELD_TYPE.ENUM:
        read, a = R_ENUM, column.size
    else:
        return None
    extra: Any = list(column.enum_values or ()) if read == R_ENUM else None
    if read in _TEXT_OUT:
        if conv is not _TEXT_OUT[read]:
            return None
        return (name, read, a, b, None, O_ASIS, None)
    if conv is None:
        out = O_ASIS
    elif conv is float32 and read == R_FLOAT:
        out = O_FLOAT32
    elif conv is json_value and read == R_STR:
        out, extra = O_CALL, json_value
    elif read == R_STR and encoding is None and conv is _str_or_b64:
        out = O_B64
    elif read == R_STR and encoding is not None and conv is _str_or_b64:
        out = O_ASIS  # decoded text stays text
    elif (read == R_STR and encoding is None and t == FIELD_TYPE.STRING and _is_binary(column)
          and int(getattr(column, "max_length", 0) or 0)):
        out, b = O_PADDED_B64, int(column.max_length)  # BINARY(n): its zero bytes back
    else:
        return None
    return (name, read, a, b, encoding, out, extra)


def plan(columns: Sequence[Any], json_columns: frozenset[str]) -> Any | None:
    """A TABLE_MAP's compiled plan, or None (no extension, or a column without a
    native reader)."""
    mod = module()
    if mod is None:
        return None
    specs = []
    for column in columns:
        found = spec(column, column.name in json_columns)
        if found is None:
            return None
        specs.append(found)
    return mod.compile(tuple(specs))



def tails(event: Any, compiled: Any, mapper: BinlogRowMapper,
          key: tuple[int, ...]) -> tuple[int, str] | list[Any] | None:
    """A rows event's rows as change-log tails (``events.RowRun``; ``key``: the key
    columns' indexes): ``(count, text)``; its mapped rows (a list, as ``rows()`` gives
    them) where the C decoder handed the body back or an update changes a key; None
    where the event is not for this path (its body unread)."""
    kind = KINDS.get(event.event_type)  # _myrow.tails' kind
    if (kind is None or not event.complete or event._ignore_decode_errors):
        return None
    body = event.packet.read(event.event_size - event.packet.read_bytes)
    first = event.columns_present_bitmap
    second = getattr(event, "columns_present_bitmap2", None) if kind == 1 else None
    found: tuple[int, str] | None = _module.tails(compiled, body, first, key, orjson.dumps,
                                                  _TAIL_SEP, second, kind)
    if found is not None:
        return found
    decoded: list[Any] | None = _module.rows(compiled, body, first, second)
    if decoded is not None:
        return decoded
    return _python_rows(event.table_map[event.table_id], body, first, second, mapper)


def raw_tails(raw: RawRows, compiled: Any, mapper: BinlogRowMapper, key: tuple[int, ...],
              table: Any) -> tuple[int, str] | list[Any]:
    """``tails`` for a rows event ``rawrows.parse`` read (``table``: its TABLE_MAP's)."""
    found: tuple[int, str] | None = _module.tails(compiled, raw.body, raw.first, key,
                                                  orjson.dumps, _TAIL_SEP, raw.second,
                                                  raw.kind)
    if found is not None:
        return found
    decoded: list[Any] | None = _module.rows(compiled, raw.body, raw.first, raw.second)
    if decoded is not None:
        return decoded
    return _python_rows(table, raw.body, raw.first, raw.second, mapper)


def rows(event: Any, compiled: Any, mapper: BinlogRowMapper) -> list[Any] | None:
    """The event's rows mapped as ``mapper`` maps them: one dict per row, a (before,
    after) pair per row of an update; None where the event is not for this path (a
    partial JSON update, an incomplete event, ``ignore_decode_errors``): its body is
    then still unread and the library decodes it."""
    if (event.event_type == BINLOG.PARTIAL_UPDATE_ROWS_EVENT or not event.complete
            or event._ignore_decode_errors):
        return None
    body = event.packet.read(event.event_size - event.packet.read_bytes)
    first = event.columns_present_bitmap
    second = getattr(event, "columns_present_bitmap2", None)
    found: list[Any] | None = _module.rows(compiled, body, first, second)
    if found is not None:
        return found
    return _python_rows(event.table_map[event.table_id], body, first, second, mapper)


def _python_rows(table: Any, body: bytes, first: bytes, second: bytes | None,
                 mapper: BinlogRowMapper) -> list[Any]:
    """The rows of a body the C decoder handed back, decoded by ``fastrows``."""
    table_plan = fastrows.plan_of(table)
    if table_plan is None or table_plan.readers is None:
        raise RuntimeError(f"{table.schema}.{table.table}: a native plan without fastrows readers")
    decoded = fastrows.decode_body(table_plan.readers, body, first, second, {})
    return mapper.map_rows(decoded, second is not None)
