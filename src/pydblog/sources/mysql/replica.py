"""Chunk reads on a MySQL/MariaDB replica (``[snapshot] read_dsn``, only with
``watermark = "read-only"``): what the read server must be, checked once per connection.

Invariants (``sources.mysql.fenced`` says why each is needed for an exact fence):
- the read server is not the source itself (its own GTIDs are left out of the fences, so
  reading on the source through ``read_dsn`` would leave out the source's transactions);
- it has ``log_bin`` and ``log_slave_updates`` on: the replicated transactions pass
  through its binlog, so its GTID state moves as the fence argument needs;
- MySQL: ``gtid_mode = ON`` there too (checked by every fence);
- the result is the read server's own name for its transactions: MySQL its
  ``server_uuid``, MariaDB its ``server_id`` (as text).

Before each read-only chunk (and each max key, each plain chunk: a blocking
snapshot's, each table definition), ``catch_up`` waits until the replica has applied every
transaction the source has written to its binlog so far (read there: MySQL
``gtid_executed`` and ``gtid_owned``, MariaDB ``gtid_binlog_pos``). Once per snapshot
request (``MySqlSnapshotReader.begin_request``): the wait in a chunk's ``table_info``
read the source's state after the chunk was asked for, so it covers the chunk's read
too (one wait per chunk, not two; a new connection waits again). Why: the core keeps
(``core.fence.Unsettled``) only the events delivered since the table's snapshot began;
an event delivered before that is taken as seen by every read. On the source that holds;
on a lagging replica it would not (its row, read before the event was applied, would land
after the event: time travel). After the wait it holds again: the event was in the
source's binlog before the chunk was asked for. A read server that never gets there is
not a replica of the source (or stopped replicating): the wait times out with that said.
A max key read on a lagging replica would miss rows written before the capture began (an
initial snapshot at the first start; so would its definition of a table created
there, tests/mysql/test_read_replica.py; the captured tables are listed on the source,
without a wait: the capture thread lists them), and a blocking snapshot's rows must be at least as
new as the stream's pause point: the same wait covers both.

A replica that ran transactions of its own on the captured tables ("errant"
transactions) diverges from the source; nothing can make a snapshot of it exact. A
replica-local GTID under another name than the replica's (e.g. from a former primary
the source never had) would never be passed by the source's stream: such a chunk waits
(restart without ``read_dsn``).
"""

from __future__ import annotations

from typing import Any

from pydblog.errors import SourceError, SourceUnavailable
from pydblog.sources.mysql.connect import MySqlDsn, connect, is_mariadb
from pydblog.sources.mysql.fences import parse_owned, union
from pydblog.sources.mysql.gtid import MySqlGtidSet

HINT = 'point [snapshot] read_dsn at a replica of the source, or remove read_dsn'


def _identity(cur: Any, mariadb: bool) -> str:
    cur.execute("SELECT @@GLOBAL.server_id" if mariadb else "SELECT @@GLOBAL.server_uuid")
    return str(cur.fetchone()[0]).lower()


def check_replica(conn: Any, source: MySqlDsn, where: str, timeout_s: float) -> str:
    """Check ``conn`` (to the read server) as the module docstring says; returns the read
    server's own name for its transactions."""
    mariadb = is_mariadb(conn)
    with conn.cursor() as cur:
        local = _identity(cur, mariadb)
        cur.execute("SELECT @@GLOBAL.log_bin, @@GLOBAL.log_slave_updates")
        log_bin, slave_updates = cur.fetchone()
    src = connect(source, timeout_s=timeout_s)
    try:
        if is_mariadb(src) != mariadb:
            raise SourceError(
                f"the read server at {where} is not of the source's kind (MySQL vs MariaDB)",
                hint=HINT,
            )
        with src.cursor() as cur:
            same = _identity(cur, mariadb) == local
    finally:
        src.close()
    if same:
        raise SourceError(
            f"[snapshot] read_dsn ({where}) is the source itself (same "
            f"{'server_id' if mariadb else 'server_uuid'} {local})", hint=HINT,
        )
    if not int(log_bin or 0) or not int(slave_updates or 0):
        raise SourceError(
            f"the read replica at {where} needs log_bin and log_slave_updates on (its GTID "
            "state must move with its binlog for a read-only chunk's fence)",
            hint="start the replica with --log-bin --log-slave-updates, or remove read_dsn",
        )
    return local


def source_state(cur: Any, mariadb: bool) -> str:
    """Every transaction the source has written to its binlog so far, as a GTID state
    (MySQL: ``gtid_executed`` and ``gtid_owned``, whose GTIDs are being committed)."""
    if mariadb:
        cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
        return str(cur.fetchone()[0] or "")
    cur.execute("SELECT @@GLOBAL.gtid_executed, @@GLOBAL.gtid_owned")
    executed, owned = cur.fetchone()
    return str(union(MySqlGtidSet.parse(str(executed or "")), parse_owned(str(owned or ""))))


def catch_up(cur: Any, mariadb: bool, state: str, timeout_s: float, where: str) -> None:
    """Wait until the read server has applied ``state`` (``source_state``); a timeout is
    a retriable ``SourceUnavailable``."""
    if not state:
        return
    seconds = max(1, int(timeout_s))
    if mariadb:
        cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (state, seconds))
    else:
        cur.execute("SELECT WAIT_FOR_EXECUTED_GTID_SET(%s, %s)", (state, seconds))
    result = cur.fetchone()[0]
    if result is None or int(result) != 0:
        raise SourceUnavailable(
            f"the read replica at {where} did not apply the source's transactions up to "
            f"{state} within {seconds} s",
            hint="is it a replica of the source, replicating? ([snapshot] "
            "statement_timeout_ms bounds the wait)",
        )
