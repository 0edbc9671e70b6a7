"""The driver's side of a sync of several sources (``[[sync.sources]]``): one routing
decision, one schema per target and one set of watermarks for all the sources' queries.

Each source has its own streaming query (its own checkpoint, its own ``dblog`` source)
and its own ``BatchApplier``; they share a ``Drain``, which

- maps source tables to targets with one ``core.drainer.Router`` (so two sources'
  unrouted tables of the same name are refused, ``RouteCollision``);
- gives every target its schema: the union (``core.drainer.union_schema``) of the
  recorded schemas of every source table routed to it, from every source, checked
  before any sink applies a batch (``SchemaConflict`` names the column and the tables);
- keeps each source's progress time and their minimum ``T`` (``Watermarks``), and with
  ``consistent = true`` the rounds' last complete cut (``spark.rounds``: the planners
  keep the rounds' state in a file of the status directory; the driver reads it);
- serializes the sinks: one batch of one source is applied at a time (Delta's
  application-transaction confs are the Spark session's, and two MERGEs into one
  merged table would conflict).

Invariant: a source's progress time never passes what its applied events prove: the
commit time of the first unapplied event minus one (commit times are in log order, and
a batch may end inside a transaction), or, once the whole log is applied, the newest
applied commit time minus one (a commit logged later may share it) or the time the
capture last checkpointed with no transaction open (its heartbeat; for a source
stamping whole seconds, MySQL/MariaDB, the end of the second before it).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from pydblog.changelog import open_reader
from pydblog.config import LogConfig, SyncRouteConfig, SyncSourceConfig
from pydblog.core.drainer import (
    Rounds,
    Route,
    Router,
    SchemaConflict,
    Target,
    Watermarks,
    union_schema,
)
from pydblog.ports import TableSchema
from pydblog.spark.typemap import merge_schemas

log = logging.getLogger("pydblog.sync")

WATERMARKS_FILE = "sync-watermarks.json"
"""In the ``[log] path`` of the sync's config: the sources' progress times and ``T``
(``dblog status`` shows them)."""


def _routes(routes: Sequence[SyncRouteConfig]) -> list[Route]:
    return [Route.parse(r.tables, r.target, r.key, r.sources) for r in routes]


class Drain:
    def __init__(self, sources: Sequence[SyncSourceConfig], routes: Sequence[SyncRouteConfig],
                 status_dir: str | Path | None = None) -> None:
        self.sources = {s.name: s for s in sources}
        self.route_configs = list(routes)
        self.router = Router(_routes(routes))
        self.watermarks = Watermarks(list(self.sources))
        self.lock = threading.Lock()
        self.flushed: dict[str, int | None] = {}  # the marks last written to every sink
        self.flushed_cut: int | None = None  # ... and the rounds' cut
        self._schemas: dict[str, list[tuple[int, TableSchema]]] = {}
        self._db: dict[str, str] = {}
        self._state_lock = threading.Lock()
        self.status_dir = None if status_dir is None else Path(status_dir)
        self.status_path = None if status_dir is None else Path(status_dir) / WATERMARKS_FILE
        self.cap: int | None = None  # --available-now with consistent = true: no round past it
        self.rounds: Rounds | None = None  # the last state read (consistent = true)
        self.consistent = False  # [sync] consistent: the rounds' cut is reported

    def route_option(self, source: str) -> str | None:
        """The ``route`` option of a source's query (None without routes)."""
        if not self.route_configs:
            return None
        from pydblog.spark.merge import route_spec

        return route_spec(source, [r.model_dump() for r in self.route_configs])

    def bound_option(self, source: str) -> str:
        """The ``bound`` option of a source's query with ``consistent = true``: the
        rounds' state file (in the status directory), every source's ``[log]``, the cap."""
        from pydblog.spark.rounds import bound_spec

        if self.status_dir is None:
            raise ValueError("consistent = true needs the sync's status directory")
        return bound_spec(self.status_dir, source,
                          {n: s.log.model_dump_json() for n, s in self.sources.items()},
                          self.cap)

    def rounds_path(self) -> Path | None:
        from pydblog.spark.rounds import ROUNDS_FILE

        return None if self.status_dir is None else self.status_dir / ROUNDS_FILE

    def read_rounds(self) -> Rounds | None:
        """The rounds' state as the planners left it (None without a state file)."""
        from pydblog.spark.rounds import read_state

        path = self.rounds_path()
        if path is None or not path.exists():
            return None
        try:
            return read_state(path)
        except (OSError, ValueError) as exc:
            log.debug("cannot read %s: %s", path, exc)
            return None

    def cut_ms(self) -> int | None:
        """``consistent = true``: the rounds' last complete cut as the planners left it
        (read now); None otherwise or before the first round ended."""
        if not self.consistent:
            return None
        self.poll_rounds()
        with self._state_lock:
            return None if self.rounds is None else self.rounds.cut

    def poll_rounds(self) -> None:
        """Publish the rounds' last complete cut when the planners moved it."""
        state = self.read_rounds()
        if state is None or state == self.rounds:
            return
        with self._state_lock:
            self.rounds = state
        self._publish()

    # -- schemas ---------------------------------------------------------------------
    def set_schemas(self, source: str, schemas: list[tuple[int, TableSchema]]) -> None:
        with self._state_lock:
            self._schemas[source] = schemas

    def _schemas_of(self, source: str) -> list[tuple[int, TableSchema]]:
        with self._state_lock:
            have = self._schemas.get(source)
        if have is None:
            have = read_schemas(self.sources[source].log)
            self.set_schemas(source, have)
        return have

    def db(self, source: str) -> str:
        """The database a source's capture reads (its events' ``source.db``)."""
        found = self._db.get(source)
        if found is None:
            found = first_db(self.sources[source].log)
            if found is None:
                return ""
            self._db[source] = found
        return found

    def target(self, source: str, s: TableSchema) -> Target:
        return self.router.target(source, self.db(source), s.schema, s.table)

    def target_schemas(self, source: str, end: int) -> dict[str, tuple[TableSchema, Target]]:
        """Every target's schema as ``source``'s batch ending at ``end`` needs it: the
        tables of ``source`` (schemas recorded below ``end``) and of every other source
        (all recorded), routed; merged targets get the union of their parts. Raises
        ``RouteCollision``/``SchemaConflict`` before anything is applied."""
        parts: dict[str, dict[str, TableSchema]] = {}
        targets: dict[str, Target] = {}
        own: dict[str, TableSchema] = {}
        for name in self.sources:
            tables: dict[str, TableSchema] = {}
            for from_offset, s in self._schemas_of(name):
                if name == source and from_offset >= end:
                    continue
                tables[s.qualified] = merge_schemas(tables.get(s.qualified), s)
            for q, s in tables.items():
                t = self.target(name, s)
                targets[t.qualified] = t
                parts.setdefault(t.qualified, {})[f"{name}/{self.db(name)}/{q}"] = s
                if name == source:
                    own[t.qualified] = s
        out: dict[str, tuple[TableSchema, Target]] = {}
        for tq, t in targets.items():
            if not t.merged:
                if tq in own:
                    s = own[tq]
                    out[tq] = (TableSchema(t.schema, t.table, s.columns, s.key), t)
                continue
            try:
                out[tq] = (union_schema(t, parts[tq]), t)
            except SchemaConflict as exc:
                raise SchemaConflict(exc.message + " (nothing of this batch was applied)",
                                     hint=exc.hint) from None
        return out

    # -- watermarks ------------------------------------------------------------------
    def advance(self, source: str, time_ms: int | None) -> None:
        if time_ms is None:
            return
        with self._state_lock:
            self.watermarks.advance(source, time_ms)
        self._publish()

    def marks(self) -> dict[str, int | None]:
        with self._state_lock:
            return {s: self.watermarks.time(s) for s in self.sources}

    def status(self) -> dict[str, Any]:
        with self._state_lock:
            w = self.watermarks
            out: dict[str, Any] = {
                "sources": {s: w.time(s) for s in self.sources},
                "low_ms": w.low,
                "lag_ms": w.lag_ms(),
                "holding_back": w.holding_back(),
                "updated_ms": int(time.time() * 1000),
            }
            r = self.rounds
            if r is not None:  # consistent = true
                out["cut_ms"] = r.cut
                out["round"] = {"round": r.round, "t_ms": r.t,
                                "waiting_for": sorted(set(self.sources) - r.done)}
            return out

    def _publish(self) -> None:
        from pydblog.api.sync import SYNC

        st = self.status()
        SYNC.observe_watermarks(st["sources"], st["low_ms"], st["holding_back"],
                                st.get("cut_ms"))
        if self.status_path is not None:
            try:
                self.status_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.status_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(st))
                tmp.replace(self.status_path)
            except OSError as exc:
                log.debug("cannot write %s: %s", self.status_path, exc)

    def progress_after(self, source: str, end: int, newest_ms: int | None) -> int | None:
        """What ``source``'s applied events up to ``end`` prove (module docstring)."""
        reader = open_reader(self.sources[source].log)
        try:
            nxt = reader.read(end, 1)
            if nxt:  # everything committed before the first unapplied event is applied
                return int(nxt[0].ts_ms) - 1
            # a transaction logged later may commit in the same millisecond (second, on
            # MySQL/MariaDB) as the newest applied one, or the newest may go on (the
            # capture's checkpoint inside it): complete only up to just before it
            best = None if newest_ms is None else newest_ms - 1
            return _most(best, heartbeat_ms(reader, end))
        finally:
            reader.close()


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def heartbeat_ms(reader: Any, end: int) -> int | None:
    """When the capture last checkpointed outside a transaction, if that checkpoint
    covers nothing at or after ``end`` (the embedded log's checkpoint time); None when
    unknown (a Kafka log), mid-transaction, or events were logged since ``end``."""
    fn = getattr(reader, "heartbeat", None)
    hb = None if fn is None else fn()
    if hb is None or hb[1] > end:
        return None
    return int(hb[0])


def read_schemas(log_cfg: LogConfig) -> list[tuple[int, TableSchema]]:
    reader = open_reader(log_cfg)
    try:
        return reader.schemas()
    finally:
        reader.close()


def first_db(log_cfg: LogConfig) -> str | None:
    """The ``source.db`` of the change log's first event (None: no event yet)."""
    reader = open_reader(log_cfg)
    try:
        recs = reader.read(reader.first_offset(), 1)
        if not recs:
            return None
        src = orjson.loads(recs[0].body).get("source") or {}
        return str(src.get("db") or "")
    finally:
        reader.close()
