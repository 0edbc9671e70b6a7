"""Asking the running capture for a repair, and following it to its markers.

A repair is one ``execute-snapshot`` signal: for each table, ``additional-conditions``
restricts the rows read to the key ranges (the same ``ROW(key) > lo AND ROW(key) <= hi``
conditions as ``dblog verify`` reads them: ``COLLATE "C"`` for PostgreSQL text keys,
``CAST(key AS BINARY)`` for MySQL/MariaDB ones), and
``repair`` names the ranges (``core.repair``). The capture logs, per table, a range-end
marker (its TABLE_SCAN_COMPLETED notification); once each sink has applied past it,
the ranges are healed.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from pydblog.config import Config
from pydblog.errors import DblogError
from pydblog.ports import TableSchema
from pydblog.verifier.pg import PgTable
from pydblog.verifier.ranges import Range, show

if TYPE_CHECKING:  # needs the mysql extra
    from pydblog.verifier.mysql import MyTable


@dataclass
class RepairPlan:
    """The tables to repair: ``ranges[table]`` (``None``: the whole table)."""

    schemas: dict[str, TableSchema] = field(default_factory=dict)
    ranges: dict[str, list[Range] | None] = field(default_factory=dict)
    # tables without primary key, repaired whole: the column each one's snapshot chunks by
    chunk_by: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.ranges)


def _bound(b: tuple[Any, ...] | None) -> list[Any] | None:
    return None if b is None else [show(v) for v in b]


def range_filter(src: PgTable | MyTable, ranges: Sequence[Range]) -> str:
    """The SQL condition selecting the rows of ``ranges`` (for ``additional-conditions``)."""
    return " OR ".join(f"({src.cond_text(r.lo_text, r.hi_text)})" for r in ranges)


_PG_CHUNK_COLUMN = """
SELECT a.attname
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
  AND (t.typtype = 'e' OR t.typcategory = 'A' OR EXISTS (
       SELECT 1 FROM pg_opclass o JOIN pg_am m ON m.oid = o.opcmethod
       WHERE m.amname = 'btree' AND o.opcdefault
         AND o.opcintype = COALESCE(NULLIF(t.typbasetype, 0), a.atttypid)))
ORDER BY EXISTS (SELECT 1 FROM pg_index i
                 WHERE i.indrelid = a.attrelid AND i.indkey[0] = a.attnum) DESC,
         a.attnotnull DESC, a.attnum
LIMIT 1
"""

_MY_CHUNK_COLUMN = """
SELECT c.COLUMN_NAME
FROM information_schema.COLUMNS c
WHERE c.TABLE_SCHEMA = %s AND c.TABLE_NAME = %s
  AND c.DATA_TYPE NOT IN ('json', 'geometry', 'point', 'linestring', 'polygon', 'multipoint',
                          'multilinestring', 'multipolygon', 'geometrycollection',
                          'tinyblob', 'blob', 'mediumblob', 'longblob',
                          'tinytext', 'text', 'mediumtext', 'longtext')
ORDER BY EXISTS (SELECT 1 FROM information_schema.STATISTICS s
                 WHERE s.TABLE_SCHEMA = c.TABLE_SCHEMA AND s.TABLE_NAME = c.TABLE_NAME
                   AND s.COLUMN_NAME = c.COLUMN_NAME AND s.SEQ_IN_INDEX = 1) DESC,
         c.IS_NULLABLE = 'NO' DESC, c.ORDINAL_POSITION
