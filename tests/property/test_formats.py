"""Kafka Connect's formats (``changelog.formats``): Debezium's schema per column type, the
envelope's shape in ``json-schema`` and ``avro``, and values that convert back to the
change log's exactly."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.changelog import formats
from pydblog.changelog.formats import (
    AvroEncoder,
    Formatter,
    JsonSchemaEncoder,
    Registry,
    TableFormat,
    column_schema,
    connect_to_avro,
    decode_avro,
    from_connect,
    to_connect,
)
from pydblog.ports import ColumnSchema, TableSchema

PG = "postgresql"

def _bc_date(d: dt.date, cycles: int) -> str:
    """A date as PostgreSQL writes one before year 1: ``d``'s month and day in an
    astronomical year ``cycles`` 400-year cycles earlier (leap years alike), ``Y BC``
    being astronomical year ``1 - Y``."""
    year = 1 - (d.year % 400 - 400 * cycles)
    return f"{year:04d}-{d.month:02d}-{d.day:02d} BC"


# (sql type, logical type, connector) -> (Connect type, Debezium/Connect schema name)
SCHEMAS = [
    ("smallint", "int16", PG, "int16", None),
    ("integer", "int32", PG, "int32", None),
    ("bigint", "int64", PG, "int64", None),
    ("real", "float32", PG, "float", None),
    ("double precision", "float64", PG, "double", None),
    ("boolean", "bool", PG, "boolean", None),
    ("text", "string", PG, "string", None),
    ("character varying(20)", "string", PG, "string", None),
    ("bytea", "bytes", PG, "bytes", None),
    ("uuid", "uuid", PG, "string", "io.debezium.data.Uuid"),
    ("jsonb", "json", PG, "string", "io.debezium.data.Json"),
    ("public.mood", "enum", PG, "string", "io.debezium.data.Enum"),
    ("numeric(10,2)", "decimal", PG, "bytes", "org.apache.kafka.connect.data.Decimal"),
    ("numeric", "decimal", PG, "struct", "io.debezium.data.VariableScaleDecimal"),
    ("date", "date", PG, "int32", "io.debezium.time.Date"),
    ("time without time zone", "time", PG, "int64", "io.debezium.time.MicroTime"),
    ("time(3) without time zone", "time", PG, "int32", "io.debezium.time.Time"),
    ("time with time zone", "timetz", PG, "string", "io.debezium.time.ZonedTime"),
    ("timestamp without time zone", "timestamp", PG, "int64", "io.debezium.time.MicroTimestamp"),
    ("timestamp(3) without time zone", "timestamp", PG, "int64", "io.debezium.time.Timestamp"),
    ("timestamp with time zone", "timestamptz", PG, "string", "io.debezium.time.ZonedTimestamp"),
    ("interval", "interval", PG, "int64", "io.debezium.time.MicroDuration"),
    ("integer[]", "array<int32>", PG, "array", None),
    ("inet", "string", PG, "string", None),
    ("xml", "string", PG, "string", "io.debezium.data.Xml"),
    ("tinyint", "int16", "mysql", "int16", None),
    ("year", "int16", "mysql", "int32", "io.debezium.time.Year"),
    ("decimal(65,30)", "decimal", "mysql", "bytes", "org.apache.kafka.connect.data.Decimal"),
    ("datetime", "timestamp", "mysql", "int64", "io.debezium.time.Timestamp"),
    ("datetime(6)", "timestamp", "mysql", "int64", "io.debezium.time.MicroTimestamp"),
    ("timestamp(3)", "timestamptz", "mysql", "string", "io.debezium.time.ZonedTimestamp"),
    ("time", "time", "mysql", "int64", "io.debezium.time.MicroTime"),
    ("set('a','b')", "array<string>", "mysql", "string", "io.debezium.data.EnumSet"),
    ("json", "json", "mysql", "string", "io.debezium.data.Json"),
    ("enum('s','m')", "string", "mysql", "string", "io.debezium.data.Enum"),
    ("varbinary(10)", "bytes", "mysql", "bytes", None),
]


@pytest.mark.parametrize(("sql", "logical", "connector", "typ", "name"), SCHEMAS)
def test_schema_per_column_type(sql: str, logical: str, connector: str, typ: str,
                                name: str | None) -> None:
    s = column_schema(ColumnSchema("c", sql, logical), connector)
    assert s["type"] == typ
    assert s.get("name") == name


def test_mysql_enum_allowed_labels() -> None:
    s = column_schema(ColumnSchema("c", "enum('s','it''s')", "string"), "mysql")
    assert s["parameters"] == {"allowed": "s,it's"}


def test_decimal_schema_parameters() -> None:
    s = column_schema(ColumnSchema("c", "numeric(10,2)", "decimal"), PG)
    assert s["parameters"] == {"scale": "2", "connect.decimal.precision": "10"}
    assert column_schema(ColumnSchema("c", "numeric(5)", "decimal"), PG)["parameters"]["scale"] == "0"


@pytest.mark.parametrize(("n", "raw"), [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x00\x80"), (255, b"\x00\xff"), (256, b"\x01\x00"),
    (-1, b"\xff"), (-128, b"\x80"), (-129, b"\xff\x7f"), (-256, b"\xff\x00"),
])
def test_decimal_bytes_are_javas_big_integer(n: int, raw: bytes) -> None:
    """``BigInteger.toByteArray``: two's complement, big endian, fewest bytes."""
    assert formats._int_bytes(n) == raw


