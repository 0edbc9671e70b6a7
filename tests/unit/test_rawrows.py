"""``rawrows.parse`` against mysql-replication's own reading of the same packet: on
arbitrary packets (rows events of every kind and version, other events, odd post-header
lengths, V2 extra data, every length-coded column count form, truncated events), where
``parse`` gives a ``RawRows`` the library builds a rows event with the same fields and
the same body; and it does give one for every well-formed V1/V2 rows event. The same
for ``table_map`` and ``boundary`` (GTID and XID events)."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pymysql.connections import MysqlPacket
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import MariadbGtidEvent, XidEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    RowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)
from pymysqlreplication.table import Table

from pydblog.sources.mysql import rawrows

ROWS = [BINLOG.WRITE_ROWS_EVENT_V1, BINLOG.UPDATE_ROWS_EVENT_V1, BINLOG.DELETE_ROWS_EVENT_V1,
        BINLOG.WRITE_ROWS_EVENT_V2, BINLOG.UPDATE_ROWS_EVENT_V2, BINLOG.DELETE_ROWS_EVENT_V2]
V2 = {BINLOG.WRITE_ROWS_EVENT_V2, BINLOG.UPDATE_ROWS_EVENT_V2, BINLOG.DELETE_ROWS_EVENT_V2}
OTHERS = [BINLOG.QUERY_EVENT, BINLOG.XID_EVENT, BINLOG.TABLE_MAP_EVENT,
          BINLOG.PARTIAL_UPDATE_ROWS_EVENT, BINLOG.HEARTBEAT_LOG_EVENT, 0xA0, 0xA6]
CLASSES = {0: WriteRowsEvent, 1: UpdateRowsEvent, 2: DeleteRowsEvent}


def length_coded(n: int, form: int) -> bytes:
    if form == 0 and n < 251:
        return bytes([n])
    if form <= 1 and n < 1 << 16:
        return b"\xfc" + n.to_bytes(2, "little")
    if form <= 2:
        return b"\xfd" + n.to_bytes(3, "little")
    return b"\xfe" + n.to_bytes(8, "little")  # (the library cannot read it)


@st.composite
def packets(draw: Any) -> tuple[bytes, bool, list[int] | None, int, bool]:
    """(payload, checksum, post-header lengths, table id, well-formed rows event)."""
    well_formed = draw(st.booleans())
    event_type = draw(st.sampled_from(ROWS if well_formed else ROWS + OTHERS))
    checksum = draw(st.booleans())
    v2 = event_type in V2
    known = 10 if v2 else 8
    post_header: list[int] | None = None
    if draw(st.booleans()):
        post_header = [19] * draw(st.sampled_from([40, 200]))
        if event_type <= len(post_header):
            post_header[event_type - 1] = known if well_formed else draw(
                st.sampled_from([known, known + 2, known - 2]))
    table_id = draw(st.integers(0, (1 << 48) - 1))
    post = table_id.to_bytes(6, "little") + struct.pack("<H", draw(st.integers(0, 0xFFFF)))
    if v2:
        extra = b"" if well_formed else draw(st.sampled_from(
            [b"", b"\x00\x04\x01", b"\x01\x05\x00", b"\x02\x09\x00\x00"]))
        post += struct.pack("<H", 2 + len(extra)) + extra
    columns = draw(st.integers(0, 300))
    form = draw(st.integers(0, 2 if well_formed else 3))
    width = (columns + 7) // 8
    body = length_coded(columns, form) + draw(st.binary(min_size=width, max_size=width))
    if event_type in (BINLOG.UPDATE_ROWS_EVENT_V1, BINLOG.UPDATE_ROWS_EVENT_V2):
        body += draw(st.binary(min_size=width, max_size=width))
    body += draw(st.binary(max_size=200))
    event = post + body + (draw(st.binary(min_size=4, max_size=4)) if checksum else b"")
    size = 19 + len(event)
    if not well_formed and draw(st.booleans()):
        event = event[:draw(st.integers(0, len(event)))]  # truncated, or a lying size
    header = struct.pack("<IBIIIH", draw(st.integers(0, 2**32 - 1)), event_type,
                         draw(st.integers(0, 2**32 - 1)), size, draw(st.integers(0, 2**32 - 1)),
                         draw(st.integers(0, 0xFFFF)))
    return b"\x00" + header + event, checksum, post_header, table_id, well_formed


def library_event(data: bytes, checksum: bool, post_header: list[int] | None,
                  table_id: int) -> Any:
    table = Table(table_id, "db", "t", [], primary_key="")
    ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mariadb")
    allowed = frozenset({WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent})
    wrapper = BinLogPacketWrapper(
        MysqlPacket(data, "utf8"), {table_id: table}, ctl, (10, 11, 0), checksum, allowed,
        None, None, None, None, False, False, False, False, False, False, post_header,
    )
    return wrapper.event


@settings(max_examples=600, deadline=None)
@given(packets())
def test_parse_reads_what_the_library_reads(case: tuple[bytes, bool, list[int] | None, int, bool]
                                            ) -> None:
    data, checksum, post_header, table_id, well_formed = case
    raw = rawrows.parse(data, checksum, post_header)
    if well_formed:
        assert raw is not None
    if raw is None:
        return
    event = library_event(data, checksum, post_header, table_id)
    assert isinstance(event, RowsEvent)
    assert type(event) is CLASSES[raw.kind]
    assert (raw.timestamp, raw.event_type, raw.log_pos, raw.table_id) == (
        event.timestamp, event.event_type, event.packet.log_pos, event.table_id)
    assert raw.first == event.columns_present_bitmap
    assert raw.second == getattr(event, "columns_present_bitmap2", None)
    assert raw.body == event.packet.read(event.event_size - event.packet.read_bytes)


def test_other_packets_are_left_to_the_library() -> None:
    header = struct.pack("<IBIIIH", 1, BINLOG.XID_EVENT, 1, 19 + 12, 100, 0)
    assert rawrows.parse(b"\x00" + header + b"\x00" * 12, True, None) is None
    assert rawrows.parse(b"\xfe\x00\x00\x02\x00", False, None) is None  # EOF
    assert rawrows.parse(b"", False, None) is None


@settings(max_examples=200, deadline=None)
@given(table_id=st.integers(0, (1 << 48) - 1), rest=st.binary(max_size=120),
       checksum=st.booleans(), log_pos=st.integers(0, 2**32 - 1))
def test_table_map_reads_the_table_id_and_body(table_id: int, rest: bytes, checksum: bool,
                                                log_pos: int) -> None:
    body = table_id.to_bytes(6, "little") + b"\x01\x00" + rest
    event = body + (b"\xaa\xbb\xcc\xdd" if checksum else b"")
    header = struct.pack("<IBIIIH", 7, BINLOG.TABLE_MAP_EVENT, 1, 19 + len(event), log_pos, 0)
    found = rawrows.table_map(b"\x00" + header + event, checksum, None)
    assert found is not None
    lengths = [19] * 40
    assert rawrows.table_map(b"\x00" + header + event, checksum, lengths) is None
    lengths[BINLOG.TABLE_MAP_EVENT - 1] = 8
    assert rawrows.table_map(b"\x00" + header + event, checksum, lengths) == found
    assert (found.table_id, found.log_pos, found.body) == (table_id, log_pos, body)
    assert rawrows.parse(b"\x00" + header + event, checksum, None) is None
    other = struct.pack("<IBIIIH", 7, BINLOG.WRITE_ROWS_EVENT_V1, 1, 19 + len(event), log_pos, 0)
    assert rawrows.table_map(b"\x00" + other + event, checksum, None) is None


@settings(max_examples=300, deadline=None)
@given(event_type=st.sampled_from([BINLOG.XID_EVENT, BINLOG.MARIADB_GTID_EVENT,
                                   BINLOG.QUERY_EVENT, BINLOG.GTID_LOG_EVENT]),
       body=st.binary(min_size=0, max_size=40), checksum=st.booleans(),
       timestamp=st.integers(0, 2**32 - 1), server_id=st.integers(0, 2**32 - 1),
       log_pos=st.integers(0, 2**32 - 1))
def test_boundary_reads_what_the_library_reads(event_type: int, body: bytes, checksum: bool,
                                               timestamp: int, server_id: int,
                                               log_pos: int) -> None:
    event = body + (b"\x01\x02\x03\x04" if checksum else b"")
    header = struct.pack("<IBIIIH", timestamp, event_type, server_id, 19 + len(event),
                         log_pos, 0)
    data = b"\x00" + header + event
    found = rawrows.boundary(data, checksum)
    well_formed = len(body) >= {BINLOG.XID_EVENT: 8, BINLOG.MARIADB_GTID_EVENT: 13}.get(
        event_type, 1 << 30)
    assert (found is not None) == well_formed
    if found is None:
        return
    ctl = SimpleNamespace(charset="utf8mb4", _get_dbms=lambda: "mariadb")
    allowed = frozenset({XidEvent, MariadbGtidEvent})
    library = BinLogPacketWrapper(
        MysqlPacket(data, "utf8"), {}, ctl, (10, 11, 0), checksum, allowed,
        None, None, None, None, False, False, False, False, False, False, None,
    )
    assert (found.timestamp, found.log_pos) == (library.timestamp, library.log_pos)
    if isinstance(found, rawrows.MariaGtid):
        assert isinstance(library.event, MariadbGtidEvent)
        assert (found.gtid, found.flags, found.event_size) == (
            library.event.gtid, library.event.flags, library.event_size)
    else:
        assert isinstance(library.event, XidEvent)
