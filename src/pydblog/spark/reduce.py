"""One micro-batch reduced to the net change per ``(table, key)``. IO-free.

Rules (the batch is taken in offset order, which per key is source commit order):
- the last event of a key wins: ``c``/``u``/``r`` make it an upsert of that event's
  ``after``, ``d`` a delete (also of keys the target never had);
- ``t`` (truncate) empties the table: every earlier event of that table in the batch
  is dropped and the sink must empty the target before applying the rest;
- ``n`` (notifications) and anything else are ignored;
- a column the source did not send (``unchanged``, unchanged TOAST) takes the value of
  the key's latest earlier event in the batch that had it; if there is none, it stays in
  ``unchanged`` and the sink keeps the target's current value.

After the reduce the keys of a table are distinct, so sinks may apply them in any order
and in parallel by key partition.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pydblog.events import UNCHANGED_TOAST

ROW_OPS = ("c", "u", "d", "r")
UPSERT = "u"
DELETE = "d"


@dataclass
class TableChanges:
    """The net change of one table in one batch. Row ``i`` is ``ops[i]`` (``u``
    upsert or ``d`` delete) of ``rows[i]`` (the full row for an upsert, the key columns
    for a delete), from the event at ``offsets[i]``; ``unchanged[i]`` lists columns whose
    target value must be kept; ``fresh[i]`` says the key's first event in the reduced
