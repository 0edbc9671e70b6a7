"""What information_schema says about the captured database's tables.

These are the *current* definitions. The binlog carries each row event's own column names,
types, signedness, charsets, ENUM/SET members and primary key (binlog_row_metadata=FULL);
only MariaDB's JSON columns (LONGTEXT with a ``json_valid`` CHECK) need this module on the
binlog path, and a DDL in the stream drops the cached answer.
"""

from __future__ import annotations

from typing import Any

from pydblog.ports import ColumnSchema, TableSchema
from pydblog.sources.mysql.types import ColumnType, logical_type


def list_tables(cur: Any, database: str) -> list[str]:
    cur.execute(
        "SELECT TABLE_NAME FROM information_schema.TABLES "
        "WHERE TABLE_SCHEMA = %s AND TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_NAME",
        (database,),
    )
    return [str(r[0]) for r in cur.fetchall()]


def json_columns(cur: Any, database: str, table: str, mariadb: bool) -> frozenset[str]:
    """Columns declared JSON: MySQL's own type, or MariaDB's ``json_valid`` CHECK."""
    if mariadb:
        cur.execute(
            "SELECT CONSTRAINT_NAME, CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS "
            "WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s",
            (database, table),
        )
        return frozenset(
            str(name)
            for name, clause in cur.fetchall()
            if str(clause).replace(" ", "").lower() == f"json_valid(`{str(name).lower()}`)"
        )
    cur.execute(
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND DATA_TYPE = 'json'",
        (database, table),
    )
    return frozenset(str(r[0]) for r in cur.fetchall())


def table_columns(cur: Any, database: str, table: str, mariadb: bool) -> list[ColumnType]:
    """Columns in ordinal order (empty if the table does not exist)."""
    cur.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
        (database, table),
    )
    rows = cur.fetchall()
    if not rows:
        return []
    js = json_columns(cur, database, table, mariadb)
    return [
        ColumnType(str(n), str(dt).lower(), str(ct), str(nl) == "YES", str(n) in js)
        for n, dt, ct, nl in rows
    ]


def primary_key(cur: Any, database: str, table: str) -> tuple[str, ...]:
    cur.execute(
        "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' "
        "ORDER BY ORDINAL_POSITION",
        (database, table),
    )
    return tuple(str(r[0]) for r in cur.fetchall())


def table_schema(cur: Any, database: str, table: str, mariadb: bool) -> TableSchema | None:
    """The table's columns and key for the change log's schema records."""
    cols = table_columns(cur, database, table, mariadb)
    if not cols:
        return None
    return TableSchema(
        database,
        table,
        tuple(ColumnSchema(c.name, c.column_type, logical_type(c), c.nullable) for c in cols),
        # the row identity: the primary key, else every column (as the binlog keys events)
        primary_key(cur, database, table) or tuple(c.name for c in cols),
    )
