"""Result-set rows of MySQL's text protocol parsed in C (``_mytext``) instead of PyMySQL's
per-value Python loop: a snapshot chunk's SELECT spends most of its client time there.

``install()`` replaces ``pymysql.connections.MySQLResult._read_rowdata_packet`` (a
buffered result's rows). The values are parsed by ``_mytext.row``, through the
converters PyMySQL chose for the result's columns. The packets: after each packet PyMySQL
reads (``Connection._read_packet``: sequence ids, multi-packet rows, error packets,
timeouts) the complete row packets the connection has already buffered are taken in C
(``_mytext.rows``: their sequence ids checked, the bytes then consumed), stopping before
any packet that is not a plain complete row (the result's end, an error, a row of 16 MiB
or more, one not fully arrived), which PyMySQL reads and checks as before
(``_check_packet_is_eof``: warnings, more results).
``types.SelectMapper.map_rows`` maps a chunk's rows to pydblog's values with
``_mytext.map_rows`` (the same mapping as ``SelectMapper.map``, its text fast paths in C).

Invariant: the rows are PyMySQL's own, value for value and type for type
(``tests/unit/test_textrows.py`` checks packets of every shape against
``_read_row_from_packet``, ``tests/mysql/test_textrows.py`` result sets of every column
type from a real server).
Without the extension (no C compiler at install), or with ``PYDBLOG_NATIVE_TEXTROWS=0``,
nothing is replaced.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

ABI_VERSION = 3
"""The ``_mytext`` interface this module speaks (its ``VERSION``)."""
DISABLE_ENV = "PYDBLOG_NATIVE_TEXTROWS"

_ENCODINGS = {None: 0, "utf8": 1, "utf-8": 1, "ascii": 2}
_INSTALLED = False
_ORIGINAL: Any = None


_module: Any = None
_loaded = False


def module() -> Any | None:
    """The loaded ``_mytext`` extension, or None (not built, a stale build, or switched
    off with ``PYDBLOG_NATIVE_TEXTROWS=0``; looked up once)."""
    global _module, _loaded
    if not _loaded:
        _loaded = True
        if os.environ.get(DISABLE_ENV, "1") != "0":
            try:
                from pydblog.sources.mysql import _mytext  # type: ignore[attr-defined]
            except ImportError:
                _mytext = None
            if getattr(_mytext, "VERSION", None) == ABI_VERSION:
                _module = _mytext
    return _module


def reset() -> None:
    """Look the extension up again (tests switch it off and on)."""
    global _module, _loaded
    _module, _loaded = None, False


def plan(converters: list[tuple[str | None, Any]]) -> tuple[tuple[Any, Any], ...]:
    """``_mytext.row``'s plan for PyMySQL's ``(encoding, converter)`` of each column."""
    out = []
    for encoding, converter in converters:
        enc: Any = _ENCODINGS.get(encoding, encoding)
        conv: Any = 0 if converter is None else 1 if converter is int else (
            2 if converter is float else converter)
        out.append((enc, conv))
    return tuple(out)


def install() -> bool:
    """Parse result rows in C from now on (idempotent, process-wide); False when the
    extension is not available (PyMySQL's own loop stays)."""
    global _INSTALLED, _ORIGINAL
    if _INSTALLED:
        return True
    native = module()
    if native is None:
        log.info("native result-row parser not available: PyMySQL parses chunk rows")
        return False
    from pymysql.connections import MySQLResult

    parse, parse_buffered = native.row, native.rows

    def _read_rowdata_packet(self: Any) -> None:
        spec = plan(self.converters)
        conn = self.connection
        rows: list[tuple[Any, ...]] = []
        while True:
            packet = conn._read_packet()
            if self._check_packet_is_eof(packet):
                self.connection = None  # (as PyMySQL: no cycle)
                break
            rows.append(parse(packet._data, packet._position, spec))
            # The row packets after it that the connection has already buffered, in C;
            # the first one it does not take (the result's end, an error, a row split
            # over packets or not complete yet) is read above by PyMySQL.
            while True:
                buffered = _peek(conn)
                used, seq = parse_buffered(buffered, conn._next_seq_id, spec, rows)
                if not used:
                    break
                conn._rfile.read(used)
                conn._next_seq_id = seq
        self.affected_rows = len(rows)
        self.rows = tuple(rows)

    _ORIGINAL = MySQLResult._read_rowdata_packet
    MySQLResult._read_rowdata_packet = _read_rowdata_packet
    _INSTALLED = True
    return True


def _peek(conn: Any) -> bytes:
    """The bytes ``conn`` has buffered (one read of the socket when none are: called only
    while a result set is still coming), a lost connection raised as PyMySQL raises it."""
    import errno

    from pymysql import err
    from pymysql.constants import CR

    while True:
        try:
            return bytes(conn._rfile.peek(1))
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            conn._force_close()
            raise err.OperationalError(
                CR.CR_SERVER_LOST, f"Lost connection to MySQL server during query ({exc})"
            ) from None
        except BaseException:
            conn._force_close()
            raise


def uninstall() -> None:
    """PyMySQL's own loop again (tests)."""
    global _INSTALLED
    if _INSTALLED:
        from pymysql.connections import MySQLResult

        MySQLResult._read_rowdata_packet = _ORIGINAL
        _INSTALLED = False
