"""``GET /events``: the change log as JSON lines (long-polling) or server-sent events.

Shared by the API's own threads and the events process (``events_worker``), which
serves the requests handed to it so that a consumer reading everything spends its CPU
outside the capture process. Everything here reads the change log through its own reader
(SQLite WAL readers never block the writer).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from pydblog.changelog import log_exists, open_reader
from pydblog.events import with_offset
from pydblog.ports import ChangeLogReader

if TYPE_CHECKING:
    from pydblog.config import LogConfig

SSE_KEEPALIVE_S = 15.0
POLL_S = 0.1
SSE_BATCH = 5000


@dataclass(frozen=True)
class EventsRequest:
    """A validated ``/events`` request (``start`` None: the oldest kept offset)."""

    sse: bool
    start: int | None
    limit: int
    wait: float
    tables: list[str] | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EventsRequest:
        return cls(**data)


def open_log_reader(log: LogConfig) -> ChangeLogReader | None:
    """A reader of the change log (``[log]``: embedded or Kafka, through the ports'
    ``ChangeLogReader``), or None while it does not exist yet."""
    if not log_exists(log):
        return None
    return open_reader(log)


def long_poll(log: LogConfig, start: int | None, limit: int, wait: float,
              tables: list[str] | None, stopping: threading.Event) -> tuple[bytes, int]:
    """Up to ``limit`` events from ``start`` as JSON lines, waiting up to ``wait``
    seconds for the first; and the offset to continue from."""
    deadline = time.monotonic() + wait
    reader = open_log_reader(log)
    try:
        while True:
            if reader is None:
                body, nxt = b"", start or 0
                reader = open_log_reader(log)
            else:
                body, nxt = read_lines(reader, start, limit, tables)
            if body or time.monotonic() >= deadline or stopping.is_set():
                return body, nxt
            start = nxt
            time.sleep(POLL_S)
    finally:
        if reader is not None:
            reader.close()


def read_lines(reader: ChangeLogReader, start: int | None, limit: int,
               tables: list[str] | None) -> tuple[bytes, int]:
    end = reader.next_offset()
    first = reader.first_offset()
    offset = first if start is None else max(start, first)
    if offset >= end:
        return b"", max(offset, end) if start is not None else end
    return render_events(reader, offset, end, limit, tables, sse=False)


def sse_stream(log: LogConfig, start: int | None, tables: list[str] | None,
               stopping: threading.Event) -> Iterator[bytes]:
    """Server-sent events from ``start`` on, until ``stopping`` (or the client leaves:
    the caller stops iterating); a comment line every ``SSE_KEEPALIVE_S`` when idle."""
    yield b": pydblog change log\n\n"
    last_write = time.monotonic()
    while not stopping.is_set():
        reader = open_log_reader(log)
        if reader is None:
            time.sleep(1.0)
            continue
        try:
            while not stopping.is_set():
                end = reader.next_offset()
                offset = reader.first_offset() if start is None else start
                if offset < end:
                    body, start = render_events(reader, offset, end, SSE_BATCH, tables,
                                                sse=True)
                    if body:
                        yield body
                        last_write = time.monotonic()
                        continue
                start = max(offset, end)
                if time.monotonic() - last_write > SSE_KEEPALIVE_S:
                    yield b": keepalive\n\n"
                    last_write = time.monotonic()
                time.sleep(POLL_S)
        finally:
            reader.close()


_REST = itemgetter(slice(1, None))
_SSE_PARTS = ("id: ", None, '\ndata: {"offset":', None, ",", None, "\n\n")
_LINE_PARTS = ('{"offset":', None, ",", None, "\n")


def _interleave(first: int, bodies: list[str], sse: bool) -> str:
    """Every envelope with its offset, as ``"".join`` of a list filled by slice
    assignments (C loops: no Python step per event)."""
    n = len(bodies)
    if not n:
        return ""
    offsets = list(map(str, range(first, first + n)))
    rests = list(map(_REST, bodies))
    shape = _SSE_PARTS if sse else _LINE_PARTS
    k = len(shape)
    parts: list[str | None] = [None] * (k * n)
    fill = iter((offsets, offsets, rests) if sse else (offsets, rests))
    for i, const in enumerate(shape):
        parts[i::k] = [const] * n if const is not None else next(fill)
    return "".join(parts)  # type: ignore[arg-type]


def render_events(reader: ChangeLogReader, offset: int, end: int, limit: int,
                  tables: list[str] | None, *, sse: bool) -> tuple[bytes, int]:
    """Events ``offset <= o < end`` (at most ``limit``) as JSON lines (``sse``: as
    server-sent events, ``id:`` = offset), and the offset to continue from.

    Unfiltered reads take the stored blocks as they are and add each event's offset
    with C-level joins (a consumer reading everything costs the capture process little
    CPU); a table filter goes through ``read`` (the log filters by table per block)."""
    blocks = getattr(reader, "read_range_blocks", None)
    if tables is None and blocks is not None:
        stop = min(end, offset + limit)
        parts: list[str] = []
        for first, _metas, bodies in blocks(offset, stop):
            parts.append(_interleave(first, bodies, sse))
        return "".join(parts).encode(), stop
    recs = [r for r in reader.read(offset, limit, tables) if r.offset < end]
    if sse:
        lines = [b"id: %d\ndata: %s\n\n" % (r.offset, with_offset(r.offset, r.body))
                 for r in recs]
    else:
        lines = [with_offset(r.offset, r.body) + b"\n" for r in recs]
    return b"".join(lines), recs[-1].offset + 1 if len(recs) >= limit else end


