"""Connections to the source PostgreSQL, with errors turned into clear messages.

Invariant: no message produced here contains the password (libpq messages are
relayed as they are: they never contain it; DSNs are shown redacted).
"""

from __future__ import annotations

import socket
from typing import Any

import psycopg
import psycopg2
import psycopg2.extensions
import psycopg2.extras
from psycopg.conninfo import conninfo_to_dict

from pydblog.config import redact_dsn
from pydblog.errors import SlotInUse, SourceError, SourceUnavailable
from pydblog.sources.postgres.types import SESSION_SETTINGS

# SQLSTATE classes / codes used for classification (never message text).
INVALID_AUTHORIZATION = {"28000", "28P01"}
INSUFFICIENT_PRIVILEGE = "42501"
OBJECT_IN_USE = "55006"
INVALID_CATALOG_NAME = "3D000"
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"


def _options() -> str:
    return " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())


def _reachable(dsn: str) -> bool:
    """Whether something accepts TCP connections at the DSN's host and port (libpq
    reports connection-time errors without a SQLSTATE: this tells "the server refused
    us" from "no server there" without reading the message text)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return False
    host = str(params.get("host") or "")
    if not host or host.startswith("/"):
        return True  # a Unix socket: the file exists or libpq says so
    try:
        with socket.create_connection((host.split(",")[0], int(params.get("port") or 5432)), timeout=2):
            return True
    except OSError:
        return False


def _connect_error(dsn: str, exc: Exception, sqlstate: str | None,
                   setting: str = "[source] dsn") -> SourceError:
    detail = " ".join(str(exc).split()) or type(exc).__name__
    detail = detail.removeprefix("connection failed: ")
    where = redact_dsn(dsn)
    if sqlstate is None and _reachable(dsn):
        return SourceError(
            f"PostgreSQL at {where} ({setting}) refused the connection: {detail}",
            hint=f"check the user, password and database name in {setting}, and pg_hba.conf",
        )
    if sqlstate in INVALID_AUTHORIZATION:
        return SourceError(
            f"PostgreSQL at {where} ({setting}) refused the login: {detail}",
            hint=f"check the user and password in {setting}",
        )
    if sqlstate == INVALID_CATALOG_NAME:
        return SourceError(f"PostgreSQL at {where} ({setting}): {detail}",
                           hint=f"check the database name in {setting}")
    return SourceUnavailable(
        f"cannot connect to PostgreSQL at {where} ({setting}): {detail}",
        hint=f"is the server running and reachable, and are host/port/user/password in {setting} right?",
    )


def connect(dsn: str, *, timeout_s: float = 10.0, autocommit: bool = True,
            setting: str = "[source] dsn") -> psycopg.Connection[Any]:
    """An ordinary psycopg 3 connection with pydblog's session settings (``setting``:
    the configuration key of ``dsn``, named in errors)."""
    try:
        return psycopg.connect(
            dsn, autocommit=autocommit, connect_timeout=max(1, int(timeout_s)), options=_options()
        )
    except psycopg.Error as exc:
        raise _connect_error(dsn, exc, exc.sqlstate, setting) from None


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
    if exc.pgcode == OBJECT_NOT_IN_PREREQUISITE_STATE:
        # "can no longer get changes from replication slot" (invalidated), wal_level or
        # a standby's prerequisites: no retry helps.
        return SourceError(
            f"cannot stream from replication slot {slot!r}: {detail}",
            hint="an invalidated slot has lost the changes since the change log's last "
            "checkpoint: drop it and start a fresh change log with [snapshot] mode = "
            '"initial"; otherwise fix the setting the message names')
    return SourceUnavailable(f"replication stream failed: {detail}")
