"""Naming a TABLE_MAP's columns where the binlog does not carry the names (MySQL < 8.0.14).

Without ``binlog_row_metadata=FULL`` a TABLE_MAP event has each column's type and binary
metadata (lengths, precision, fractional seconds) but no name, signedness, charset, ENUM/SET
members or primary key. Those come from ``information_schema`` here, which describes the
table *now*, not as it was when the row events were written. So:

Invariants:
- A TABLE_MAP is named only by a definition with the same number of columns and, column by
  column, the same binlog type (``type_mismatch``), or, where only harmless ALTERs lie
  ahead (below), of which its columns are a prefix (``ADD COLUMN`` appends). Anything else
  is a ``SourceError``: rows are never decoded with another version's column list.
- Same count and types do not prove same names (a rename, or a drop and add of a column of
  the same type). ``DdlLookahead`` scans the binlog between the row events and the
  server's end for DDL on the table; if one may rename, reorder or drop a column
  (``may_rename``: renames, moves, drops, MODIFY/CHANGE, CONVERT), the rows cannot be named safely either: ``SourceError``. Other DDL
  (``ADD INDEX``, ``ALTER COLUMN ... SET DEFAULT``, ``ENGINE=``) keeps them right.
- The binlog source caches one definition per table and drops it at every DDL on the table
  it reads, so each definition is read after the last DDL before the rows it names.

MySQL 8.0.14+ and MariaDB 10.5+ with ``binlog_row_metadata=FULL`` never come here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import RowsEvent

from pydblog.sources.mysql.ddl import DdlKind, parse_ddl
from pydblog.sources.mysql.gtid import MySqlGtidSet
from pydblog.sources.mysql.position import file_sequence


@dataclass(frozen=True, slots=True)
class SchemaColumn:
    """One column as information_schema.COLUMNS describes it."""

    name: str
    data_type: str  # lower case
    column_type: str
    charset: str | None  # CHARACTER_SET_NAME (None for binary and non-text types)
    is_json: bool = False

    @property
    def unsigned(self) -> bool:
        return "unsigned" in self.column_type.lower()


@dataclass(frozen=True, slots=True)
class SchemaTable:
    """A table's definition as read at one moment: columns in ordinal order, primary key."""

    columns: tuple[SchemaColumn, ...]
    primary_key: tuple[str, ...]
    charset: str | None = None  # the table's default charset (for columns added later)


def read_table(cur: Any, database: str, table: str) -> SchemaTable | None:
    """The table's current definition (None if it does not exist)."""
    cur.execute(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME "
        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
        "ORDER BY ORDINAL_POSITION",
        (database, table),
    )
    rows = cur.fetchall()
    if not rows:
        return None
    cols = tuple(
        SchemaColumn(
            str(n), str(dt).lower(), str(ct), str(cs) if cs is not None else None,
            str(dt).lower() == "json",
        )
        for n, dt, ct, cs in rows
    )
    cur.execute(
        "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' "
        "ORDER BY ORDINAL_POSITION",
        (database, table),
    )
    pk = tuple(str(r[0]) for r in cur.fetchall())
    cur.execute(
        "SELECT TABLE_COLLATION FROM information_schema.TABLES "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
        (database, table),
    )
    row = cur.fetchone()
    collation = str(row[0]) if row and row[0] else None
    charset = collation.lower().split("_", 1)[0] if collation else None
    return SchemaTable(cols, pk, charset)


# The binlog type codes a column of each information_schema DATA_TYPE can have (the old
# pre-5.6 temporal codes too: a table created by an old server keeps them).
_CODES: dict[str, frozenset[int]] = {
    "tinyint": frozenset({FIELD_TYPE.TINY}),
    "smallint": frozenset({FIELD_TYPE.SHORT}),
    "mediumint": frozenset({FIELD_TYPE.INT24}),
    "int": frozenset({FIELD_TYPE.LONG}),
    "bigint": frozenset({FIELD_TYPE.LONGLONG}),
    "float": frozenset({FIELD_TYPE.FLOAT}),
    "double": frozenset({FIELD_TYPE.DOUBLE}),
    "decimal": frozenset({FIELD_TYPE.NEWDECIMAL}),
    "year": frozenset({FIELD_TYPE.YEAR}),
    "date": frozenset({FIELD_TYPE.DATE, FIELD_TYPE.NEWDATE}),
    "time": frozenset({FIELD_TYPE.TIME, FIELD_TYPE.TIME2}),
    "datetime": frozenset({FIELD_TYPE.DATETIME, FIELD_TYPE.DATETIME2}),
    "timestamp": frozenset({FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIMESTAMP2}),
    "char": frozenset({FIELD_TYPE.STRING}),
    "binary": frozenset({FIELD_TYPE.STRING}),
    "varchar": frozenset({FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING}),
    "varbinary": frozenset({FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING}),
    "enum": frozenset({FIELD_TYPE.ENUM}),
    "set": frozenset({FIELD_TYPE.SET}),
    "bit": frozenset({FIELD_TYPE.BIT}),
    "json": frozenset({FIELD_TYPE.JSON}),
}
for _t in ("tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob", "longblob"):
    _CODES[_t] = frozenset({FIELD_TYPE.BLOB})
