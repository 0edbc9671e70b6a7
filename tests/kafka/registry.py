"""A schema registry in memory for the tests, over HTTP: Confluent's API for the writer
(``POST /subjects/<subject>/versions``, ``GET /schemas/ids/<id>``) and the reads of
Apicurio Registry's v2 API that Apicurio's converter makes in Confluent mode (``GET
/apis/registry/v2/ids/contentIds/<id>`` and its ``/references``), one id space for both
(a schema's id is its content id, as Apicurio's ``/apis/ccompat`` gives it). Neither
Confluent's registry nor Apicurio's server (a Quarkus application without a runnable jar
on Maven Central) nor Karapace (not on PyPI here) runs on these machines."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class SchemaStore:
    def __init__(self) -> None:
        self.schemas: list[str] = []
        self.subjects: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def register(self, subject: str, text: str) -> int:
        json.loads(text)  # a schema is JSON
        with self.lock:
            if text not in self.schemas:
                self.schemas.append(text)
            schema_id = self.schemas.index(text) + 1
            self.subjects.setdefault(subject, []).append(schema_id)
            return schema_id

    def get(self, schema_id: int) -> str | None:
        with self.lock:
            return self.schemas[schema_id - 1] if 0 < schema_id <= len(self.schemas) else None


def _handler(store: SchemaStore) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, code: int, body: Any, raw: str | None = None,
                    ctype: str = "application/vnd.schemaregistry.v1+json") -> None:
            data = raw.encode() if raw is not None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if "/subjects/" not in self.path or not self.path.endswith("/versions"):
                self._answer(404, {"error_code": 404, "message": "not here"})
                return
            subject = self.path.split("/subjects/")[1].rsplit("/versions", 1)[0]
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._answer(200, {"id": store.register(subject, body["schema"])})

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path.endswith("/references"):
                self._answer(200, [], ctype="application/json")
                return
            schema_id = int(path.rstrip("/").rsplit("/", 1)[1])
            text = store.get(schema_id)
            if text is None:
                self._answer(404, {"error_code": 40403, "message": "Schema not found"})
            elif "/ids/contentIds/" in path or "/ids/globalIds/" in path:
                self._answer(200, None, raw=text, ctype="application/json")
            else:
                self._answer(200, {"schema": text})

    return Handler


@contextmanager
def schema_registry() -> Iterator[tuple[str, SchemaStore]]:
    """``(base URL, store)``; Apicurio's v2 API is under ``<base>/apis/registry/v2``."""
    store = SchemaStore()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(store))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()
