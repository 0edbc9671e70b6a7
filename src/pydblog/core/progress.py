"""Snapshot progress: one ``TableJob`` per table to read, queued in a ``Lane``.

Everything here is what ``SnapshotCore.state()`` persists with the checkpoint, so it
only ever describes *completed* steps: ``last_key`` is the key of the last row of the
last chunk whose high watermark has been processed, and a restart resumes *after* it
(the chunk that was in flight is read again, with new watermarks).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydblog.core.keys import RawKey, match_key
from pydblog.events import SnapshotKind


@dataclass(frozen=True, slots=True)
class TableJob:
    """One table's snapshot.

    Before the table is started (``started`` False) only the request is known: table,
    signal, kind, filter, surrogate key. Starting it fixes ``key_columns`` (the chunk
    key), ``identity`` (the row identity, ``TableInfo.identity``: the event key of the
    rows and what the window drops by; persisted here so a restart keeps it) and
    ``max_key`` (the bound: rows with a greater key come from the stream). ``last_key``
    None means "from the first row"; chunks read ``last_key < key <= max_key``.
    ``identity`` None (state written before it existed) means "as the reader says".
    """

    table: str
    signal_id: str
    kind: SnapshotKind = SnapshotKind.INCREMENTAL
    condition: str | None = None
    surrogate_key: str | None = None
    schema_name: str = ""
    table_name: str = ""
    key_columns: tuple[str, ...] | None = None
    max_key: RawKey | None = None
    last_key: RawKey | None = None
    chunks: int = 0
    rows: int = 0
    identity: tuple[str, ...] | None = None
    # A repair (``core.repair``): the repaired key ranges, ``(lo, hi)`` each (None: open).
    repair: tuple[tuple[tuple[Any, ...] | None, tuple[Any, ...] | None], ...] | None = None

    @property
    def started(self) -> bool:
        return self.key_columns is not None

    def start(
        self, schema: str, table: str, key: tuple[str, ...], max_key: RawKey,
        identity: tuple[str, ...] | None = None,
    ) -> TableJob:
        return dataclasses.replace(
            self, schema_name=schema, table_name=table, key_columns=key, max_key=max_key,
            identity=identity,
        )

    def advance(self, last_key: RawKey | None, emitted: int, *, chunk: bool = True) -> TableJob:
        """After a chunk (``chunk`` False: a slice of one, ``core.flight``): progress
        moves to ``last_key`` (unchanged for an empty chunk)."""
        return dataclasses.replace(
            self,
            last_key=self.last_key if last_key is None else last_key,
            chunks=self.chunks + chunk,
            rows=self.rows + emitted,
        )

    def reached_end(self, read: int, limit: int, last_key: RawKey | None) -> bool:
        """True when a chunk of ``limit`` that returned ``read`` rows ending at
        ``last_key`` was the table's last: ending at ``max_key``, or empty; for a primary
        key also short (a keyset page with ``LIMIT`` is short only at the range's end).

        A surrogate-key chunk is not a plain ``LIMIT`` page (MySQL reads the whole NULL
        group as one chunk; both sources extend a chunk to the end of its last group by a
        second SELECT, which concurrent deletes can make short), so its short read says
        nothing: the table ends only when the database returns no row of the remaining
        range ``last_key < key <= max_key`` (one more, empty chunk) or at ``max_key``."""
        if last_key is None:
            return True
        if self.max_key is not None and match_key(last_key) == match_key(self.max_key):
            return True
        if self.surrogate_key is not None:
            return read == 0
        return read < limit

    def fraction(self) -> float:
        """Rough share of the table done: ``last/max`` for a single numeric key, else 0."""
        if self.last_key is None or self.max_key is None or len(self.max_key) != 1:
            return 0.0
        last, top = self.last_key[0], self.max_key[0]
        if not _is_number(last) or not _is_number(top) or top <= 0:
            return 0.0
        return float(max(0.0, min(1.0, last / top)))

    def status(self) -> dict[str, Any]:
        """For ``SnapshotCore.status()``."""
        return {
            "table": self.table,
            "kind": self.kind.value,
            "signal_id": self.signal_id,
            "started": self.started,
            "last_key": json_key(self.last_key),
            "max_key": json_key(self.max_key),
            "chunks": self.chunks,
            "rows": self.rows,
            "percent": round(100.0 * self.fraction(), 1),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "signal_id": self.signal_id,
            "kind": self.kind.value,
            "condition": self.condition,
            "surrogate_key": self.surrogate_key,
            "schema_name": self.schema_name,
            "table_name": self.table_name,
            "key_columns": None if self.key_columns is None else list(self.key_columns),
            "max_key": None if self.max_key is None else list(self.max_key),
            "last_key": None if self.last_key is None else list(self.last_key),
            "chunks": self.chunks,
            "rows": self.rows,
            "identity": None if self.identity is None else list(self.identity),
            **({"repair": repair_json(self.repair)} if self.repair is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableJob:
        def tup(value: Any) -> tuple[Any, ...] | None:
            return None if value is None else tuple(value)

        return cls(
            table=data["table"],
            signal_id=data["signal_id"],
            kind=SnapshotKind(data["kind"]),
            condition=data.get("condition"),
            surrogate_key=data.get("surrogate_key"),
            schema_name=data.get("schema_name", ""),
            table_name=data.get("table_name", ""),
            key_columns=tup(data.get("key_columns")),
            max_key=tup(data.get("max_key")),
            last_key=tup(data.get("last_key")),
            chunks=int(data.get("chunks", 0)),
            rows=int(data.get("rows", 0)),
            identity=tup(data.get("identity")),
            repair=repair_from_json(data.get("repair")),
        )


RepairRanges = tuple[tuple[tuple[Any, ...] | None, tuple[Any, ...] | None], ...]


def repair_json(ranges: RepairRanges) -> list[dict[str, Any]]:
    return [{"lo": json_key(lo), "hi": json_key(hi)} for lo, hi in ranges]


def repair_from_json(data: Any) -> RepairRanges | None:
    if data is None:
        return None
    return tuple(
        (None if r.get("lo") is None else tuple(r["lo"]), None if r.get("hi") is None else tuple(r["hi"]))
        for r in data
    )


def json_key(key: RawKey | None) -> list[Any] | None:
    return None if key is None else list(key)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Lane:
    """A FIFO of table jobs of one kind; ``current`` is the one being read, ``also`` the
    tables read beside it (concurrent windows across tables, ``core.flight``: taken from
    the queue, in order, once every table before them had no more chunk to start).

    Invariants: a table appears at most once in ``current`` + ``also`` + ``queue``;
    ``also`` is empty while ``current`` is None (finishing ``current`` promotes
    ``also[0]``). ``to_json`` writes ``also`` at the head of the queue (same format as
    before ``also`` existed): a restart finds those jobs, with their progress, first in
    line, and reads them again from their ``last_key`` whatever the parallelism is.
    """

    __slots__ = ("also", "current", "queue")

    def __init__(self, current: TableJob | None = None, queue: Iterable[TableJob] = ()) -> None:
        self.current = current
        self.also: list[TableJob] = []
        self.queue: deque[TableJob] = deque(queue)

    def __bool__(self) -> bool:
        return self.current is not None or bool(self.queue)

    def tables(self) -> list[str]:
        return [j.table for j in self.running()] + [j.table for j in self.queue]

    def running(self) -> list[TableJob]:
        """``current`` and ``also``, in lane order."""
        head = [self.current] if self.current is not None else []
        return head + self.also

    def head(self) -> TableJob | None:
        """The job to work on: ``current``, else the next queued one (made current)."""
        if self.current is None and self.queue:
            self.current = self.queue.popleft()
        return self.current

    def take_next(self) -> TableJob | None:
        """Move the next queued job beside the running ones (``also``; made ``current``
        when nothing runs); returns it, or None when the queue is empty."""
        if not self.queue:
            return None
        if self.current is None:
            return self.head()
        job = self.queue.popleft()
        self.also.append(job)
        return job

    def job(self, table: str) -> TableJob | None:
        """The running job of ``table``, if any."""
        return next((j for j in self.running() if j.table == table), None)

    def put(self, job: TableJob) -> None:
        """Replace the running job of the same table by ``job``."""
        if self.current is not None and self.current.table == job.table:
            self.current = job
            return
        for i, j in enumerate(self.also):
            if j.table == job.table:
                self.also[i] = job
                return

    def finish(self, table: str) -> TableJob | None:
        """Remove the running job of ``table`` (``also[0]`` becomes current if it was the
        current one); returns it."""
        if self.current is not None and self.current.table == table:
            job = self.current
            self.current = self.also.pop(0) if self.also else None
            return job
        for i, j in enumerate(self.also):
            if j.table == table:
                return self.also.pop(i)
        return None

    def reset(self, table: str) -> None:
        """``table``'s job, running or queued, starts over (``TableJob`` as requested:
        the key, max key and progress described another relation)."""
        def fresh(j: TableJob) -> TableJob:
            if j.table != table or not j.started:
                return j
            return TableJob(j.table, j.signal_id, j.kind, j.condition, j.surrogate_key,
                            repair=j.repair)

        if self.current is not None:
            self.current = fresh(self.current)
        self.also = [fresh(j) for j in self.also]
        self.queue = deque(fresh(j) for j in self.queue)

    def drop(self, matches: Callable[[str], bool]) -> list[TableJob]:
        """Remove and return the jobs whose table ``matches``."""
        dropped = [j for j in self.running() if matches(j.table)]
        dropped += [j for j in self.queue if matches(j.table)]
        self.queue = deque(j for j in self.queue if not matches(j.table))
        for job in dropped:
            self.finish(job.table)
        return dropped

    def to_json(self) -> dict[str, Any]:
        return {
            "current": None if self.current is None else self.current.to_json(),
            "queue": [j.to_json() for j in (*self.also, *self.queue)],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Lane:
        if not data:
            return cls()
        current = data.get("current")
        return cls(
            TableJob.from_json(current) if current else None,
            [TableJob.from_json(j) for j in data.get("queue", [])],
        )
