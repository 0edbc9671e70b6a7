"""Many change logs, one set of targets: a source's decoded events routed to their
targets (``core.drainer``), in the executors, before the batch is packed.

Every event of a source table that a ``[[sync.routes]]`` entry merges is rewritten to
look like an event of its target table: ``schema``/``table`` name the target, ``after``
(and, with ``key = "source"``, ``key``) gain the identity columns ``_dblog_source``,
``_dblog_db`` and ``_dblog_schema``. Everything after this step (the batch's summary,
the reduce, the sinks) then sees one ordinary table per target: a merged table's rows
of two shards have different keys, so they never meet in the reduce or in a sink.

Invariants:
- Deterministic: the same events always give the same rewritten events (a replayed
  batch is the same batch), and the number and order of events never change (the
  dense-offset checks still hold).
- A table no route matches keeps its name and its events are untouched.
- A merged table's notifications lose their payload (``after``), except a repair's
  range-end marker when the route keeps the identity in the key (``key = "source"``):
  it gains ``repair.scope``, the part's identity, so the sinks apply it to that part
  only (``core.repair``). With ``key = "row"`` a row's part cannot be told from its key,
  and the marker is dropped like any notification's payload.
- A merged table's truncate empties only its own part of the target: its ``key`` is the
  part's identity, ``{"_dblog_db", "_dblog_schema", "_dblog_source"}`` (``scope_of``),
  and ``after_prefix`` gives the text every row event of that part starts with.
- The source block's ``db`` is read from the envelope text without a JSON parse per
  event (the strict envelope form; any other body is parsed), and only when the
  source has routes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pydblog.core.drainer import DB_COLUMN, SCHEMA_COLUMN, SOURCE_COLUMN, KeyMode, Route, Router

_DB = r'"source":\{"connector":"(?:[^"\\]|\\.)*","db":"(?P<db>(?:[^"\\]|\\.)*)"'


def route_spec(source: str, routes: Sequence[dict[str, Any]]) -> str:
    """The ``route`` option of the ``dblog`` source: this source's name and the routes."""
    return json.dumps({"source": source, "routes": list(routes)})


def _router(spec: dict[str, Any]) -> Router:
    return Router([Route.parse(r["tables"], r["target"], r.get("key", "source"),
                               r.get("sources", ())) for r in spec.get("routes", ())])


def _source_dbs(bodies: pa.Array) -> pa.Array:
    """Per body the source block's ``db`` (JSON string content, escaped as stored);
    bodies not of the strict form are parsed."""
    db = pc.struct_field(pc.extract_regex(bodies, _DB), "db")
    missing = pc.is_null(db)
    if pc.any(missing).as_py():
        dbs = db.to_pylist()
        for i in pc.indices_nonzero(missing).to_pylist():
            src = orjson.loads(bodies[i].as_py()).get("source") or {}
            d = src.get("db")
            dbs[i] = None if d is None else json.dumps(str(d))[1:-1]
        db = pa.array(dbs, pa.string())
    return db


def _json_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _identity(source: str, db: str, schema: str) -> dict[str, str]:
    return {SOURCE_COLUMN: _json_str(source), DB_COLUMN: _json_str(db),
            SCHEMA_COLUMN: _json_str(schema)}


def after_prefix(scope: dict[str, str]) -> str:
    """The opening of every routed row event's ``after`` of the part ``scope`` (a
    truncate's ``key``, parsed), up to its identity members."""
    ident = _identity(scope[SOURCE_COLUMN], scope[DB_COLUMN], scope[SCHEMA_COLUMN])
    return "{" + ",".join(f'"{k}":{v}' for k, v in ident.items())