@pytest.mark.parametrize(("value", "sql", "logical", "expected"), [
    ("2024-02-29", "date", "date", 19782),
    ("1970-01-01", "date", "date", 0),
    ("1969-12-31", "date", "date", -1),
    ("00:00:00.500000", "time without time zone", "time", 500_000),
    ("24:00:00", "time without time zone", "time", 86_400_000_000),
    ("01:02:03.250000-08:00", "time with time zone", "timetz", "09:02:03.250000Z"),
    ("23:30:00+01:00", "time with time zone", "timetz", "22:30:00Z"),
    ("2024-01-02T03:04:05.123000", "timestamp without time zone", "timestamp", 1704164645123000),
    ("2024-01-02T03:04:05.123000", "timestamp(3) without time zone", "timestamp", 1704164645123),
    ("2024-01-02T01:04:05.123000Z", "timestamp with time zone", "timestamptz",
     "2024-01-02T01:04:05.123000Z"),
    ("P1Y2M3DT4H5M6.5S", "interval", "interval",
     round((14 * 365.25 / 12 + 3) * 86_400_000_000) + (4 * 3600 + 5 * 60) * 1_000_000 + 6_500_000),
    ("P-1D", "interval", "interval", -86_400_000_000),
    ("-123.4500", "numeric(10,4)", "decimal", formats._int_bytes(-1234500)),
    ("3.14", "numeric(10,2)", "decimal", formats._int_bytes(314)),
    ("NaN", "numeric(10,2)", "decimal", None),
    ("infinity", "date", "date", None),
    ({"a": [1, None]}, "jsonb", "json", '{"a":[1,null]}'),
    ("AP8Q", "bytea", "bytes", b"\x00\xff\x10"),
    ("NaN", "real", "float32", float("nan")),
    (["a", "b"], "set('a','b')", "array<string>", "a,b"),
])
def test_values_as_debezium_writes_them(value: Any, sql: str, logical: str, expected: Any) -> None:
    connector = "mysql" if sql.startswith("set") else PG
    got = to_connect(value, column_schema(ColumnSchema("c", sql, logical), connector))
    if isinstance(expected, float) and expected != expected:
        assert got != got
    else:
        assert got == expected


def test_variable_scale_decimal() -> None:
    s = column_schema(ColumnSchema("c", "numeric", "decimal"), PG)
    assert to_connect("-1.050", s) == {"scale": 3, "value": formats._int_bytes(-1050)}
    assert from_connect(to_connect("0.0000001", s), s) == "0.0000001"


# -- round trips -----------------------------------------------------------------------------

_dates = st.dates(min_value=dt.date(1, 1, 1), max_value=dt.date(9999, 12, 31))
_times = st.times()


def _time_text(t: dt.time) -> str:
    return t.isoformat()


