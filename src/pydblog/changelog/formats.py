"""Kafka Connect's formats for the Kafka change log's table topics (``[log] value_format``).

- ``json``: pydblog's own envelope, schemaless JSON (Kafka Connect's ``JsonConverter`` with
  ``schemas.enable=false``); not handled here, the writer's fast path.
- ``json-schema``: ``JsonConverter`` with ``schemas.enable=true``: ``{"schema": ...,
  "payload": ...}``, the schema a Debezium connector declares for the table.
- ``avro``: Confluent's wire format (magic byte 0, the 4-byte schema id, the Avro binary
  body) against a Confluent-API schema registry, subjects ``<topic>-key`` /
  ``<topic>-value`` (Debezium's with Confluent's converter), the Avro schema as Confluent's
  ``AvroData`` derives it from the Connect schema (``connect.name``, ``connect.parameters``,
  ``connect.type``).

Keys take the same format. Values use Debezium's logical types with its default settings
(``time.precision.mode=adaptive``, MySQL's ``adaptive_time_microseconds``,
``decimal.handling.mode=precise``, ``binary.handling.mode=bytes``,
``interval.handling.mode=numeric``); docs/kafka.md maps every source type.

Everything but ``Registry`` is free of IO. Invariants (tested in
``tests/property/test_formats.py``): a column's Connect value converts back to the
change log's value (``from_connect``) wherever the mapping is exact (every type but
floats' NaN/infinities, special dates and timestamps, ``timetz`` offsets (normalized to
UTC) and intervals (Debezium's microseconds of an average month)); a table's schemas are a
function of its ``TableSchema`` and connector alone, so one registry id serves every event
of a table until its columns change.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any

import orjson

from pydblog.ports import ColumnSchema, TableSchema

FORMATS = ("json", "json-schema", "avro")

Schema = dict[str, Any]
"""A Kafka Connect schema in ``JsonConverter``'s JSON form (``type``, ``optional``,
``name``, ``version``, ``parameters``, ``fields``/``items``; a struct's fields carry
``field``)."""

_DIGITS = 200_000
"""Decimal arithmetic here is exact: PostgreSQL's numeric holds up to 147,455 digits."""

_EPOCH = dt.date(1970, 1, 1)
_EPOCH_DT = dt.datetime(1970, 1, 1)
DAYS_PER_MONTH_AVG = 365.25 / 12
"""Debezium's ``MicroDuration``: a month is the average month."""

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"


# -- column schemas --------------------------------------------------------------------------


def _named(typ: str, name: str, **params: str) -> Schema:
    s: Schema = {"type": typ, "name": name, "version": 1}
    if params:
        s["parameters"] = params
    return s


def _precision(sql: str) -> tuple[int | None, int | None]:
    """``numeric(10,2)`` -> (10, 2); ``timestamp(3) ...`` -> (3, None); none -> (None, None)."""
    m = re.search(r"\((\d+)(?:\s*,\s*(-?\d+))?\)", sql)
    if m is None:
        return None, None
    return int(m.group(1)), (int(m.group(2)) if m.group(2) is not None else None)


def column_schema(col: ColumnSchema, connector: str) -> Schema:
    """The Connect schema Debezium declares for ``col`` (without ``field``/``optional``)."""
    return _type_schema(col.logical, col.type.lower(), connector)


