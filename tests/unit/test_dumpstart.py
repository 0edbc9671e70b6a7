"""The GTID dump packet rewrite and the checkpoint record of ``sources.mysql.dumpstart``
(no server; the server side is tests/mysql/test_dump_start.py)."""

from __future__ import annotations

import struct

import pytest

from pydblog.sources.mysql.dumpstart import DumpStart, from_record, record, with_start


def library_packet(server_id: int, data: bytes) -> bytes:
    """COM_BINLOG_DUMP_GTID as mysql-replication 1.0 writes it (empty name, position 4;
    its length field undercounts the body by four bytes, which the server tolerates)."""
    prelude = struct.pack("<i", 22 + len(data)) + bytes([0x1E])
    prelude += struct.pack("<H", 0x04) + struct.pack("<I", server_id)
    prelude += struct.pack("<I", 3) + b"\0\0\0" + struct.pack("<Q", 4)
    return prelude + struct.pack("<I", len(data)) + data


def parse(packet: bytes) -> tuple[int, int, bytes, int, bytes]:
    length = int.from_bytes(packet[:3], "little")
    assert packet[3] == 0 and len(packet) == 4 + length and packet[4] == 0x1E
    flags, server_id, name_len = struct.unpack_from("<HII", packet, 5)
    name = packet[15:15 + name_len]
    (pos,) = struct.unpack_from("<Q", packet, 15 + name_len)
    (size,) = struct.unpack_from("<I", packet, 23 + name_len)
    data = packet[27 + name_len:]
    assert size == len(data)
    return flags, server_id, name, pos, data


def test_with_start_keeps_everything_but_the_start() -> None:
    data = b"\x01" + bytes(range(40))
    out = with_start(library_packet(4242, data), "mysql-bin.000123", 987654321)
    assert parse(out) == (0x04, 4242, b"mysql-bin.000123", 987654321, data)
    with pytest.raises(ValueError):
        with_start(b"\x05\0\0\0\x12" + bytes(30), "f", 4)  # not a GTID dump


def test_the_record_allows_only_its_epoch_and_a_transaction() -> None:
    uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
    rec = record(3, uuid)
    assert from_record(rec, 3, "b.000002", 880, f"{uuid}:7") == DumpStart(
        "b.000002", 880, f"{uuid}:7", uuid
    )
    assert from_record(rec, 2, "b.000002", 880, f"{uuid}:7") is None  # another epoch
    assert from_record(rec, 3, "b.000002", 880, None) is None  # between transactions
    assert from_record(None, 3, "b.000002", 880, f"{uuid}:7") is None  # older checkpoint
    assert from_record({"epoch": 3}, 3, "b.000002", 880, f"{uuid}:7") is None