EXACT: list[tuple[str, str, str, st.SearchStrategy[Any]]] = [
    ("smallint", "int16", PG, st.integers(-(2**15), 2**15 - 1)),
    ("bigint", "int64", PG, st.integers(-(2**63), 2**63 - 1)),
    ("boolean", "bool", PG, st.booleans()),
    ("text", "string", PG, st.text()),
    ("bytea", "bytes", PG, st.binary().map(lambda b: base64.b64encode(b).decode())),
    ("uuid", "uuid", PG, st.uuids().map(str)),
    ("jsonb", "json", PG, st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8)),
    ("date", "date", PG, _dates.map(dt.date.isoformat) | st.builds(_bc_date, _dates, st.integers(1, 11))),
    ("time without time zone", "time", PG, _times.map(_time_text)),
    ("timestamp without time zone", "timestamp", PG,
     st.datetimes(min_value=dt.datetime(1, 1, 1)).map(dt.datetime.isoformat)),
    ("timestamp(3) without time zone", "timestamp", PG,
     st.datetimes().map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000).isoformat())),
    ("numeric(12,3)", "decimal", PG,
     st.integers(-(10**12) + 1, 10**12 - 1).map(lambda n: format(Decimal(n).scaleb(-3), "f"))),
    ("numeric", "decimal", PG,
     st.decimals(allow_nan=False, allow_infinity=False, places=None).map(
         lambda d: format(d, "f"))),
    ("integer[]", "array<int32>", PG,
     st.lists(st.none() | st.integers(-(2**31), 2**31 - 1))),
    ("set('a','b','c')", "array<string>", "mysql",
     st.lists(st.sampled_from("abc"), min_size=1, unique=True)),
    ("datetime(6)", "timestamp", "mysql",
     st.datetimes(min_value=dt.datetime(1000, 1, 1)).map(dt.datetime.isoformat)),
]


@pytest.mark.parametrize(("sql", "logical", "connector", "values"), EXACT,
                         ids=[e[0] for e in EXACT])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_connect_values_convert_back_exactly(sql: str, logical: str, connector: str,
                                              values: st.SearchStrategy[Any], data: Any) -> None:
    value = data.draw(values)
    schema = column_schema(ColumnSchema("c", sql, logical), connector)
    back = from_connect(to_connect(value, schema), schema)
    if logical == "decimal" and "(" not in sql:
        assert Decimal(back) == Decimal(value) and back == format(Decimal(value), "f")
    else:
        assert back == value


# -- envelopes -------------------------------------------------------------------------------

TABLE = TableSchema("public", "items", (
    ColumnSchema("id", "integer", "int32", False),
    ColumnSchema("price", "numeric(10,2)", "decimal"),
    ColumnSchema("born", "date", "date"),
    ColumnSchema("at", "timestamp with time zone", "timestamptz"),
    ColumnSchema("doc", "jsonb", "json"),
    ColumnSchema("tags", "text[]", "array<string>"),
    ColumnSchema("raw", "bytea", "bytes"),
), ("id",))

ENV = {
    "op": "u", "ts_ms": 1700000000123,
    "source": {"connector": "postgresql", "db": "app", "schema": "public", "table": "items",
               "lsn": 123456, "txId": 77, "index": 2, "ts_ms": 1700000000000,
               "snapshot": "false"},
    "key": {"id": 7},
    "before": {"id": 7, "price": "1.50", "born": "2000-01-01", "at": "2024-01-02T01:04:05Z",
               "doc": {"a": 1}, "tags": ["x", None], "raw": "AP8Q"},
    "after": {"id": 7, "price": "2.25", "born": None, "at": "2024-01-02T01:04:05.5Z",
              "doc": [1, "two"], "tags": [], "raw": None},
}
TOPIC = "app.public.items"


def test_json_schema_envelope_is_debeziums() -> None:
    fmt = TableFormat.build(TOPIC, PG, TABLE, ENV, server="app")
    value, key = JsonSchemaEncoder().encode(fmt, ENV)
    doc = orjson.loads(value)
    assert set(doc) == {"schema", "payload"}
    schema, payload = doc["schema"], doc["payload"]
    assert schema["type"] == "struct" and schema["name"] == f"{TOPIC}.Envelope"
    fields = {f["field"]: f for f in schema["fields"]}
    assert list(fields)[:5] == ["before", "after", "source", "transaction", "op"]
    assert fields["before"]["name"] == fields["after"]["name"] == f"{TOPIC}.Value"
    assert fields["before"]["optional"] and fields["after"]["optional"]
    assert fields["source"]["name"] == "io.debezium.connector.postgresql.Source"
    cols = {f["field"]: f for f in fields["after"]["fields"]}
    assert cols["id"] == {"type": "int32", "optional": False, "field": "id"}
    assert cols["price"]["name"] == "org.apache.kafka.connect.data.Decimal"
    assert cols["tags"] == {"type": "array", "items": {"type": "string", "optional": True},
                            "optional": True, "field": "tags"}
    assert payload["op"] == "u" and payload["ts_ms"] == 1700000000123
    assert payload["after"]["price"] == base64.b64encode(formats._int_bytes(225)).decode()
    assert payload["before"]["born"] == 10957 and payload["after"]["born"] is None
    assert payload["before"]["doc"] == '{"a":1}'
    assert payload["before"]["raw"] == "AP8Q"
    assert payload["source"]["lsn"] == 123456 and payload["source"]["txId"] == 77
    assert payload["source"]["name"] == "app" and payload["source"]["schema"] == "public"
    assert payload["transaction"] is None  # Debezium's without provide.transaction.metadata
    # Debezium 2.x's finer timestamps: the same instants, at pydblog's millisecond precision
    assert (payload["ts_us"], payload["ts_ns"]) == (1700000000123000, 1700000000123000000)
    assert (payload["source"]["ts_us"], payload["source"]["ts_ns"]) == (
        1700000000000000, 1700000000000000000)
    assert payload["source"]["version"] == "pydblog" and payload["source"]["sequence"] is None
    k = orjson.loads(key)  # type: ignore[arg-type]
    assert k["schema"] == {"type": "struct", "optional": False, "name": f"{TOPIC}.Key",
                           "fields": [{"type": "int32", "optional": False, "field": "id"}]}
    assert k["payload"] == {"id": 7}


