"""Rows events read straight from the dump's packets, past the library's event objects.

mysql-replication builds an event object for every packet; for a rows event whose table
the native decoder reads whole (``native``) that object only carries its header, table
id, columns-present bitmaps and body on to ``_myrow``, and building it costs more than
decoding its rows. ``parse`` reads those fields from the packet's bytes instead.
``MySqlLogSource`` reads each packet itself, keeps the rows events of tables it already
knows this way, and hands every other packet back to the library
(``StreamConnection.held``): the library still reads every FORMAT_DESCRIPTION and ROTATE
event and each TABLE_MAP that differs from the table's last, and keeps its table map and
settings. IO-free.

Invariant: ``parse(data, checksum, post_header)`` is a ``RawRows`` only where the library
(with the same ``checksum`` and post-header lengths) builds a Write/Update/Delete rows
event (V1 or V2) from ``data``, and then its fields are that event's: timestamp,
``packet.log_pos``, ``table_id``, ``event_type``, ``columns_present_bitmap(2)`` and the
body it decodes rows from (``tests/unit/test_rawrows.py`` checks this on arbitrary
packets). It is None for every other packet, for a post-header length other than the
one the library knows, for V2 extra data, and for anything malformed: the library then
reads the packet as before. ``table_map`` reads a TABLE_MAP event's table id and body,
which ``MySqlLogSource`` compares with the last one the library read for that table id:
each transaction repeats its tables' TABLE_MAPs, and one equal to the last is not read
again. ``boundary`` reads the two events that start and end each MariaDB transaction
(GTID, XID) with the values the library gives (also checked against it).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from pymysqlreplication.constants import BINLOG

KINDS = {
    BINLOG.WRITE_ROWS_EVENT_V1: 0, BINLOG.WRITE_ROWS_EVENT_V2: 0,
    BINLOG.UPDATE_ROWS_EVENT_V1: 1, BINLOG.UPDATE_ROWS_EVENT_V2: 1,
    BINLOG.DELETE_ROWS_EVENT_V1: 2, BINLOG.DELETE_ROWS_EVENT_V2: 2,
}
"""The rows event types read here and their kind (``_myrow.tails``'s: 0 write, 1
update, 2 delete)."""
_V2 = frozenset({BINLOG.WRITE_ROWS_EVENT_V2, BINLOG.UPDATE_ROWS_EVENT_V2,
                 BINLOG.DELETE_ROWS_EVENT_V2})
# OK byte, then the event header: timestamp, type, server id, event size, log_pos, flags.
_HEADER = struct.Struct("<BIBIIIH")
_HEADER_END = 1 + 19


@dataclass(slots=True)
class RawRows:
    """One rows event as ``parse`` read it (module docstring)."""

    timestamp: int
    event_type: int
    log_pos: int
    table_id: int
    kind: int
    first: bytes  # the columns-present bitmap (of the before image, for an update)
    second: bytes | None  # an update's after image's columns-present bitmap
    body: bytes


@dataclass(slots=True)
class TableMap:
    """A TABLE_MAP event as ``table_map`` read it: its table id, its end and its body
    (everything after the event header, up to the checksum: table id, flags, names,
    column types and metadata, null bitmap, optional metadata)."""

    table_id: int
    log_pos: int
    body: bytes


def table_map(data: bytes, checksum: bool, post_header: Sequence[int] | None) -> TableMap | None:
    """``data`` (a dump packet's payload) as a TABLE_MAP event, or None (also for a
    post-header length other than 8: a table id of 6 bytes, then 2 of flags)."""
    event_type = BINLOG.TABLE_MAP_EVENT
    if len(data) < _HEADER_END + 8 or data[0] != 0 or data[5] != event_type:
        return None
    if (post_header and 0 <= event_type - 1 < len(post_header)
            and post_header[event_type - 1] != 8):
        return None
    _, _, _, _, size, log_pos, _ = _HEADER.unpack_from(data, 0)
    end = 1 + size - (4 if checksum else 0)
    if size < 19 or end > len(data) or end < _HEADER_END + 8:
        return None
    table_id = int.from_bytes(data[_HEADER_END:_HEADER_END + 6], "little")
    return TableMap(table_id, log_pos, data[_HEADER_END:end])


@dataclass(slots=True)
class Xid:
    """An XID event (a transaction's commit) as ``boundary`` read it."""

    timestamp: int
    log_pos: int


@dataclass(slots=True)
class MariaGtid:
    """A MariaDB GTID event (a transaction's start) as ``boundary`` read it: the fields
    ``MySqlLogSource`` takes from the library's ``MariadbGtidEvent``."""

    timestamp: int
    log_pos: int
    event_size: int
    gtid: str  # domain-server-sequence
    flags: int


_GTID_BODY = struct.Struct("<QIB")  # sequence number, domain id, flags


def boundary(data: bytes, checksum: bool) -> Xid | MariaGtid | None:
    """``data`` (a dump packet's payload) as an XID or a MariaDB GTID event, with the
    values the library reads from it; None for any other packet or a short one."""
    if len(data) < _HEADER_END or data[0] != 0:
        return None
    _, timestamp, event_type, server_id, size, log_pos, _ = _HEADER.unpack_from(data, 0)
    end = 1 + size - (4 if checksum else 0)
    if size < 19 or end > len(data):
        return None
    if event_type == BINLOG.XID_EVENT:
        return Xid(timestamp, log_pos) if end >= _HEADER_END + 8 else None
    if event_type == BINLOG.MARIADB_GTID_EVENT and end >= _HEADER_END + _GTID_BODY.size:
        seq, domain, flags = _GTID_BODY.unpack_from(data, _HEADER_END)
        return MariaGtid(timestamp, log_pos, size, f"{domain}-{server_id}-{seq}", flags)
    return None


def parse(data: bytes, checksum: bool, post_header: Sequence[int] | None) -> RawRows | None:
    """``data`` (a dump packet's payload) as a rows event, or None (module docstring)."""
    if len(data) < _HEADER_END + 9 or data[0] != 0:
        return None
    _, timestamp, event_type, _, size, log_pos, _ = _HEADER.unpack_from(data, 0)
    kind = KINDS.get(event_type)
    if kind is None:
        return None
    v2 = event_type in _V2
    known = 10 if v2 else 8
    if (post_header and 0 <= event_type - 1 < len(post_header)
            and post_header[event_type - 1] != known):
        return None
    end = 1 + size - (4 if checksum else 0)  # the body ends before the checksum
    if size < 19 or end > len(data):
        return None
    table_id = int.from_bytes(data[_HEADER_END:_HEADER_END + 6], "little")
    off = _HEADER_END + 8  # the table id, then 2 bytes of flags
    if v2:
        if data[off] | (data[off + 1] << 8) != 2:  # extra data: the library's reading
            return None
        off += 2
    count, off = _length_coded(data, off, end)
    if count is None:
        return None
    width = (count + 7) // 8
    first = data[off:off + width]
    off += width
    second = None
    if kind == 1:
        second = data[off:off + width]
        off += width
    if off > end:
        return None
    return RawRows(timestamp, event_type, log_pos, table_id, kind, first, second,
                   data[off:end])


def _length_coded(data: bytes, off: int, end: int) -> tuple[int | None, int]:
    """A length-coded integer at ``off`` and the offset after it; None where it is the
    NULL marker, the 8-byte form or runs past ``end``."""
    if off >= end:
        return None, off
    first = data[off]
    if first < 251:
        return first, off + 1
    width = {252: 2, 253: 3}.get(first)  # (the library cannot read the 8-byte form)
    if width is None or off + 1 + width > end:
        return None, off
    return int.from_bytes(data[off + 1:off + 1 + width], "little"), off + 1 + width
