"""What the stream decoder knows of each relation: names, converters, key columns.

Built from pgoutput Relation messages (which arrive before a relation's first change
in a session and after every change of its columns) plus the catalog's primary key.
The envelope ``key`` is the table's row identity (``identity_columns``, the one
definition the snapshot reader uses too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

import orjson

from pydblog.events import EncodedRow
from pydblog.ports import ColumnSchema, TableSchema
from pydblog.sources.postgres.pgoutput import Relation, ReplicaIdentity
from pydblog.sources.postgres.types import TypeRegistry

Converter = Callable[[str], Any]


def compile_row(names: tuple[str, ...], converters: tuple[Converter, ...]) -> Callable[[Any], dict[str, Any]]:
    """A function mapping a pgoutput tuple to a row dict, generated once per relation.

    It is the innermost loop of capture: one dict display with each column's converter
    bound as a local is about twice as fast as a comprehension over ``zip``. Values that
    are not text (NULL, unchanged TOAST) pass through unconverted.
    """
    env: dict[str, Any] = {f"c{i}": c for i, c in enumerate(converters)}
    env["_str"] = str
    items = ", ".join(
        f"{n!r}: (c{i}(v[{i}]) if v[{i}].__class__ is _str else v[{i}])" for i, n in enumerate(names)
    )
    args = ", ".join(f"c{i}=c{i}" for i in range(len(converters)))
    src = f"def row(v, {args}{', ' if args else ''}_str=_str):\n    return {{{items}}}\n"
    exec(compile(src, "<pydblog-row>", "exec"), env)  # names are repr()-quoted: no injection
    fn: Callable[[Any], dict[str, Any]] = env["row"]
    return fn


def compile_encoder(
    names: tuple[str, ...],
    fragments: tuple[tuple[str, Converter], ...],
    chunk_key: tuple[int, ...],
    identity: tuple[int, ...],
) -> Callable[[Any], EncodedRow]:
    """A function from a row of text values (``None`` for NULL) to an ``EncodedRow``,
    generated once per table and column list: the snapshot reader's innermost loop.

    ``fragments`` are ``TypeRegistry.fragment`` of each column; ``chunk_key`` and
    ``identity`` are column indexes. The row's JSON is byte for byte
    ``orjson.dumps(compile_row(names, converters)(values))`` (the JSON texts of the
    values joined in column order, no spaces), which the property tests check.
    """
    env: dict[str, Any] = {
        "_E": EncodedRow, "_new": tuple.__new__, "_esc": encode_basestring, "_dumps": orjson.dumps
    }
    n = len(names)
    lines = ["    " + "".join(f"a{i}, " for i in range(n)) + "= v"] if n else []
    for i, (how, conv) in enumerate(fragments):
        env[f"c{i}"] = conv
        a = f"a{i}"
        if how == "raw":
            expr = a
        elif how == "bool":
            expr = f"('true' if c{i}({a}) else 'false')"
        elif how == "quote":
            expr = f"'\"' + {a} + '\"'" if conv is str else f"'\"' + c{i}({a}) + '\"'"
        elif how == "escape":
            expr = f"_esc({a})" if conv is str else f"_esc(c{i}({a}))"
        else:
            expr = f"_dumps(c{i}({a})).decode()"
        lines.append(f"    x{i} = 'null' if {a} is None else {expr}")

    def literal(text: str) -> str:
        return text.replace("\\", "\\\\").replace("'", "\\'").replace("{", "{{").replace("}", "}}")

    def obj(indexes: tuple[int, ...]) -> str:
        if not indexes:
            return "'{}'"
        parts = [
            literal(("{" if k == 0 else ",") + encode_basestring(names[i]) + ":") + f"{{x{i}}}"
            for k, i in enumerate(indexes)
        ]
        return "f'" + "".join(parts) + "}}'"

    keys = []
    for i in chunk_key:
        keys.append(f"None if a{i} is None else c{i}(a{i}), ")
    # tuple.__new__ directly: a NamedTuple's own __new__ is a Python function (4x slower)
    row = f"({''.join(keys)}), {obj(identity)}, {obj(tuple(range(n)))}"
    lines.append(f"    return _new(_E, ({row}))")
    src = "def enc(v):\n" + "\n".join(lines) + "\n"
    exec(compile(src, "<pydblog-encoder>", "exec"), env)  # names escaped by literal(): no injection
    fn: Callable[[Any], EncodedRow] = env["enc"]
    return fn


TABLE_COLUMNS_SQL = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid,
       array_position(i.indkey::int2[], a.attnum),
       array_position(ri.indkey::int2[], a.attnum), c.relreplident::text, a.atttypmod
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
LEFT JOIN pg_index ri ON ri.indrelid = c.oid AND ri.indisreplident
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attgenerated = ''
ORDER BY a.attnum
"""
"""A table's published columns (generated ones are not published) in order, one row
each: name, type text, type oid, place in the primary key, place in the replica
identity index, the table's replica identity setting, type modifier."""

def identity_columns(
    names: tuple[str, ...], pk: tuple[str, ...], index: tuple[str, ...]
) -> tuple[str, ...]:
    """A PostgreSQL table's row identity (see ``ports.TableInfo``): the columns of its
    ``REPLICA IDENTITY USING INDEX`` index (``index``; also when there is a primary key,
    since UPDATE and DELETE then carry only those); else the primary key; else every
    column (``REPLICA IDENTITY FULL``; with ``DEFAULT`` and no primary key the log
    carries no old values and a table has nothing better)."""
    return index or pk or names


@dataclass(frozen=True, slots=True)
class RelationState:
    oid: int
    schema: str
    table: str
    qualified: str
    names: tuple[str, ...]
    converters: tuple[Converter, ...]
    key_idx: tuple[int, ...]
    full_identity: bool
    captured: bool
    table_schema: TableSchema
    row: Callable[[Any], dict[str, Any]]
    key_names: tuple[str, ...] = ()
    """``names[i] for i in key_idx``: the event key's columns, in order."""

    def key_of(self, values: tuple[Any, ...]) -> dict[str, Any]:
        names = self.names
        return {names[i]: values[i] for i in self.key_idx}


def build_relation(
    rel: Relation, types: TypeRegistry, pk: list[str] | None, captured: bool
) -> RelationState:
    names = tuple(c.name for c in rel.columns)
    index = (
        tuple(c.name for c in rel.columns if c.is_key)
        if rel.replica_identity == ReplicaIdentity.INDEX else ()
    )
    identity = identity_columns(names, tuple(k for k in pk or () if k in names), index)
    key_idx = tuple(names.index(k) for k in identity)
    schema = TableSchema(
        rel.namespace,
        rel.name,
        tuple(
            ColumnSchema(
                c.name,
                types.sql_type(c.type_oid, c.type_modifier),
                types.logical_type(c.type_oid),
                names[i] not in (pk or ()) and names[i] not in index,  # both NOT NULL
            )
            for i, c in enumerate(rel.columns)
        ),
        tuple(names[i] for i in key_idx),
    )
    return RelationState(
        oid=rel.oid,
        schema=rel.namespace,
        table=rel.name,
        qualified=f"{rel.namespace}.{rel.name}",
        names=names,
        converters=tuple(types.converter(c.type_oid) for c in rel.columns),
        key_idx=key_idx,
        full_identity=rel.replica_identity == ReplicaIdentity.FULL,
        captured=captured,
        table_schema=schema,
        row=compile_row(names, tuple(types.converter(c.type_oid) for c in rel.columns)),
        key_names=tuple(names[i] for i in key_idx),
    )