def test_finer_timestamps_are_null_where_ts_ms_is() -> None:
    fmt = TableFormat.build(TOPIC, PG, TABLE, ENV)
    payload = fmt.value_payload({**ENV, "ts_ms": None})
    assert payload["ts_us"] is None and payload["ts_ns"] is None
    assert payload["source"]["ts_us"] == 1700000000000000  # the source's own ts_ms
    source: dict[str, Any] = dict(ENV["source"])  # type: ignore[call-overload]
    src = {k: v for k, v in source.items() if k != "ts_ms"}
    payload = fmt.value_payload({**ENV, "source": src})
    assert payload["source"]["ts_ms"] == 1700000000123  # the event's, as ts_ms itself
    assert payload["source"]["ts_us"] == 1700000000123000


def test_every_payload_field_has_its_schema() -> None:
    """JsonConverter's rule: the payload's struct fields are exactly the schema's."""
    fmt = TableFormat.build(TOPIC, PG, TABLE, ENV)
    doc = orjson.loads(JsonSchemaEncoder().encode(fmt, ENV)[0])

    def check(schema: dict[str, Any], value: Any) -> None:
        if value is None:
            assert schema.get("optional"), schema
            return
        if schema["type"] == "struct":
            assert [f["field"] for f in schema["fields"]] == list(value)
            for f in schema["fields"]:
                check(f, value[f["field"]])
        elif schema["type"] == "array":
            for v in value:
                check(schema["items"], v)
    check(doc["schema"], doc["payload"])


def test_truncates_and_deletes() -> None:
    fmt = TableFormat.build(TOPIC, PG, TABLE, ENV)
    enc = JsonSchemaEncoder()
    value, key = enc.encode(fmt, {**ENV, "op": "t", "key": None, "before": None, "after": None})
    assert key is None and orjson.loads(value)["payload"]["op"] == "t"
    value, key = enc.encode(fmt, {**ENV, "op": "d", "after": None})
    payload = orjson.loads(value)["payload"]
    assert payload["after"] is None and payload["before"]["id"] == 7


class FakeRegistry:
    """A Confluent-API registry in memory, through ``Registry``'s opener."""

    def __init__(self) -> None:
        self.subjects: dict[str, list[str]] = {}
        self.by_id: list[str] = []

    def __call__(self, req: Any, timeout: float = 0) -> Any:
        if isinstance(req, str):  # GET /schemas/ids/<id>
            schema_id = int(req.rsplit("/", 1)[1])
            return io.BytesIO(json.dumps({"schema": self.by_id[schema_id - 1]}).encode())
        assert req.get_method() == "POST"
        subject = req.full_url.split("/subjects/")[1].split("/versions")[0]
        text = json.loads(req.data)["schema"]
        json.loads(text)
        if text not in self.by_id:
            self.by_id.append(text)
        self.subjects.setdefault(subject, []).append(text)
        return io.BytesIO(json.dumps({"id": self.by_id.index(text) + 1}).encode())


def test_avro_wire_format_and_subjects() -> None:
    fake = FakeRegistry()
    reg = Registry("http://user:pw@registry.invalid:8081", opener=fake)
    enc = AvroEncoder(reg)
    fmt = TableFormat.build(TOPIC, PG, TABLE, ENV)
    value, key = enc.encode(fmt, ENV)
    assert set(fake.subjects) == {f"{TOPIC}-key", f"{TOPIC}-value"}
    assert value[:1] == b"\x00" and key is not None and key[:1] == b"\x00"
    datum = decode_avro(value, reg)
    assert datum["op"] == "u"
    assert datum["after"]["price"] == formats._int_bytes(225)
    assert datum["before"]["raw"] == b"\x00\xff\x10"
    assert datum["before"]["tags"] == ["x", None]
    assert datum["source"]["lsn"] == 123456
    assert decode_avro(key, reg) == {"id": 7}
    enc.encode(fmt, ENV)  # the ids are cached: nothing registered again
    assert len(fake.subjects[f"{TOPIC}-value"]) == 1


