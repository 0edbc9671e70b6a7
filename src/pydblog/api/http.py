"""A small HTTP server for the API: the standard library's ``ThreadingHTTPServer``, one
daemon thread per connection, routes as plain functions.

Why the standard library (see docs/operations.md): the API serves a handful of
endpoints to a scraper, a probe and a few consumers; a framework would bring an event
loop or a WSGI stack into the capture process for no gain, and every request already
runs on its own thread, away from the capture loop (which only ever shares the GIL).

A response may instead hand the connection to another process (``Response.handoff``:
``/events`` goes to the events process); such a connection is then closed here without
being shut down.

Invariants: a handler never raises to the client (an unexpected error is a 500 with a
generic message, logged here); the bearer token is compared in constant time and never
logged; request bodies are bounded (``MAX_BODY``).
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes
    stopping: threading.Event

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: Iterator[bytes] | None = None
    """Chunks written (and flushed) one by one until exhausted or the client leaves."""
    handoff: Callable[[socket.socket], bool] | None = None
    """Hands the client's connection to another process, which answers on it; when it
    returns False, ``fallback()`` is the response instead."""
    fallback: Callable[[], Response] | None = None


def json_response(status: int, data: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n",
                    headers=headers or {})


def error(status: int, message: str, hint: str | None = None) -> Response:
    data: dict[str, str] = {"error": message}
    if hint:
        data["hint"] = hint
    return json_response(status, data)


Handler = Callable[[Request], Response]


class Router:
    """``(method, path) -> handler``; ``token`` protects the routes added with
    ``auth=True`` (and every route needing it gets 401 without a valid one)."""

    def __init__(self, token: str | None) -> None:
        self._routes: dict[tuple[str, str], tuple[Handler, bool]] = {}
        self._token = token.encode() if token else None
        self.on_request: Callable[[str, int], None] = lambda path, code: None

    def add(self, method: str, path: str, handler: Handler, auth: bool = False) -> None:
        self._routes[(method, path)] = (handler, auth)

    def authorized(self, req: Request) -> bool:
        if self._token is None:
            return False
        header = req.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self._token)

    def dispatch(self, req: Request) -> Response:
        route = self._routes.get((req.method, req.path))
        if route is None:
            if any(p == req.path for _, p in self._routes):
                return error(405, f"{req.method} is not allowed on {req.path}")
            return error(404, f"no such endpoint: {req.path}")
        handler, auth = route
        if auth and not self.authorized(req):
            if self._token is None:
                return error(
                    403, f"{req.method} {req.path} needs api.token, and none is configured",
                    hint="set [api] token in the config (at least 16 characters) and send "
                         "Authorization: Bearer TOKEN",
                )
            return Response(401, b'{"error": "missing or wrong token"}\n',
                            headers={"WWW-Authenticate": 'Bearer realm="dblog"'})
        try:
            return handler(req)
        except Exception:
            log.exception("API handler for %s %s failed", req.method, req.path)
            return error(500, "internal error (see the process's log)")


class ApiServer:
    """Serves ``router`` on ``host:port`` from daemon threads until ``close``."""

    def __init__(self, host: str, port: int, router: Router) -> None:
        stopping = self.stopping = threading.Event()

        class _Handler(BaseHTTPRequestHandler):
            server_version = "pydblog"
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s %s", self.address_string(), format % args)

            def _handle(self, method: str) -> None:
                parts = urlsplit(self.path)
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    self._send(error(400, "Content-Length is not a number"), close=True)
                    return
                if length > MAX_BODY:
                    self._send(error(413, f"request body over {MAX_BODY} bytes"), close=True)
                    return
                body = self.rfile.read(length) if length > 0 else b""
                req = Request(
                    method, parts.path.rstrip("/") or "/", parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()}, body, stopping,
                )
                resp = router.dispatch(req)
                router.on_request(req.path, resp.status)
                if resp.handoff is not None:
                    if resp.handoff(self.connection):
                        handed_off.add(self.connection.fileno())
                        self.close_connection = True
                        return
                    assert resp.fallback is not None
                    resp = resp.fallback()
                self._send(resp)

            def _send(self, resp: Response, close: bool = False) -> None:
                try:
                    self.send_response(resp.status)
                    self.send_header("Content-Type", resp.content_type)
                    self.send_header("Cache-Control", "no-store")
                    for k, v in resp.headers.items():
                        self.send_header(k, v)
                    if resp.stream is None:
                        self.send_header("Content-Length", str(len(resp.body)))
                        if close:
                            self.send_header("Connection", "close")
                            self.close_connection = True
                        self.end_headers()
                        self.wfile.write(resp.body)
                        return
                    self.send_header("Connection", "close")
                    self.close_connection = True
                    self.end_headers()
                    for chunk in resp.stream:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                finally:
                    if resp.stream is not None and hasattr(resp.stream, "close"):
                        resp.stream.close()

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PUT(self) -> None:
                self._handle("PUT")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        handed_off: set[int] = set()

        class _Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

            def shutdown_request(self, request: Any) -> None:
                """A connection handed to another process is closed here, never shut
                down (that would end it for the other process too)."""
                try:
                    fd = request.fileno()
                except OSError:
                    fd = -1
                if fd in handed_off:
                    handed_off.discard(fd)
                    self.close_request(request)
                    return
                super().shutdown_request(request)

        self._server = _Server((host, port), _Handler)
        address = self._server.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])
        # ``shutdown`` waits for the serve loop to notice: up to ``poll_interval``, which
        # every SIGTERM of `dblog run` (and so an HA handover) paid (0.5 s: ~0.4 s a stop).
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
            name="dblog-api", daemon=True,
        )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ApiServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
