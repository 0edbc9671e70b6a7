"""Column types of the targets, derived from the change log's recorded ``TableSchema``.

- Delta: each column's *logical* type (docs/types.md) maps to an Arrow type; JSON
  values (as the envelope carries them) convert to that type. Types without an exact
  Arrow counterpart (json, arrays, intervals, bytea, ranges, unknown) are kept as the
  envelope's value: text as is, anything else as JSON text, so nothing is lost.
- PostgreSQL: the source's SQL type is used verbatim (``numeric(12,2)``, ``text[]``).

When a table has no recorded schema (a change log written without one), the schema is
inferred from the events' JSON values and the envelope key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from datetime import date, datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from pydblog.errors import SinkError
from pydblog.ports import ColumnSchema, TableSchema

_SIMPLE: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
    "int16": pa.int16(),
    "int2": pa.int16(),
    "smallint": pa.int16(),
    "int32": pa.int32(),
    "int4": pa.int32(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "int64": pa.int64(),
    "int8": pa.int64(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float32": pa.float32(),
    "float4": pa.float32(),
    "real": pa.float32(),
    "float64": pa.float64(),
    "float8": pa.float64(),
    "double": pa.float64(),
    "string": pa.string(),
    "text": pa.string(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
}

_NUMERIC = re.compile(r"^\s*(?:numeric|decimal)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)\s*$", re.I)

META_COLUMNS = ("_dblog_op", "_dblog_offset", "_dblog_unchanged")
"""Columns a reduced batch carries besides the table's own (never written to targets
except where a sink says so)."""


# Delta has no unsigned integers: a MySQL unsigned column takes the next wider type.
_UNSIGNED: dict[str, pa.DataType] = {
    "int16": pa.int32(),
    "int32": pa.int64(),
    "int64": pa.decimal128(20, 0),
}


def arrow_type(col: ColumnSchema) -> pa.DataType:
    logical = col.logical.lower().strip()
    if logical in _UNSIGNED and "unsigned" in col.type.lower():
        return _UNSIGNED[logical]
    if logical in ("decimal", "numeric"):
        m = _NUMERIC.match(col.type)
        if m and int(m.group(1)) <= 38:
            return pa.decimal128(int(m.group(1)), int(m.group(2) or 0))
        return pa.string()
    return _SIMPLE.get(logical, pa.string())


def arrow_schema(schema: TableSchema) -> pa.Schema:
    """Identity columns are non-nullable only where the source declares them NOT NULL
    (a whole-row identity, ``REPLICA IDENTITY FULL`` without primary key, holds NULLs)."""
    return pa.schema(
        [
            pa.field(c.name, arrow_type(c), nullable=c.nullable or c.name not in schema.key)
            for c in schema.columns
        ]
    )


def null_safe_key(schema: TableSchema) -> bool:
    """True when a row's identity may hold NULLs: sinks then match it null-safely
    (``IS NOT DISTINCT FROM``) and the PostgreSQL sink declares no primary key."""
    key = set(schema.key)
    return not key or any(c.nullable for c in schema.columns if c.name in key)


def _to_text(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    return orjson.dumps(v).decode()


def _to_temporal(values: list[Any], typ: pa.DataType) -> pa.Array:
    out: list[Any] = []
    for v in values:
        if isinstance(v, str):
            if pa.types.is_date(typ):
                out.append(date.fromisoformat(v))
            else:
                dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
                if typ.tz is None and dt.tzinfo is not None:
                    dt = dt.replace(tzinfo=None)
                out.append(dt)
        else:
            out.append(v)
    return pa.array(out, type=typ)


def column_array(values: list[Any], typ: pa.DataType) -> pa.Array:
    """``values`` (decoded JSON) as an Arrow array of ``typ``; raises ValueError/
    ArrowException when a value does not fit."""
    if pa.types.is_string(typ):
        return pa.array([_to_text(v) for v in values], type=typ)
    if pa.types.is_decimal(typ):
        return pc.cast(pa.array([_to_text(v) for v in values], type=pa.string()), typ)
    if pa.types.is_timestamp(typ) or pa.types.is_date(typ):
        return _to_temporal(values, typ)
    if pa.types.is_floating(typ):
        return pa.array([float(v) if isinstance(v, int | str) else v for v in values], type=typ)
    return pa.array(values, type=typ)


def rows_to_arrow(table: str, rows: Sequence[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts of JSON values) as an Arrow table of ``schema``; a value that does
    not fit its column raises ``SinkError`` naming the table and column."""
    arrays = []
    for f in schema:
        name = f.name
        values = [r.get(name) for r in rows]
        try:
            arrays.append(column_array(values, f.type))
        except (ValueError, TypeError, pa.ArrowException) as exc:
            raise SinkError(
                f"table {table}: column {name!r} holds a value that does not fit {f.type}: {exc}",
                hint="the source type and the recorded schema disagree; see docs/sync.md",
            ) from exc
    return pa.Table.from_arrays(arrays, schema=schema)