def scope_of(key_text: str) -> dict[str, str] | None:
    """The part a routed truncate empties (its ``key``), or None for any other key."""
    try:
        obj = orjson.loads(key_text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or set(obj) != {SOURCE_COLUMN, DB_COLUMN, SCHEMA_COLUMN}:
        return None
    return {k: str(v) for k, v in obj.items()}


def route_batch(batch: pa.RecordBatch, bodies: pa.Array, spec_json: str) -> pa.RecordBatch:
    """``batch`` (decoded columns of ``bodies``, same rows in the same order) with its
    merged tables' events rewritten for their targets (module docstring)."""
    spec = json.loads(spec_json)
    source = str(spec["source"])
    router = _router(spec)
    n = batch.num_rows
    if n == 0:
        return batch
    names = batch.schema.names
    cols = {name: batch.column(i) for i, name in enumerate(names)}
    if router.routes and "schema" in cols and "table" in cols:
        db_raw = _source_dbs(bodies)
        db_filled = pc.fill_null(db_raw, "")
        group = pc.binary_join_element_wise(db_filled, pc.fill_null(cols["schema"], ""),
                                            pc.fill_null(cols["table"], ""), "\x1f")
        uniq = pc.unique(group)
        idx = pc.index_in(group, value_set=uniq)
        t_schema: list[str | None] = []
        t_table: list[str | None] = []
        after_pre: list[str | None] = []
        key_pre: list[str | None] = []
        scopes: list[str | None] = []
        marker_scopes: list[str | None] = []  # the scope a repair marker keeps (key mode)
        for g in uniq.to_pylist():
            raw, schema, table = g.split("\x1f")
            db = json.loads(f'"{raw}"')
            target = None
            for route in router.routes:
                if route.matches(source, db, schema, table):
                    target = route
                    break
            if target is None:
                t_schema.append(None)
                t_table.append(None)
                after_pre.append(None)
                key_pre.append(None)
                scopes.append(None)
                marker_scopes.append(None)
                continue
            t_schema.append(target.target[0])
            t_table.append(target.target[1])
            ident = _identity(source, db, schema)
            after_pre.append("{" + ",".join(f'"{k}":{v}' for k, v in ident.items()))
            sorted_ident = ",".join(f'"{k}":{ident[k]}' for k in sorted(ident))
            key_pre.append("{" + sorted_ident if target.key is KeyMode.SOURCE else None)
            scopes.append("{" + sorted_ident + "}")
            marker_scopes.append(scopes[-1] if target.key is KeyMode.SOURCE else None)
        routed = pc.is_valid(pc.take(pa.array(t_schema, pa.string()), idx))
        if pc.any(routed).as_py():
            cols["schema"] = pc.coalesce(pc.take(pa.array(t_schema, pa.string()), idx), cols["schema"])
            cols["table"] = pc.coalesce(pc.take(pa.array(t_table, pa.string()), idx), cols["table"])
            notes = pc.and_(routed, pc.equal(cols["op"], "n")) if "op" in cols else None
            if "after" in cols:
                markers = (None if notes is None else
                           _scoped_markers(cols["after"], notes,
                                           pc.take(pa.array(marker_scopes, pa.string()), idx)))
                cols["after"] = _prefixed(cols["after"], pc.take(pa.array(after_pre, pa.string()), idx))
                if markers is not None:
                    cols["after"] = pc.if_else(notes, markers, cols["after"])
            if "key" in cols:
                cols["key"] = _prefixed(cols["key"], pc.take(pa.array(key_pre, pa.string()), idx))
                if "op" in cols:  # a truncate names the part it empties
                    truncates = pc.and_(routed, pc.equal(cols["op"], "t"))
                    if pc.any(truncates).as_py():
                        cols["key"] = pc.if_else(
                            truncates, pc.take(pa.array(scopes, pa.string()), idx), cols["key"])
    return pa.RecordBatch.from_arrays([cols[name] for name in names], schema=batch.schema)


def _scoped_markers(afters: pa.Array, notes: pa.Array, scopes: pa.Array) -> pa.Array:
    """Per row: for a routed notification (``notes``) that is a repair's range-end
    marker and has a scope, its ``after`` with ``repair.scope`` set; else null."""
    out: list[str | None] = [None] * len(afters)
    texts = pc.cast(afters, pa.string())
    for i in pc.indices_nonzero(pc.and_(notes, pc.is_valid(scopes))).to_pylist():
        text = texts[i].as_py()
        if not text or '"repair"' not in text:
            continue
        doc = orjson.loads(text)
        rep = doc.get("repair")
        if isinstance(rep, dict) and rep.get("key"):
            doc["repair"] = {**rep, "scope": orjson.loads(scopes[i].as_py())}
            out[i] = orjson.dumps(doc).decode()
    return pa.array(out, pa.string())


def _prefixed(texts: pa.Array, prefix: pa.Array) -> pa.Array:
    """Each JSON object text of ``texts`` with ``prefix`` (an object's opening and
    first members, null: unchanged) put in front of its members; null texts stay null."""
    texts = pc.cast(texts, pa.string())
    rest = pc.utf8_slice_codeunits(texts, 1)
    sep = pc.if_else(pc.starts_with(rest, "}"), pa.scalar(""), pa.scalar(","))
    joined = pc.binary_join_element_wise(prefix, sep, rest, "")
    return pc.if_else(pc.and_(pc.is_valid(prefix), pc.is_valid(texts)), joined, texts)
