"""Connections to the source PostgreSQL, with errors turned into clear messages.

Invariant: no message produced here contains the password (libpq messages are
relayed as they are: they never contain it; DSNs are shown redacted).
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg2
import psycopg2.extensions
import psycopg2.extras

from pydblog.config import redact_dsn
from pydblog.errors import SlotInUse, SourceError, SourceUnavailable
from pydblog.sources.postgres.types import SESSION_SETTINGS

# SQLSTATE classes / codes used for classification (never message text).
INVALID_AUTHORIZATION = {"28000", "28P01"}
INSUFFICIENT_PRIVILEGE = "42501"
OBJECT_IN_USE = "55006"
INVALID_CATALOG_NAME = "3D000"


def _options() -> str:
    return " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())


def _connect_error(dsn: str, exc: Exception, sqlstate: str | None) -> SourceError:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = redact_dsn(dsn)
    if sqlstate in INVALID_AUTHORIZATION:
        return SourceError(
            f"PostgreSQL at {where} refused the login: {detail}",
            hint="check the user and password in [source] dsn",
        )
    if sqlstate == INVALID_CATALOG_NAME:
        return SourceError(f"PostgreSQL at {where}: {detail}", hint="check the database name in [source] dsn")
    return SourceUnavailable(
        f"cannot connect to PostgreSQL at {where}: {detail}",
        hint="is the server running and reachable, and are host/port/user/password in [source] dsn right?",
    )


def connect(dsn: str, *, timeout_s: float = 10.0, autocommit: bool = True) -> psycopg.Connection[Any]:
    """An ordinary psycopg 3 connection with pydblog's session settings."""
    try:
        return psycopg.connect(
            dsn, autocommit=autocommit, connect_timeout=max(1, int(timeout_s)), options=_options()
        )
    except psycopg.Error as exc:
        raise _connect_error(dsn, exc, exc.sqlstate) from None


def connect_replication(dsn: str, *, timeout_s: float = 10.0) -> psycopg2.extras.LogicalReplicationConnection:
    """A psycopg2 logical replication connection (psycopg 3 has no replication API)."""
    try:
        conn = psycopg2.connect(
            dsn,
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
            connect_timeout=max(1, int(timeout_s)),
            options=_options(),
        )
    except psycopg2.Error as exc:
        raise _connect_error(dsn, exc, exc.pgcode) from None
    assert isinstance(conn, psycopg2.extras.LogicalReplicationConnection)
    return conn


def replication_error(exc: psycopg2.Error, slot: str) -> SourceError:
    detail = (exc.pgerror or str(exc)).strip().splitlines()[0]
    if exc.pgcode == OBJECT_IN_USE:
        return SlotInUse(
            f"replication slot {slot!r} is in use by another process: {detail}",
            hint="stop the other `dblog run` (or consumer) of this slot, or configure another [source] slot",
        )
    if exc.pgcode == INSUFFICIENT_PRIVILEGE or exc.pgcode in INVALID_AUTHORIZATION:
        return SourceError(
            f"not allowed to stream from slot {slot!r}: {detail}",
            hint="grant the role REPLICATION (ALTER ROLE <user> REPLICATION) and allow replication connections in pg_hba.conf",
        )
    return SourceUnavailable(f"replication stream failed: {detail}")