events is an insert (``c``): the source had no row of that key just before it. ``texts[i]`` is ``rows[i]`` as JSON text (what the log
    holds; the placeholders of kept columns replaced by null): ``rows`` is parsed from
    ``texts`` on first use, so a sink that converts the texts in bulk never builds the
    dicts."""

    schema: str
    table: str
    truncated: bool = False
    keys: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    unchanged: list[Sequence[str]] = field(default_factory=list)
    fresh: list[bool] = field(default_factory=list)
    _rows: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    @property
    def rows(self) -> list[dict[str, Any]]:
        if self._rows is None or len(self._rows) != len(self.texts):
            loads = orjson.loads
            self._rows = [loads(t) for t in self.texts]
        return self._rows

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def __len__(self) -> int:
        return len(self.ops)

    def has_unchanged(self) -> bool:
        return any(self.unchanged)

    def partition_of(self, i: int, parts: int) -> int:
        """A stable key partition (same on every run and machine)."""
        return zlib.crc32(self.keys[i].encode()) % parts


def _qualified(events: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(events["schema"], events["table"], ".")


def _drop_truncated(ev: pa.Table) -> tuple[pa.Table, set[str]]:
    """Events after the last truncate of their table; the truncated tables."""
    is_t = pc.equal(ev["op"], "t")
    if not pc.any(is_t).as_py():
        return ev, set()
    cut: dict[str, int] = {}
    trunc = ev.filter(is_t)
    for q, off in zip(trunc["_q"].to_pylist(), trunc["offset"].to_pylist(), strict=True):
        cut[q] = max(cut.get(q, -1), off)
    limits = pa.array([cut.get(q, -1) for q in ev["_q"].to_pylist()], type=pa.int64())
    keep = pc.and_(pc.greater(ev["offset"], limits), pc.invert(is_t))
    return ev.filter(keep), set(cut)


Pending = dict[tuple[str, str], tuple[dict[str, Any], list[str], TableChanges, int]]
"""Rows whose unchanged columns may be filled from earlier events of their key:
``(table, key) -> (row, missing columns, its TableChanges, its index there)``."""


def _fill_unchanged(rows: pa.Table, pending: Pending) -> None:
    """Fill ``pending[(table, key)]``'s unchanged columns from earlier events of that key
    (``rows`` in any order); what no earlier event has stays unchanged."""
    qk = pc.binary_join_element_wise(rows["_q"], rows["key"], "\x00")
    wanted = pa.array(["\x00".join(k) for k in pending], type=pa.string())
    earlier = rows.filter(pc.is_in(qk, value_set=wanted))
    if not _ascending(earlier["offset"]):
        earlier = earlier.sort_by("offset")
    history: dict[tuple[str, str], list[tuple[str, str | None, list[str] | None]]] = {}
    for q, k, op, after, unch in zip(
        earlier["_q"].to_pylist(),
        earlier["key"].to_pylist(),
        earlier["op"].to_pylist(),
        earlier["after"].to_pylist(),
        earlier["unchanged"].to_pylist(),
        strict=True,
    ):
        history.setdefault((q, k), []).append((op, after, unch))
    for qk_, (row, missing, tc, i) in pending.items():
        # The last entry is the event being filled itself.
        for op, after, unch in reversed(history.get(qk_, [])[:-1]):
            if op == "d" or not missing:
                break
            if after is None:
                continue
            prev = orjson.loads(after)
            for col in list(missing):
                if col not in (unch or ()) and col in prev and prev[col] != UNCHANGED_TOAST:
                    row[col] = prev[col]
                    missing.remove(col)
        tc.texts[i] = orjson.dumps(row).decode()


def _collect(tc: TableChanges, part: pa.Table, fresh: pa.Array, pending: Pending) -> None:
    """Append the last events of one table (``part``, in offset order; ``fresh``: per
    row whether its key's first event is an insert) to ``tc`` as net changes: an upsert
    keeps the event's ``after`` text, a delete the key's."""
    keys = part["key"].to_pylist()
    tc.fresh.extend(fresh.to_pylist())
    deleted = pc.fill_null(
        pc.or_(pc.equal(part["op"], DELETE), pc.is_null(part["after"])), True
    ).combine_chunks()
    base = len(tc.texts)
    tc.keys.extend(keys)
    tc.offsets.extend(part["offset"].to_pylist())
    tc.ops.extend(pc.if_else(deleted, DELETE, UPSERT).to_pylist())
    key_texts = pc.fill_null(part["key"], "{}")
    tc.texts.extend(pc.if_else(deleted, key_texts, part["after"]).to_pylist())
    tc.unchanged.extend([()] * len(keys))
    unch_col = part["unchanged"]
    if unch_col.null_count == len(unch_col):
        return
    some = pc.and_(
        pc.fill_null(pc.greater(pc.list_value_length(unch_col), 0), False), pc.invert(deleted)
    )
    for i in pc.indices_nonzero(some).to_pylist():
        key, unch = keys[i], unch_col[i].as_py()
        row = orjson.loads(tc.texts[base + i])
        missing = [c for c in unch if c in row]
        for c in missing:
            row[c] = None
        tc.unchanged[base + i] = missing or ()
        tc.texts[base + i] = orjson.dumps(row).decode()
        if missing:
            pending[(tc.qualified, key)] = (row, missing, tc, base + i)


def _table_codes(ev: pa.Table) -> tuple[pa.Array, list[tuple[str, str]]]:
    """A code per row for its qualified table name (equal names, equal codes) and the
    ``(schema, table)`` of every code, without building the names row by row: the
    schema and table columns are dictionary-encoded and only their few distinct pairs
    are joined."""
    schemas = pc.dictionary_encode(ev["schema"].combine_chunks())
    tables = pc.dictionary_encode(ev["table"].combine_chunks())
    width = len(tables.dictionary)
    pair = pc.add(
        pc.multiply(pc.cast(schemas.indices, pa.int64()), width),
        pc.cast(tables.indices, pa.int64()),
    )
    s_names, t_names = schemas.dictionary.to_pylist(), tables.dictionary.to_pylist()
    present = pc.unique(pair)  # only the pairs that occur (not every schema x table)
    code_of: dict[str, int] = {}
    names: list[tuple[str, str]] = []
    present_code: list[int] = []
    for p in present.to_pylist():
        schema, table = s_names[p // width], t_names[p % width]
        q = f"{schema}.{table}"
        if q not in code_of:
            code_of[q] = len(names)
            names.append((schema, table))
        present_code.append(code_of[q])
    where = pc.index_in(pair, value_set=present)
    return pc.take(pa.array(present_code, type=pa.int32()), where), names


_KEEP_OPS = pa.array([*ROW_OPS, "t"])


def reduce_events(events: pa.Table) -> dict[str, TableChanges]:
    """Reduce ``events`` (columns ``offset, op, schema, table, key, after, unchanged``
    of the ``dblog`` source, any order) to the net change per table and key."""
    keep = pc.is_in(events["op"], value_set=_KEEP_OPS)
    ev = events if pc.all(keep).as_py() else events.filter(keep)
    if ev.num_rows == 0:
        return {}
    out: dict[str, TableChanges] = {}
    if pc.any(pc.equal(ev["op"], "t")).as_py():
        ev = ev.append_column("_q", _qualified(ev))
        ev, truncated = _drop_truncated(ev)
        for q in truncated:
            schema, _, table = q.partition(".")
            out[q] = TableChanges(schema, table, truncated=True)
        ev = ev.drop_columns(["_q"])
        if ev.num_rows == 0:
            return out
    # The last event of each (table, key): the highest offset of its group (offsets are
    # unique), its rows taken in offset order, per table only the columns needed. The
    # batch itself need not be in offset order (a Kafka log's partitions interleave):
    # only the few last events are sorted, not every row of the batch.
    codes, names = _table_codes(ev)
    groups = pa.table({"q": codes, "key": ev["key"], "offset": ev["offset"]})
    last = groups.group_by(["q", "key"], use_threads=False).aggregate(
        [("offset", "max"), ("offset", "min")])
    idx = pc.indices_nonzero(pc.is_in(ev["offset"], value_set=last["offset_max"]))
    idx = pc.take(idx, pc.sort_indices(pc.take(ev["offset"], idx)))
    last_codes = pc.take(codes, idx)
    # Per last event: whether its key's first event (the group's lowest offset) is a "c".
    first_ops = pc.take(ev["op"], pc.index_in(last["offset_min"], value_set=ev["offset"]))
    group_fresh = pc.fill_null(pc.equal(first_ops, "c"), False)
    last_fresh = pc.take(group_fresh, pc.index_in(pc.take(ev["offset"], idx),
                                                  value_set=last["offset_max"]))
    needed = ev.select(["offset", "op", "key", "after", "unchanged"])
    pending: Pending = {}
    for code in pc.unique(last_codes).to_pylist():
        schema, table = names[code]
        q = f"{schema}.{table}"
        mine = pc.equal(last_codes, code)
        part = needed.take(pc.filter(idx, mine))
        tc = out.get(q)
        if tc is None:
            tc = out[q] = TableChanges(schema, table)
        _collect(tc, part, pc.filter(last_fresh, mine), pending)
    if pending:
        _fill_unchanged(ev.append_column("_q", _qualified(ev)), pending)
    return out


def _ascending(values: pa.ChunkedArray | pa.Array) -> bool:
    n = len(values)
    return n < 2 or bool(pc.all(pc.less(values.slice(0, n - 1), values.slice(1))).as_py())
