"""Leader election through a PostgreSQL advisory lock on a dedicated connection: no
server besides PostgreSQL.

The leader holds ``pg_try_advisory_lock(key)`` (``key`` derived from ``path``) on its
own connection, whose ``idle_session_timeout`` is the session timeout: a leader that
stops talking (killed, frozen, cut off) loses the connection, hence the lock, within
that time. Standbys poll the lock.

Invariants:
- The epoch (a row of ``[ha] table``, one per ``path``) is incremented by a statement
  run on the connection that holds the lock: that backend holds the lock while the
  statement runs, so epochs are handed out in leadership order.
- The lease is renewed by a ``SELECT 1`` on that connection every quarter of the
  timeout (which also keeps it from idling out); a failed ping ends the lease.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from pydblog.config import redact_dsn
from pydblog.errors import ConfigError, DblogError, SourceError
from pydblog.ha.lease import TTL_SHARE, DeadlineLease
from pydblog.sources.postgres.connect import connect

log = logging.getLogger(__name__)


def lock_key(path: str) -> int:
    """A signed 64-bit advisory-lock key for ``path`` (stable across processes)."""
    return int.from_bytes(hashlib.blake2b(f"pydblog-ha:{path}".encode(), digest_size=8).digest(),
                          "big", signed=True)


class PgLockElection:
    def __init__(self, dsn: str, path: str, table: str, session_timeout_s: float,
                 member: str) -> None:
        self.dsn = dsn
        self.path = path
        self.key = lock_key(path)
        schema, name = table.split(".", 1)
        self.table = sql.Identifier(schema, name)
        self.member = member
        self.timeout = session_timeout_s
        self.poll_s = min(0.5, session_timeout_s / 4)
        self._conn: psycopg.Connection[Any] | None = None
        self._io = threading.Lock()  # one statement at a time on the connection
        self._lease: DeadlineLease | None = None

    def _connect(self) -> psycopg.Connection[Any]:
        conn = connect(self.dsn, timeout_s=max(2.0, self.timeout))
        try:
            if conn.info.server_version < 140000:
                raise ConfigError(
                    '[ha] backend "postgres" needs PostgreSQL 14 or newer (idle_session_timeout)',
                    hint='point [ha] dsn at a newer server, or use backend = "zookeeper"',
                )
            conn.execute(sql.SQL("SET idle_session_timeout = {}").format(
                sql.Literal(f"{int(self.timeout * 1000)}ms")))
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (path text PRIMARY KEY, epoch bigint NOT NULL, "
                "leader text, since timestamptz)").format(self.table))
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
            pass  # members starting together: another one created it at the same moment
        except psycopg.Error as exc:
            conn.close()
            raise SourceError(
                f"cannot prepare the [ha] lock table on {redact_dsn(self.dsn)}: {exc}",
                hint="grant CREATE on the schema of [ha] table, or create the table beforehand",
            ) from None
        return conn

    def campaign(self, stop: Any) -> DeadlineLease | None:
        warned = False
        while not stop.is_set():
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                conn = self._conn
                with self._io:
                    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
                if row is not None and row[0]:
                    return self._lead(conn)
                warned = False
            except (psycopg.Error, DblogError) as exc:
                if isinstance(exc, DblogError) and not exc.retriable:
                    raise
                if not warned:
                    log.warning("[ha] lock database %s unreachable (%s); retrying",
                                redact_dsn(self.dsn), str(exc).strip().splitlines()[0])
                    warned = True
                self._drop()
            stop.wait(self.poll_s)
        return None

    def _lead(self, conn: psycopg.Connection[Any]) -> DeadlineLease:
        started = time.monotonic()
        with self._io:
            row = conn.execute(sql.SQL(
                "INSERT INTO {t} AS h (path, epoch, leader, since) VALUES (%s, 1, %s, now()) "
                "ON CONFLICT (path) DO UPDATE SET epoch = h.epoch + 1, leader = excluded.leader, "
                "since = excluded.since RETURNING epoch").format(t=self.table),
                (self.path, self.member)).fetchone()
        assert row is not None
        lease = DeadlineLease(int(row[0]), self.timeout * TTL_SHARE, "the [ha] lock's PostgreSQL",
                              self._release, started)
        self._lease = lease
        threading.Thread(target=self._renew, args=(lease, conn), name="dblog-ha-renew",
                         daemon=True).start()
        return lease

    def _renew(self, lease: DeadlineLease, conn: psycopg.Connection[Any]) -> None:
        interval = self.timeout / 4
        while not lease.lost:
            started = time.monotonic()
            try:
                with self._io:
                    if conn.closed:
                        raise psycopg.OperationalError("connection closed")
                    conn.execute("SELECT 1")
            except psycopg.Error as exc:
                lease.lose(f"the lock's connection failed ({str(exc).strip().splitlines()[0]})")
                return
            lease.renew(started)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))

    def _release(self) -> None:
        """Unlock by closing the connection (a standby polls within ``poll_s``)."""
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with self._io, contextlib.suppress(psycopg.Error):
                conn.close()

    def leader(self) -> str | None:
        try:
            with connect(self.dsn, timeout_s=3) as conn:
                row = conn.execute(sql.SQL(
                    "SELECT h.leader FROM {t} h JOIN pg_locks l ON l.locktype = 'advisory' "
                    "AND l.granted AND ((l.classid::bigint << 32) | l.objid::bigint) = %s "
                    "WHERE h.path = %s").format(t=self.table), (self.key, self.path)).fetchone()
        except (psycopg.Error, DblogError):
            return None
        return str(row[0]) if row and row[0] else None

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
        self._drop()
