"""Waiting for the binlog stream's socket in a way another thread can end early.

``pymysqlreplication`` blocks in a socket read until the server sends something (an
event, or a heartbeat every ``idle_s``). A read-only snapshot's chunk answer must reach
the runner sooner than that: the snapshot worker (and the change log writer) call
``Wakeup.set``, and the stream waits with ``Wakeup.wait`` before each read.

Invariant: ``wait`` returns True whenever a read would not block on the socket (bytes in
the connection's buffer, or readable on its socket, which includes a closed one); it
returns False only when woken or after ``timeout`` with nothing to read. Where it cannot
tell (no connection yet, an odd socket) it returns True and the read blocks as before.
"""

from __future__ import annotations

import contextlib
import os
import select
import ssl
import weakref
from typing import Any

from pydblog.sources.mysql.sockread import SocketReader


def _buffered(conn: Any) -> bool | None:
    """Whether ``conn`` (a pymysql connection) has bytes buffered or on its socket
    without blocking; None if that cannot be told."""
    if getattr(conn, "held", None) is not None:  # a packet handed back (connect.StreamConnection)
        return True
    sock, rfile = getattr(conn, "_sock", None), getattr(conn, "_rfile", None)
    if sock is None or rfile is None:
        return None
    ours = type(rfile) is SocketReader
    if ours and rfile.buffered():
        return True
    timeout = sock.gettimeout()
    try:
        sock.setblocking(False)
        if ours:
            rfile.fill()  # bytes, or the end of the stream: a read would not block
            return True
        return bool(rfile.peek(1))  # one non-blocking read if its buffer is empty
    except (BlockingIOError, ssl.SSLWantReadError):
        # TLS (MySQL negotiates it by default): no decrypted byte pending in the TLS
        # layer and none buffered; the raw socket tells whether encrypted bytes wait.
        return False
    except (OSError, ValueError):
        return None
    finally:
        with contextlib.suppress(OSError, ValueError):
            sock.settimeout(timeout)


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Wakeup:
    """A self-pipe (see the module docstring). ``set`` is thread-safe. The pipe is closed
    when the object is collected, never while a thread that still holds it may write
    (a closed descriptor's number can be reused by another file at once)."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        weakref.finalize(self, _close, self._r, self._w)

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._w, b"x")

    def wait(self, conn: Any, timeout: float) -> bool:
        has = _buffered(conn) if conn is not None else None
        if has is None or has:
            return True
        try:
            ready, _, _ = select.select([conn._sock, self._r], [], [], timeout)
        except (OSError, ValueError):
            return True
        if self._r in ready:
            with contextlib.suppress(BlockingIOError, OSError):
                while os.read(self._r, 512):
                    pass
            return False
        return bool(ready)