def _type_schema(logical: str, sql: str, connector: str) -> Schema:
    mysql = connector != "postgresql"
    if logical.startswith("array<"):
        inner = logical[6:-1]
        if mysql and sql.startswith("set"):
            return _named("string", "io.debezium.data.EnumSet")
        elem_sql = sql[:-2] if sql.endswith("[]") else ""
        items = _type_schema(inner, elem_sql, connector)
        items["optional"] = True
        return {"type": "array", "items": items}
    if logical in ("int16", "int32", "int64"):
        if mysql and sql.startswith("year"):
            return _named("int32", "io.debezium.time.Year")
        return {"type": logical}
    if logical == "float32":
        return {"type": "float"}
    if logical == "float64":
        return {"type": "double"}
    if logical == "bool":
        return {"type": "boolean"}
    if logical == "bytes":
        return {"type": "bytes"}
    if logical == "uuid":
        return _named("string", "io.debezium.data.Uuid")
    if logical == "json":
        return _named("string", "io.debezium.data.Json")
    if logical == "enum":
        return _named("string", "io.debezium.data.Enum")
    if mysql and sql.startswith("enum("):
        labels = re.findall(r"'((?:[^']|'')*)'", sql)
        return _named("string", "io.debezium.data.Enum",
                      allowed=",".join(x.replace("''", "'") for x in labels))
    if logical == "decimal":
        p, s = _precision(sql)
        if s is None and p is not None and (sql.startswith("numeric") or sql.startswith("decimal")):
            s = 0
        if p is None or s is None:
            return {"type": "struct", "name": VARIABLE_DECIMAL, "version": 1,
                    "doc": "Variable scaled decimal",
                    "fields": [{"type": "int32", "optional": False, "field": "scale"},
                               {"type": "bytes", "optional": False, "field": "value"}]}
        return _named("bytes", DECIMAL, scale=str(s), **{"connect.decimal.precision": str(p)})
    if logical == "date":
        return _named("int32", "io.debezium.time.Date")
    if logical == "time":
        p, _ = _precision(sql)
        if not mysql and p is not None and p <= 3:
            return _named("int32", "io.debezium.time.Time")
        return _named("int64", "io.debezium.time.MicroTime")
    if logical == "timetz":
        return _named("string", "io.debezium.time.ZonedTime")
    if logical == "timestamp":
        p, _ = _precision(sql)
        if p is None:
            p = 0 if mysql else 6
        if p <= 3:
            return _named("int64", "io.debezium.time.Timestamp")
        return _named("int64", "io.debezium.time.MicroTimestamp")
    if logical == "timestamptz":
        return _named("string", "io.debezium.time.ZonedTimestamp")
    if logical == "interval":
        return _named("int64", "io.debezium.time.MicroDuration")
    if not mysql and sql == "xml":
        return _named("string", "io.debezium.data.Xml")
    return {"type": "string"}


def _inferred_schema(value: Any) -> Schema:
    """A column without a recorded type: from its JSON value."""
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "int64"}
    if isinstance(value, float):
        return {"type": "double"}
    if isinstance(value, str) or value is None:
        return {"type": "string"}
    return _named("string", "io.debezium.data.Json")


# -- values ----------------------------------------------------------------------------------


def _unscaled(text: str, scale: int) -> int | None:
    try:
        d = Decimal(text)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    with localcontext() as ctx:
        ctx.prec = _DIGITS
        return int(d.scaleb(scale).to_integral_value())


def _int_bytes(n: int) -> bytes:
    """Two's complement, big endian, shortest (Java's ``BigInteger.toByteArray``)."""
    length = max(1, (n + (n < 0)).bit_length() // 8 + 1)
    return n.to_bytes(length, "big", signed=True)


def _days(text: str) -> int | None:
    bc = text.endswith(" BC")
    core = text[:-3] if bc else text
    try:
        y, m, d = (int(x) for x in core.split("-"))
    except ValueError:
        return None  # 'infinity', '-infinity'
    if bc:
        y = 1 - y
    if 1 <= y <= 9999:
        return (dt.date(y, m, d) - _EPOCH).days
    # proleptic Gregorian outside datetime's range, by 400-year cycles (146097 days)
    cycles, y400 = divmod(y - 1, 400)
    return (dt.date(y400 + 1, m, d) - _EPOCH).days + cycles * 146097


def _time_micros(text: str) -> int:
    neg = text.startswith("-")
    hms, _, frac = text.lstrip("-").partition(".")
    h, mi, s = (int(x) for x in hms.split(":"))
    micros = ((h * 60 + mi) * 60 + s) * 1_000_000 + (int((frac + "000000")[:6]) if frac else 0)
    return -micros if neg else micros


def _timestamp_micros(text: str) -> int | None:
    bc = text.endswith(" BC")
    core = text[:-3] if bc else text
    date_part, sep, time_part = core.partition("T")
    if not sep:
        return None  # 'infinity'
    days = _days(date_part + (" BC" if bc else ""))
    if days is None:
        return None
    return days * 86_400_000_000 + _time_micros(time_part)


_DURATION = re.compile(
    r"^P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)W)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?$")


def _duration_micros(text: str) -> int | None:
    m = _DURATION.match(text)
    if m is None:
        return None
    y, mo, w, d, h, mi = (int(g) if g else 0 for g in m.groups()[:6])
    sec = Decimal(m.group(7)) if m.group(7) else Decimal(0)
    days = (y * 12 + mo) * DAYS_PER_MONTH_AVG + w * 7 + d
    return round(days * 86_400_000_000) + (h * 3600 + mi * 60) * 1_000_000 + int(sec * 1_000_000)


def _utc_time(text: str) -> str:
    """``01:02:03.25-08:00`` -> ``09:02:03.25Z`` (Debezium's ``ZonedTime`` is in UTC)."""
    m = re.match(r"^(\d+):(\d+):(\d+)(\.\d+)?([+-])(\d+)(?::(\d+))?(?::(\d+))?$", text)
    if m is None:
        return text
    h, mi, s = int(m.group(1)), int(m.group(2)), int(m.group(3))
    off = int(m.group(6)) * 3600 + int(m.group(7) or 0) * 60 + int(m.group(8) or 0)
    secs = (h * 3600 + mi * 60 + s - (off if m.group(5) == "+" else -off)) % 86400
    return f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}{m.group(4) or ''}Z"


