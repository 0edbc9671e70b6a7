"""The IO of a read-only chunk on MySQL/MariaDB: open the consistent-snapshot
transaction with its GTID fence (``sources.mysql.fences`` says why each step is where
it is).

Invariant: ``open_fenced`` leaves the connection inside one ``REPEATABLE READ``
``READ ONLY`` transaction whose read view was created by ``START TRANSACTION WITH
CONSISTENT SNAPSHOT``; every SELECT of the chunk must run in it, and the caller ends it
(ROLLBACK). Nothing here writes (``SET TRANSACTION`` only sets the next transaction's
isolation level on this session). Every statement is a variable or status read: no
binlog is scanned, so a chunk's fence costs a few round trips whatever the write load.

**On a replica** (``[snapshot] read_dsn``; ``local`` = the replica's own
``server_uuid`` (MySQL) or ``server_id`` (MariaDB)): the same reads on the replica's
connection, and the same argument, since a replica with ``log_bin`` and
``log_slave_updates`` commits the primary's transactions through its own binlog, under
their GTIDs (``sources.mysql.replica`` checks both). GTIDs of the replica's own
transactions are left out of both states: the primary's stream never delivers them, so a
fence holding them would never be passed. That is exact for the primary's transactions
because a GTID names one transaction everywhere and the replica's own writes are under
its own name (MySQL: its ``server_uuid``; MariaDB: its ``server_id``, where a domain
holding both its own and other servers' GTIDs is refused: the domain's last GTID would no
longer tell where the primary's transactions stand).
"""

from __future__ import annotations

import logging
from typing import Any

from pydblog.errors import SourceError
from pydblog.sources.mysql.fences import UNFENCED, GtidFence, Unfenced, parse_owned, union
from pydblog.sources.mysql.gtid import MariaGtidPos, MySqlGtidSet
from pydblog.sources.mysql.position import file_sequence

log = logging.getLogger(__name__)

ATTEMPTS = 3
_warned = False  # (``blocking_unfenced_warning``: once a process)

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


def _begin(cur: Any) -> None:
    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")


def blocking_unfenced_warning(where: str, mode: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "blocking snapshot reads are no longer fenced: gtid_mode is %s on %s (it was ON "
            "when dblog run started), so a blocking snapshot can read a row older than a "
            "commit the binlog already holds, and the change log keeps it (set gtid_mode = "
            "ON again; see docs/mysql.md)", mode, where,
        )


def open_fenced(
    cur: Any, mariadb: bool, where: str, local: str | None = None, blocking_only: bool = False
) -> GtidFence | Unfenced:
    """Open the chunk's transaction (see the module docstring) and return its fence;
    ``local``: the read server is a replica, and this names its own transactions.
    ``blocking_only``: the capture fences only its blocking reads (MySQL with
    ``gtid_mode = ON`` at its start, ``fences_blocking_reads``): if gtid_mode is no
    longer ON, the read is opened unfenced (``UNFENCED``) with a warning, as a capture
    begun without GTIDs reads, instead of failing."""
    if mariadb:
        return _open_mariadb(cur, where, None if local is None else int(local))
    cur.execute("SELECT @@GLOBAL.gtid_mode, @@GLOBAL.gtid_executed")
    mode, executed = cur.fetchone()
    if str(mode).upper() != "ON":
        if blocking_only:
            blocking_unfenced_warning(where, str(mode))
            _begin(cur)
            return UNFENCED
        raise gtid_mode_error(where, str(mode))
    low = MySqlGtidSet.parse(str(executed or ""))
    _begin(cur)
    # gtid_owned strictly before gtid_executed (see fences.py).
    cur.execute("SELECT @@GLOBAL.gtid_owned")
    owned = parse_owned(str(cur.fetchone()[0] or ""))
    cur.execute("SELECT @@GLOBAL.gtid_executed")
    high = union(owned, MySqlGtidSet.parse(str(cur.fetchone()[0] or "")))
    if local is not None:
        low, high = without_source(low, local), without_source(high, local)
    return GtidFence(low, high)


def without_source(state: MySqlGtidSet, uuid: str) -> MySqlGtidSet:
    """``state`` without the GTIDs of server ``uuid``."""
    return MySqlGtidSet(tuple(s for s in state.sources if s[0] != uuid.lower()))


def replicated_state(text: str, local: int, where: str) -> MariaGtidPos:
    """``@@gtid_binlog_state`` of a MariaDB replica without the replica's own GTIDs
    (server ``local``): the last GTID of each domain among the others' (see the module
    docstring). A domain holding GTIDs of both is refused."""
    entries = [p.strip() for p in text.replace("\n", "").split(",") if p.strip()]
    own: set[int] = set()
    others: list[str] = []
    for part in entries:
        domain, server, _ = (int(x) for x in part.split("-"))
        if server == local:
            own.add(domain)
        else:
            others.append(part)
    mixed = own & {int(p.split("-")[0]) for p in others}
    if mixed:
        raise SourceError(
            f"the read replica at {where} has transactions of its own (server_id {local}) in "
            f"GTID domain {min(mixed)}, which it also replicates: a read-only chunk read there "
            "cannot be fenced",
            hint="write on the replica only in a GTID domain of its own (gtid_domain_id), "
            "or remove [snapshot] read_dsn",
        )
    return MariaGtidPos.parse(",".join(others))


def _binlog_pos(cur: Any, local: int | None, where: str) -> MariaGtidPos:
    if local is not None:
        cur.execute("SELECT @@GLOBAL.gtid_binlog_state")
        return replicated_state(str(cur.fetchone()[0] or ""), local, where)
    cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
    return MariaGtidPos.parse(str(cur.fetchone()[0] or ""))


def _open_mariadb(cur: Any, where: str, local: int | None = None) -> GtidFence:
    """MariaDB: ``low`` = ``@@gtid_binlog_pos`` read before the binlog's end ``E``
    (``SHOW MASTER STATUS``), both before the snapshot; ``high`` = ``@@gtid_binlog_pos``
    after it. The snapshot sees exactly the binlog before its position ``P``
    (``Binlog_snapshot_file/position``); ``low``'s transactions are all before ``E``, so
    when ``P >= E`` they are visible. Otherwise (a commit was between its binlog write and
    its engine commit meanwhile) the reads are taken again, and after ``ATTEMPTS`` the
    fence claims nothing visible (every event the window sees drops its key: safe)."""
    high = MariaGtidPos()
    for attempt in range(ATTEMPTS):
        low = _binlog_pos(cur, local, where)
        cur.execute("SHOW MASTER STATUS")
        row = cur.fetchone()
        if row is None:
            raise SourceError(f"MariaDB at {where} has no binary log",
                              hint="start the server with --log-bin")
        end = (file_sequence(str(row[0])), int(row[1]))
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
        high = _binlog_pos(cur, local, where)
        if (file_sequence(file), int(pos)) >= end:
            return GtidFence(low, high)
        if attempt < ATTEMPTS - 1:
            cur.execute("ROLLBACK")
    return GtidFence(MariaGtidPos(), high)
