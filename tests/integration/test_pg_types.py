"""Type mapping: every documented type, through both paths, against a real PostgreSQL.

For each case a table ``(id int PRIMARY KEY, v <type>)`` gets rows of literal values;
the test asserts that (a) the values captured through pgoutput and (b) ``SELECT v::text``
read with psycopg 3, both mapped by the one ``TypeRegistry``, equal the expected JSON
values. The database's own defaults are set to hostile values (German dates, verbose
intervals, a non-UTC zone, escaped bytea) so only ``SESSION_SETTINGS`` can make it pass.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.devtools.pgcluster import PgCluster
from pydblog.sources.postgres import pgoutput as po
from pydblog.sources.postgres.types import SESSION_SETTINGS, TypeRegistry, parse_array
from tests.conftest import drop_database
from tests.unit.test_pgoutput import make_slot, replication_options


@dataclass(frozen=True)
class Case:
    """A column type, SQL literals to insert and the JSON value each must map to."""

    name: str
    type_sql: str
    values: tuple[tuple[str, Any], ...]
    logical: str
    sql_type: str | None = None  # expected TypeRegistry.sql_type; default: format_type's


NULL: tuple[str, Any] = ("NULL", None)
TEXT_EDGES: tuple[tuple[str, Any], ...] = (
    ("''", ""),
    ("'héllo wörld ✓ 😀'", "héllo wörld ✓ 😀"),
    ("E'quote '' and \\\\ backslash'", "quote ' and \\ backslash"),
    ("E'line\\nbreak\\ttab'", "line\nbreak\ttab"),
    ("'NULL'", "NULL"),
    NULL,
)
TRICKY_TEXT_ARRAY = (
    "ARRAY['a,b', 'c\"d', E'e\\\\f', 'NULL', NULL, '', ' x ', '{}', 'ü']",
    ["a,b", 'c"d', "e\\f", "NULL", None, "", " x ", "{}", "ü"],
)

SETUP = (
    "CREATE EXTENSION citext",
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN price AS numeric(8,2)",
    "CREATE DOMAIN tags AS text[]",
    "CREATE TYPE pair AS (a int, b text)",
)

CASES: tuple[Case, ...] = (
    Case("int2", "smallint", (("-32768", -32768), ("32767", 32767), NULL), "int16"),
    Case("int4", "integer", (("0", 0), ("-2147483648", -2147483648), NULL), "int32"),
    Case("int8", "bigint", (("9223372036854775807", 9223372036854775807), NULL), "int64"),
    Case("oid", "oid", (("4294967295", 4294967295),), "int64"),
    Case(
        "numeric",
        "numeric",
        (
            ("-123.4500", "-123.4500"),
            ("'NaN'", "NaN"),
            ("'Infinity'", "Infinity"),
            ("1e-20", "0.00000000000000000001"),
            ("12345678901234567890.123456789", "12345678901234567890.123456789"),
            NULL,
        ),
        "decimal",
    ),
    Case("numeric_p_s", "numeric(10,2)", (("3.14159", "3.14"), ("-0.5", "-0.50")), "decimal"),
    Case(
        "float4",
        "real",
        (
            ("1.5", 1.5),
            ("0.1", 0.1),
            ("'NaN'", "NaN"),
            ("'Infinity'", "Infinity"),
            ("'-Infinity'", "-Infinity"),
            NULL,
        ),
        "float32",
    ),
    Case(
        "float8",
        "double precision",
        (("3.141592653589793", 3.141592653589793), ("1e308", 1e308), ("-1e-300", -1e-300)),
        "float64",
    ),
    Case("bool", "boolean", (("true", True), ("false", False), NULL), "bool"),
    Case("text", "text", TEXT_EDGES, "string"),
    Case("varchar", "varchar(20)", (("'abc'", "abc"), ("''", ""), NULL), "string"),
    Case("bpchar", "char(5)", (("'ab'", "ab"), ("'abcde'", "abcde"), NULL), "string"),
    Case("char", '"char"', (("'x'", "x"),), "string"),
    Case("name", "name", (("'a_name'", "a_name"),), "string"),
    Case("citext", "citext", (("'MiXeD'", "MiXeD"),), "string", "public.citext"),
    Case(
        "bytea",
        "bytea",
        (("'\\x00ff10'::bytea", "AP8Q"), ("''::bytea", ""), ("'abc'::bytea", "YWJj"), NULL),
        "bytes",
    ),
    Case(
        "uuid",
        "uuid",
        (("'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),),
        "uuid",
    ),
    Case(
        "date",
        "date",
        (
            ("'2024-02-29'", "2024-02-29"),
            ("'infinity'", "infinity"),
            ("'-infinity'", "-infinity"),
            ("'0044-03-15 BC'", "0044-03-15 BC"),
            NULL,
        ),
        "date",
    ),
    Case(
        "time",
        "time",
        (("'12:34:56'", "12:34:56"), ("'00:00:00.5'", "00:00:00.500000"), ("'24:00'", "24:00:00")),
        "time",
    ),
    Case("time_p", "time(3)", (("'12:34:56.789'", "12:34:56.789000"),), "time"),
    Case(
        "timetz",
        "timetz",
        (
            ("'12:00:00+05:30'", "12:00:00+05:30"),
            ("'01:02:03.25-08'", "01:02:03.250000-08:00"),
        ),
        "timetz",
    ),
    Case(
        "timestamp",
        "timestamp",
        (
            ("'2024-01-02 03:04:05.123'", "2024-01-02T03:04:05.123000"),
            ("'2024-01-02 03:04:05'", "2024-01-02T03:04:05"),
            ("'infinity'", "infinity"),
            ("'0044-03-15 10:00:00.5 BC'", "0044-03-15 10:00:00.5 BC"),
            ("'0001-01-01 00:00:00'", "0001-01-01T00:00:00"),
            ("'0099-06-01 12:00:00.000001'", "0099-06-01T12:00:00.000001"),
            ("'10000-01-01 00:00:00'", "10000-01-01T00:00:00"),
            NULL,
        ),
        "timestamp",
    ),
    Case(
        "timestamptz",
        "timestamptz",
        (
            ("'2024-01-02 03:04:05.123+02'", "2024-01-02T01:04:05.123000Z"),
            ("'2024-07-01 00:00:00 America/New_York'", "2024-07-01T04:00:00Z"),
            ("'1999-12-31 23:59:59.999999+00'", "1999-12-31T23:59:59.999999Z"),
            ("'-infinity'", "-infinity"),
            ("'0044-03-15 10:00:00+00 BC'", "0044-03-15 10:00:00+00 BC"),
            ("'0001-01-01 00:00:00.25+00'", "0001-01-01T00:00:00.250000Z"),
            ("'10000-01-01 00:00:00+00'", "10000-01-01T00:00:00Z"),
            NULL,
        ),
        "timestamptz",
    ),
    Case(
        "timestamptz_p",
        "timestamptz(0)",
        (("'2024-01-02 03:04:05.6Z'", "2024-01-02T03:04:06Z"),),
        "timestamptz",
    ),
    Case(
        "interval",
        "interval",
        (
            ("'1 year 2 months 3 days 04:05:06.5'", "P1Y2M3DT4H5M6.5S"),
            ("'0'", "PT0S"),
            ("'-1 day'", "P-1D"),
            NULL,
        ),
        "interval",
    ),
    Case(
        "interval_fields",
        "interval day to second(3)",
        (("'1 day 00:00:01.2345'", "P1DT1.235S"),),
        "interval",
    ),
    Case(
        "json",
        "json",
        (
            (
                '\'{"a": [1, 2.5, {"b": null}], "c": "x", "d": {"e": true}}\'',
                {"a": [1, 2.5, {"b": None}], "c": "x", "d": {"e": True}},
            ),
            ("'\"str\"'", "str"),
            ("'[]'", []),
            ("'123'", 123),
            # json keeps its input verbatim, raw newlines between tokens included
            ("E'{\\n \"k\": \"a\\\\nb\",\\r\\n \"n\": [1,\\n2]}'", {"k": "a\nb", "n": [1, 2]}),
            NULL,
        ),
        "json",
    ),
    Case(
        "jsonb",
        "jsonb",
        (('\'{"b": [1, "ü"], "a": {}}\'', {"a": {}, "b": [1, "ü"]}), ("'null'", None)),
        "json",
    ),
    Case(
        "int_array",
        "integer[]",
        (("'{1,NULL,3}'", [1, None, 3]), ("'{}'", []), ("'[0:1]={7,8}'", [7, 8]), NULL),
        "array<int32>",
    ),
    Case(
        "int_array_2d",
        "integer[][]",
        (
            ("'{{1,2},{3,NULL}}'", [[1, 2], [3, None]]),
            ("'{{{1},{2}},{{3},{4}}}'", [[[1], [2]], [[3], [4]]]),
        ),
        "array<int32>",
        "integer[]",
    ),
    Case(
        "text_array",
        "text[]",
        (TRICKY_TEXT_ARRAY, ("ARRAY[ARRAY['a','b'],ARRAY['c,',NULL]]", [["a", "b"], ["c,", None]])),
        "array<string>",
    ),
    Case(
        "varchar_array",
        "varchar(3)[]",
        (("'{ab,\"c d\"}'", ["ab", "c d"]),),
        "array<string>",
    ),
    Case("bpchar_array", "char(3)[]", (("'{a,bb}'", ["a", "bb"]),), "array<string>"),
    Case("bool_array", "boolean[]", (("'{t,f,NULL}'", [True, False, None]),), "array<bool>"),
    Case(
        "numeric_array",
        "numeric(6,2)[]",
        (("'{1.5,-2,NaN}'", ["1.50", "-2.00", "NaN"]),),
        "array<decimal>",
    ),
    Case(
        "float8_array",
        "float8[]",
        (("'{1.25,NaN,-Infinity}'", [1.25, "NaN", "-Infinity"]),),
        "array<float64>",
    ),
    Case(
        "timestamptz_array",
        "timestamptz[]",
        (
            (
                "ARRAY['2024-01-02 03:04:05+00'::timestamptz, 'infinity']",
                ["2024-01-02T03:04:05Z", "infinity"],
            ),
        ),
        "array<timestamptz>",
    ),
    Case(
        "jsonb_array",
        "jsonb[]",
        (("ARRAY['{\"a\": \"x,y\"}'::jsonb, '[1]', NULL]", [{"a": "x,y"}, [1], None]),),
        "array<json>",
    ),
    Case("bytea_array", "bytea[]", (("ARRAY['\\x01ff'::bytea]", ["Af8="]),), "array<bytes>"),
    Case(
        "uuid_array",
        "uuid[]",
        (
            (
                "ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid]",
                ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
            ),
        ),
        "array<uuid>",
    ),
    Case(
        "date_array",
        "date[]",
        (("'{2024-01-01,infinity}'", ["2024-01-01", "infinity"]),),
        "array<date>",
    ),
    Case(
        "box_array",
        "box[]",
        (("ARRAY[box '((0,0),(1,1))', box '((2,2),(3,3))']", ["(1,1),(0,0)", "(3,3),(2,2)"]),),
        "array<string>",
    ),
    Case("enum", "mood", (("'happy'", "happy"), NULL), "enum", "public.mood"),
    Case("enum_array", "mood[]", (("'{sad,ok}'", ["sad", "ok"]),), "array<enum>", "public.mood[]"),
    Case("domain_int", "posint", (("5", 5),), "int32", "integer"),
    Case("domain_numeric", "price", (("1.5", "1.50"),), "decimal", "numeric(8,2)"),
    Case("domain_elem_array", "posint[]", (("'{1,2}'", [1, 2]),), "array<int32>", "integer[]"),
    Case("domain_array", "tags", (("'{a,\"b c\"}'", ["a", "b c"]),), "array<string>", "text[]"),
    Case("composite", "pair", (("ROW(1, 'x y')", '(1,"x y")'),), "string", "public.pair"),
    Case("money", "money", (("12.34", "$12.34"),), "string"),
    Case(
        "inet",
        "inet",
        (("'10.0.0.1'", "10.0.0.1"), ("'10.0.0.0/8'", "10.0.0.0/8"), ("'::1'", "::1")),
        "string",
    ),
    Case("cidr", "cidr", (("'10.0.0.0/8'", "10.0.0.0/8"),), "string"),
    Case("point", "point", (("'(1,2.5)'", "(1,2.5)"),), "string"),
    Case("int4range", "int4range", (("'[1,5)'", "[1,5)"), ("'empty'", "empty")), "string"),
    Case("bit", "bit(4)", (("B'1010'", "1010"),), "string"),
)


HOSTILE_DEFAULTS = {
    "DateStyle": "'SQL, DMY'",
    "IntervalStyle": "postgres_verbose",
    "TimeZone": "'Asia/Kathmandu'",
    "extra_float_digits": "0",
    "bytea_output": "escape",
}


@dataclass
class Captured:
    registry: TypeRegistry
    stream: dict[str, list[tuple[Any, ...]]]  # case name -> [(raw text, mapped), ...]
    snapshot: dict[str, list[tuple[Any, ...]]]
    exact: dict[str, list[str | None]]  # via TypeRegistry.text_expr
    relations: dict[str, po.Relation]
    format_types: dict[str, str]
    dsn: str


def _session_conn(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, options=replication_options())


def _map(registry: TypeRegistry, oid: int, raw: str | None) -> Any:
    return None if raw is None else registry.converter(oid)(raw)


@pytest.fixture(scope="module")
def captured(pg_cluster: PgCluster) -> Iterator[Captured]:
    name = f"t_{uuid.uuid4().hex[:10]}"
    dsn = pg_cluster.create_database(name)
    try:
        yield _capture_all(dsn, name)
    finally:
        drop_database(pg_cluster, name)


def _capture_all(dsn: str, dbname: str) -> Captured:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for key, value in HOSTILE_DEFAULTS.items():
            conn.execute(f'ALTER DATABASE "{dbname}" SET {key} = {value}')
        for stmt in SETUP:
            conn.execute(stmt)
        for case in CASES:
            conn.execute(f"CREATE TABLE t_{case.name} (id int PRIMARY KEY, v {case.type_sql})")
    slot = make_slot(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        for case in CASES:
            for i, (literal, _) in enumerate(case.values):
                conn.execute(f"INSERT INTO t_{case.name} VALUES ({i}, {literal})")
    messages = [po.decode(raw) for raw in slot.capture()]
    relations = {m.oid: m for m in messages if isinstance(m, po.Relation)}
    by_name = {r.name.removeprefix("t_"): r for r in relations.values()}
    with _session_conn(dsn) as conn:
        registry = TypeRegistry.load(conn)
        stream: dict[str, list[tuple[Any, ...]]] = {c.name: [] for c in CASES}
        for m in messages:
            if isinstance(m, po.Insert):
                rel = relations[m.relation_oid]
                raw = m.new[1]
                assert not isinstance(raw, po.Unchanged)
                stream[rel.name.removeprefix("t_")].append(
                    (raw, _map(registry, rel.columns[1].type_oid, raw))
                )
        snapshot, exact, format_types = {}, {}, {}
        for case in CASES:
            oid = by_name[case.name].columns[1].type_oid
            rows = conn.execute(
                f"SELECT v::text, {registry.text_expr('v', oid)} FROM t_{case.name} ORDER BY id"
            ).fetchall()
            snapshot[case.name] = [(r[0], _map(registry, oid, r[0])) for r in rows]
            exact[case.name] = [r[1] for r in rows]
            format_types[case.name] = conn.execute(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                " WHERE attrelid = %s::regclass AND attname = 'v'",
                (f"t_{case.name}",),
            ).fetchone()[0]  # type: ignore[index]
    return Captured(registry, stream, snapshot, exact, by_name, format_types, dsn)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_stream_and_snapshot_map_to_expected(captured: Captured, case: Case) -> None:
    expected = [value for _, value in case.values]
    assert [mapped for _, mapped in captured.stream[case.name]] == expected
    assert [mapped for _, mapped in captured.snapshot[case.name]] == expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_json_text_expr_gives_the_mapped_values(captured: Captured, case: Case) -> None:
    """The snapshot's fast path: PostgreSQL writes each value's JSON text with
    ``json_text_expr``; parsed, it must equal the mapping's value (arrays and timetz have
    none: their tables take the text path checked above)."""
    oid = captured.relations[case.name].columns[1].type_oid
    expr = captured.registry.json_text_expr("v", oid)
    if expr is None:
        assert case.logical.startswith("array<") or case.logical == "timetz", case.name
        return
    with _session_conn(captured.dsn) as conn:
        rows = conn.execute(f"SELECT {expr} FROM t_{case.name} ORDER BY id").fetchall()
    got = [None if r[0] is None else orjson.loads(r[0]) for r in rows]
    assert got == [value for _, value in case.values]
    # the change log separates bodies by newlines: no JSON text may hold a raw one
    assert not any(r[0] is not None and ("\n" in r[0] or "\r" in r[0]) for r in rows)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_text_expr_gives_pgoutput_text(captured: Captured, case: Case) -> None:
    assert captured.exact[case.name] == [raw for raw, _ in captured.stream[case.name]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_logical_and_sql_type(captured: Captured, case: Case) -> None:
    col = captured.relations[case.name].columns[1]
    assert captured.registry.logical_type(col.type_oid) == case.logical
    sql_type = captured.registry.sql_type(col.type_oid, col.type_modifier)
    assert sql_type == (case.sql_type or captured.format_types[case.name])


def test_sql_type_is_castable(captured: Captured, pg_db: str) -> None:
    """Every non-domain sql_type works in CREATE TABLE on another database."""
    columns = ", ".join(
        f"c_{case.name} {captured.registry.sql_type(rel.columns[1].type_oid, rel.columns[1].type_modifier)}"
        for case in CASES
        if (rel := captured.relations[case.name])
        and case.name not in ("citext",)
        and "public." not in (case.sql_type or "")
    )
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE downstream ({columns})")


def test_new_enum_after_load_needs_refresh(pg_db: str) -> None:
    with _session_conn(pg_db) as conn:
        registry = TypeRegistry.load(conn)
        conn.execute("CREATE TYPE later AS ENUM ('a', 'b')")
        oid = conn.execute("SELECT 'later'::regtype::oid").fetchone()[0]  # type: ignore[index]
        array_oid = conn.execute("SELECT 'later[]'::regtype::oid").fetchone()[0]  # type: ignore[index]
        assert not registry.known(oid)
        assert registry.logical_type(array_oid) == "unknown"
        assert registry.converter(array_oid)("{a,b}") == "{a,b}"  # passthrough before refresh
        registry.refresh(conn, [oid])
        assert registry.known(oid) and registry.known(array_oid)
        assert registry.logical_type(array_oid) == "array<enum>"
        assert registry.converter(array_oid)("{a,b}") == ["a", "b"]
        assert registry.sql_type(array_oid, -1) == "public.later[]"


def test_session_settings_are_space_free() -> None:
    """connect.py passes them as ``-c key=value`` without quoting."""
    assert all(" " not in k + v for k, v in SESSION_SETTINGS.items())


# -- pure converter and parser tests -------------------------------------------------------


def test_unknown_oid_passes_text_through() -> None:
    registry = TypeRegistry()
    assert registry.converter(999_999)("anything") == "anything"
    assert registry.logical_type(999_999) == "unknown"
    assert registry.sql_type(999_999, -1) == "text"


def test_timestamptz_with_other_offsets_is_converted_to_utc() -> None:
    conv = TypeRegistry().converter(1184)
    assert conv("2024-01-02 03:04:05.5+05:45") == "2024-01-01T21:19:05.500000Z"
    assert conv("2024-01-02 03:04:05-08") == "2024-01-02T11:04:05Z"
    assert conv("10000-01-01 00:00:00+00") == "10000-01-01T00:00:00Z"
    assert conv("0044-03-15 12:00:00+00 BC") == "0044-03-15 12:00:00+00 BC"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{}", []),
        ('{""}', [""]),
        ("{NULL}", [None]),
        ('{"NULL"}', ["NULL"]),
        ('{"a\\\\b","c\\"d"}', ["a\\b", 'c"d']),
        ("{{a,b},{c,d}}", [["a", "b"], ["c", "d"]]),
        ("[2:3][1:1]={{x},{y}}", [["x"], ["y"]]),
        ('{"{}",{}}', ["{}", []]),
    ],
)
def test_parse_array_examples(text: str, expected: list[Any]) -> None:
    assert parse_array(text) == expected


@pytest.mark.parametrize("text", ["", "x", "{a", "{a}}", '{"a}', "{{a},{b}"])
def test_parse_array_rejects_malformed(text: str) -> None:
    with pytest.raises((ValueError, IndexError)):
        parse_array(text)


def _quote(element: str | None) -> str:
    """An element as array_out writes it (the inverse of the parser, for round trips)."""
    if element is None:
        return "NULL"
    if (
        element == ""
        or element.upper() == "NULL"
        or any(c in element for c in '{}",\\')
        or any(c.isspace() for c in element)
    ):
        escaped = element.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    return element


def _literal(value: list[Any]) -> str:
    return "{" + ",".join(_literal(v) if isinstance(v, list) else _quote(v) for v in value) + "}"


elements = st.one_of(st.none(), st.text(max_size=8))
arrays = st.recursive(
    st.lists(elements, min_size=1, max_size=4),
    lambda inner: st.lists(inner, min_size=1, max_size=3),
    max_leaves=20,
)


@given(arrays)
def test_parse_array_round_trip(value: list[Any]) -> None:
    assert parse_array(_literal(value)) == value


pg_text = st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=6)
pg_elements = st.one_of(st.none(), pg_text)
pg_arrays = st.one_of(
    st.lists(pg_elements, min_size=1, max_size=5),
    st.integers(1, 3).flatmap(
        lambda width: st.lists(
            st.lists(pg_elements, min_size=width, max_size=width), min_size=1, max_size=3
        )
    ),
)


@settings(max_examples=60, deadline=None)
@given(pg_arrays)
def test_parse_array_reads_what_postgresql_prints(pg_cluster: PgCluster, value: list[Any]) -> None:
    with _session_conn(pg_cluster.dsn()) as conn:
        row = conn.execute("SELECT %s::text[]::text", (value,)).fetchone()
    assert row is not None
    assert parse_array(row[0]) == value