_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def to_connect(value: Any, schema: Schema) -> Any:
    """The change log's JSON value of a column (docs/types.md) as the Connect value of
    ``schema`` (bytes as ``bytes``); ``None`` stays ``None``. Values Debezium's type
    cannot hold (a date's ``infinity``, a decimal's ``NaN``) become ``None``."""
    if value is None:
        return None
    typ = schema["type"]
    name = schema.get("name")
    if typ == "array" and name is None:
        items = schema["items"]
        return [to_connect(v, items) for v in value]
    if name is None:
        if typ in ("int16", "int32", "int64", "int8"):
            return int(value)
        if typ in ("float", "double"):
            return _FLOATS[value] if isinstance(value, str) else float(value)
        if typ == "boolean":
            return bool(value)
        if typ == "bytes":
            return base64.b64decode(value) if isinstance(value, str) else bytes(value)
        if typ == "string":
            return value if isinstance(value, str) else orjson.dumps(value).decode()
        return value
    if name == DECIMAL:
        n = _unscaled(str(value), int(schema["parameters"]["scale"]))
        return None if n is None else _int_bytes(n)
    if name == VARIABLE_DECIMAL:
        try:
            d = Decimal(str(value))
        except InvalidOperation:
            return None
        if not d.is_finite():
            return None
        exp = d.as_tuple().exponent
        scale = -exp if isinstance(exp, int) and exp < 0 else 0
        with localcontext() as ctx:
            ctx.prec = _DIGITS
            return {"scale": scale, "value": _int_bytes(int(d.scaleb(scale)))}
    if name == "io.debezium.time.Date":
        return _days(value)
    if name == "io.debezium.time.MicroTime":
        return _time_micros(value)
    if name == "io.debezium.time.Time":
        return _time_micros(value) // 1000
    if name == "io.debezium.time.MicroTimestamp":
        return _timestamp_micros(value)
    if name == "io.debezium.time.Timestamp":
        us = _timestamp_micros(value)
        return None if us is None else us // 1000
    if name == "io.debezium.time.ZonedTime":
        return _utc_time(value)
    if name == "io.debezium.time.MicroDuration":
        return _duration_micros(value)
    if name == "io.debezium.time.Year":
        return int(value)
    if name == "io.debezium.data.Json":
        return orjson.dumps(value).decode()
    if name == "io.debezium.data.EnumSet":
        return ",".join(value) if isinstance(value, list) else str(value)
    return value if isinstance(value, str) else str(value)


def _fraction(micros: int) -> str:
    return f".{micros:06d}" if micros else ""


def _date_text(days: int) -> str:
    if -719162 <= days <= 2932896:
        return (_EPOCH + dt.timedelta(days=days)).isoformat()
    cycles, rest = divmod(days + 719162, 146097)  # days from 0001-01-01
    d = dt.date(1, 1, 1) + dt.timedelta(days=rest)
    y = d.year + cycles * 400
    if y <= 0:
        return f"{1 - y:04d}-{d.month:02d}-{d.day:02d} BC"
    return f"{y:04d}-{d.month:02d}-{d.day:02d}"


def _time_text(micros: int) -> str:
    sign = "-" if micros < 0 else ""
    secs, us = divmod(abs(micros), 1_000_000)
    return f"{sign}{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}{_fraction(us)}"