for _t in (
    "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
    "multipolygon", "geometrycollection",
):
    _CODES[_t] = frozenset({FIELD_TYPE.GEOMETRY})


def type_mismatch(columns: Sequence[Any], table: SchemaTable, appended: bool = False) -> str | None:
    """Why ``table`` cannot name the TABLE_MAP ``columns`` (None if it can). With
    ``appended`` (only ALTERs that cannot rename, move, drop or retype lie between the rows
    and ``table``: columns can only have been added at the end) the rows may have a prefix
    of ``table``'s columns."""
    n = len(columns)
    if n != len(table.columns) and not (appended and n < len(table.columns)):
        return f"the binlog's rows have {n} columns, the table now has {len(table.columns)}"
    for i, (col, sc) in enumerate(zip(columns, table.columns[:n], strict=True)):
        codes = _CODES.get(sc.data_type)
        if codes is None or col.type not in codes:
            return (
                f"column {i + 1} is binlog type {col.type} in the rows but "
                f"{sc.column_type} ({sc.name}) now"
            )
    return None


_BYTES = frozenset(
    {FIELD_TYPE.STRING, FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING, FIELD_TYPE.BLOB, FIELD_TYPE.GEOMETRY}
)


def _members(column_type: str) -> list[str]:
    """``enum('a','b''c')`` -> ``['a', "b'c"]``."""
    body = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    return [m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", body)]


def name_columns(columns: Sequence[Any], table: SchemaTable) -> None:
    """Give the TABLE_MAP's columns (mysql-replication ``Column`` objects) what
    ``binlog_row_metadata=FULL`` would have: name, signedness, charset, ENUM/SET members,
    primary key membership. Call only when ``type_mismatch`` is None."""
    key = set(table.primary_key)
    for col, sc in zip(columns, table.columns[: len(columns)], strict=True):
        col.name = sc.name
        col.unsigned = sc.unsigned
        col.is_primary = sc.name in key
        if sc.charset is not None:
            col.character_set_name = RowsEvent.charset_to_encoding(sc.charset)
        elif col.type in _BYTES:  # BINARY/VARBINARY/BLOB: what FULL metadata says
            col.character_set_name = "binary"
        if col.type == FIELD_TYPE.ENUM:
            col.enum_values = ["", *_members(sc.column_type)]
        elif col.type == FIELD_TYPE.SET:
            col.set_values = _members(sc.column_type)


# -- DDL after the rows --------------------------------------------------------------------
# Clauses of an ALTER TABLE that can change a column's name, position, signedness, charset or
# ENUM/SET members: renames (of a column, or of the table: another table may take its
# name), moves, drops (of a column: not of an index, key or constraint), MODIFY/CHANGE,
# CONVERT TO CHARACTER SET. ADD is not among them (an added
# column changes the count, which ``type_mismatch`` sees).
_RISKY = re.compile(
    r"\bCHANGE\b|\bMODIFY\b|\bCONVERT\b|\bRENAME\s+(?!INDEX\b|KEY\b)|\bFIRST\b|\bAFTER\b"
    r"|\bDROP\s+(?!INDEX\b|KEY\b|PRIMARY\b|FOREIGN\b|CHECK\b|CONSTRAINT\b|PARTITION\b)",
    re.I,
)


def may_rename(kind: DdlKind, query: str) -> bool:
    """Whether a DDL on a table may change what ``name_columns`` gives its columns
    (conservative). A plain CREATE TABLE never changes a table that exists (and the rows
    being named prove it existed; a DROP or RENAME in between is itself counted): pydblog's
    own ``CREATE TABLE IF NOT EXISTS`` at every start is binlogged by MySQL even as a
    no-op. DROP, RENAME and MariaDB's ``CREATE OR REPLACE`` count."""
    if kind == DdlKind.TRUNCATE:
        return False
    if kind == DdlKind.CREATE:
        return bool(_OR_REPLACE.match(query))
    if kind != DdlKind.ALTER:
        return True
    return bool(_RISKY.search(query))


_OR_REPLACE = re.compile(r"^\s*CREATE\s+OR\s+REPLACE\b", re.I)


_USE = re.compile(r"^\s*use\s+`((?:[^`]|``)+)`\s*;\s*", re.I)


@dataclass(slots=True)
class DdlLookahead:
    """DDL statements found in the binlog ahead of the stream, by scanning it with ``SHOW
    BINLOG EVENTS`` up to the server's end. Each byte is scanned once; what the stream has
    passed is forgotten."""

    page: int = 5000
    scanned: tuple[str, int] | None = None  # (file, offset) the scan has reached
    found: list[tuple[tuple[int, int], str, str, DdlKind, str]] = field(default_factory=list)

    def reset(self) -> None:
        self.scanned = None
        self.found.clear()

    def ahead(
        self, cur: Any, here: tuple[str, int], database: str, table: str
    ) -> list[tuple[DdlKind, str]]:
        """DDL on ``database.table`` in the binlog after ``here`` (an event boundary)."""
        here_key = (file_sequence(here[0]), here[1])
        if self.scanned is None or (file_sequence(self.scanned[0]), self.scanned[1]) < here_key:
            self.scanned = here
            self.found.clear()
        self.found = [f for f in self.found if f[0] > here_key]
        self._scan(cur)
        return [(kind, q) for _, db, t, kind, q in self.found if (db, t) == (database, table)]

    def _scan(self, cur: Any) -> None:
        assert self.scanned is not None
        cur.execute("SHOW BINARY LOGS")
        files = [str(r[0]) for r in cur.fetchall()]
        file, offset = self.scanned
        later = [f for f in files if file_sequence(f) > file_sequence(file)]
        for name in [file, *later]:
            if name != file:
                offset = 4
            while True:
                cur.execute(f"SHOW BINLOG EVENTS IN %s FROM {int(offset)} LIMIT {self.page}", (name,))
                rows = cur.fetchall()
                for _log, pos, kind, _sid, end, info in rows:
                    if str(kind) == "Query":
                        self._note(file_sequence(name), int(pos), str(info))
                    offset = max(offset, int(end) if int(end) else offset)
                self.scanned = (name, offset)
                if len(rows) < self.page:
                    break

    def _note(self, seq: int, pos: int, info: str) -> None:
        m = _USE.match(info)
        default_db = m.group(1).replace("``", "`") if m else ""
        query = info[m.end() :] if m else info
        ddl = parse_ddl(query, default_db)
        if ddl is not None:
            for db, t in ddl.tables:
                self.found.append(((seq, pos), db, t, ddl.kind, query))


_GTID_NEXT = re.compile(r"'([^']+)'")


def mysql_state_at(cur: Any, file: str, offset: int, page: int = 5000) -> MySqlGtidSet | None:
    """MySQL's executed GTID set at ``(file, offset)`` (an event-group boundary): the
    file's ``Previous_gtids`` plus every ``Gtid`` event before ``offset``, read with
    ``SHOW BINLOG EVENTS`` (the server formats both; None if the file has no
    ``Previous_gtids``, i.e. was written with GTIDs off). Reads the file up to ``offset``
    once: used at a fresh start and at a file + offset resume only."""
    state: MySqlGtidSet | None = None
    pos = 4
    while True:
        cur.execute(f"SHOW BINLOG EVENTS IN %s FROM {int(pos)} LIMIT {int(page)}", (file,))
        rows = cur.fetchall()
        for _log, at, kind, _sid, end, info in rows:
            if int(at) >= offset:
                return state
            if str(kind) == "Previous_gtids":
                state = MySqlGtidSet.parse(str(info or ""))
            elif str(kind) == "Gtid" and state is not None:
                m = _GTID_NEXT.search(str(info))
                if m and ":" in m.group(1):  # not ANONYMOUS
                    state = state.advance(m.group(1))
            pos = max(pos, int(end))
        if len(rows) < page:
            return state


def describe(ddls: Iterable[tuple[DdlKind, str]]) -> str:
    return "; ".join(q.strip()[:200] for _, q in ddls)
