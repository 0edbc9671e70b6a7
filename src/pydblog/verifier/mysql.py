"""A MySQL/MariaDB table read for verification: a captured source table or a ``mysql``
sink's mirror table.

Rows are read with the capture's own SELECT mapping (``SelectMapper``: the values the
change log holds for them) in a UTC session, then normalized by the source's logical
types (``ranges.row_of``), so a MySQL row, a PostgreSQL row and a Delta row that mean the
same value compare equal. No lock, no long transaction: each range is one autocommit
statement.

Key order: the key columns' own order, except text-like key columns, which are ordered
by their bytes (``CAST(c AS BINARY)``: UTF-8 byte order is code point order, the order
of PostgreSQL's ``COLLATE "C"`` and of Python). Such a key cannot use its index: each
range then reads the table (slower, still no lock). Integer, decimal, date and time keys
use the index.

In-database checksums (``sql`` mode, when both sides are MySQL/MariaDB tables): each
range's row count and the sum of a 64-bit hash of each row's canonical text, computed by
the server. The canonical text of a value is lossless (two different values never give
the same text; a column holds the same text on both sides when the sink's type differs
from the source's, as ``mysql`` sinks map types: ``VARCHAR`` -> ``LONGTEXT``, ``BIT`` ->
``BIGINT UNSIGNED``, ``DATETIME(0)`` -> ``DATETIME(6)``): text as UTF-8, temporal values
with six fraction digits, ``BIT`` as its number, bytes as hex, JSON compacted (MariaDB) or
as the server prints it (MySQL), each length-prefixed so that column boundaries count. A
range whose checksums differ is only a suspect: it is compared row by row afterwards, so a
value that prints differently on the two sides (a float on two server kinds) costs that
re-read, never a false report.

Where the capture stands: the server's GTID state after a read (``@@gtid_binlog_pos``
on MariaDB, ``@@GLOBAL.gtid_executed`` on MySQL) is passed once the capture's checkpoint's GTID
state contains it. A MySQL server with GTIDs off gives no such state: there the binlog's
end after the read (``SHOW MASTER STATUS``: file and offset) is passed once the capture's
checkpoint is at or past it in file order (an idle capture's checkpoint moves to the end
of what it has read, ``binlog.py``'s heartbeats), so a later transaction, or the capture
having read to that end, settles it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from pydblog.ports import TableSchema
from pydblog.sources.mysql import schema as schema_mod
from pydblog.sources.mysql.connect import MySqlDsn, connect, is_mariadb
from pydblog.sources.mysql.gtid import GtidState, parse_gtid_state
from pydblog.sources.mysql.position import BinlogPosition, file_sequence
from pydblog.sources.mysql.types import ColumnType, quote_ident, select_column
from pydblog.verifier.ranges import Key, Row, key_columns, row_of

_TEMPORAL_FORMAT = {"datetime": "DATE_FORMAT({}, '%%Y-%%m-%%d %%H:%%i:%%s.%%f')",
                    "timestamp": "DATE_FORMAT({}, '%%Y-%%m-%%d %%H:%%i:%%s.%%f')",
                    "time": "TIME_FORMAT({}, '%%H:%%i:%%s.%%f')"}
"""(``%%``: the statements holding them always go through pymysql's parameter
formatting.)"""
_TEXT_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"})
_INT_LOGICAL = frozenset({"int16", "int32", "int64"})
_BINARY_KINDS = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob",
                           "geometry", "point", "linestring", "polygon", "multipoint",
                           "multilinestring", "multipolygon", "geometrycollection"})


def open_mysql(dsn: str, database: str | None = None) -> Any:
    """An autocommit pymysql connection in a UTC session (``database`` overrides the
    DSN's)."""
    parsed = MySqlDsn.parse(dsn)
    if database is not None and database != parsed.database:
        parsed = MySqlDsn(parsed.host, parsed.port, parsed.user, parsed.password, database, parsed.raw)
    return connect(parsed)


class MyTable:
    """One table of one MySQL/MariaDB database, read with the columns of ``schema`` (the
    change log's schema of the source table; a column the table lacks reads NULL)."""

    def __init__(self, conn: Any, database: str, table: str, schema: TableSchema) -> None:
        self.conn = conn
        self.schema = schema
        self.database = database
        self.table = table
        self.name = f"{database}.{table}"
        self.ident = f"{quote_ident(database)}.{quote_ident(table)}"
        self.mariadb = is_mariadb(conn)
        with conn.cursor() as cur:
            cols = schema_mod.table_columns(cur, database, table, self.mariadb)
        self.columns: dict[str, ColumnType] = {c.name: c for c in cols}
        self.exists = bool(self.columns)
        self.keys = key_columns(schema)

    # -- SQL pieces --------------------------------------------------------------------
    def _key_expr(self, name: str) -> str:
        col = self.columns.get(name)
        if col is None:
            return "NULL"
        if col.data_type in _TEXT_TYPES:
            return f"CAST({quote_ident(name)} AS BINARY)"
        return quote_ident(name)

    def _bound(self, name: str) -> str:
        col = self.columns.get(name)
        if col is not None and col.data_type in _TEXT_TYPES:
            return "CAST(%s AS BINARY)"
        if col is not None and col.data_type == "decimal":
            return "CAST(%s AS DECIMAL(65,30))"
        return "%s"

    def _order(self, desc: bool = False) -> str:
        return ", ".join(self._key_expr(k) + (" DESC" if desc else "") for k in self.keys)

    def _cond(self, lo: Sequence[str] | None, hi: Sequence[str] | None) -> tuple[str, list[Any]]:
        keys = ", ".join(self._key_expr(k) for k in self.keys)
        bounds = ", ".join(self._bound(k) for k in self.keys)
        parts: list[str] = []
        params: list[Any] = []
        if lo is not None:
            parts.append(f"({keys}) > ({bounds})")
            params.extend(_param(self.columns.get(k), t) for k, t in zip(self.keys, lo, strict=True))
        if hi is not None:
            parts.append(f"({keys}) <= ({bounds})")
            params.extend(_param(self.columns.get(k), t) for k, t in zip(self.keys, hi, strict=True))
        return (" AND ".join(parts) or "TRUE"), params

    def cond_text(self, lo: Sequence[str] | None, hi: Sequence[str] | None) -> str:
        """``_cond`` with the bounds as SQL literals (a filter for a snapshot signal)."""
        cond, params = self._cond(lo, hi)
        if not params:
            return cond
        return cond % tuple(self.conn.escape(p) for p in params)

    def _canon(self, name: str) -> str:
        """The lossless canonical text of column ``name`` (module docstring), or NULL."""
        col = self.columns.get(name)
        if col is None:
            return "NULL"
        q, t = quote_ident(name), col.data_type
        if col.is_json or t == "json":
            text = f"JSON_COMPACT({q})" if self.mariadb else f"CAST({q} AS CHAR)"
        elif t in _TEMPORAL_FORMAT:
            text = _TEMPORAL_FORMAT[t].format(q)
        elif t == "bit":
            text = f"CAST({q} + 0 AS CHAR)"
        elif t in _BINARY_KINDS:
            text = f"HEX({q})"
        else:
            text = f"CAST({q} AS CHAR CHARACTER SET utf8mb4)"
        return f"IFNULL(CONCAT(LENGTH({text}), ':', {text}), '-')"

    def hash_expr(self) -> str:
        """A row's 64-bit hash (an unsigned integer) of its columns' canonical texts."""
        parts = ", ".join(self._canon(c.name) for c in self.schema.columns)
        return f"CAST(CONV(LEFT(MD5(CONCAT_WS(',', {parts})), 16), 16, 10) AS UNSIGNED)"

    def comparable(self, other: MyTable) -> bool:
        """Whether in-database checksums of the two tables can be compared: every
        column present on both sides (a missing one reads NULL on one side only)."""
        if not other.exists:
            return True  # (its checksums are those of an empty range)
        return all(c.name in self.columns and c.name in other.columns for c in self.schema.columns)

    def next_chunk(self, lo: Sequence[str] | None, limit: int,
                   h: str | None = None) -> tuple[int, int, tuple[str, ...] | None]:
        """The next range after ``lo``: (rows, hash sum, text of its last key), at most
        ``limit`` rows in key order, aggregated by the server (``h``: the row hash,
        default ``hash_expr``)."""
        cond, params = self._cond(lo, None)
        count, total = self._count_sum(
            "_h", f"(SELECT {h or self.hash_expr()} AS _h FROM {self.ident} WHERE {cond} "
            f"ORDER BY {self._order()} LIMIT {int(limit)}) r", params,
        )
        if count == 0:
            return 0, 0, None
        return count, total, self._key_at(cond, params, count - 1)

    def checksum(self, lo: Sequence[str] | None, hi: Sequence[str] | None) -> tuple[int, int]:
        """(rows, hash sum) of the range ``(lo, hi]``, computed by the server."""
        if not self.exists:
            return 0, 0
        cond, params = self._cond(lo, hi)
        return self._count_sum(self.hash_expr(), f"{self.ident} WHERE {cond}", params)

    def _count_sum(self, hashed: str, rows: str, params: list[Any]) -> tuple[int, int]:
        """(rows, sum of ``hashed`` over them) of ``SELECT ... FROM {rows}``, computed by
        the server (the sum as text: it may exceed 64 bits)."""
        with self.conn.cursor() as cur:
            cur.execute(
                f"SELECT COUNT(*), CAST(COALESCE(SUM({hashed}), 0) AS CHAR) FROM {rows}", params
            )
            row = cur.fetchone()
        return int(row[0]), int(row[1])

    def _key_at(self, cond: str, params: list[Any], offset: int) -> tuple[str, ...]:
        """The text of the key at ``offset`` in key order among the rows of ``cond``
        (as ``rows`` gives a last key)."""
        exprs, convs = [], []
        for k in self.keys:
            e, f = select_column(self.columns[k])
            exprs.append(e)
            convs.append(f)
        with self.conn.cursor() as cur:
            cur.execute(
                f"SELECT {', '.join(exprs)} FROM {self.ident} WHERE {cond} "
                f"ORDER BY {self._order()} LIMIT 1 OFFSET {int(offset)}",
                params,
            )
            rec = cur.fetchone()
        assert rec is not None
        return tuple(_text(None if v is None else (f(v) if f is not None else v))
                     for f, v in zip(convs, rec, strict=True))

    # -- reads -------------------------------------------------------------------------
    def estimate(self) -> int:
        if not self.exists:
            return 0
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                (self.database, self.table),
            )
            row = cur.fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def rows(
        self, lo: Sequence[str] | None, hi: Sequence[str] | None, limit: int | None = None
    ) -> tuple[list[tuple[Key, Row]], tuple[str, ...] | None]:
        """The rows of ``(lo, hi]`` in key order (at most ``limit``), normalized, and the
        text of the last key read."""
        if not self.exists:
            return [], None
        cond, params = self._cond(lo, hi)
        return self._select(cond, params, limit)

    def rows_by_keys(self, keys: Collection[Key]) -> list[tuple[Key, Row]]:
        """The rows with these (normalized) keys, normalized."""
        if not keys or not self.exists or any(k not in self.columns for k in self.keys):
            return []
        out: list[tuple[Key, Row]] = []
        ordered = list(keys)
        for i in range(0, len(ordered), 500):
            params: list[Any] = []
            ors = []
            for key in ordered[i:i + 500]:
                ands = []
                for k, v in zip(self.keys, key, strict=True):
                    if v is None:
                        ands.append(f"{quote_ident(k)} IS NULL")
                    else:
                        ands.append(f"{quote_ident(k)} = {self._bound(k)}")
                        params.append(_param(self.columns[k], _text(v)))
                ors.append("(" + " AND ".join(ands) + ")")
            out.extend(self._select(" OR ".join(ors), params, None)[0])
        return out

    def _select(self, cond: str, params: list[Any],
                limit: int | None) -> tuple[list[tuple[Key, Row]], tuple[str, ...] | None]:
        exprs: list[str] = []
        convs: list[Any] = []
        names = [c.name for c in self.schema.columns]
        for name in names:
            col = self.columns.get(name)
            if col is None:
                exprs.append("NULL")
                convs.append(None)
            else:
                e, f = select_column(col)
                exprs.append(e)
                convs.append(f)
        query = f"SELECT {', '.join(exprs)} FROM {self.ident} WHERE {cond} ORDER BY {self._order()}"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        out: list[tuple[Key, Row]] = []
        last: tuple[str, ...] | None = None
        pos = {n: i for i, n in enumerate(names)}
        with self.conn.cursor() as cur:
            cur.execute(query, params or None)
            for rec in cur.fetchall():
                mapped = [
                    None if v is None else (f(v) if f is not None else v)
                    for f, v in zip(convs, rec, strict=True)
                ]
                key, row = row_of(self.schema, dict(zip(names, mapped, strict=True)))
                out.append((key, row))
                last = tuple(_text(mapped[pos[k]]) for k in self.keys)
        return out, last

    def bound_text(self, key: Key | None) -> tuple[str, ...] | None:
        """A normalized range bound as this table's key text (for a bound read from a
        source of another kind, whose text would not compare here: PostgreSQL's ``\\x..``
        bytes, its time zone suffixes)."""
        return None if key is None else tuple(_text(v) for v in key)

    def key_of_text(self, texts: Sequence[str]) -> Key:
        """The normalized key of a key's text (as ``rows`` gives it)."""
        logical = {c.name: c.logical for c in self.schema.columns}
        values = {}
        for k, t in zip(self.keys, texts, strict=True):
            lg = logical[k].lower()
            values[k] = int(t) if lg in _INT_LOGICAL and t is not None else t
        key, _ = row_of(self.schema, values)
        return key

    # -- where the capture stands ------------------------------------------------------
    def gtid_state(self) -> GtidState | None:
        """The server's GTID state now (every transaction committed so far), or None
        where GTIDs are off."""
        # (GLOBAL: MySQL 5.7's session gtid_executed is the session's own transactions)
        var = "@@GLOBAL.gtid_binlog_pos" if self.mariadb else "@@GLOBAL.gtid_executed"
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT {var}")
            row = cur.fetchone()
        text = str(row[0] or "").replace("\n", "") if row else ""
        if not text.strip():
            return None
        return parse_gtid_state(text)

    def binlog_end(self) -> tuple[str, int] | None:
        """The end of the server's binlog now (file, offset), or None where the server
        does not say (binary logging off, or no privilege to ask)."""
        import pymysql

        for statement in ("SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"):
            try:
                with self.conn.cursor() as cur:
                    cur.execute(statement)
                    row = cur.fetchone()
            except pymysql.err.MySQLError:
                continue
            if row:
                return str(row[0]), int(row[1])
        return None

    def wal_lsn(self) -> Any:
        """A test ``checkpoint position -> bool``: whether the capture has logged every
        change committed before now (by GTID state; with GTIDs off, by the binlog's end
        in file order)."""
        state = self.gtid_state()
        end = self.binlog_end() if state is None else None

        def passed(position: Any) -> bool:
            if state is None:
                if end is None or not isinstance(position, BinlogPosition):
                    return False
                try:
                    return (file_sequence(position.file), position.pos) >= (
                        file_sequence(end[0]), end[1])
                except ValueError:
                    return False
            after = getattr(position, "after_state", None)
            have = after() if callable(after) else None
            if have is None:
                return False
            try:
                return bool(have >= state)
            except TypeError:
                return False

        return passed