def from_connect(value: Any, schema: Schema) -> Any:
    """The inverse of ``to_connect`` where it is exact (see the module docstring)."""
    if value is None:
        return None
    typ = schema["type"]
    name = schema.get("name")
    if typ == "array" and name is None:
        return [from_connect(v, schema["items"]) for v in value]
    if name is None:
        if typ == "bytes":
            return base64.b64encode(value).decode()
        return value
    if name == DECIMAL:
        scale = int(schema["parameters"]["scale"])
        n = int.from_bytes(value, "big", signed=True)
        if scale <= 0:
            return str(n * 10 ** -scale)
        with localcontext() as ctx:
            ctx.prec = _DIGITS
            return format(Decimal(n).scaleb(-scale), "f")
    if name == VARIABLE_DECIMAL:
        n = int.from_bytes(value["value"], "big", signed=True)
        with localcontext() as ctx:
            ctx.prec = _DIGITS
            return format(Decimal(n).scaleb(-value["scale"]), "f")
    if name == "io.debezium.time.Date":
        return _date_text(value)
    if name in ("io.debezium.time.MicroTime", "io.debezium.time.Time"):
        return _time_text(value * (1000 if name.endswith(".Time") else 1))
    if name in ("io.debezium.time.MicroTimestamp", "io.debezium.time.Timestamp"):
        us = value * (1000 if name.endswith(".Timestamp") else 1)
        days, rest = divmod(us, 86_400_000_000)
        date = _date_text(days)
        bc = date.endswith(" BC")
        text = f"{date.removesuffix(' BC')}T{_time_text(rest)}"
        return text + " BC" if bc else text
    if name == "io.debezium.data.Json":
        return orjson.loads(value)
    if name == "io.debezium.data.EnumSet":
        return value.split(",") if value else []
    return value


# -- the envelope ----------------------------------------------------------------------------

_ENVELOPE_VERSION = 2
_SNAPSHOT_ENUM = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"


def _source_schema(connector: str) -> Schema:
    """Debezium's ``source`` block (``io.debezium.connector.<connector>.Source``): its
    common fields, then the connector's position fields as pydblog writes them."""
    pg = connector == "postgresql"
    fields: list[Schema] = [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "name"},
        {"type": "int64", "optional": False, "field": "ts_ms"},
        {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
         "parameters": {"allowed": _SNAPSHOT_ENUM}, "default": "false", "field": "snapshot"},
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": True, "field": "sequence"},
        {"type": "int64", "optional": True, "field": "ts_us"},
        {"type": "int64", "optional": True, "field": "ts_ns"},
    ]
    if pg:
        fields += [
            {"type": "string", "optional": False, "field": "schema"},
            {"type": "string", "optional": False, "field": "table"},
            {"type": "int64", "optional": True, "field": "txId"},
            {"type": "int64", "optional": True, "field": "lsn"},
            {"type": "int64", "optional": True, "field": "xmin"},
        ]
    else:
        fields += [
            {"type": "string", "optional": True, "field": "table"},
            {"type": "int64", "optional": False, "field": "server_id"},
            {"type": "string", "optional": True, "field": "gtid"},
            {"type": "string", "optional": False, "field": "file"},
            {"type": "int64", "optional": False, "field": "pos"},
            {"type": "int32", "optional": False, "field": "row"},
            {"type": "int64", "optional": True, "field": "thread"},
            {"type": "string", "optional": True, "field": "query"},
            {"type": "string", "optional": True, "field": "schema"},
        ]
    fields.append({"type": "int64", "optional": True, "field": "index"})
    name = "postgresql" if pg else "mysql"
    return {"type": "struct", "fields": fields, "optional": False,
            "name": f"io.debezium.connector.{name}.Source", "field": "source"}


_TRANSACTION: Schema = {
    "type": "struct", "optional": True, "name": "event.block", "version": 1, "field": "transaction",
    "fields": [{"type": "string", "optional": False, "field": "id"},
               {"type": "int64", "optional": False, "field": "total_order"},
               {"type": "int64", "optional": False, "field": "data_collection_order"}],
}


