"""Range-end markers in a micro-batch (``core.repair``), for the sinks.

A repair's marker is a notification (``op: n``) whose ``after`` holds
``{"repair": {"key": [...], "ranges": [{"lo", "hi"}...], "keep": [[...]...]}}``.
``purges`` reads the batch's markers and, per table, returns what the sink deletes in
the target besides the batch's net change; it also turns the net change of keys a
marker removes into deletes (``core.repair.plan_purge``). Keys are compared as the
change log holds them (JSON values), in Python's order: numbers, and text by code point.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pydblog.core.repair import Key, RangeEnd, Scope, TargetDelete, freeze, plan_purge
from pydblog.spark.reduce import DELETE, TableChanges

T = TypeVar("T")


@dataclass
class TablePurge:
    """The target deletes of one table in one batch: rows whose ``key`` columns fall in
    a ``TargetDelete``'s range and are not among its spared keys."""

    key: list[str]
    deletes: list[TargetDelete] = field(default_factory=list)


def _markers(events: pa.Table, since: int) -> dict[str, tuple[list[str], list[RangeEnd]]]:
    sel = pc.and_(pc.equal(events["op"], "n"), pc.greater_equal(events["offset"], since))
    if not pc.any(sel).as_py():
        return {}
    notes = events.filter(sel).select(["offset", "schema", "table", "after"]).to_pylist()
    return range_ends((int(n["offset"]), n["schema"], n["table"], n["after"]) for n in notes)


def range_ends(
    notes: Iterable[tuple[int, str, str, str | None]],
) -> dict[str, tuple[list[str], list[RangeEnd]]]:
    """The range-end markers among notifications ``(offset, schema, table, after)``, per
    table: its key columns and its markers."""
    out: dict[str, tuple[list[str], list[RangeEnd]]] = {}
    for offset, schema, table, after in notes:
        if not after:
            continue
        rep = orjson.loads(after).get("repair")
        if not isinstance(rep, dict) or not rep.get("key"):
            continue
        q = f"{schema}.{table}"
        keep = frozenset(freeze(k) for k in rep.get("keep") or ())
        scope = scope_of(rep)
        _, ends = out.setdefault(q, (list(rep["key"]), []))
        for r in rep.get("ranges") or [{"lo": None, "hi": None}]:
            lo, hi = r.get("lo"), r.get("hi")
            ends.append(RangeEnd(q, int(offset), None if lo is None else freeze(lo),
                                 None if hi is None else freeze(hi), keep, scope))
    return out


def scope_of(rep: Mapping[str, Any]) -> Scope:
    """A marker's scope (``repair.scope``: the identity of a merged target's part)."""
    return tuple(sorted((str(k), str(v)) for k, v in (rep.get("scope") or {}).items()))


def plan_table(key: list[str], ends: list[RangeEnd],
               net: Iterable[tuple[str | None, int, T]]) -> tuple[list[TargetDelete], list[T]]:
    """``plan_purge`` of one table's markers, each scope with its part's keys: ``net``
    is the batch's net change as ``(key text, offset, payload)``; returns the target
    deletes and the payloads of the keys whose net change becomes a delete."""
    objs = [(orjson.loads(text) if text else {}, offset, payload) for text, offset, payload in net]
    deletes: list[TargetDelete] = []
    dropped: list[T] = []
    for scope in sorted({e.scope for e in ends}):
        last: dict[Key, int] = {}
        which: dict[Key, T] = {}
        for obj, offset, payload in objs:
            if (isinstance(obj, dict) and all(k in obj for k in key)
                    and all(str(obj.get(c)) == v for c, v in scope)):
                k = freeze(obj[c] for c in key)
                last[k] = offset
                which[k] = payload
        plan = plan_purge([e for e in ends if e.scope == scope], last, _less)
        deletes.extend(plan.ranges)
        dropped.extend(which[k] for k in plan.dropped)
    return deletes, dropped


def purges(events: pa.Table, since: int, changes: dict[str, TableChanges]) -> dict[str, TablePurge]:
    """The batch's target deletes per table; the net changes of ``changes`` (the reduce
    of the same events from ``since``) that a marker removes become deletes."""
    out: dict[str, TablePurge] = {}
    for q, (key, ends) in _markers(events, since).items():
        ch = changes.get(q)
        net = [] if ch is None else [(t, ch.offsets[i], i) for i, t in enumerate(ch.keys)]
        deletes, dropped = plan_table(key, ends, net)
        for i in dropped:
            if ch is not None and ch.ops[i] != DELETE:
                ch.ops[i] = DELETE
                ch.unchanged[i] = []
        out[q] = TablePurge(key, deletes)
    return out


