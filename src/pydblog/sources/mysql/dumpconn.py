"""The binlog dump a capture leaves on the server, and ending it before the next one.

A server runs one dump per replica ``server_id``: a dump that registers with the id of
a running one makes the server end the older one first, and while that older one is
blocked writing to a reader that does not read (a frozen process, a network partition)
the new dump sends nothing: MariaDB holds it until the older one's write times out
(``net_write_timeout``), past the new reader's read timeout, so the new reader
reconnects and waits again. Every member of an HA group captures with the same
``server_id``, and a frozen ex-leader's dump is exactly such a blocked one.

So each dump records its server connection id (checkpoint ``extra[DUMP_CONNECTION_KEY]``,
yielded before any item of the dump, so the change log holds it from the dump's first
commit on), and a source ends the recorded dump before it starts its own: ``KILL
CONNECTION`` closes the blocked write at once. It kills only a connection that is still
a binlog dump of the capture's own user (a user may always end its own connections, so
no privilege is needed). Connection ids are not reused while a server runs; after a
restart a reused id that is again a dump of the same user costs that reader one
reconnect, no data. Where the kill is refused the new dump waits as before.
"""

from __future__ import annotations

import logging
from typing import Any

import pymysql

DUMP_CONNECTION_KEY = "mysql_dump_connection"
"""Checkpoint ``extra`` key: ``{"id": n}``, the server connection id of the dump that
delivered the checkpoint's position."""

log = logging.getLogger(__name__)


def record(connection_id: int) -> dict[str, Any]:
    return {"id": connection_id}


def recorded(raw: Any) -> int | None:
    """The connection id of a checkpoint's record, or None."""
    if not isinstance(raw, dict):
        return None
    value = raw.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def end_dump(cur: Any, connection_id: int) -> bool:
    """Kill connection ``connection_id`` (through cursor ``cur``) if it is a binlog dump
    of ``cur``'s user; whether it was killed. Never raises for a refusal."""
    try:
        cur.execute(
            "SELECT COMMAND, USER FROM information_schema.PROCESSLIST WHERE ID = %s",
            (connection_id,),
        )
        row = cur.fetchone()
        if row is None or not str(row[0]).startswith("Binlog Dump"):
            return False
        cur.execute("SELECT SUBSTRING_INDEX(CURRENT_USER(), '@', 1)")
        me = cur.fetchone()
        if me is None or str(row[1]) != str(me[0]):
            return False
        cur.execute(f"KILL CONNECTION {int(connection_id)}")
    except pymysql.Error as exc:
        log.warning("could not end the previous binlog dump (connection %d): %s; the new "
                    "dump may wait until the server ends it", connection_id, exc)
        return False
    log.info("ended the previous binlog dump of this capture's server_id (connection %d)",
             connection_id)
    return True
