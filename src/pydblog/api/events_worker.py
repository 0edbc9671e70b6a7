"""The events process: serves ``GET /events`` requests handed over by the API, so that
consumers reading the change log spend their CPU outside the capture process (which
then only accepts, authenticates and validates the request).

Hand-over: the API thread sends the client's socket (``SCM_RIGHTS``) and the validated
request as JSON over a Unix socket pair; the events process answers on that socket
(status line, headers, body or stream) and closes it. The capture process closes its
copy without shutting the connection down. If the events process is gone, the API
serves the request itself (``CaptureApi._local``).

Invariants: the events process only reads the change log; it exits when the capture
process closes the control socket (or dies: end of file).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading

import orjson

from pydblog.api.events import EventsRequest, long_poll, sse_stream
from pydblog.config import LogConfig

log = logging.getLogger(__name__)

MAX_MESSAGE = 64 * 1024


class EventsWorker:
    """The capture process's side: starts the events process, hands requests over."""

    def __init__(self, log: LogConfig) -> None:
        self._ctl, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per recv
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "pydblog.api.events_worker", str(child.fileno())],
            pass_fds=[child.fileno()], stdin=subprocess.DEVNULL,
        )
        child.close()
        # The log's settings go over the socket, not the command line (Kafka settings
        # may hold credentials, which ps would show).
        socket.send_fds(self._ctl, [log.model_dump_json().encode()], [])

    def alive(self) -> bool:
        return self._proc.poll() is None

    def handoff(self, client: socket.socket, request: EventsRequest) -> bool:
        """Send ``client`` and ``request`` to the events process; False when it cannot
        take them (the caller then serves the request itself)."""
        message = orjson.dumps(request.to_json())
        if len(message) > MAX_MESSAGE:
            return False
        try:
            with self._lock:
                socket.send_fds(self._ctl, [message], [client.fileno()])
        except OSError as exc:
            log.warning("events process unavailable (%s); serving /events here", exc)
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._ctl.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


# -- the events process ---------------------------------------------------------------------

_HEADERS = {
    True: b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
          b"Connection: close\r\n\r\n",
    False: b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nCache-Control: no-store\r\n"
           b"Connection: close\r\nX-Next-Offset: %d\r\nContent-Length: %d\r\n\r\n",
}


def _serve_one(conn: socket.socket, log: LogConfig, request: EventsRequest,
               stopping: threading.Event) -> None:
    try:
        conn.settimeout(None)
        if request.sse:
            conn.sendall(_HEADERS[True])
            for chunk in sse_stream(log, request.start, request.tables, stopping):
                conn.sendall(chunk)
        else:
            body, nxt = long_poll(log, request.start, request.limit, request.wait,
                                  request.tables, stopping)
            conn.sendall(_HEADERS[False] % (nxt, len(body)) + body)
    except OSError:
        pass  # the client left
    finally:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        conn.close()


def serve(ctl: socket.socket) -> None:
    stopping = threading.Event()
    message, _fds, _flags, _addr = socket.recv_fds(ctl, MAX_MESSAGE, 1)
    if not message:
        return
    log = LogConfig.model_validate_json(message)
    try:
        while True:
            message, fds, _flags, _addr = socket.recv_fds(ctl, MAX_MESSAGE, 1)
            if not message:
                return  # the capture process closed the control socket (or died)
            if not fds:
                continue
            conn = socket.socket(fileno=fds[0])
            request = EventsRequest.from_json(orjson.loads(message))
            threading.Thread(target=_serve_one, args=(conn, log, request, stopping),
                             name="dblog-events", daemon=True).start()
    finally:
        stopping.set()


def main(argv: list[str]) -> None:
    # Ctrl-C reaches the whole process group: the capture process decides when we stop
    # (it closes the control socket), so no KeyboardInterrupt traceback here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctl = socket.socket(fileno=int(argv[0]))
    try:
        serve(ctl)
    finally:
        ctl.close()
        os._exit(0)  # daemon threads mid-write: no interpreter teardown


if __name__ == "__main__":
    main(sys.argv[1:])
