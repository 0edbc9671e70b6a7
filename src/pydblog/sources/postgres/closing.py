"""Closing a PostgreSQL connection another thread may be reading on.

psycopg's ``Connection.close`` calls ``PQfinish`` without taking ``conn.lock``; a read
in progress on another thread (psycopg's own, or the native encoder's C loop, which
runs libpq without the GIL while holding ``conn.lock``) would then use freed memory:
a crash, or a chunk cut short and returned as if complete.

Invariant: ``PQfinish`` runs only while this thread holds ``conn.lock``. A read that
holds it is ended first at the socket: ``shutdown`` of a duplicate of the connection's
descriptor (the descriptor itself stays libpq's), which makes the read fail promptly;
then the lock is taken and the connection closed. If the lock still cannot be had, the
connection is left open (leaked, logged) rather than freed under the reader.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import psycopg

log = logging.getLogger(__name__)

LOCK_WAIT_S = 30.0
"""How long ``close`` waits for a read ended at its socket to let go of the connection."""


def close(conn: psycopg.Connection[Any] | None, wait_s: float = LOCK_WAIT_S) -> None:
    """Closes ``conn`` without freeing it under a read in progress (module docstring)."""
    if conn is None or conn.closed:
        return
    lock = conn.lock
    if not lock.acquire(blocking=False):
        _shutdown(conn)
        if not lock.acquire(timeout=wait_s):
            log.warning("a PostgreSQL read did not end %.0f s after its socket was shut "
                        "down: its connection is left open", wait_s)
            return
    try:
        conn.close()
    finally:
        lock.release()


def _shutdown(conn: psycopg.Connection[Any]) -> None:
    """Ends the connection's traffic both ways (the read in progress sees an error)."""
    try:
        fd = os.dup(conn.pgconn.socket)
    except (OSError, psycopg.Error):
        return  # no socket (already broken): the read ends by itself
    try:
        with socket.socket(fileno=fd) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