def _text(v: Any) -> str:
    """A key value as text MySQL compares with the column (bytes stay bytes' latin-1
    text, undone by ``_param``)."""
    if isinstance(v, bytes):
        return "0x" + v.hex()
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, datetime | date | time):
        return v.isoformat().replace("+00:00", "")
    if isinstance(v, Decimal):
        return format(v, "f")
    return str(v)


def _param(col: ColumnType | None, text: str) -> Any:
    """A key's text as the parameter compared with ``col``."""
    if col is None or text is None:
        return text
    t = col.data_type
    if t in ("datetime", "timestamp"):
        return text.removesuffix("Z").replace("T", " ")
    if t in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        import base64

        if text.startswith("0x"):
            return bytes.fromhex(text[2:])
        return base64.b64decode(text)
    return text


def mysql_applied(conn: Any, database: str, parts: int) -> int:
    """One past the last change-log offset a ``mysql`` sink has applied to every table:
    the least ``applied_end`` of its steps (``-1`` and ``0..parts-1``); 0 when it has
    applied nothing."""
    import pymysql

    try:
        with conn.cursor() as cur:
            cur.execute(
                f"SELECT part, applied_end FROM {quote_ident(database)}.`dblog_sync_progress` "
                "WHERE nparts = %s",
                (parts,),
            )
            rows = cur.fetchall()
    except pymysql.err.ProgrammingError:
        return 0
    have = {int(p): int(e) for p, e in rows}
    if any(p not in have for p in range(-1, parts)):
        return 0
    return min(have.values())