def test_avro_schema_as_confluents_avro_data_writes_it() -> None:
    fastavro = pytest.importorskip("fastavro")
    fmt = TableFormat.build("app.public.2items", PG, TABLE, ENV)
    avro = connect_to_avro(fmt.value_schema)
    fastavro.parse_schema(avro)  # a valid Avro schema, decimal logical type included
    assert avro["name"] == "Envelope" and avro["namespace"] == "app.public._2items"
    assert avro["connect.name"] == "app.public.2items.Envelope"
    before, after = avro["fields"][0], avro["fields"][1]
    assert before["type"][0] == "null" and before["default"] is None
    assert after["type"] == ["null", "app.public._2items.Value"]  # the named type, again
    price = next(f for f in before["type"][1]["fields"] if f["name"] == "price")
    assert price["type"][1] == {
        "type": "bytes", "connect.name": "org.apache.kafka.connect.data.Decimal",
        "connect.version": 1, "logicalType": "decimal", "scale": 2, "precision": 10,
        "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"}}
    ident = next(f for f in before["type"][1]["fields"] if f["name"] == "id")
    assert ident == {"name": "id", "type": "int"}


def test_registry_errors_hide_credentials() -> None:
    def refuse(req: Any, timeout: float = 0) -> Any:
        raise OSError("connection refused")
    reg = Registry("http://user:secret@127.0.0.1:1", opener=refuse)
    with pytest.raises(formats.RegistryError) as info:
        reg.register("s-value", "{}")
    assert "secret" not in str(info.value) and "***@127.0.0.1:1" in str(info.value)


def test_a_new_table_schema_gives_new_schemas() -> None:
    f = Formatter("json-schema", "app")
    v1, _ = f.encode(TOPIC, TABLE, ENV)
    wider = TableSchema("public", "items", (*TABLE.columns, ColumnSchema("n", "bigint", "int64")),
                        TABLE.key)
    v2, _ = f.encode(TOPIC, wider, {**ENV, "after": {**ENV["after"], "n": 5}})  # type: ignore[dict-item]
    assert "n" not in [c["field"] for c in orjson.loads(v1)["schema"]["fields"][1]["fields"]]
    assert orjson.loads(v2)["payload"]["after"]["n"] == 5


def test_config_rules() -> None:
    from pydblog.config import LogConfig

    kafka = {"type": "kafka", "bootstrap_servers": "x:1", "topic_prefix": "p"}
    assert LogConfig(**kafka).value_format == "json"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="schema_registry_url"):
        LogConfig(**kafka, value_format="avro")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='needs type = "kafka"'):
        LogConfig(value_format="json-schema")
    with pytest.raises(ValueError, match="http"):
        LogConfig(**kafka, value_format="avro", schema_registry_url="registry:8081")  # type: ignore[arg-type]
    LogConfig(**kafka, value_format="avro", schema_registry_url="http://r:8081")  # type: ignore[arg-type]


def test_a_table_without_a_recorded_schema() -> None:
    """Types from the values; a truncate first, rows with their columns after it."""
    f = Formatter("json-schema", "app")
    trunc = {**ENV, "op": "t", "key": None, "before": None, "after": None}
    f.encode(TOPIC, None, trunc)
    row = {"id": 1, "name": "x", "n": 2.5, "ok": True, "doc": {"a": 1}}
    value, key = f.encode(TOPIC, None, {**ENV, "op": "c", "key": {"id": 1}, "before": None,
                                        "after": row})
    doc = orjson.loads(value)
    cols = {c["field"]: c for c in doc["schema"]["fields"][1]["fields"]}
    assert {n: c["type"] for n, c in cols.items()} == {
        "id": "int64", "name": "string", "n": "double", "ok": "boolean", "doc": "string"}
    assert cols["doc"]["name"] == "io.debezium.data.Json"
    assert doc["payload"]["after"] == {**row, "doc": '{"a":1}'}
    assert orjson.loads(key)["payload"] == {"id": 1}  # type: ignore[arg-type]