LIMIT 1
"""


def chunk_column(src: PgTable | MyTable) -> str:
    """The column a repair of a table without primary key chunks by (its snapshot's
    ``surrogate-key``): one the database can order, the first of an index before
    others, a NOT NULL one before nullable ones, then the first in column order. Any
    such column reads every row exactly (a chunk extends to the end of its last value's
    group); an indexed, selective one reads faster. Raises ``DblogError`` when the table
    has none."""
    if isinstance(src, PgTable):
        row = src.conn.execute(_PG_CHUNK_COLUMN, (src.ident.as_string(src.conn),)).fetchone()
    else:
        with src.conn.cursor() as cur:
            cur.execute(_MY_CHUNK_COLUMN, (src.database, src.table))
            row = cur.fetchone()
    if row is None:
        raise DblogError(f"{src.name} has no primary key and no column to chunk a repair by",
                         hint="add a primary key, or repair it with `dblog snapshot --repair "
                              "--surrogate-key COLUMN`")
    return str(row[0])


def signals(cfg: Config, plan: RepairPlan) -> list[dict[str, Any]]:
    """The ``execute-snapshot`` data of each signal a repair sends: one for the tables
    with a key, one per table without (a ``surrogate-key`` holds for a whole signal)."""
    out = []
    keyed = RepairPlan(plan.schemas, {t: r for t, r in plan.ranges.items() if t not in plan.chunk_by})
    if keyed:
        out.append(signal_data(cfg, keyed))
    for table, column in sorted(plan.chunk_by.items()):
        pattern = re.escape(table)
        out.append({"data-collections": [pattern], "type": "incremental",
                    "surrogate-key": column,
                    "repair": [{"data-collection": pattern, "ranges": None}]})
    return out


def signal_data(cfg: Config, plan: RepairPlan) -> dict[str, Any]:
    """The ``execute-snapshot`` data of a repair of tables with a key."""
    data: dict[str, Any] = {"data-collections": [], "type": "incremental", "repair": []}
    conditions = []
    from pydblog.verifier.run import open_source, source_table

    conn = open_source(cfg)
    try:
        for table, ranges in sorted(plan.ranges.items()):
            pattern = re.escape(table)
            data["data-collections"].append(pattern)
            if ranges is None:
                data["repair"].append({"data-collection": pattern, "ranges": None})
                continue
            schema = plan.schemas[table]
            src = source_table(cfg, conn, schema)
            conditions.append({"data-collection": pattern, "filter": range_filter(src, ranges)})
            data["repair"].append({
                "data-collection": pattern,
                "ranges": [{"lo": _bound(r.lo), "hi": _bound(r.hi)} for r in ranges],
            })
    finally:
        conn.close()
    if conditions:
        data["additional-conditions"] = conditions
    return data


def send(cfg: Config, data: dict[str, Any]) -> str:
    """Send the repair signal; its id."""
    from pydblog.capture.signals import post_signal, send_signal, signals_go_direct

    signal_id = f"repair-{uuid.uuid4()}"
    if signals_go_direct(cfg):
        post_signal(cfg, signal_id, "execute-snapshot", data)
    else:
        send_signal(cfg, signal_id, "execute-snapshot", data)
    return signal_id


@dataclass
class RepairOutcome:
    signal_id: str
    markers: dict[str, int] = field(default_factory=dict)  # table -> marker offset
    failed: dict[str, str] = field(default_factory=dict)  # table -> why

    @property
    def end(self) -> int:
        """One past the last marker: a mirror that applied up to here is repaired."""
        return max(self.markers.values(), default=-1) + 1


def wait_markers(cfg: Config, signal_id: str, start: int, timeout_s: float,
                 on_table: Callable[[str], None] | None = None) -> RepairOutcome:
    """Follow the change log from ``start`` until every table of the repair has its
    range-end marker (or was rejected, skipped or aborted)."""
    from pydblog.changelog import open_reader

    out = RepairOutcome(signal_id)
    reader = open_reader(cfg.log)
    tables: set[str] | None = None
    offset = start
    deadline = time.monotonic() + timeout_s
    done = False
    try:
        while not done:
            recs = reader.read(offset, 10_000)
            for rec in recs:
                offset = rec.offset + 1
                if rec.op != "n":
                    continue
                body = orjson.loads(rec.body)
                note = body.get("notification") or {}
                if note.get("signal_id") != signal_id:
                    continue
                kind = note.get("type")
                data = note.get("additional_data") or {}
                table = f"{body['source']['schema']}.{body['source']['table']}"
                if kind == "STARTED":
                    tables = set(data.get("data_collections") or [])
                elif kind == "SKIPPED":
                    raise DblogError(f"the capture skipped repair {signal_id}: {data.get('reason')}")
                elif kind == "TABLE_SCAN_COMPLETED" and (body.get("after") or {}).get("repair"):
                    out.markers[table] = rec.offset
                    if on_table is not None:
                        on_table(table)
                elif kind in ("REJECTED", "ABORTED"):
                    out.failed[table or "*"] = str(data.get("reason") or kind.lower())
                    if not table:
                        done = True
            if tables is not None and tables <= set(out.markers) | set(out.failed):
                done = True
            if done:
                break
            if time.monotonic() > deadline:
                raise DblogError(
                    f"repair {signal_id}: no range-end marker after {timeout_s:.0f} s "
                    f"({len(out.markers)} of {len(tables or ())} tables)",
                    hint="is `dblog run` running? `dblog status` shows its snapshot",
                )
            if not recs:
                time.sleep(0.2)
    finally:
        reader.close()
    return out


def wait_applied(applied: Callable[[], int], end: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while applied() < end:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