@dataclass
class TableFormat:
    """One table's Connect schemas (key, value) and how its events become payloads."""

    topic: str
    connector: str
    columns: list[tuple[str, Schema]]
    key_columns: list[tuple[str, Schema]]
    key_schema: Schema
    value_schema: Schema
    version: str = "pydblog"
    server: str = ""

    @classmethod
    def build(cls, topic: str, connector: str, table: TableSchema | None,
              env: Mapping[str, Any] | None = None, server: str = "") -> TableFormat:
        """From the table's recorded ``TableSchema``; without one (a table whose schema
        the log does not hold), types are inferred from ``env``'s values."""
        if table is not None:
            columns = [(c.name, {**column_schema(c, connector), "optional": c.nullable})
                       for c in table.columns]
            by_name = dict(columns)
            key_names = list(table.key)
        else:
            row = (env or {}).get("after") or (env or {}).get("before") or {}
            columns = [(n, {**_inferred_schema(v), "optional": True}) for n, v in row.items()]
            by_name = dict(columns)
            key_names = list(((env or {}).get("key") or {}).keys())
        if env is not None and env.get("key"):
            # the event's key (a table without a primary key: its identity columns)
            key_names = list(env["key"].keys())
        key_columns = [(n, {**(by_name.get(n) or {"type": "string"}), "optional": False})
                       for n in key_names]
        value_struct: Schema = {
            "type": "struct", "optional": True, "name": f"{topic}.Value",
            "fields": [{**s, "field": n} for n, s in columns],
        }
        key_schema: Schema = {"type": "struct", "optional": False, "name": f"{topic}.Key",
                              "fields": [{**s, "field": n} for n, s in key_columns]}
        value_schema: Schema = {
            "type": "struct", "optional": False, "name": f"{topic}.Envelope",
            "version": _ENVELOPE_VERSION,
            "fields": [
                {**value_struct, "field": "before"},
                {**value_struct, "field": "after"},
                _source_schema(connector),
                _TRANSACTION,
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
                {"type": "int64", "optional": True, "field": "ts_us"},
                {"type": "int64", "optional": True, "field": "ts_ns"},
            ],
        }
        return cls(topic, connector, columns, key_columns, key_schema, value_schema,
                   server=server)

    def __post_init__(self) -> None:
        self._convs = [(n, _converter(s)) for n, s in self.columns]
        self._key_convs = [(n, _converter(s)) for n, s in self.key_columns]
        self._typed = {n for n, s in self.columns if s.get("type") != "string"}

    def _row(self, row: Mapping[str, Any] | None, unchanged: Sequence[str]) -> dict[str, Any] | None:
        if row is None:
            return None
        out: dict[str, Any] = {}
        for name, conv in self._convs:
            v = row.get(name)
            if v is not None and conv is not None:
                v = conv(v)
            out[name] = v
        for name in unchanged:
            if name in self._typed:
                out[name] = None  # the unchanged TOAST placeholder has no value of the type
        return out

    def key_payload(self, key: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if key is None:
            return None
        out: dict[str, Any] = {}
        for name, conv in self._key_convs:
            v = key.get(name)
            out[name] = conv(v) if v is not None and conv is not None else v
        return out

    def value_payload(self, env: Mapping[str, Any]) -> dict[str, Any]:
        """The envelope's payload (Connect values) for a change-log envelope ``env``."""
        src = env.get("source") or {}
        unchanged = env.get("unchanged") or ()
        source: dict[str, Any] = {}
        for f in self.value_schema["fields"][2]["fields"]:
            name = f["field"]
            v = src.get(name)
            if name == "version":
                v = self.version
            elif name == "name":
                v = self.server
            elif name == "connector":
                v = v or self.connector
            elif name == "ts_ms":
                v = v if v is not None else env.get("ts_ms", 0)
            elif name in ("ts_us", "ts_ns"):
                ms = src.get("ts_ms")
                v = _scaled(ms if ms is not None else env.get("ts_ms"), name)
            elif name == "snapshot" and v is not None:
                v = str(v)
            elif name in ("server_id", "pos", "row") and v is None:
                v = 0
            elif name == "file" and v is None:
                v = ""
            elif v is not None and f["type"] in ("int64", "int32") and not isinstance(v, int):
                v = None
            elif v is not None and f["type"] == "string" and not isinstance(v, str):
                v = str(v)
            if v is None and not f["optional"]:
                v = "" if f["type"] == "string" else 0
            source[name] = v
        return {
            "before": self._row(env.get("before"), unchanged),
            "after": self._row(env.get("after"), unchanged),
            "source": source,
            "transaction": None,
            "op": env["op"],
            "ts_ms": env.get("ts_ms"),
            "ts_us": _scaled(env.get("ts_ms"), "ts_us"),
            "ts_ns": _scaled(env.get("ts_ms"), "ts_ns"),
        }


def _scaled(ms: Any, name: str) -> int | None:
    """``ts_us`` / ``ts_ns`` (Debezium 2.x's finer copies of a ``ts_ms``) from the change
    log's milliseconds: the same instant, at millisecond precision (pydblog keeps
    milliseconds); null where the ``ts_ms`` is."""
    if not isinstance(ms, int) or isinstance(ms, bool):
        return None
    return ms * (1_000 if name == "ts_us" else 1_000_000)


def _converter(schema: Schema) -> Callable[[Any], Any] | None:
    """``to_connect`` for one schema, or None where the change log's value already is
    the Connect value (integers, booleans, text)."""
    if schema.get("name") is None and schema["type"] in ("int8", "int16", "int32", "int64",
                                                         "boolean"):
        return None
    if schema.get("name") is None and schema["type"] == "string":
        return _text
    return functools.partial(_to_connect_given, schema)


def _text(value: Any) -> Any:
    return value if type(value) is str else to_connect(value, {"type": "string"})


def _to_connect_given(schema: Schema, value: Any) -> Any:
    return to_connect(value, schema)


def _bytes_as_json(value: Any) -> Any:
    """``orjson``'s ``default``: Connect's bytes are base64 text in ``JsonConverter``'s JSON."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON")


class JsonSchemaEncoder:
    """``JsonConverter`` with ``schemas.enable=true``: ``{"schema": ..., "payload": ...}``."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[bytes, bytes]] = {}

    def _schema_texts(self, fmt: TableFormat) -> tuple[bytes, bytes]:
        texts = self._texts.get(id(fmt))
        if texts is None:
            texts = (orjson.dumps(fmt.key_schema), orjson.dumps(fmt.value_schema))
            self._texts[id(fmt)] = texts
        return texts

    def forget(self, fmt: TableFormat) -> None:
        self._texts.pop(id(fmt), None)

    def encode(self, fmt: TableFormat, env: Mapping[str, Any]) -> tuple[bytes, bytes | None]:
        key_text, value_text = self._schema_texts(fmt)
        value = b'{"schema":' + value_text + b',"payload":' + orjson.dumps(
            fmt.value_payload(env), default=_bytes_as_json) + b"}"
        kp = fmt.key_payload(env.get("key"))
        key = None if kp is None else (
            b'{"schema":' + key_text + b',"payload":' + orjson.dumps(kp, default=_bytes_as_json) + b"}")
        return value, key


# -- Avro -----------------------------------------------------------------------------------

_AVRO_NAME = re.compile(r"[^A-Za-z0-9_]")


def avro_name(name: str) -> str:
    """A valid Avro name (Debezium's ``schema.name.adjustment.mode=avro``): characters
    outside ``[A-Za-z0-9_]`` become ``_``, and a leading digit gets a ``_`` before it."""
    out = _AVRO_NAME.sub("_", name)
    return "_" + out if not out or out[0].isdigit() else out


def _avro_fullname(name: str) -> tuple[str, str]:
    parts = [avro_name(p) for p in name.split(".")]
    return ".".join(parts[:-1]), parts[-1]


_AVRO_PRIMITIVE = {"int8": "int", "int16": "int", "int32": "int", "int64": "long",
                   "float": "float", "double": "double", "boolean": "boolean",
                   "string": "string", "bytes": "bytes"}


def connect_to_avro(schema: Schema, seen: set[str] | None = None) -> Any:
    """The Avro schema Confluent's ``AvroData.fromConnectSchema`` gives for ``schema``
    (Apicurio's converter reads it back to the same Connect schema): ``connect.name``,
    ``connect.version``, ``connect.parameters``, ``connect.type`` for int8/int16,
    ``decimal`` logical type, optional as a union with ``null`` first, default null."""
    seen = set() if seen is None else seen
    typ = schema["type"]
    name = schema.get("name")
    out: Any
    if typ == "struct":
        full = ".".join(filter(None, _avro_fullname(name or "ConnectDefault")))
        if full in seen:
            out = full
        else:
            seen.add(full)
            ns, simple = _avro_fullname(name or "ConnectDefault")
            out = {"type": "record", "name": simple,
                   "fields": [_avro_field(f, seen) for f in schema["fields"]]}
            if ns:
                out["namespace"] = ns
            if name:
                out["connect.name"] = name
            if schema.get("doc"):
                out["doc"] = schema["doc"]
            if schema.get("version") is not None:
                out["connect.version"] = schema["version"]
    elif typ == "array":
        out = {"type": "array", "items": connect_to_avro(schema["items"], seen)}
    else:
        out = {"type": _AVRO_PRIMITIVE[typ]}
        if typ in ("int8", "int16"):
            out["connect.type"] = typ
        if name:
            out["connect.name"] = name
            if schema.get("version") is not None:
                out["connect.version"] = schema["version"]
            if schema.get("parameters"):
                out["connect.parameters"] = dict(schema["parameters"])
            if name == DECIMAL:
                params = schema["parameters"]
                out["logicalType"] = "decimal"
                out["scale"] = int(params["scale"])
                out["precision"] = int(params.get("connect.decimal.precision", 64))
        if len(out) == 1:
            out = out["type"]
    if schema.get("optional"):
        return ["null", out]
    return out


def _avro_field(f: Schema, seen: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": avro_name(f["field"]), "type": connect_to_avro(f, seen)}
    if f.get("optional"):
        out["default"] = None
    elif "default" in f:
        out["default"] = f["default"]
    return out


def _avro_datum(value: Any, schema: Schema) -> Any:
    """Connect values to fastavro's datum (field names made Avro names; decimals as
    their unscaled bytes, written as ``bytes``)."""
    if value is None:
        return None
    typ = schema["type"]
    if typ == "struct":
        return {avro_name(f["field"]): _avro_datum(value.get(f["field"]), f)
                for f in schema["fields"]}
    if typ == "array":
        return [_avro_datum(v, schema["items"]) for v in value]
    return value


def _strip_logical(avro: Any) -> Any:
    """The schema fastavro writes with: ``decimal`` logical types dropped (the datum
    already holds the unscaled bytes Confluent's converter writes)."""
    if isinstance(avro, list):
        return [_strip_logical(a) for a in avro]
    if isinstance(avro, dict):
        out = {k: _strip_logical(v) for k, v in avro.items() if k != "logicalType"}
        if avro.get("logicalType") == "decimal":
            out.pop("precision", None)
            out.pop("scale", None)
        return out
    return avro


class RegistryError(Exception):
    """The schema registry refused a schema or could not be reached."""


class Registry:
    """A Confluent-API schema registry client (``POST /subjects/<subject>/versions``):
    the id of a schema, registered if new, cached per (subject, schema). Works with
    Confluent's, Karapace and Apicurio's ``/apis/ccompat/v7``."""

    def __init__(self, url: str, timeout_s: float = 10.0,
                 opener: Callable[..., Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.shown = re.sub(r"//[^@/]*@", "//***@", self.url)  # no credentials in messages
        self.timeout_s = timeout_s
        self._open = opener or urllib.request.urlopen
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, str] = {}
        self._lock = threading.Lock()

    def register(self, subject: str, schema_text: str) -> int:
        with self._lock:
            cached = self._ids.get((subject, schema_text))
        if cached is not None:
            return cached
        body = json.dumps({"schema": schema_text}).encode()
        quoted = urllib.parse.quote(subject, safe="")
        req = urllib.request.Request(
            f"{self.url}/subjects/{quoted}/versions", data=body, method="POST",
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json",
                     "Accept": "application/vnd.schemaregistry.v1+json, application/json"})
        try:
            with self._open(req, timeout=self.timeout_s) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise RegistryError(
                f"the schema registry at {self.shown} refused the schema of subject {subject!r} "
                f"(HTTP {exc.code}: {detail})") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RegistryError(
                f"the schema registry at {self.shown} cannot be reached ({exc})") from None
        schema_id = int(answer["id"])
        with self._lock:
            self._ids[(subject, schema_text)] = schema_id
            self._schemas[schema_id] = schema_text
        return schema_id

    def schema(self, schema_id: int) -> str:
        """The schema text of ``schema_id`` (``GET /schemas/ids/<id>``)."""
        with self._lock:
            text = self._schemas.get(schema_id)
        if text is not None:
            return text
        try:
            with self._open(f"{self.url}/schemas/ids/{schema_id}", timeout=self.timeout_s) as resp:
                text = str(json.loads(resp.read())["schema"])
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            raise RegistryError(
                f"the schema registry at {self.shown} has no schema {schema_id} ({exc})") from None
        with self._lock:
            self._schemas[schema_id] = text
        return text


def _fastavro() -> Any:
    try:
        import fastavro
    except ImportError:
        raise ImportError(
            "value_format = \"avro\" needs fastavro: pip install 'pydblog[kafka]'") from None
    return fastavro


@dataclass
class _AvroTable:
    key_id: int
    value_id: int
    key_schema: Any
    value_schema: Any
    renamed: bool  # a column name is not an Avro name: datums are renamed (``_avro_datum``)
    row: str  # the row record's Avro full name: ``before``/``after`` name their union branch


class AvroEncoder:
    """Confluent's wire format: ``0``, the schema id (4 bytes, big endian), the Avro
    binary body. Schemas are registered under ``<topic>-key`` / ``<topic>-value``."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._fa = _fastavro()
        self._tables: dict[int, _AvroTable] = {}

    def forget(self, fmt: TableFormat) -> None:
        self._tables.pop(id(fmt), None)

    def _table(self, fmt: TableFormat) -> _AvroTable:
        t = self._tables.get(id(fmt))
        if t is None:
            fa = self._fa
            key_avro = connect_to_avro(fmt.key_schema)
            value_avro = connect_to_avro(fmt.value_schema)
            key_id = self.registry.register(f"{fmt.topic}-key", json.dumps(key_avro))
            value_id = self.registry.register(f"{fmt.topic}-value", json.dumps(value_avro))
            t = _AvroTable(key_id, value_id,
                           fa.parse_schema(_strip_logical(key_avro)),
                           fa.parse_schema(_strip_logical(value_avro)),
                           any(avro_name(n) != n for n, _ in fmt.columns),
                           ".".join(filter(None, _avro_fullname(f"{fmt.topic}.Value"))))
            self._tables[id(fmt)] = t
        return t

    def _frame(self, schema_id: int, schema: Any, datum: Any) -> bytes:
        import io

        buf = io.BytesIO()
        buf.write(b"\x00" + schema_id.to_bytes(4, "big"))
        self._fa.schemaless_writer(buf, schema, datum)
        return buf.getvalue()

    def encode(self, fmt: TableFormat, env: Mapping[str, Any]) -> tuple[bytes, bytes | None]:
        t = self._table(fmt)
        payload: Any = fmt.value_payload(env)
        kp: Any = fmt.key_payload(env.get("key"))
        if t.renamed:
            payload = _avro_datum(payload, fmt.value_schema)
            kp = _avro_datum(kp, fmt.key_schema)
        for side in ("before", "after"):  # fastavro then skips matching the union's branches
            if payload[side] is not None:
                payload[side] = (t.row, payload[side])
        value = self._frame(t.value_id, t.value_schema, payload)
        key = None if kp is None else self._frame(t.key_id, t.key_schema, kp)
        return value, key


def decode_avro(data: bytes, registry: Registry) -> Any:
    """A Confluent-framed Avro message back to its datum (for tests and tools)."""
    fa = _fastavro()
    import io

    if data[:1] != b"\x00":
        raise ValueError("not Confluent's wire format (magic byte 0 missing)")
    schema_id = int.from_bytes(data[1:5], "big")
    schema = fa.parse_schema(_strip_logical(json.loads(registry.schema(schema_id))))
    return fa.schemaless_reader(io.BytesIO(data[5:]), schema)


@dataclass
class Formatter:
    """Per log: turns change-log envelopes into the chosen format's key and value, one
    ``TableFormat`` per topic, made again when the table's ``TableSchema`` (the log's
    record of its columns) or the event key's columns change. A table without a recorded
    schema gets one from its rows' values, made again when a row has other columns."""

    value_format: str
    server: str
    registry_url: str | None = None
    _tables: dict[str, tuple[TableSchema | None, tuple[str, ...], TableFormat]] = field(
        default_factory=dict)
    _encoder: Any = None

    def __post_init__(self) -> None:
        if self.value_format == "json-schema":
            self._encoder = JsonSchemaEncoder()
        elif self.value_format == "avro":
            if not self.registry_url:
                raise ValueError('value_format = "avro" needs [log] schema_registry_url')
            self._encoder = AvroEncoder(Registry(self.registry_url))
        else:
            raise ValueError(f"no formatter for value_format {self.value_format!r}")

    def encode(self, topic: str, table: TableSchema | None,
               env: Mapping[str, Any]) -> tuple[bytes, bytes | None]:
        """``(value, key)`` of one event (``key`` None for keyless events)."""
        key_names = tuple((env.get("key") or {}).keys())
        cached = self._tables.get(topic)
        if cached is not None and cached[0] is table and (not key_names or cached[1] == key_names) \
                and (table is not None or _same_columns(cached[2], env)):
            fmt = cached[2]
        else:
            connector = str((env.get("source") or {}).get("connector") or "postgresql")
            fmt = TableFormat.build(topic, connector, table, env, server=self.server)
            if cached is not None:
                self._encoder.forget(cached[2])
            self._tables[topic] = (table, key_names or tuple(n for n, _ in fmt.key_columns), fmt)
        value: bytes
        key: bytes | None
        value, key = self._encoder.encode(fmt, env)
        return value, key


def _same_columns(fmt: TableFormat, env: Mapping[str, Any]) -> bool:
    """Whether an event of a table without a recorded schema has the columns ``fmt`` was
    inferred with (an event without a row, a truncate, has)."""
    row = env.get("after") or env.get("before")
    return row is None or (len(row) == len(fmt.columns)
                           and all(n in row for n, _ in fmt.columns))