def _json_parse_type(typ: pa.DataType) -> pa.DataType | None:
    """How the bulk JSON reader reads a column of ``typ`` (``None``: not supported):
    text-carried types as strings (then cast), the rest as themselves."""
    if (
        pa.types.is_string(typ)
        or pa.types.is_decimal(typ)
        or pa.types.is_timestamp(typ)
        or pa.types.is_date(typ)
    ):
        return pa.string()
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        return typ
    return None


def _bulk_texts_to_arrow(
    texts: Sequence[str],
    schema: pa.Schema,
    rows: Callable[[], Sequence[dict[str, Any]]] | None = None,
    any_json: Collection[str] = (),
) -> pa.Table | None:
    """``texts`` (JSON objects) as a table of ``schema`` through Arrow's JSON reader,
    or ``None`` whenever the reader or a cast refuses a value. The reader is strict: a
    value of another JSON kind than its column's parse type (an object or number in a
    text column, ``"NaN"`` in a float column, an out-of-range integer, a timestamp
    string without the zone its column needs) is refused, never coerced, so every
    accepted value converts as ``column_array`` would convert it. Text columns named in
    ``any_json`` (``json``/array source columns: any JSON value) are left out of the
    reader and converted per value from ``rows()``, as ``column_array`` does."""
    parse = []
    for f in schema:
        if f.name in any_json and rows is not None and pa.types.is_string(f.type):
            continue
        t = _json_parse_type(f.type)
        if t is None:
            return None
        parse.append(pa.field(f.name, t))
    if not texts:
        return schema.empty_table()
    data = "\n".join(texts).encode()
    try:
        raw = pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(block_size=max(1 << 20, len(data) // 4 + 1)),
            parse_options=pj.ParseOptions(
                explicit_schema=pa.schema(parse),
                unexpected_field_behavior="ignore",
                newlines_in_values=False,
            ),
        )
        if raw.num_rows != len(texts):
            return None
        cols = []
        for f in schema:
            if f.name in raw.column_names:
                col = raw[f.name]
                cols.append(col if col.type == f.type else pc.cast(col, f.type))
            else:  # an any_json column
                assert rows is not None
                cols.append(column_array([r.get(f.name) for r in rows()], f.type))
        return pa.Table.from_arrays(cols, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError):
        return None


def texts_to_arrow(
    table: str,
    texts: Sequence[str],
    schema: pa.Schema,
    rows: Callable[[], Sequence[dict[str, Any]]],
    any_json: Collection[str] = (),
) -> pa.Table:
    """Rows given as JSON object texts as an Arrow table of ``schema``: in bulk when
    Arrow's JSON reader accepts every value (``_bulk_texts_to_arrow``; the columns in
    ``any_json`` per value), else ``rows_to_arrow(table, rows(), schema)`` (the same
    values; it names the column of a value that does not fit)."""
    bulk = _bulk_texts_to_arrow(texts, schema, rows, any_json)
    if bulk is not None:
        return bulk
    return rows_to_arrow(table, rows(), schema)


def _infer_logical(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "text"
    return "json"


_PG_FROM_LOGICAL = {
    "bool": "boolean",
    "int64": "bigint",
    "float64": "double precision",
    "text": "text",
    "json": "jsonb",
}


def infer_schema(
    schema: str, table: str, rows: Sequence[dict[str, Any]], key: Sequence[str]
) -> TableSchema:
    """A schema for a table the change log recorded none for: columns in first-seen
    order, types from the first non-null value (text when all are null)."""
    names: dict[str, str] = {}
    for row in rows:
        for name, value in row.items():
            if value is not None and names.get(name) in (None, "null"):
                names[name] = _infer_logical(value)
            else:
                names.setdefault(name, "null")
    for k in key:
        names.setdefault(k, "text")
    # A key of every column is a whole-row identity (no primary key at the source): it
    # may hold NULLs. A narrower key is a primary key or an identity index: NOT NULL.
    whole_row = set(names) <= set(key)
    cols = []
    for name, logical in names.items():
        lg = "text" if logical == "null" else logical
        cols.append(ColumnSchema(name, _PG_FROM_LOGICAL[lg], lg, whole_row or name not in key))
    return TableSchema(schema, table, tuple(cols), tuple(key))


def merge_schemas(old: TableSchema | None, new: TableSchema) -> TableSchema:
    """``new`` plus the columns only ``old`` has (a dropped source column stays in the
    target, null from then on): targets only ever gain columns."""
    if old is None:
        return new
    names = {c.name for c in new.columns}
    extra = tuple(c for c in old.columns if c.name not in names)
    return TableSchema(new.schema, new.table, new.columns + extra, new.key or old.key)
