"""Downstream PostgreSQL column types: the source's own when it is a PostgreSQL
built-in, else derived from the logical type (a MySQL source, an enum)."""

from __future__ import annotations

import psycopg
import pytest

from pydblog.ports import ColumnSchema
from pydblog.spark.sinks.postgres import target_type


@pytest.mark.parametrize(
    ("source_type", "logical", "expected"),
    [
        ("integer", "int32", "integer"),
        ("numeric(12,3)", "decimal", "numeric(12,3)"),
        ("character varying(20)", "string", "character varying(20)"),
        ("timestamp with time zone", "timestamptz", "timestamp with time zone"),
        ("text[]", "array<string>", "text[]"),
        ("mood", "enum", "text"),
        ("int(11)", "int32", "integer"),
        ("bigint(20) unsigned", "int64", "numeric(20,0)"),
        ("int(10) unsigned", "int32", "bigint"),
        ("decimal(12,2)", "decimal", "numeric(12,2)"),
        ("datetime(6)", "timestamp", "timestamp without time zone"),
        ("timestamp(3)", "timestamptz", "timestamp with time zone"),
        ("double", "float64", "double precision"),
        ("tinyint(1)", "int16", "smallint"),
        ("varchar(40)", "string", "text"),
        ("enum('a','b')", "enum", "text"),
        ("longblob", "bytes", "bytea"),
        ("json", "json", "json"),
        ("set('x','y')", "array<string>", "text[]"),
        ("geometry", "unknown", "text"),
    ],
)
def test_target_type(source_type: str, logical: str, expected: str) -> None:
    assert target_type(ColumnSchema("c", source_type, logical)) == expected


def test_every_mapped_type_is_valid_on_postgresql(pg_db: str) -> None:
    cols = [
        ColumnSchema(f"c{i}", t, lg)
        for i, (t, lg) in enumerate(
            [("int(11)", "int32"), ("decimal(12,2)", "decimal"), ("datetime(6)", "timestamp"),
             ("double", "float64"), ("enum('a')", "enum"), ("blob", "bytes"),
             ("set('x')", "array<string>"), ("time(3)", "time"), ("year(4)", "int16")]
        )
    ]
    ddl = ", ".join(f"{c.name} {target_type(c)}" for c in cols)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE mapped ({ddl})")


def test_bytea_values_are_decoded_from_base64(pg_db: str) -> None:
    from pydblog.spark.sinks.postgres import _copy_value

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE b (v bytea)")
        with conn.cursor().copy("COPY b (v) FROM STDIN") as copy:
            copy.write_row([_copy_value("AP8=", "bytea")])
        assert conn.execute("SELECT v FROM b").fetchone() == (b"\x00\xff",)
