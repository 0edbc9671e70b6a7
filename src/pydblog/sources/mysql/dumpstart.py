"""A MySQL GTID resume that starts reading at known binlog coordinates.

A MySQL GTID dump (COM_BINLOG_DUMP_GTID) with an empty file name makes the server find
the first binlog file not wholly in the requested GTID set and read it from its start,
skipping every transaction in the set: MySQL 5.7 skips ~4,000 small transactions a second
(docs/performance.md), so a restart late in a large binlog file waits for
seconds to minutes. The same command also takes a file name and an offset: the server
then starts reading there, still skipping transactions in the set.

Exactness: such a dump sends every transaction at or after ``(file, offset)`` that is not
in the set, and nothing before. So it sends exactly what the plain dump would iff every
transaction before ``(file, offset)`` in this server's binlog is in the set. That holds
for a checkpoint position ``p`` (``p.file``, ``p.pos`` = the start of ``p``'s transaction,
``p.gtids`` = the state before it) when ``p``'s coordinates are this server's: the dump
that delivered ``p`` ran on this server and sent every transaction of its binlog not in
its starting set, in binlog order, so everything before ``p`` is in that starting set or
was delivered (and so is in ``p.gtids``). ``MySqlLogSource`` therefore records, for each
epoch, the ``server_uuid`` of the server its dump read (``DUMP_SERVER_KEY`` in the
checkpoint's ``extra``), and uses the coordinates only when

- the checkpoint's position is of the recorded epoch and has a GTID, and
- on the dump's own connection (not a second one, which a moved address could send
  elsewhere): ``@@server_uuid`` is the recorded one, and the event at ``(file,
  offset)`` is the ``Gtid`` event of the position's GTID (a reset or rewritten binlog
  fails this);

otherwise it sends the plain GTID dump. Either way the positions yielded are of a new
epoch, and ``position.py``'s resume rule (drop the resumed transaction's logged part)
is unchanged. MariaDB is not concerned (its GTID dump starts from the state alone).
"""

from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass
from typing import Any

import pymysql

from pydblog.sources.mysql.connect import Connection, StreamConnection

DUMP_SERVER_KEY = "mysql_dump_server"
"""Checkpoint ``extra`` key: ``{"epoch": e, "server_uuid": u}``, positions of epoch ``e``
are coordinates in the binlog of server ``u``."""

COM_BINLOG_DUMP_GTID = 0x1E
_GTID_NEXT = re.compile(r"GTID_NEXT\s*=\s*'([^']+)'", re.IGNORECASE)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DumpStart:
    """Where a GTID dump may start: ``(file, offset)`` holding transaction ``gtid``, in
    the binlog of server ``server_uuid``; ``gtid`` None: the binlog's end as that server
    reported it a moment ago (a fresh start, ``MySqlLogSource._settled_executed``)."""

    file: str
    offset: int
    gtid: str | None
    server_uuid: str


def record(epoch: int, server_uuid: str) -> dict[str, Any]:
    return {"epoch": epoch, "server_uuid": server_uuid}


def from_record(raw: Any, epoch: int, file: str, offset: int, gtid: str | None) -> DumpStart | None:
    """The ``DumpStart`` a checkpoint's record allows for its position, or None."""
    if not gtid or not isinstance(raw, dict) or raw.get("epoch") != epoch:
        return None
    uuid = raw.get("server_uuid")
    if not isinstance(uuid, str) or not uuid:
        return None
    return DumpStart(file, offset, gtid, uuid)


def server_uuid(conn: Any) -> str:
    with conn.cursor() as cur:
        cur.execute("SELECT @@GLOBAL.server_uuid")
        return str(cur.fetchone()[0]).lower()


def holds(conn: Any, start: DumpStart) -> bool:
    """Whether ``(start.file, start.offset)`` on this connection's server is the start
    of transaction ``start.gtid`` (a ``Gtid`` event there); a binlog end just read (no
    ``gtid``) holds on its server."""
    if start.gtid is None:
        return True
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"SHOW BINLOG EVENTS IN %s FROM {int(start.offset)} LIMIT 1", (start.file,)
            )
            row = cur.fetchone()
    except pymysql.Error as exc:  # no such file, not an event boundary, ...
        log.debug("binlog coordinates %s:%s not usable: %s", start.file, start.offset, exc)
        return False
    if row is None or str(row[2]) != "Gtid":
        return False
    found = _GTID_NEXT.search(str(row[5] or ""))
    return found is not None and found.group(1).lower() == start.gtid.lower()


def with_start(packet: bytes, file: str, offset: int) -> bytes:
    """A COM_BINLOG_DUMP_GTID packet (as mysql-replication writes it: length, sequence
    0, command, flags, server id, name length, name, position, data length, data) with
    ``file`` and ``offset`` as its start."""
    if len(packet) < 30 or packet[4] != COM_BINLOG_DUMP_GTID:
        raise ValueError("not a COM_BINLOG_DUMP_GTID packet")
    flags_and_id = packet[5:11]
    (name_len,) = struct.unpack_from("<I", packet, 11)
    rest = 15 + name_len + 8  # after name and position: data length, data
    data = packet[rest:]
    name = file.encode()
    body = (
        bytes([COM_BINLOG_DUMP_GTID]) + flags_and_id + struct.pack("<I", len(name)) + name
        + struct.pack("<Q", offset) + data
    )
    if len(body) >= 1 << 24:
        raise ValueError("GTID dump packet too large")
    return struct.pack("<I", len(body))[:3] + b"\x00" + body


class DumpConnection(StreamConnection):
    """The binlog dump's connection: writes the GTID dump command with ``start``'s
    coordinates when ``start`` is set (checked on this connection first)."""

    start: DumpStart | None = None

    def _write_bytes(self, data: bytes) -> None:
        start = self.start
        if start is not None and len(data) > 4 and data[4] == COM_BINLOG_DUMP_GTID:
            data = with_start(data, start.file, start.offset)
        super()._write_bytes(data)


class Reconnect(Exception):
    """The library tried to reconnect by itself (from a position we do not trust)."""


class OneConnection:
    """``pymysql_wrapper`` for one ``BinLogStreamReader``: one stream and one control
    connection, never a silent second one (``Reconnect``). MySQL (``mysql``): the stream
    connection learns its server's ``server_uuid`` and, if ``start`` holds there, starts
    the GTID dump at its coordinates."""

    def __init__(self, *, mysql: bool = False, start: DumpStart | None = None) -> None:
        self.opened: set[str] = set()
        self.mysql = mysql
        self.start = start
        self.server_uuid: str | None = None
        self.started_at: DumpStart | None = None
        self.connection_id: int | None = None  # the stream's server connection id

    def __call__(self, **kwargs: Any) -> Any:
        # The library names some arguments the old way; pymysql warns about those.
        for old, new in (("db", "database"), ("passwd", "password")):
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
        role = "ctl" if kwargs.get("database") == "information_schema" else "stream"
        if role in self.opened:
            raise Reconnect(role)
        self.opened.add(role)
        if role == "ctl":
            return Connection(**kwargs)
        if not self.mysql:
            conn = StreamConnection(**kwargs)
            self.connection_id = conn.thread_id()
            return conn
        conn = DumpConnection(**kwargs)
        self.connection_id = conn.thread_id()
        try:
            self.server_uuid = server_uuid(conn)
            start = self.start
            if start is not None and start.server_uuid == self.server_uuid and holds(conn, start):
                conn.start = self.started_at = start
        except BaseException:
            conn.close()
            raise
        return conn
