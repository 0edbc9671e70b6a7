"""The IO of a read-only chunk on MySQL/MariaDB: open the consistent-snapshot
transaction with its GTID fence (``sources.mysql.fences`` says why each step is where
it is), and MariaDB's GTID state at a binlog position.

Invariants:
- ``open_fenced`` leaves the connection inside one ``REPEATABLE READ`` ``READ ONLY``
  transaction whose read view was created by ``START TRANSACTION WITH CONSISTENT
  SNAPSHOT``; every SELECT of the chunk must run in it, and the caller ends it
  (ROLLBACK). Nothing here writes (``SET TRANSACTION`` only sets the next transaction's
  isolation level on this session).
- ``BinlogStates.at(file, pos)`` is the GTID state after every event group that ends at
  or before ``pos`` in ``file`` (``pos`` is an event-group boundary). It reads the binlog
  written since the previous lookup in the same file only (``SHOW BINLOG EVENTS``), so
  the cost per chunk follows the write load, not the binlog file's size; the first
  lookup in a file asks the server (``BINLOG_GTID_POS``, which reads the file from its
  start).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydblog.errors import SourceError
from pydblog.sources.mysql.fences import GtidFence, parse_owned, union
from pydblog.sources.mysql.gtid import MariaGtidPos, MySqlGtidSet

_MARIA_GTID = re.compile(r"GTID (\d+-\d+-\d+)")
PAGE = 2000

GTID_MODE_HINT = (
    "set gtid_mode = ON and enforce_gtid_consistency = ON on the server (in its config; "
    "online: SET GLOBAL enforce_gtid_consistency = ON, then gtid_mode = OFF_PERMISSIVE, "
    'ON_PERMISSIVE, ON; see docs/mysql.md), or use [snapshot] watermark = "table"'
)


def gtid_mode_error(where: str, mode: str) -> SourceError:
    return SourceError(
        f'[snapshot] watermark = "read-only" needs GTIDs on MySQL: gtid_mode is {mode} on '
        f"{where} (read-only chunks are fenced by GTID sets)",
        hint=GTID_MODE_HINT,
    )


@dataclass(frozen=True, slots=True)
class MariaSnapshot:
    """A MariaDB read's snapshot position; the fence follows from the binlog there."""

    file: str
    pos: int


def _begin(cur: Any) -> None:
    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")


def open_fenced(cur: Any, mariadb: bool, where: str) -> GtidFence | MariaSnapshot:
    """Open the chunk's transaction (see the module docstring). MySQL: returns its fence
    (``low`` read before the read view is created, ``high`` after). MariaDB: returns
    the snapshot's binlog position (``BinlogStates.at`` turns it into the fence once the
    chunk is read, outside the transaction)."""
    if mariadb:
        _begin(cur)
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
        file, pos = status.get("binlog_snapshot_file", ""), status.get("binlog_snapshot_position")
        if not file or pos is None:
            raise SourceError(
                f"MariaDB at {where} reports no binlog position for a consistent snapshot "
                "(Binlog_snapshot_file is empty)",
                hint="start the server with --log-bin",
            )
        return MariaSnapshot(file, int(pos))
    cur.execute("SELECT @@GLOBAL.gtid_mode, @@GLOBAL.gtid_executed")
    mode, executed = cur.fetchone()
    if str(mode).upper() != "ON":
        raise gtid_mode_error(where, str(mode))
    low = MySqlGtidSet.parse(str(executed or ""))
    _begin(cur)
    # gtid_owned strictly before gtid_executed (see fences.py).
    cur.execute("SELECT @@GLOBAL.gtid_owned")
    owned = parse_owned(str(cur.fetchone()[0] or ""))
    cur.execute("SELECT @@GLOBAL.gtid_executed")
    high = union(owned, MySqlGtidSet.parse(str(cur.fetchone()[0] or "")))
    return GtidFence(low, high)


class BinlogStates:
    """MariaDB: GTID states at binlog positions (see the module docstring). One per
    connection user; not thread-safe."""

    def __init__(self) -> None:
        self._last: tuple[str, int, MariaGtidPos] | None = None

    def at(self, cur: Any, file: str, pos: int) -> MariaGtidPos:
        last = self._last
        if last is not None and last[0] == file and last[1] <= pos:
            state = self._scan(cur, file, last[1], pos, last[2])
        else:
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, pos))
            row = cur.fetchone()
            if row is None or row[0] is None:
                raise SourceError(
                    f"MariaDB cannot tell the GTID state at {file}:{pos} (BINLOG_GTID_POS "
                    "returned NULL: the binlog file is gone or the position is not a "
                    "transaction boundary)"
                )
            state = MariaGtidPos.parse(str(row[0]))
        self._last = (file, pos, state)
        return state

    @staticmethod
    def _scan(cur: Any, file: str, start: int, end: int, state: MariaGtidPos) -> MariaGtidPos:
        at = start
        while at < end:
            cur.execute(f"SHOW BINLOG EVENTS IN %s FROM {int(at)} LIMIT {PAGE}", (file,))
            rows = cur.fetchall()
            for _log, begins, kind, _server, ends, info in rows:
                if int(begins) >= end:
                    return state
                if str(kind) == "Gtid":
                    found = _MARIA_GTID.search(str(info or ""))
                    if found is None:
                        raise SourceError(f"cannot read the GTID of {file}:{begins}: {info!r}")
                    state = state.advance(found.group(1))
                at = int(ends)
            if len(rows) < PAGE:
                break
        return state


def maria_fence(cur: Any, states: BinlogStates, snapshot: MariaSnapshot) -> GtidFence:
    state = states.at(cur, snapshot.file, snapshot.pos)
    return GtidFence(state, state)
