"""What a new leader does to the previous leader's connection to the source.

PostgreSQL: a frozen leader's walsender keeps the slot ``active`` until
``wal_sender_timeout`` (60 s by default). Once the new leader's epoch owns the change
log (the old leader can no longer write), it terminates that walsender so the slot is
free at once. MySQL/MariaDB: nothing to do; every member uses the same ``server_id`` and
the server drops the older binlog connection of a replica id when a new one registers.
"""

from __future__ import annotations

import logging

import psycopg

from pydblog.config import Config
from pydblog.errors import DblogError
from pydblog.sources.postgres.connect import connect

log = logging.getLogger(__name__)


def free_slot(cfg: Config) -> None:
    """Terminate the backend holding ``cfg``'s replication slot (best effort)."""
    if cfg.source.type != "postgres":
        return
    try:
        with connect(cfg.source.dsn, timeout_s=cfg.source.connect_timeout_s) as conn:
            row = conn.execute(
                "SELECT active_pid, pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (cfg.source.slot,),
            ).fetchone()
    except (psycopg.Error, DblogError) as exc:
        log.warning("could not free replication slot %r: %s", cfg.source.slot,
                    str(exc).strip().splitlines()[0])
        return
    if row is not None:
        log.warning("terminated the walsender (pid %s) that still held slot %r: the previous "
                    "leader's", row[0], cfg.source.slot)
