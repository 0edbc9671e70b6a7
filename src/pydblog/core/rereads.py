"""Key-level re-reads: DBLog's "repair at the primary-key level" for values the log
did not carry.

PostgreSQL does not send a large (TOASTed) value an UPDATE left alone (with
``REPLICA IDENTITY DEFAULT`` / ``USING INDEX``); such an event lists the column in
``ChangeEvent.unchanged`` and a consumer keeps the value it has. Two kinds of events
leave a consumer that has *no* value for the row:

- a partial update inside a chunk's window: it drops that key's chunk row, and the only
  event left for the key carries the placeholder;
- the create half of a key-changing UPDATE (delete of the old identity + create of the
  new one): no consumer has seen the new identity.

For each, the core queues the row's identity here; the worker re-reads those keys as a
tiny chunk (``KeyReadRequest``) through the normal window: low watermark L, a SELECT of
exactly those rows, high watermark H, the same drop rules. The full rows land at H, after
the partial event, so materializing the log (keeping the previous value of every
``unchanged`` column) gives the table. A re-read row that is itself dropped by a partial
update in its window is queued again (until a full row lands, or a full event or a
delete makes it unneeded).

The queue is part of the core's persisted state: a key leaves it only when the H of the
re-read that covered it has been processed (``landed``), or when re-reads of its table
keep failing (``failed``: after ``max_attempts`` in a row, so a dropped table cannot
block snapshots forever), so a restart re-reads whatever was pending.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydblog.core.keys import MatchKey, match_key
from pydblog.events import ChangeEvent, Op

MAX_KEYS_PER_READ = 256
"""Keys of one table re-read by one request (a WHERE (identity) IN (...) list)."""


@dataclass(slots=True)
class _TableKeys:
    schema: str
    table: str
    identity: tuple[str, ...]
    keys: dict[MatchKey, tuple[Any, ...]] = field(default_factory=dict)  # insertion order


class RereadQueue:
    """Identities waiting for a re-read, per table, in the order they were queued.

    Invariant: a key is queued once per table (adding it again is a no-op) and leaves
    only through ``done`` (``landed``, or ``failed`` giving up). Consecutive failures
    are counted per table and are not persisted (a restart tries again)."""

    __slots__ = ("_failures", "_tables")

    def __init__(self) -> None:
        self._tables: dict[str, _TableKeys] = {}
        self._failures: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self._tables)

    def __len__(self) -> int:
        return sum(len(t.keys) for t in self._tables.values())

    def tables(self) -> set[str]:
        """The qualified names of the tables with keys queued."""
        return set(self._tables)

    def add(self, schema: str, table: str, ident: dict[str, Any]) -> None:
        """Queue the row whose identity (column -> value) is ``ident``."""
        if not ident:
            return
        qualified = f"{schema}.{table}"
        entry = self._tables.get(qualified)
        cols = tuple(ident)
        if entry is None or entry.identity != cols:
            if entry is not None and set(entry.identity) == set(cols):
                cols = entry.identity
            else:
                # First key of the table (or its identity changed: the old keys cannot
                # be read by the new columns, and the new identity is what events use).
                entry = self._tables[qualified] = _TableKeys(schema, table, cols)
        raw = tuple(ident[c] for c in entry.identity)
        entry.keys.setdefault(match_key(raw), raw)

    def add_all(self, schema: str, table: str, idents: Iterable[dict[str, Any]]) -> None:
        for ident in idents:
            self.add(schema, table, ident)

    def next_batch(self) -> tuple[str, str, tuple[str, ...], tuple[tuple[Any, ...], ...]] | None:
        """The first table's first keys: ``(schema, table, identity, keys)``."""
        for entry in self._tables.values():
            keys = tuple(list(entry.keys.values())[:MAX_KEYS_PER_READ])
            return entry.schema, entry.table, entry.identity, keys
        return None

    def done(self, schema: str, table: str, keys: Iterable[tuple[Any, ...]]) -> None:
        """These keys of the table were re-read (their H processed)."""
        qualified = f"{schema}.{table}"
        entry = self._tables.get(qualified)
        if entry is None:
            return
        for raw in keys:
            entry.keys.pop(match_key(raw), None)
        if not entry.keys:
            del self._tables[qualified]

    def note(self, event: ChangeEvent) -> bool:
        """A captured stream event: the create half of a key change that carries
        unchanged columns (no consumer has a value for them) queues its key. True if
        it did."""
        if event.unchanged and event.op is Op.CREATE and event.key:
            self.add(event.schema, event.table, event.key)
            return True
        return False

    def landed(
        self, schema: str, table: str, identity: tuple[str, ...],
        keys: Iterable[tuple[Any, ...]], reread: Iterable[dict[str, Any]],
        saw_partial: Callable[[dict[str, Any]], bool],
    ) -> None:
        """A re-read of ``keys`` closed conclusively (its rows are emitted): the keys
        leave the queue, except the rows its window dropped for a partial event
        (``reread``) and the keys it did not find that had one (``saw_partial``):
        those go back in."""
        keys = tuple(keys)
        self._failures.pop(f"{schema}.{table}", None)
        self.done(schema, table, keys)
        self.add_all(schema, table, reread)
        for key in keys:  # a partial event of a key the read did not find yet
            ident = dict(zip(identity, key, strict=True))
            if saw_partial(ident):
                self.add(schema, table, ident)

    def failed(
        self, schema: str, table: str, keys: Iterable[tuple[Any, ...]],
        retriable: bool | None, max_attempts: int,
    ) -> bool:
        """A re-read of ``keys`` failed: it is tried again unless the failure is fatal
        (``retriable`` False) or the table's re-reads failed ``max_attempts`` times in a
        row (``retriable`` None); then the keys leave the queue (returns True)."""
        qualified = f"{schema}.{table}"
        failures = self._failures[qualified] = self._failures.get(qualified, 0) + 1
        if retriable or (retriable is None and failures < max_attempts):
            return False
        self._failures.pop(qualified, None)
        self.done(schema, table, keys)
        return True

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {"schema": e.schema, "table": e.table, "identity": list(e.identity),
             "keys": [list(k) for k in e.keys.values()]}
            for e in self._tables.values()
        ]

    def load(self, data: list[dict[str, Any]] | None) -> None:
        """Replace the queue by a persisted one (``to_json``)."""
        self._tables.clear()
        self._failures.clear()
        for e in data or []:
            cols = tuple(e["identity"])
            for raw in e["keys"]:
                self.add(e["schema"], e["table"], dict(zip(cols, raw, strict=True)))

    @classmethod
    def from_json(cls, data: list[dict[str, Any]] | None) -> RereadQueue:
        queue = cls()
        queue.load(data)
        return queue