def _less(a: Key, b: Key) -> bool:
    try:
        return bool(a < b)
    except TypeError:  # a key not comparable with the bounds: never in a range
        return False


def pg_purge(conn: Any, schema: str, table: str, purge: TablePurge,
             value: Callable[[Any, str], Any] = lambda v, _t: _text(v)) -> int:
    """Apply ``purge`` to the PostgreSQL table ``schema.table`` inside the caller's
    transaction: delete its rows of each range (``ROW(key) > lo AND ROW(key) <= hi``,
    text keys compared ``COLLATE "C"``, bounds cast to the column types) whose key is
    not spared. A table without primary key (a whole-row identity that may hold NULLs)
    matches its spared rows null-safely, by their record texts, as the sink applies
    such tables. ``value(v, sql_type)`` turns a logged key value into what COPY takes.
    Returns the rows deleted."""
    from psycopg import sql

    cols = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typcollation <> 0 "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
        (sql.Identifier(schema, table).as_string(conn),),
    ).fetchall()
    types = {c[0]: (str(c[1]), bool(c[2])) for c in cols}
    if not types or any(k not in types for k in purge.key):
        return 0  # no such table (yet): nothing to delete
    target = sql.Identifier(schema, table)
    spare = sql.Identifier("_dblog_spare")
    keyed = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = to_regclass(%s) AND indisprimary)",
        (target.as_string(conn),),
    ).fetchone()[0]

    def col(name: str, alias: str) -> sql.Composable:
        ident = sql.SQL(alias + ".{}").format(sql.Identifier(name))
        return sql.SQL('{} COLLATE "C"').format(ident) if types[name][1] else ident

    def bound(name: str) -> sql.Composable:
        typ, collatable = types[name]
        cast = sql.SQL("CAST(%s::text AS {})").format(sql.SQL(typ))
        return sql.SQL('{} COLLATE "C"').format(cast) if collatable else cast

    keys = sql.SQL(", ").join(col(k, "t") for k in purge.key)
    bounds = sql.SQL(", ").join(bound(k) for k in purge.key)
    if keyed:
        match = sql.SQL(" AND ").join(
            sql.SQL("s.{k} = t.{k}").format(k=sql.Identifier(k)) for k in purge.key
        )
    else:
        match = sql.SQL("ROW({})::text = ROW({})::text").format(
            sql.SQL(", ").join(sql.SQL("s.{}").format(sql.Identifier(k)) for k in purge.key),
            sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(k)) for k in purge.key),
        )
    deleted = 0
    for d in purge.deletes:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(spare))
        conn.execute(
            sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DROP").format(
                spare,
                sql.SQL(", ").join(
                    sql.SQL("{} {}").format(sql.Identifier(k), sql.SQL(types[k][0])) for k in purge.key
                ),
            )
        )
        if d.spare:
            with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(spare)) as copy:
                for k in d.spare:
                    copy.write_row([None if v is None else value(_thaw_sql(v, types[c][0]), types[c][0])
                                    for c, v in zip(purge.key, k, strict=True)])
        where: list[sql.Composable] = []
        params: list[Any] = []
        if d.lo is not None:
            where.append(sql.SQL("ROW({}) > ROW({})").format(keys, bounds))
            params.extend(_text(v) for v in d.lo)
        if d.hi is not None:
            where.append(sql.SQL("ROW({}) <= ROW({})").format(keys, bounds))
            params.extend(_text(v) for v in d.hi)
        for c, v in d.scope:  # a merged target: only the rows of the marker's part
            where.append(sql.SQL("t.{} = %s").format(sql.Identifier(c)))
            params.append(v)
        where.append(sql.SQL("NOT EXISTS (SELECT 1 FROM {} s WHERE {})").format(spare, match))
        cur = conn.execute(
            sql.SQL("DELETE FROM {} t WHERE {}").format(target, sql.SQL(" AND ").join(where)),
            params,
        )
        deleted += cur.rowcount
    return deleted


def _thaw_sql(v: Any, sql_type: str) -> Any:
    """A frozen key value (``core.repair.freeze``) of an array column back to its list
    (JSON columns take the JSON text as it is)."""
    if isinstance(v, str) and sql_type.endswith("[]") and v.startswith("["):
        return orjson.loads(v)
    return v


def _thaw(logical: str, v: Any) -> Any:
    """A frozen key value of a JSON or array column back to its JSON value."""
    lg = logical.lower()
    if isinstance(v, str) and (lg == "json" or lg.startswith("array")):
        return orjson.loads(v)
    return v


