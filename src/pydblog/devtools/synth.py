"""Synthetic change logs and their oracle, for the sync's tests and benchmark.

``SyntheticLoad`` plays a write load over three tables (inserts, updates, deletes,
snapshot rows, optional truncates, unchanged-TOAST updates and an added column) and
appends it to an embedded change log with the tables' schemas. ``materialize`` replays a
change log (invariant 2 of the architecture: c/u/r upsert ``after``, d delete, t empties
the table, unchanged columns keep their value): what every mirror must equal.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from pydblog.changelog import open_reader, open_writer
from pydblog.events import UNCHANGED_TOAST, ChangeEvent, Op, encode_event
from pydblog.ports import ChangeLogWriter, Checkpoint, ColumnSchema, TableSchema
from pydblog.positions import Lsn, PgPosition

if TYPE_CHECKING:
    from pydblog.config import LogConfig

Row = dict[str, Any]

ORDERS = TableSchema(
    "public",
    "orders",
    (
        ColumnSchema("id", "bigint", "int64", False),
        ColumnSchema("customer", "text", "string"),
        ColumnSchema("qty", "integer", "int32"),
        ColumnSchema("amount", "numeric(12,2)", "decimal"),
        ColumnSchema("paid", "boolean", "bool"),
        ColumnSchema("note", "text", "string"),
        ColumnSchema("updated_at", "timestamp with time zone", "timestamptz"),
    ),
    ("id",),
)
LINES = TableSchema(
    "public",
    "order_lines",
    (
        ColumnSchema("order_id", "bigint", "int64", False),
        ColumnSchema("line", "integer", "int32", False),
        ColumnSchema("price", "double precision", "float64"),
        ColumnSchema("tags", "jsonb", "json"),
    ),
    ("order_id", "line"),
)
ACCOUNTS = TableSchema(
    "shop",
    "accounts",
    (
        ColumnSchema("name", "text", "string", False),
        ColumnSchema("balance", "bigint", "int64"),
        ColumnSchema("opened", "date", "date"),
    ),
    ("name",),
)
EXTRA_COLUMN = ColumnSchema("rating", "smallint", "int16")
"""Added to ``orders`` mid-stream by ``add_column``."""


def key_json(key: Row) -> str:
    return orjson.dumps(key, option=orjson.OPT_SORT_KEYS).decode()


@dataclass
class SyntheticLoad:
    seed: int = 1
    update_share: float = 0.45
    delete_share: float = 0.15
    toast_share: float = 0.05
    schemas: dict[str, TableSchema] = field(
        default_factory=lambda: {s.qualified: s for s in (ORDERS, LINES, ACCOUNTS)}
    )
    state: dict[str, dict[str, Row]] = field(default_factory=dict)
    lsn: int = 1_000_000
    next_id: int = 1

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        for q in self.schemas:
            self.state.setdefault(q, {})
        self._keys: dict[str, list[str]] = {q: [] for q in self.schemas}

    # -- rows ------------------------------------------------------------------------
    def _row(self, schema: TableSchema, n: int) -> Row:
        rng = self.rng
        if schema.table == "orders":
            row: Row = {
                "id": n,
                "customer": f"c{rng.randrange(10_000)}",
                "qty": rng.randrange(1, 100),
                "amount": f"{rng.randrange(0, 10**7) / 100:.2f}",
                "paid": rng.random() < 0.5,
                "note": "x" * rng.randrange(0, 40) if rng.random() < 0.9 else None,
                "updated_at": f"2026-11-{rng.randrange(1, 29):02d}T{rng.randrange(24):02d}:"
                f"{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d}Z",
            }
            if any(c.name == EXTRA_COLUMN.name for c in schema.columns):
                row[EXTRA_COLUMN.name] = rng.randrange(1, 6)
            return row
        if schema.table == "order_lines":
            return {
                "order_id": n // 4,
                "line": n % 4,
                "price": round(rng.random() * 1000, 3),
                "tags": {"t": [rng.randrange(9) for _ in range(rng.randrange(3))]},
            }
        return {
            "name": f"acct-{n:07d}",
            "balance": rng.randrange(-(10**9), 10**9),
            "opened": f"20{rng.randrange(10, 27)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
        }

    def _event(
        self,
        op: Op,
        q: str,
        key: Row | None,
        before: Row | None,
        after: Row | None,
        unchanged: tuple[str, ...] = (),
    ) -> ChangeEvent:
        self.lsn += 1
        s = self.schemas[q]
        return ChangeEvent(
            op,
            s.schema,
            s.table,
            PgPosition(Lsn(self.lsn), 0, Lsn(self.lsn + 1), self.lsn),
            int(time.time() * 1000),
            key=key,
            before=before,
            after=after,
            unchanged=unchanged,
        )

    def _pick(self, q: str) -> str | None:
        keys = self._keys[q]
        while keys:
            i = self.rng.randrange(len(keys))
            k = keys[i]
            if k in self.state[q]:
                return k
            keys[i] = keys[-1]
            keys.pop()
        return None

    def next_event(self, snapshot: bool = False) -> ChangeEvent:
        rng = self.rng
        q = rng.choice(list(self.schemas))
        schema = self.schemas[q]
        r = rng.random()
        k = None if r >= self.update_share + self.delete_share else self._pick(q)
        if k is None or snapshot:
            n = self.next_id
            self.next_id += 1
            row = self._row(schema, n)
            key = {c: row[c] for c in schema.key}
            kj = key_json(key)
            if kj in self.state[q]:
                return self.next_event(snapshot)
            self.state[q][kj] = row
            self._keys[q].append(kj)
            return self._event(Op.READ if snapshot else Op.CREATE, q, key, None, row)
        old = self.state[q][k]
        key = orjson.loads(k)
        if r < self.delete_share:
            del self.state[q][k]
            return self._event(Op.DELETE, q, key, dict(key), None)
        row = {**self._row(schema, 0), **key}
        unchanged: tuple[str, ...] = ()
        if schema.table == "orders" and rng.random() < self.toast_share:
            unchanged = ("note",)
            row["note"] = UNCHANGED_TOAST
            self.state[q][k] = {**row, "note": old.get("note")}
        else:
            self.state[q][k] = row
        return self._event(Op.UPDATE, q, key, None, row, unchanged)

    def truncate(self, q: str) -> ChangeEvent:
        self.state[q].clear()
        self._keys[q].clear()
        return self._event(Op.TRUNCATE, q, None, None, None)

    def add_column(self) -> TableSchema:
        s = self.schemas[ORDERS.qualified]
        new = TableSchema(s.schema, s.table, (*s.columns, EXTRA_COLUMN), s.key)
        self.schemas[ORDERS.qualified] = new
        return new

    def events(self, n: int) -> Iterator[ChangeEvent]:
        for _ in range(n):
            yield self.next_event()


def _embedded(directory: str | Path) -> LogConfig:
    """The ``[log]`` of the embedded change log in ``directory``."""
    from pydblog.config import LogConfig

    return LogConfig(path=str(directory))


def append_events(
    log: ChangeLogWriter, events: list[ChangeEvent], schemas: list[TableSchema] | None = None
) -> int:
    now = int(time.time() * 1000)
    enc = [encode_event(e, "postgresql", "app", now) for e in events]
    return log.append(enc, Checkpoint(None), schemas or [])


def write_load(
    directory: str | Path, load: SyntheticLoad, n: int, chunk: int = 10_000, first: bool = True
) -> int:
    """Append ``n`` events of ``load`` (the schemas with the first chunk if ``first``) to
    the embedded change log in ``directory``; returns its next offset."""
    if n <= 0:
        reader = open_reader(_embedded(directory))
        try:
            return reader.next_offset()
        finally:
            reader.close()
    log = open_writer(_embedded(directory))
    try:
        done = 0
        end = 0
        while done < n:
            m = min(chunk, n - done)
            evs = list(load.events(m))
            end = append_events(log, evs, list(load.schemas.values()) if first else None)
            first = False
            done += m
        return end
    finally:
        log.close()


def materialize(directory: str | Path, end: int | None = None) -> dict[str, dict[str, Row]]:
    """The tables the change log in ``directory`` describes (events below ``end``):
    ``{"schema.table": {key_json: row}}``; unchanged columns keep the earlier value."""
    reader = open_reader(_embedded(directory))
    out: dict[str, dict[str, Row]] = {}
    try:
        stop = reader.next_offset() if end is None else end
        pos = reader.first_offset()
        while pos < stop:
            recs = reader.read(pos, min(stop, pos + 50_000) - pos)
            for rec in recs:
                env = orjson.loads(rec.body)
                op = env["op"]
                src = env["source"]
                q = f"{src['schema']}.{src['table']}"
                tbl = out.setdefault(q, {})
                if op == "t":
                    tbl.clear()
                elif op == "d":
                    tbl.pop(key_json(env["key"]), None)
                elif op in ("c", "u", "r"):
                    kj = key_json(env["key"])
                    row = dict(env["after"])
                    for col in env.get("unchanged", ()):
                        row[col] = tbl.get(kj, {}).get(col)
                    tbl[kj] = row
            pos += len(recs) if recs else stop - pos
    finally:
        reader.close()
    return out
