"""What a MySQL/MariaDB server says about its binlog and GTIDs, as the binlog source
needs it: the binlog's end, the GTID state at a place in it, whether the server holds a
checkpoint's transactions, and why it refuses a GTID dump.

Every function takes a cursor on the control connection (never the dump's) and
``server``, the server's redacted DSN for messages; none keeps state.
"""

from __future__ import annotations

import time
from typing import Any

import pymysql

from pydblog.errors import SourceError
from pydblog.sources.mysql.connect import (
    ER_MASTER_FATAL_READING_BINLOG,
    ER_PARSE_ERROR,
    MySqlDsn,
    classify,
    errno,
)
from pydblog.sources.mysql.dumpstart import DumpStart
from pydblog.sources.mysql.fences import parse_owned
from pydblog.sources.mysql.gtid import GtidState, MariaGtidPos, MySqlGtidSet
from pydblog.sources.mysql.position import BinlogPosition, file_sequence
from pydblog.sources.mysql.tablemap import mysql_state_at

SETTLE_S = 1.0
"""Longest a fresh MySQL start waits for the GTIDs being committed to be executed."""


def master_status(cur: Any, server: str) -> tuple[str, int, str]:
    """``(file, offset, Executed_Gtid_Set)`` (MySQL's GTID set, ``""`` on MariaDB)."""
    try:
        cur.execute("SHOW MASTER STATUS")
    except pymysql.Error as exc:  # MySQL 8.4 renamed it
        if errno(exc) != ER_PARSE_ERROR:
            raise
        cur.execute("SHOW BINARY LOG STATUS")
    row = cur.fetchone()
    if row is None:
        raise SourceError(
            f"MySQL at {server} has no binary log", hint="start the server with --log-bin"
        )
    executed = str(row[4]) if len(row) > 4 and row[4] is not None else ""
    return str(row[0]), int(row[1]), executed


def gtid_mode(cur: Any) -> str:
    """MySQL's ``@@GLOBAL.gtid_mode`` (``"unknown"`` if it has none)."""
    cur.execute("SELECT @@GLOBAL.gtid_mode")
    row = cur.fetchone()
    return str(row[0]) if row else "unknown"


def empty_state(mariadb: bool) -> GtidState:
    return MariaGtidPos() if mariadb else MySqlGtidSet()


def own_flavour(state: GtidState | None, mariadb: bool, server: str) -> GtidState | None:
    """A checkpoint's state in this server's flavour (an empty one reads back as
    MariaDB's); a state of the other flavour is an error."""
    if state is None:
        return None
    empty = empty_state(mariadb)
    if not state:
        return empty
    if state.flavour != empty.flavour:
        raise SourceError(
            f"the change log's GTID state {state} is a {state.flavour} state, but "
            f"{server} is {empty.flavour}",
            hint="point [source] dsn at the server this log was captured from (or a "
            "replica of it), or start with a fresh [log] path and snapshot the tables",
        )
    return state


def state_at(cur: Any, mariadb: bool, file: str, offset: int) -> GtidState | None:
    """The GTID state at ``(file, offset)``, an event-group boundary (None where it
    cannot be known). MariaDB computes it from its binlog (``BINLOG_GTID_POS``). MySQL
    has no such function: the file's ``Previous_gtids`` plus the GTIDs of the groups
    before ``offset`` (``mysql_state_at``). (Not ``SHOW MASTER STATUS``'s
    ``Executed_Gtid_Set``: MySQL reads it a moment before the file and offset, and a
    transaction committing in between would be missing from the state for good.)"""
    if not mariadb:
        return mysql_state_at(cur, file, offset)
    cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, offset))
    row = cur.fetchone()
    if row is None or row[0] is None:
        return None
    return MariaGtidPos.parse(str(row[0]))


def settled_executed(cur: Any, file: str, offset: int) -> tuple[MySqlGtidSet | None, DumpStart | None]:
    """MySQL fresh start: ``(gtid_executed, where its dump may start)``, the set read
    (again, for up to ``SETTLE_S``) until it holds every GTID owned after the binlog's
    end ``(file, offset)`` was read. A transaction written before that end was then
    owned or executed, and stays in the set once executed, so the set holds every
    transaction before ``offset``: a dump from ``offset`` asking for the transactions
    not in it sends exactly what the server would find itself
    (``sources.mysql.dumpstart``). Not settled in time: no start (the server finds the
    place). ``(None, None)`` while the set is empty (a dump cannot ask for
    "everything")."""
    deadline = time.monotonic() + SETTLE_S
    cur.execute("SELECT @@GLOBAL.server_uuid, @@GLOBAL.gtid_owned")
    uuid, owned_text = cur.fetchone()
    owned = parse_owned(str(owned_text or ""))
    while True:
        cur.execute("SELECT @@GLOBAL.gtid_executed")
        executed = MySqlGtidSet.parse(str(cur.fetchone()[0] or ""))
        if owned <= executed or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    if not executed:
        return None, None
    if not owned <= executed:
        return executed, None
    return executed, DumpStart(file, offset, None, str(uuid).lower())


