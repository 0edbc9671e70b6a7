"""A row hash that PostgreSQL or MySQL/MariaDB and Spark compute alike, for checksums of
a Delta mirror inside both engines.

The canonical text of a row is its columns' canonical texts in schema order, each as
``<length>:<text>`` (``-`` for NULL), joined by ``,``; its hash is the first 60 bits of
its md5, so sums never overflow a 64-bit integer on either side. A column's canonical
text is the same in both engines for the value the change log carries:

- integers, decimals, text (also enums, uuids), booleans, dates: their SQL text
  (PostgreSQL's ``::text``, Spark's ``CAST(c AS STRING)``);
- floats: the IEEE-754 bits of the value as a double, as a signed decimal integer
  (PostgreSQL ``float8send``, Spark ``Double.doubleToLongBits``; MySQL has no way to
  print them: a MySQL table with a float column is not checksummed this way);
- timestamps with and without time zone: microseconds since the epoch, UTC;
- bytes: base64 (the Delta sink stores them as the change log's base64 text).

Invariant: equal values give equal texts; a value either engine prints differently
(an infinite timestamp, a ``char(n)`` padding) only makes its range a suspect, which the
row-by-row comparison settles. A table with a column of any other logical type (json,
time, interval, arrays, ...), or whose Delta column has another type than the sink
writes for it, is not checksummed this way (``spark_hash`` returns None).
"""

from __future__ import annotations

from collections.abc import Mapping

from psycopg import sql

from pydblog.ports import ColumnSchema, TableSchema

_FLOAT = frozenset({"float32", "float64"})
_TIME = frozenset({"timestamp", "timestamptz"})
_BYTES = frozenset({"bytes"})
_EXPECT = {  # logical type -> Delta (Spark simpleString) types the sink writes for it
    "int16": ("smallint", "int", "bigint", "decimal"),
    "int32": ("int", "bigint", "decimal"),
    "int64": ("bigint", "decimal"),
    "decimal": ("decimal", "string"),
    "string": ("string",), "enum": ("string",), "uuid": ("string",),
    "bool": ("boolean",), "boolean": ("boolean",),
    "date": ("date",),
    "float32": ("float", "double"), "float64": ("double",),
    "timestamp": ("timestamp_ntz", "timestamp"), "timestamptz": ("timestamp", "timestamp_ntz"),
    "bytes": ("string", "binary"),
}


def _logical(c: ColumnSchema) -> str:
    return c.logical.lower()


def portable(schema: TableSchema) -> bool:
    """Whether every column's logical type has a canonical text in both engines."""
    return all(_logical(c) in _EXPECT for c in schema.columns)


def _join(parts: list[sql.Composable]) -> sql.Composable:
    return sql.SQL("concat_ws(',', {})").format(sql.SQL(", ").join(parts))


def pg_hash(schema: TableSchema, present: Mapping[str, object]) -> sql.Composable:
    """The row hash as a PostgreSQL expression (a ``bigint``, 60 bits) over the table's
    columns (``present``: the columns the table has; others count as NULL)."""
    parts: list[sql.Composable] = []
    for c in schema.columns:
        ident = sql.Identifier(c.name)
        lg = _logical(c)
        if c.name not in present:
            text: sql.Composable = sql.SQL("NULL::text")
        elif lg in _FLOAT:
            text = sql.SQL("('x' || encode(float8send({}::float8), 'hex'))::bit(64)::bigint::text"
                           ).format(ident)
        elif lg in _TIME:
            text = sql.SQL("CASE WHEN isfinite({c}) THEN (extract(epoch FROM {c}) * 1000000)"
                           "::bigint::text END").format(c=ident)
        elif lg in _BYTES:
            text = sql.SQL("translate(encode({}, 'base64'), E'\\n', '')").format(ident)
        else:
            text = sql.SQL("{}::text").format(ident)
        parts.append(sql.SQL("coalesce(length({t})::text || ':' || {t}, '-')").format(t=text))
    return sql.SQL("('x' || left(md5({}), 15))::bit(60)::bigint").format(_join(parts))


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def spark_hash(schema: TableSchema, fields: Mapping[str, str]) -> str | None:
    """The row hash as a Spark SQL expression (a ``bigint``) over a Delta table whose
    columns have the Spark types ``fields`` (name -> ``simpleString``), or None when a
    column's type is not the one the sink writes for its logical type."""
    parts = []
    for c in schema.columns:
        lg = _logical(c)
        typ = fields.get(c.name)
        if lg not in _EXPECT:
            return None
        if typ is None:
            text = "CAST(NULL AS STRING)"
        elif typ.split("(")[0] not in _EXPECT[lg]:
            return None
        elif lg in _FLOAT:
            text = (f"CASE WHEN {_q(c.name)} IS NOT NULL THEN java_method('java.lang.Double', "
                    f"'doubleToLongBits', CAST({_q(c.name)} AS DOUBLE)) END")
        elif lg in _TIME:
            text = f"CAST(unix_micros(CAST({_q(c.name)} AS TIMESTAMP)) AS STRING)"
        elif lg in _BYTES and typ == "binary":
            text = f"base64({_q(c.name)})"
        else:
            text = f"CAST({_q(c.name)} AS STRING)"
        parts.append(f"coalesce(concat(CAST(length({text}) AS STRING), ':', {text}), '-')")
    return f"CAST(conv(substr(md5(concat_ws(',', {', '.join(parts)})), 1, 15), 16, 10) AS BIGINT)"


_MY_FLOATS = frozenset({"float", "double", "real"})


def my_portable(schema: TableSchema, present: Mapping[str, object]) -> bool:
    """Whether a MySQL/MariaDB table (``present``: its columns, ``ColumnType``) has a
    portable hash: ``portable`` and no float or JSON column."""
    if not portable(schema):
        return False
    for c in schema.columns:
        col = present.get(c.name)
        if col is not None and (getattr(col, "data_type", "") in _MY_FLOATS
                                or getattr(col, "is_json", False)):
            return False
    return True


def my_hash(schema: TableSchema, present: Mapping[str, object]) -> str:
    """The row hash as a MySQL/MariaDB expression (an unsigned integer, 60 bits) in a UTC
    session, for statements that go through pymysql's parameter formatting (``%%``)."""
    parts = []
    for c in schema.columns:
        col = present.get(c.name)
        q = "`" + c.name.replace("`", "``") + "`"
        t = str(getattr(col, "data_type", ""))
        lg = _logical(c)
        if col is None:
            text = "NULL"
        elif lg in _TIME:
            text = f"CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {q}) AS CHAR)"
        elif lg == "date":
            text = f"DATE_FORMAT({q}, '%%Y-%%m-%%d')"
        elif lg in _BYTES:
            text = f"REPLACE(TO_BASE64({q}), '\\n', '')"
        elif t == "bit":
            text = f"CAST(CAST({q} AS UNSIGNED) AS CHAR)"
        else:
            text = f"CAST({q} AS CHAR CHARACTER SET utf8mb4)"
        parts.append(f"COALESCE(CONCAT(CHAR_LENGTH({text}), ':', {text}), '-')")
    return f"CAST(CONV(SUBSTRING(MD5(CONCAT_WS(',', {', '.join(parts)})), 1, 15), 16, 10) AS UNSIGNED)"