def _logged(logical: str, v: Any) -> Any:
    """A normalized key value (``verifier.ranges.value``, frozen) as the change log
    writes it, so a sink's typed rows read it back to the target's value: bytes as
    base64, JSON and arrays as their JSON values, the rest as ``show`` prints them."""
    from pydblog.verifier.ranges import show

    if isinstance(v, bytes | bytearray):
        return base64.b64encode(v).decode()
    return show(_thaw(logical, v))


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    return orjson.dumps(v).decode() if isinstance(v, dict | list) else str(v)


@dataclass
class SparkPurge:
    """What a batch's markers make a sink do for one table (``core.repair.plan_purge``
    over the batch's reduced keys): ``deletes`` (target ranges minus their spared keys),
    ``dropped`` (key texts whose net change becomes a delete) and ``keys`` (the key
    text of every row of the table's net change)."""

    key: list[str]
    deletes: list[TargetDelete]
    dropped: list[str]
    keys: set[str]


def spark_purges(batch: Any, since: Mapping[str, int], floor: int = -1) -> dict[str, SparkPurge]:
    """The purges of ``batch`` (a ``plan.SparkBatch``) per table, from its markers of
    offset ``>= since[table]`` and ``>= floor``; the net change is ``batch.reduced(since)``
    (only the few rows of the marked tables reach the driver: key and offset)."""
    notes = [m for m in batch.markers
             if m[0] >= max(floor, since.get(f"{m[1]}.{m[2]}", -1))]
    ends = range_ends(notes)
    if not ends:
        return {}
    from pyspark.sql import functions as F

    red = batch.reduced(since)
    cond = None
    for q in ends:
        s, _, t = q.partition(".")
        c = (F.col("schema") == s) & (F.col("table") == t)
        cond = c if cond is None else cond | c
    net: dict[str, list[tuple[str | None, int, str]]] = {q: [] for q in ends}
    for r in red.where(cond).select("schema", "table", "key", "offset").collect():
        net[f"{r['schema']}.{r['table']}"].append((r["key"], int(r["offset"]), r["key"]))
    out: dict[str, SparkPurge] = {}
    for q, (key, table_ends) in ends.items():
        deletes, dropped = plan_table(key, table_ends, net[q])
        out[q] = SparkPurge(key, deletes, sorted(dropped), {t for t, _, _ in net[q] if t})
    return out


def target_columns(purge: SparkPurge, schema: Any) -> list[str]:
    """The target's columns ``target_deletes`` needs of each row: its key, the
    marker's key and the identity columns of the markers' scopes."""
    out = dict.fromkeys(list(schema.key) or [c.name for c in schema.columns])
    out.update(dict.fromkeys(purge.key))
    for d in purge.deletes:
        out.update(dict.fromkeys(c for c, _ in d.scope))
    return list(out)


def target_deletes(purge: SparkPurge, schema: Any, target_keys: list[dict[str, Any]]) -> list[str]:
    """The key texts (as the sinks' typed rows read them) of the target rows ``purge``
    deletes: of the delete's scope, in a range, not spared, and not a key of the
    batch's net change (those are the MERGE's own rows). Rows are the target's
    (``target_columns``); keys are compared after normalization by logical type
    (``verifier.ranges.value``)."""
    from pydblog.verifier.ranges import value

    logical = {c.name: c.logical for c in schema.columns}
    tkey = list(schema.key) or [c.name for c in schema.columns]

    def norm(cols: Sequence[str], k: Iterable[Any]) -> Key:
        return freeze(value(logical.get(c, "string"), _thaw(logical.get(c, "string"), v))
                      for c, v in zip(cols, k, strict=True))

    batch_keys = set()
    for text in purge.keys:
        obj = orjson.loads(text) if text else {}
        if isinstance(obj, dict) and all(c in obj for c in tkey):
            batch_keys.add(norm(tkey, (obj[c] for c in tkey)))
    out: dict[Key, str] = {}
    for d in purge.deletes:
        end = RangeEnd("", 0, None if d.lo is None else norm(purge.key, d.lo),
                       None if d.hi is None else norm(purge.key, d.hi))
        spare = {norm(purge.key, k) for k in d.spare}
        for row in target_keys:
            if any(str(row.get(c)) != v for c, v in d.scope):
                continue
            k = norm(purge.key, (row.get(c) for c in purge.key))
            t = norm(tkey, (row.get(c) for c in tkey))
            if k in spare or t in batch_keys or t in out or not end.holds(k, _less):
                continue
            out[t] = orjson.dumps({c: _logged(logical.get(c, "string"), v)
                                   for c, v in zip(tkey, t, strict=True)}).decode()
    return list(out.values())