def holds_through(cur: Any, pos: BinlogPosition) -> GtidState | None:
    """The state after ``pos``'s transaction if the server has NOT executed all of it
    (else None). The server must hold every transaction the change log holds, up to and
    including the checkpoint's own (which is read again): MySQL would otherwise send
    "every transaction not in the state" and skip whatever the server applies later that
    the state names (a replica behind, or one promoted without them); and the resumed
    transaction must come, or Heartbeats stay held back."""
    after = pos.after_state()
    if after is None:
        return None
    if isinstance(after, MySqlGtidSet):
        cur.execute("SELECT @@GLOBAL.gtid_executed")
        row = cur.fetchone()
        ok = after <= MySqlGtidSet.parse(str(row[0] or "") if row else "")
    else:
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        row = cur.fetchone()
        have = MariaGtidPos.parse(str(row[0] or "") if row else "")
        ok = pos.gtid is None or have.covers(pos.gtid)
    return None if ok else after


def require_file(cur: Any, pos: BinlogPosition, server: str) -> None:
    """A file resume needs ``pos.file`` on the server."""
    cur.execute("SHOW BINARY LOGS")
    names = {str(r[0]) for r in cur.fetchall()}
    if pos.file not in names:
        gtid = f" (GTID {pos.gtid})" if pos.gtid else ""
        raise SourceError(
            f"binlog file {pos.file} holding the last logged position {pos}{gtid} is no "
            f"longer on the server at {server}: changes after it are lost",
            hint="keep binlogs longer (binlog_expire_logs_seconds / expire_logs_days); "
            "start with a fresh [log] path and snapshot the tables again",
        )


def diagnose_state(cur: Any, state: GtidState) -> str:
    """Why the server may refuse a GTID dump after ``state`` (behind it, or purged), as
    a parenthesis for the message; ``""`` when its GTID variables do not tell."""
    if isinstance(state, MariaGtidPos):
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        have = MariaGtidPos.parse(str(cur.fetchone()[0] or ""))
        cur.execute("SHOW BINARY LOGS")
        first = str(cur.fetchone()[0])
        cur.execute("SELECT BINLOG_GTID_POS(%s, 4)", (first,))
        oldest = MariaGtidPos.parse(str(cur.fetchone()[0] or ""))
        for d, _, n in state.domains:
            theirs = have.seq(d)
            if theirs is None or theirs < n:
                return f" (the server is behind it: its binlog ends at {have})"
            start = oldest.seq(d)
            if start is not None and start > n:
                return f" (purged: the server's oldest binlog {first} starts at {oldest})"
        return ""
    cur.execute("SELECT @@GLOBAL.gtid_executed, @@GLOBAL.gtid_purged")
    executed, purged = (MySqlGtidSet.parse(str(v or "")) for v in cur.fetchone())
    if not state <= executed:
        return f" (the server is behind it: it has executed {executed})"
    if not purged <= state:
        return f" (purged: the server has purged {purged})"
    return ""


def gtid_dump_error(server: str, state: GtidState, message: str, why: str) -> SourceError:
    """The server refused to send the transactions after ``state`` (``why``: from
    ``diagnose_state``): say so, and what to do."""
    return SourceError(
        f"MySQL at {server} cannot send the binlog after GTID state {state}{why}: {message}",
        hint="if this server is a replica that has not applied these transactions yet, "
        "wait until it has caught up and start again; if the binlogs holding them were "
        "purged (or this server never had them), changes after them are lost: start "
        "with a fresh [log] path and snapshot the tables again",
    )


def dump_error(exc: pymysql.Error, dsn: MySqlDsn, file: str, offset: int) -> SourceError:
    """A binlog dump from ``file:offset`` failed with ``exc`` (not a GTID dump's refusal)."""
    if errno(exc) == ER_MASTER_FATAL_READING_BINLOG:
        return SourceError(
            f"MySQL at {dsn.redacted} cannot send the binlog from "
            f"{file}:{offset}: {exc.args[1] if len(exc.args) > 1 else exc}",
            hint="the binlog may have been purged; start with a fresh [log] path and "
            "snapshot the tables again",
        )
    return classify(exc, dsn, "reading the binlog")


def binlog_sizes(cur: Any) -> list[tuple[str, int]]:
    """``SHOW BINARY LOGS``: ``(file, size)`` in order."""
    cur.execute("SHOW BINARY LOGS")
    return [(str(r[0]), int(r[1])) for r in cur.fetchall()]


def bytes_after(logs: list[tuple[str, int]], file: str, offset: int) -> int:
    """Bytes of binlog after ``(file, offset)``, summed over the files of ``logs``
    (``binlog_sizes``)."""
    here = file_sequence(file)
    lag = 0
    for name, size in logs:
        seq = file_sequence(name)
        if seq == here:
            lag += max(0, size - offset)
        elif seq > here:
            lag += size
    return lag
