"""The binlog dump connection's socket reader: a large buffer whose fill is known.

pymysql reads through ``socket.makefile("rb")``: an 8 KB buffer, so a dump of 8 KB rows
events costs two or three ``recv`` calls per event, and whether a read would block can
only be told by switching the socket to non-blocking and peeking (two more system calls
per event, ``wake.Wakeup``). ``SocketReader`` takes pymysql's ``_rfile`` place on the
dump connection (``connect.StreamConnection``): one ``recv_into`` fills up to 256 KB,
many events at a time, and ``buffered()`` says without a system call whether a read can
be served.

Invariants: ``read(n)`` returns exactly ``n`` bytes, the stream's next ones, or fewer
only where the peer closed the stream (pymysql then reports a lost connection); it
raises whatever the socket's ``recv_into`` raises (its timeout included), like
``makefile``'s reader. ``fill()`` adds what one ``recv_into`` returns and never drops or
reorders bytes; ``peek`` consumes nothing.
"""

from __future__ import annotations

import socket
from typing import Any

SIZE = 1 << 18
"""The buffer: up to this many bytes are read from the socket at a time."""


class SocketReader:
    """See the module docstring. ``sock``: a connected socket (TLS included)."""

    __slots__ = ("_end", "_mem", "_sock", "_start", "_view")

    def __init__(self, sock: socket.socket, size: int = SIZE) -> None:
        self._sock: Any = sock
        self._mem = bytearray(size)
        self._view = memoryview(self._mem)
        self._start = 0
        self._end = 0

    def buffered(self) -> int:
        """How many bytes ``read`` can return without reading the socket."""
        return self._end - self._start

    def read(self, n: int) -> bytes:
        start = self._start
        if self._end - start >= n:
            self._start = start + n
            return bytes(self._view[start:start + n])
        return self._read_more(n)

    def peek(self, n: int = 1) -> bytes:
        """The buffered bytes (not consumed), after one ``fill`` if none are: as
        ``io.BufferedReader.peek``, empty only at the peer's end."""
        if self._end == self._start:
            self.fill()
        return bytes(self._view[self._start:self._end])

    def fill(self) -> int:
        """One ``recv_into`` into the buffer's free space: how many bytes it added (0:
        the peer closed the stream, or no space is left)."""
        self._compact()
        if self._end == len(self._mem):
            return 0
        got: int = self._sock.recv_into(self._view[self._end:])
        self._end += got
        return got

    def close(self) -> None:
        """Drop what is buffered (pymysql closes the socket itself)."""
        self._start = self._end = 0

    def _compact(self) -> None:
        """Move the unread bytes to the buffer's start."""
        start, end = self._start, self._end
        if start:
            have = end - start
            self._mem[:have] = bytes(self._view[start:end])
            self._start, self._end = 0, have

    def _read_more(self, n: int) -> bytes:
        if n > len(self._mem):  # larger than the buffer: read it into its own
            out = bytearray(n)
            have = self._end - self._start
            out[:have] = self._view[self._start:self._end]
            self._start = self._end = 0
            view = memoryview(out)
            while have < n:
                got = self._sock.recv_into(view[have:])
                if not got:
                    return bytes(out[:have])
                have += got
            return bytes(out)
        self._compact()
        while self._end < n:
            got = self._sock.recv_into(self._view[self._end:])
            if not got:
                break
            self._end += got
        take = min(n, self._end)
        self._start = take
        return bytes(self._view[:take])
