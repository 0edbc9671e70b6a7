"""A TCP proxy in front of a Kafka broker that can make the broker append one produce
request twice, as a broker does that loses a produce response and then, the producer
having retried, appends the retried batch again (its idempotent producer's dedup by
sequence number lost, e.g. across a restart).

Kafka frames are ``int32 length`` + payload; a request's header begins ``int16
api_key, int16 api_version, int32 correlation_id``; a connection's responses come back
in request order. ``arm()`` marks the next Produce request: the proxy sends it to the
broker twice and hands the client only the answer to the second copy (the client's
delivery reports then name the offsets of the second copy, as after a retry)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections import deque

PRODUCE = 0


def _shut(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


def _recv_exact(s: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _frame(s: socket.socket) -> bytes | None:
    head = _recv_exact(s, 4)
    if head is None:
        return None
    body = _recv_exact(s, struct.unpack(">i", head)[0])
    return None if body is None else head + body


class DupProxy:
    """Listens on ``port`` (127.0.0.1) and forwards to ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self.port: int = self._server.getsockname()[1]
        self._armed = 0
        self.duplicated = 0  # produce requests sent twice so far
        self._lock = threading.Lock()
        self._closed = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, requests: int = 1) -> None:
        """Send each of the next ``requests`` Produce requests twice."""
        with self._lock:
            self._armed += requests

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                broker = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the broker is down: so is its proxy
                client.close()
                continue
            with self._lock:
                if self._closed:  # (closed meanwhile: no socket left unclosed)
                    client.close()
                    broker.close()
                    return
                self._socks += [client, broker]
            drop: deque[bool] = deque()  # per request sent to the broker: drop its answer?
            threading.Thread(target=self._up, args=(client, broker, drop), daemon=True).start()
            threading.Thread(target=self._down, args=(broker, client, drop), daemon=True).start()

    def _up(self, client: socket.socket, broker: socket.socket, drop: deque[bool]) -> None:
        try:
            while (frame := _frame(client)) is not None:
                api_key = struct.unpack(">h", frame[4:6])[0]
                twice = False
                if api_key == PRODUCE:
                    with self._lock:
                        if self._armed:
                            self._armed -= 1
                            self.duplicated += 1
                            twice = True
                if twice:
                    drop.append(True)  # the first copy's answer is lost
                    drop.append(False)
                    broker.sendall(frame + frame)
                else:
                    drop.append(False)
                    broker.sendall(frame)
        except OSError:
            pass
        finally:
            _shut(client, broker)

    def _down(self, broker: socket.socket, client: socket.socket, drop: deque[bool]) -> None:
        try:
            while (frame := _frame(broker)) is not None:
                if not (drop and drop.popleft()):
                    client.sendall(frame)
        except OSError:
            pass
        finally:
            _shut(client)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._socks = self._socks, []
        self._server.close()
        _shut(*socks)
        for s in socks:
            s.close()
