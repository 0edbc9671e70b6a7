"""A downstream MySQL or MariaDB database: one table per source table, same name, in
the configured database (``schema``, else the DSN's database), created on first sight
with column types mapped from the logical types (``mysql_type``; docs/sync.md has the
table) and the source key as primary key; added source columns are added with ALTER
TABLE. Tested against MariaDB 10.11 and MySQL 5.7.

Exactly once, as the PostgreSQL sink (``sinks.postgres``): the progress table
``<database>.dblog_sync_progress`` holds one row per source and step ``(source, part,
nparts)`` with ``applied_end``, one past the last change-log offset of that source the
step has applied (a table of the single-source form gets the ``source`` column, its rows
the ``default`` source's). Each source's progress time and the low watermark go to
``<database>._dblog_watermarks`` after a batch's steps committed. A batch
``[start, end)`` is applied in steps, each one InnoDB transaction that also moves its
progress row to ``end``:

1. ``part = -1`` (the driver): delete the rows of the tables the batch truncates
   (``DELETE``, not ``TRUNCATE``: MySQL's TRUNCATE commits implicitly) and the target
   ranges of the batch's repair markers;
2. ``part = 0..n-1`` (one Spark task each, in parallel): the deletes and upserts of the
   keys whose hash falls in the partition.

A step locks its row first (``SELECT … FOR UPDATE``; the rows of every step are created
beforehand with ``applied_end = 0``, so the lock is always on an existing row and two
runs of one step serialize): with ``applied_end >= end`` it does nothing, otherwise it
applies only the events ``>= applied_end``. A crash anywhere leaves each step either
committed with its row or not at all; the replay redoes only the steps that did not
commit.

MySQL's DDL is not transactional (CREATE/ALTER commit implicitly), so tables and
columns are created before the step's transaction, each statement idempotent (``IF NOT
EXISTS``, columns compared with ``information_schema``): a crash after a DDL leaves a
table or column that the replay finds and keeps.

Sessions run in READ COMMITTED (no gap locks: partitions writing neighbouring keys of one
table never deadlock on each other's gaps; a deadlock or lock wait timeout that still
happens retries the step's transaction), ``time_zone = '+00:00'`` and a strict
``sql_mode`` (a value that does not fit its column is an error, never truncated).
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson

from pydblog.config import redact_dsn
from pydblog.errors import ConfigError, SinkError
from pydblog.ports import ColumnSchema, TableSchema
from pydblog.spark.batch import Batch
from pydblog.spark.plan import SparkBatch
from pydblog.spark.reduce import DELETE, TableChanges
from pydblog.spark.repairs import TablePurge, spark_purges
from pydblog.spark.sinks.widen import widens
from pydblog.spark.typemap import null_safe_key

PROGRESS_TABLE = "dblog_sync_progress"
WATERMARKS_TABLE = "_dblog_watermarks"
DEFAULT_SOURCE = "default"
MAX_IDENTIFIER = 64
"""MySQL's limit on database, table and column names (characters)."""
KEY_BYTES = 3072
"""InnoDB's limit on an index's width (DYNAMIC rows; the default of MariaDB 10.2+ and
MySQL 5.7.7+): a primary key's columns together fit in it."""
ROWS_PER_STATEMENT = 1000
STATEMENT_BYTES = 1 << 20
"""A multi-row statement is cut at this many bytes of values (and at most at half the
server's ``max_allowed_packet``): MySQL 5.7's default packet is 4 MiB, and wide rows
(TOASTed text) of 1000 rows would exceed it."""
STEP_RETRIES = 5
SQL_MODE = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO"

# MySQL errnos (mysqld_error.h, errmsg.h)
ER_DBACCESS_DENIED = 1044
ER_ACCESS_DENIED = 1045
ER_BAD_DB = 1049
ER_TOO_LONG_KEY = 1071
ER_TABLEACCESS_DENIED = 1142
ER_COLUMNACCESS_DENIED = 1143
ER_LOCK_WAIT_TIMEOUT = 1205
ER_LOCK_DEADLOCK = 1213
ER_SPECIFIC_ACCESS_DENIED = 1227
ER_DATA_TOO_LONG = 1406
ER_BINLOG_STMT_MODE = 1665
ER_NET_PACKET_TOO_LARGE = 1153
DENIED = {ER_DBACCESS_DENIED, ER_TABLEACCESS_DENIED, ER_COLUMNACCESS_DENIED,
          ER_SPECIFIC_ACCESS_DENIED}
UNREACHABLE = {2002, 2003, 2005, 2006, 2013}


@dataclass(frozen=True)
class MySqlTarget:
    """``mysql://user:password@host:port/database`` (``mariadb://`` too); ``repr`` and
    ``redacted`` hide the password."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str
    raw: str = field(repr=False)

    @classmethod
    def parse(cls, dsn: str, database: str | None = None) -> MySqlTarget:
        parts = urlsplit(dsn)
        shown = redact_dsn(dsn)
        if parts.scheme not in ("mysql", "mariadb"):
            raise ConfigError(
                f"[[sync.sinks]] dsn {shown!r} is not a MySQL DSN",
                hint="write it as mysql://user:password@host:3306/database",
            )
        try:
            port = parts.port or 3306
        except ValueError:
            raise ConfigError(f"[[sync.sinks]] dsn {shown!r} has an invalid port") from None
        db = database or unquote(parts.path.lstrip("/"))
        if not db or "/" in db:
            raise ConfigError(
                f"[[sync.sinks]] dsn {shown!r} names no database and the sink sets no schema",
                hint="name the target database in the DSN (mysql://u:p@host:3306/replica) "
                "or set schema = \"replica\"",
            )
        return cls(parts.hostname or "127.0.0.1", port, unquote(parts.username or "root"),
                   unquote(parts.password or ""), db, dsn)

    @property
    def redacted(self) -> str:
        return redact_dsn(self.raw)


def q(name: str) -> str:
    """``name`` as a MySQL identifier (backticks; a backtick doubled)."""
    return "`" + name.replace("`", "``") + "`"


# -- types ---------------------------------------------------------------------------------
_INT = {"int16": "SMALLINT", "int32": "INT", "int64": "BIGINT"}
_MY_INT = re.compile(r"\s*(tinyint|smallint|mediumint|int|integer|bigint)\b.*\bunsigned\b", re.I)
_DECIMAL = re.compile(r"(?:numeric|decimal)\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)", re.I)
_LENGTH = re.compile(r"\s*(?:character varying|varchar|character|char|nchar|nvarchar)\s*\((\d+)\)",
                     re.I)
_BY_LOGICAL = {
    # float32 too: MySQL prints a FLOAT with 6 significant digits, while the change
    # log's shortest form of a float32 value (``0.1``) is held exactly by a DOUBLE
    "float32": "DOUBLE",
    "float64": "DOUBLE",
    "bool": "BOOLEAN",
    "date": "DATE",
    "time": "TIME(6)",
    "timestamp": "DATETIME(6)",
    "timestamptz": "DATETIME(6)",
    "json": "JSON",
    "uuid": "CHAR(36)",
    "bytes": "LONGBLOB",
}
_WIDTH = {"SMALLINT": 2, "INT": 4, "BIGINT": 8, "FLOAT": 4, "DOUBLE": 8, "BOOLEAN": 1,
          "DATE": 3, "TIME(6)": 6, "DATETIME(6)": 8, "CHAR(36)": 144}
_VARIABLE = ("LONGTEXT", "LONGBLOB", "JSON")


def mysql_type(col: ColumnSchema) -> str:
    """The column's type in a MySQL/MariaDB target, from its logical type
    (docs/types.md), refined by the source type: a MySQL source's unsigned integers
    keep their width and sign, ``numeric(p,s)``/``decimal(p,s)`` with ``p <= 65`` and
    ``s <= 30`` is ``DECIMAL(p,s)``. Types MySQL lacks hold their change-log text
    (``LONGTEXT``) or JSON value (``JSON``), so nothing is lost."""
    lg = col.logical.lower().strip()
    src = col.type.lower()
    if lg in _INT:
        m = _MY_INT.match(src)
        if m:
            name = m.group(1).upper()
            return ("INT" if name == "INTEGER" else name) + " UNSIGNED"
        if src.startswith("bit"):
            return "BIGINT UNSIGNED"  # BIT(64) values reach 2^64 - 1
        return _INT[lg]
    if lg in ("decimal", "numeric"):
        m = _DECIMAL.search(src)
        if m and 0 < int(m.group(1)) <= 65 and int(m.group(2)) <= min(30, int(m.group(1))):
            return f"DECIMAL({m.group(1)},{m.group(2)})"
        return "LONGTEXT"  # any precision: the exact text
    if lg.startswith("array<"):
        return "JSON"
    return _BY_LOGICAL.get(lg, "LONGTEXT")


def _width(t: str) -> int:
    m = re.match(r"DECIMAL\((\d+),(\d+)\)", t)
    if m:
        return (int(m.group(1)) // 9 + 1) * 4 + 4
    return _WIDTH.get(t.replace(" UNSIGNED", ""), 8)


def column_types(schema: TableSchema, *, nopad: bool = True, keyed: bool = True) -> dict[str, str]:
    """Each column's target type. Primary-key columns (``keyed``) of a type an index
    cannot hold whole (text, bytes, json) become ``VARCHAR(n)``/``VARBINARY(n)`` so the
    key fits ``KEY_BYTES`` (the fixed-width key columns first, the rest shared; a text
    key declared shorter at the source keeps its length). Text keys compare exactly:
    ``utf8mb4_nopad_bin`` (MariaDB) or, where the server has no NO PAD binary collation
    (MySQL 5.7, whose ``utf8mb4_bin`` ignores trailing spaces: ``'a'`` and ``'a '`` would
    be one key), ``VARBINARY`` holding the UTF-8 bytes."""
    cols = {c.name: c for c in schema.columns}
    out = {c.name: mysql_type(c) for c in schema.columns}
    if not keyed:
        return out
    key = [k for k in schema.key if k in cols]
    variable = [k for k in key if out[k] in _VARIABLE]
    if not variable:
        return out
    fixed = sum(_width(out[k]) for k in key if k not in variable)
    share = max(1, (KEY_BYTES - fixed) // len(variable))
    for k in variable:
        if out[k] == "LONGBLOB":
            out[k] = f"VARBINARY({share})"
            continue
        m = _LENGTH.match(cols[k].type)
        chars = min(share // 4, int(m.group(1))) if m else share // 4
        if nopad:
            out[k] = f"VARCHAR({chars}) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
        else:
            out[k] = f"VARBINARY({chars * 4 if not m else share})"
    return out


_KINDS = {"bytes": "bytes", "timestamp": "datetime", "timestamptz": "datetime",
          "json": "json", "float32": "float", "float64": "float", "bool": "bool"}


def converters(schema: TableSchema) -> dict[str, str]:
    """How each column's change-log values convert (``to_db``), by logical type (the
    same whether the column is a key column or not)."""
    out = {}
    for c in schema.columns:
        lg = c.logical.lower().strip()
        out[c.name] = "json" if lg.startswith("array<") else _KINDS.get(lg, "plain")
    return out


def to_db(value: Any, kind: str) -> Any:
    """A change-log JSON value as the parameter for a column of ``kind``; ValueError
    when MySQL cannot hold it (NaN or an infinity in a float column)."""
    if value is None:
        return None
    if kind == "bytes":
        return base64.b64decode(value) if isinstance(value, str) else value
    if kind == "datetime" and isinstance(value, str):
        if value.endswith("Z"):
            value = value[:-1]
        return value.replace("T", " ", 1)
    if kind == "json":
        return orjson.dumps(value).decode()
    if kind == "float" and isinstance(value, str):
        raise ValueError(f"{value} does not fit a MySQL floating-point column")
    if kind == "bool":
        return int(bool(value))
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return value


# -- errors --------------------------------------------------------------------------------
def errno(exc: BaseException) -> int | None:
    args: tuple[Any, ...] = tuple(exc.args)
    return args[0] if args and isinstance(args[0], int) else None


def _detail(exc: BaseException) -> str:
    args: tuple[Any, ...] = tuple(exc.args)
    return str(args[1]) if len(args) >= 2 else (str(exc) or type(exc).__name__)


def sink_error(exc: BaseException, target: MySqlTarget, doing: str) -> SinkError:
    """A pymysql error as a ``SinkError`` naming what to do (by errno; the messages of
    server and client never hold the password)."""
    code = errno(exc)
    where = target.redacted
    msg = _detail(exc)
    db = target.database
    grant = (f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER ON {q(db)}.* TO "
             f"'{target.user}'@'%' (or the user's host)")
    if code == ER_ACCESS_DENIED:
        return SinkError(f"MySQL at {where} refused the login: {msg}",
                         hint="check the user and password in the [[sync.sinks]] dsn")
    if code in DENIED:
        return SinkError(f"MySQL at {where} denied {doing}: {msg}",
                         hint=f"the sink's user needs {grant}")
    if code == ER_BAD_DB:
        return SinkError(f"MySQL at {where}: {msg}",
                         hint=f"create the database {q(db)}, or grant CREATE on it: {grant}")
    if code == ER_TOO_LONG_KEY:
        return SinkError(f"MySQL at {where}, {doing}: {msg}",
                         hint=f"the key does not fit an index of {KEY_BYTES} bytes: the target "
                         "needs innodb_large_prefix (ROW_FORMAT=DYNAMIC), or create the table "
                         "yourself with a shorter key")
    if code == ER_DATA_TOO_LONG:
        return SinkError(f"MySQL at {where}, {doing}: {msg}",
                         hint="a key column holds text/bytes longer than the VARCHAR/VARBINARY "
                         f"the sink gives key columns so that the key fits an index ({KEY_BYTES} "
                         "bytes, docs/sync.md); widen the column in the target if the key fits")
    if code == ER_BINLOG_STMT_MODE:
        return SinkError(f"MySQL at {where}, {doing}: {msg}",
                         hint="the sink writes in READ COMMITTED, which needs binlog_format = "
                         "ROW or MIXED on the target")
    if code == ER_NET_PACKET_TOO_LARGE:
        return SinkError(f"MySQL at {where}, {doing}: {msg}",
                         hint="a single row is larger than the server's max_allowed_packet: "
                         "raise it on the target (SET GLOBAL max_allowed_packet = ...)")
    if code in UNREACHABLE or code is None:
        return SinkError(f"cannot reach MySQL at {where} ({doing}): {msg}",
                         hint="is the server running and reachable, and are host/port in "
                         "the [[sync.sinks]] dsn right? (A server also drops a connection "
                         "whose statement exceeds its max_allowed_packet.)")
    return SinkError(f"MySQL at {where} failed {doing}: [{code}] {msg}")


def _size(values: Sequence[Any]) -> int:
    """An upper bound of the bytes ``values`` take in a statement (escaped text)."""
    n = 0
    for v in values:
        n += 2 * len(v) + 12 if isinstance(v, str | bytes) else 24
    return n


def statements(members: Sequence[int], values: Any, limit: int) -> Iterator[list[int]]:
    """``members`` cut into runs of at most ``ROWS_PER_STATEMENT`` rows whose values
    (``values(i)``) take at most ``limit`` bytes (a single larger row is a run alone)."""
    run: list[int] = []
    size = 0
    for i in members:
        s = _size(values(i))
        if run and (len(run) >= ROWS_PER_STATEMENT or size + s > limit):
            yield run
            run, size = [], 0
        run.append(i)
        size += s
    if run:
        yield run


def _check_identifier(name: str, what: str) -> None:
    if len(name) > MAX_IDENTIFIER:
        raise SinkError(
            f"{what} {name!r} is {len(name)} characters long: MySQL names are at most "
            f"{MAX_IDENTIFIER}",
            hint="rename it at the source, or leave the table out of [[sync.sinks]] mysql "
            "targets (a PostgreSQL or Delta sink takes longer names)",
        )


# -- the sink ------------------------------------------------------------------------------
class MySqlSink:
    def __init__(self, dsn: str, schema: str | None = None, parallelism: int = 2,
                 source: str = DEFAULT_SOURCE) -> None:
        self.target_db = MySqlTarget.parse(dsn, schema)
        # the source whose batch is being applied: the progress rows' ``source``
        self.source = source
        self._migrated = False
        self.database = self.target_db.database
        self.parts = parallelism
        self.name = f"mysql:{self.target_db.redacted}" + (f" schema {schema}" if schema else "")
        self._targets: dict[str, str] = {}
        self._columns: dict[str, dict[str, str]] = {}  # table -> column -> type ensured
        # target table -> True when it has no primary key: rows are matched null-safely
        self._keyless: dict[str, bool] = {}
        self._conns: dict[int, Any] = {}
        self._flavour: dict[str, bool] = {}  # "nopad", "mariadb"
        self._packet: int | None = None  # the server's max_allowed_packet

    def target(self, schema: str, table: str) -> str:
        """Where a source table goes: the target database, same table name. Two source
        tables landing on one target table is an error."""
        source = f"{schema}.{table}"
        seen = self._targets.setdefault(table, source)
        if seen != source:
            raise SinkError(
                f"source tables {seen} and {source} would both be written to "
                f"{self.database}.{table}",
                hint="give each source schema its own mysql sink (schema = ...)",
            )
        _check_identifier(table, "table")
        return table

    def _ident(self, table: str) -> str:
        return f"{q(self.database)}.{q(table)}"

    # -- connections -------------------------------------------------------------------
    def _connect(self) -> Any:
        import pymysql
        from pymysql.constants import CLIENT

        t = self.target_db
        try:
            conn = pymysql.connect(
                host=t.host, port=t.port, user=t.user, password=t.password,
                charset="utf8mb4", connect_timeout=10, autocommit=True,
                client_flag=CLIENT.FOUND_ROWS,
                init_command=f"SET time_zone = '+00:00', sql_mode = '{SQL_MODE}'",
            )
            with conn.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        except pymysql.Error as exc:
            raise sink_error(exc, t, "the connection") from None
        except OSError as exc:
            raise SinkError(f"cannot reach MySQL at {t.redacted}: {exc}") from None
        return conn

    def _conn(self, slot: int) -> Any:
        conn = self._conns.get(slot)
        if conn is None or not conn.open:
            conn = self._conns[slot] = self._connect()
        return conn

    @contextmanager
    def _tx(self, slot: int) -> Iterator[Any]:
        """A transaction on the connection of ``slot``; on any error it is rolled
        back and the connection dropped (reopened on the next use)."""
        conn = self._conn(slot)
        try:
            conn.begin()
            cur = conn.cursor()
            yield cur
            conn.commit()
        except BaseException:
            self._conns.pop(slot, None)
            with suppress(Exception):  # the connection is dropped anyway
                conn.rollback()
                conn.close()
            raise

    def _flavours(self, cur: Any) -> dict[str, bool]:
        if not self._flavour:
            cur.execute("SELECT VERSION()")
            version = str(cur.fetchone()[0]).lower()
            cur.execute("SHOW COLLATION LIKE 'utf8mb4_nopad_bin'")
            self._flavour = {"mariadb": "mariadb" in version, "nopad": bool(cur.fetchall())}
        return self._flavour

    def _applied(self, cur: Any, part: int) -> int:
        cur.execute(
            f"SELECT applied_end FROM {self._ident(PROGRESS_TABLE)} "
            "WHERE source = %s AND part = %s AND nparts = %s FOR UPDATE",
            (self.source, part, self.parts),
        )
        row = cur.fetchone()
        return 0 if row is None else int(row[0])

    def _record(self, cur: Any, batch: Batch | SparkBatch, part: int) -> None:
        cur.execute(
            f"INSERT INTO {self._ident(PROGRESS_TABLE)} "
            "(source, part, nparts, applied_end, batch_id) "
            "VALUES (%s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE applied_end = "
            "VALUES(applied_end), batch_id = VALUES(batch_id), applied_at = CURRENT_TIMESTAMP(6)",
            (self.source, part, self.parts, batch.end, batch.batch_id),
        )

    # -- apply -------------------------------------------------------------------------
    def apply(self, batch: SparkBatch) -> None:
        """The DDL/truncate step here in the driver; the key partitions in Spark tasks
        (``mysql_parts_fn``), each in one transaction with its progress row."""
        import pymysql

        self.source = batch.source
        if not batch.tables and not batch.markers:
            self.write_watermarks(batch.watermarks, batch.source, batch.end, batch.cut_ms)
            return
        schemas = {qn: batch.schema_for(qn) for qn in batch.tables}
        self._prepare(batch, schemas)
        events = batch.row_events({}, self.parts)
        fn = mysql_parts_fn(self.target_db.raw, self.database, self.parts, batch.batch_id,
                            batch.start, batch.end, schemas, dict(self._keyless),
                            dict(self._flavour), batch.markers, batch.source)
        rows = (events.repartition(self.parts, "part").mapInArrow(fn, "part int, error string")
                .collect())
        errors = [r["error"] for r in rows if r["error"]]
        if errors:
            raise SinkError(errors[0])
        seen = {int(r["part"]) for r in rows}
        try:
            for part in range(self.parts):
                if part in seen:
                    continue
                with self._tx(0) as cur:
                    if self._applied(cur, part) < batch.end:
                        self._record(cur, batch, part)
        except pymysql.Error as exc:
            raise sink_error(exc, self.target_db, "moving the progress rows") from None
        self.write_watermarks(batch.watermarks, batch.source, batch.end, batch.cut_ms)

    def _ensure_progress(self, cur: Any) -> None:
        """The progress table keyed by ``(source, part, nparts)`` (a table of the
        single-source form gets the column, its rows ``DEFAULT_SOURCE``'s) and the
        watermarks table."""
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {self._ident(PROGRESS_TABLE)} (source VARCHAR(64) "
            f"NOT NULL DEFAULT '{DEFAULT_SOURCE}', part INT NOT NULL, "
            "nparts INT NOT NULL, applied_end BIGINT NOT NULL, batch_id BIGINT NOT NULL, "
            "applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), "
            "PRIMARY KEY (source, part, nparts)) ENGINE=InnoDB"
        )
        if self._migrated:
            return
        cur.execute("SELECT 1 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                    "AND TABLE_NAME = %s AND COLUMN_NAME = 'source'",
                    (self.database, PROGRESS_TABLE))
        if cur.fetchone() is None:
            cur.execute(f"ALTER TABLE {self._ident(PROGRESS_TABLE)} ADD COLUMN source "
                        f"VARCHAR(64) NOT NULL DEFAULT '{DEFAULT_SOURCE}' FIRST, "
                        "DROP PRIMARY KEY, ADD PRIMARY KEY (source, part, nparts)")
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {self._ident(WATERMARKS_TABLE)} (source VARCHAR(64) "
            "NOT NULL PRIMARY KEY, progress_ms BIGINT NULL, low_ms BIGINT NULL, "
            "applied_end BIGINT NULL, updated_at DATETIME(6) NOT NULL DEFAULT "
            "CURRENT_TIMESTAMP(6), cut_ms BIGINT NULL) ENGINE=InnoDB")
        cur.execute("SELECT 1 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                    "AND TABLE_NAME = %s AND COLUMN_NAME = 'cut_ms'",
                    (self.database, WATERMARKS_TABLE))
        if cur.fetchone() is None:
            cur.execute(f"ALTER TABLE {self._ident(WATERMARKS_TABLE)} ADD COLUMN cut_ms "
                        "BIGINT NULL")
        self._migrated = True

    def write_watermarks(self, marks: dict[str, int | None], source: str, end: int | None,
                         cut: int | None = None) -> None:
        """Each source's progress time, the merge's low watermark and (``consistent =
        true``) the last complete cut into ``_dblog_watermarks`` (one row per source),
        after the batch's data committed: the table never claims more than the targets
        hold. Times never move back."""
        import pymysql

        if not marks:
            return
        low = None if any(v is None for v in marks.values()) else min(
            v for v in marks.values() if v is not None)
        t = self._ident(WATERMARKS_TABLE)
        try:
            # DDL commits the open transaction in MySQL (the rows after it would then
            # commit one by one): the tables are made sure of before it begins.
            with self._tx(0) as cur:
                self._ensure_progress(cur)
            with self._tx(0) as cur:
                names = sorted(marks)
                cur.execute(f"DELETE FROM {t} WHERE source NOT IN "
                            f"({', '.join(['%s'] * len(names))})", names)
                for name in names:
                    cur.execute(
                        f"INSERT INTO {t} (source, progress_ms, low_ms, applied_end, cut_ms) "
                        "VALUES (%s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE "
                        "progress_ms = GREATEST(COALESCE(progress_ms, VALUES(progress_ms)), "
                        "COALESCE(VALUES(progress_ms), progress_ms)), "
                        "low_ms = GREATEST(COALESCE(low_ms, VALUES(low_ms)), "
                        "COALESCE(VALUES(low_ms), low_ms)), "
                        "cut_ms = GREATEST(COALESCE(cut_ms, VALUES(cut_ms)), "
                        "COALESCE(VALUES(cut_ms), cut_ms)), "
                        "applied_end = COALESCE(VALUES(applied_end), applied_end), "
                        "updated_at = CURRENT_TIMESTAMP(6)",
                        (name, marks[name], low, end if name == source else None, cut))
        except pymysql.Error as exc:
            raise sink_error(exc, self.target_db, f"writing {WATERMARKS_TABLE}") from None

    def _prepare(self, batch: SparkBatch, schemas: dict[str, TableSchema]) -> None:
        import pymysql

        db = self.database
        _check_identifier(db, "database")
        doing = f"creating the progress table {db}.{PROGRESS_TABLE}"
        try:
            cur = self._conn(0).cursor()
            self._flavours(cur)
            cur.execute("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (db,))
            if cur.fetchone() is None:
                doing = f"creating the database {db}"
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {q(db)} CHARACTER SET utf8mb4")
            doing = f"creating the progress table {db}.{PROGRESS_TABLE}"
            self._ensure_progress(cur)
            # every step's row exists before any step locks it (``_applied``); IGNORE
            # skips the rows that exist (the values are constants: nothing else to ignore)
            cur.execute(
                f"INSERT IGNORE INTO {self._ident(PROGRESS_TABLE)} "
                "(source, part, nparts, applied_end, batch_id) VALUES "
                + ", ".join(["(%s, %s, %s, 0, -1)"] * (self.parts + 1)),
                [v for p in range(-1, self.parts) for v in (self.source, p, self.parts)],
            )
            for qn in sorted(batch.tables):
                if schemas[qn].columns:
                    ts = schemas[qn]
                    doing = f"creating or altering table {db}.{self.target(ts.schema, ts.table)}"
                    self._ensure_table(cur, schemas[qn])
        except pymysql.Error as exc:
            raise sink_error(exc, self.target_db, doing) from None
        for attempt in range(STEP_RETRIES):
            try:
                with self._tx(0) as cur:
                    done = self._applied(cur, -1)
                    if done >= batch.end:
                        return
                    for _, stats in sorted(batch.tables.items()):
                        if stats.truncate is not None and stats.truncate >= done:
                            table = self.target(stats.schema, stats.table)
                            doing = f"emptying table {db}.{table}"
                            cur.execute("SELECT 1 FROM information_schema.TABLES WHERE "
                                        "TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                                        (self.database, table))
                            if cur.fetchone():  # (a table never created: nothing to empty)
                                cur.execute(f"DELETE FROM {self._ident(table)}")
                    # a merged target's truncate of one part: only that part's rows
                    for qn, cuts in sorted(batch.scoped_truncates({}).items()):
                        schema_name, _, tname = qn.partition(".")
                        table = self.target(schema_name, tname)
                        if table not in self._columns:
                            continue  # no target yet: nothing of the part to delete
                        doing = f"emptying a part of table {db}.{table}"
                        for offset, scope in cuts:
                            if offset >= done:
                                cur.execute(
                                    f"DELETE FROM {self._ident(table)} WHERE "
                                    + " AND ".join(f"{q(c)} = %s" for c in scope),
                                    list(scope.values()))
                    for qn, purge in sorted(spark_purges(batch, {}, done).items()):
                        schema_name, _, table = qn.partition(".")
                        doing = f"the repair of table {qn}"
                        self._purge(cur, schemas.get(qn), self.target(schema_name, table),
                                    TablePurge(purge.key, purge.deletes))
                    self._record(cur, batch, -1)
                return
            except pymysql.Error as exc:
                if errno(exc) in (ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT) and attempt + 1 < STEP_RETRIES:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                raise sink_error(exc, self.target_db, doing) from None

    def _ensure_table(self, cur: Any, schema: TableSchema) -> None:
        table = self.target(schema.schema, schema.table)
        keyless = null_safe_key(schema)
        types = column_types(schema, nopad=self._flavour.get("nopad", True), keyed=not keyless)
        have = self._columns.get(table)
        if have is not None and all(have.get(c.name) == types[c.name] for c in schema.columns):
            return
        for c in schema.columns:
            _check_identifier(c.name, f"column of {schema.qualified}")
        cols = ", ".join(f"{q(c.name)} {types[c.name]}" for c in schema.columns)
        pk = "" if keyless else f", PRIMARY KEY ({', '.join(q(k) for k in schema.key)})"
        # A whole-row identity (no primary key at the source) may hold NULLs: no
        # primary key here either; rows are matched null-safely (``_apply_keyless``).
        cur.execute(f"CREATE TABLE IF NOT EXISTS {self._ident(table)} ({cols}{pk}) "
                    "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")
        cur.execute(
            "SELECT COLUMN_NAME, COLUMN_KEY, COLUMN_TYPE FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (self.database, table))
        rows = cur.fetchall()
        have = {str(r[0]): str(r[2]) for r in rows}
        keyed = {str(r[0]) for r in rows if r[1] == "PRI"}
        self._keyless[table] = not keyed
        for c in schema.columns:
            if c.name not in have:
                # only ever added: MySQL has no ADD COLUMN IF NOT EXISTS (MariaDB has),
                # and information_schema said the column is missing
                cur.execute(f"ALTER TABLE {self._ident(table)} ADD COLUMN {q(c.name)} "
                            f"{mysql_type(c)}")
            elif widens(have[c.name], types[c.name]):
                null = "NOT NULL" if c.name in keyed else "NULL"
                cur.execute(f"ALTER TABLE {self._ident(table)} MODIFY COLUMN {q(c.name)} "
                            f"{types[c.name]} {null}")
            have[c.name] = types[c.name]
        self._columns[table] = have

    def _purge(self, cur: Any, schema: TableSchema | None, table: str, purge: TablePurge) -> None:
        """Delete the rows of each repair range (``ROW(key) > lo AND ROW(key) <= hi``)
        whose key is not spared. Keys compare as the change log orders them: numbers,
        and text by code point (binary collations/VARBINARY keys order UTF-8 by it)."""
        cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (self.database, table))
        have = {str(r[0]) for r in cur.fetchall()}
        if not have or any(k not in have for k in purge.key):
            return
        kinds = converters(schema) if schema is not None else {k: "plain" for k in purge.key}
        keys = ", ".join(q(k) for k in purge.key)
        marks = ", ".join(["%s"] * len(purge.key))

        def vals(k: Sequence[Any]) -> list[Any]:
            return [to_db(v, kinds.get(c, "plain")) for c, v in zip(purge.key, k, strict=True)]

        if schema is not None and self._keyless.get(table, null_safe_key(schema)):
            self._purge_null_safe(cur, schema, table, purge, vals)
            return
        for d in purge.deletes:
            where: list[str] = []
            params: list[Any] = []
            if d.lo is not None:
                where.append(f"({keys}) > ({marks})")
                params.extend(vals(d.lo))
            if d.hi is not None:
                where.append(f"({keys}) <= ({marks})")
                params.extend(vals(d.hi))
            for c, v in d.scope:  # a merged target: only the rows of the marker's part
                where.append(f"{q(c)} = %s")
                params.append(v)
            if d.spare:
                where.append(f"({keys}) NOT IN ({', '.join(f'({marks})' for _ in d.spare)})")
                for k in d.spare:
                    params.extend(vals(k))
            cur.execute(f"DELETE FROM {self._ident(table)}"
                        + (" WHERE " + " AND ".join(where) if where else ""), params)

    def _purge_null_safe(self, cur: Any, schema: TableSchema, table: str, purge: TablePurge,
                         vals: Callable[[Sequence[Any]], list[Any]]) -> None:
        """``_purge`` for a table without primary key (a whole-row identity that may hold
        NULLs): the spared rows go to a temporary table and a target row stays when one
        of them equals it null-safely (``_same``). Its ranges are whole tables: a keyless
        table is repaired whole."""
        ident = self._ident(table)
        spare_table = self._ident("_dblog_spare")  # (the connection has no default database)
        same = self._same(schema)
        cols = ", ".join(q(k) for k in purge.key)
        marks = ", ".join(["%s"] * len(purge.key))
        match = " AND ".join(same(k, f"{ident}.{q(k)}", f"s.{q(k)}") for k in purge.key)
        for d in purge.deletes:
            cur.execute(f"DROP TEMPORARY TABLE IF EXISTS {spare_table}")
            cur.execute(f"CREATE TEMPORARY TABLE {spare_table} LIKE {ident}")
            spare = [vals(k) for k in d.spare]
            for i in range(0, len(spare), 500):
                part = spare[i:i + 500]
                cur.execute(f"INSERT INTO {spare_table} ({cols}) VALUES "
                            + ", ".join(f"({marks})" for _ in part),
                            [v for row in part for v in row])
            scope = "".join(f" AND {ident}.{q(c)} = %s" for c, _ in d.scope)
            cur.execute(f"DELETE FROM {ident} WHERE NOT EXISTS "
                        f"(SELECT 1 FROM {spare_table} s WHERE {match}){scope}",
                        [v for _, v in d.scope])
            cur.execute(f"DROP TEMPORARY TABLE {spare_table}")

    def _apply_part(
        self,
        batch: Batch,
        part: int,
        changes: dict[str, TableChanges],
        schemas: dict[str, TableSchema],
    ) -> None:
        import pymysql

        slot = part + 1
        for attempt in range(STEP_RETRIES):
            label = f"partition {part}"
            try:
                with self._tx(slot) as cur:
                    done = self._applied(cur, part)
                    if done >= batch.end:
                        return
                    todo = batch.changes(done) if done > batch.start else changes
                    for qn, ch in sorted(todo.items()):
                        idx = [i for i in range(len(ch)) if ch.partition_of(i, self.parts) == part]
                        if not idx:
                            continue
                        table = self.target(ch.schema, ch.table)
                        label = (f"table {self.database}.{table} (batch {batch.batch_id}, "
                                 f"partition {part})")
                        self._apply_rows(cur, ch, schemas[qn], table, idx)
                    self._record(cur, batch, part)
                return
            except pymysql.Error as exc:
                if errno(exc) in (ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT) and attempt + 1 < STEP_RETRIES:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                raise sink_error(exc, self.target_db, label) from None
            except ValueError as exc:
                raise SinkError(f"{label}: {exc}",
                                hint="MySQL has no NaN or infinity: such a value cannot be "
                                "mirrored there (docs/sync.md)") from None

    def _apply_rows(self, cur: Any, ch: TableChanges, schema: TableSchema, table: str,
                    idx: Sequence[int]) -> None:
        cols = [c.name for c in schema.columns]
        kinds = converters(schema)
        key = list(schema.key) or cols
        ident = self._ident(table)
        rows = ch.rows

        def values(row: dict[str, Any], names: Sequence[str]) -> list[Any]:
            return [to_db(row.get(n), kinds[n]) for n in names]

        if self._keyless.get(table, null_safe_key(schema)):
            self._apply_keyless(cur, ch, schema, ident, key, idx)
            return
        limit = self._statement_bytes(cur)
        deletes = [i for i in idx if ch.ops[i] == DELETE]
        for chunk in statements(deletes, lambda i: values(rows[i], key), limit):
            if len(key) == 1:
                cur.execute(f"DELETE FROM {ident} WHERE {q(key[0])} IN "
                            f"({', '.join(['%s'] * len(chunk))})",
                            [to_db(rows[i].get(key[0]), kinds[key[0]]) for i in chunk])
            else:
                one = "(" + ", ".join(["%s"] * len(key)) + ")"
                cur.execute(f"DELETE FROM {ident} WHERE ({', '.join(q(k) for k in key)}) IN "
                            f"({', '.join([one] * len(chunk))})",
                            [v for i in chunk for v in values(rows[i], key)])
        # upserts, grouped by the columns whose target value is kept (unchanged TOAST)
        groups: dict[tuple[str, ...], list[int]] = {}
        for i in idx:
            if ch.ops[i] != DELETE:
                groups.setdefault(tuple(ch.unchanged[i] or ()), []).append(i)
        col_list = ", ".join(q(n) for n in cols)
        row_marks = "(" + ", ".join(["%s"] * len(cols)) + ")"
        for kept, members in sorted(groups.items()):
            update = [n for n in cols if n not in key and n not in kept] or key[:1]
            sets = ", ".join(f"{q(n)} = VALUES({q(n)})" for n in update)
            for chunk in statements(members, lambda i: values(rows[i], cols), limit):
                cur.execute(
                    f"INSERT INTO {ident} ({col_list}) VALUES {', '.join([row_marks] * len(chunk))}"
                    f" ON DUPLICATE KEY UPDATE {sets}",
                    [v for i in chunk for v in values(rows[i], cols)],
                )

    def _statement_bytes(self, cur: Any) -> int:
        if self._packet is None:
            cur.execute("SELECT @@max_allowed_packet")
            self._packet = int(cur.fetchone()[0])
        return max(1024, min(STATEMENT_BYTES, self._packet // 2))

    def _same(self, schema: TableSchema) -> Callable[[str, str, str], str]:
        """``same(column, left, right)``: the null-safe equality of a whole-row identity
        column, as SQL (``<=>``; text compared as bytes, so trailing spaces count; JSON
        as JSON on MySQL, as bytes of its text on MariaDB)."""
        mariadb = self._flavour.get("mariadb", True)
        kinds = converters(schema)
        types = column_types(schema, keyed=False)

        def same(n: str, left: str, right: str) -> str:
            if kinds.get(n) == "json" and not mariadb:
                return f"{left} <=> {right}"
            if kinds.get(n) == "json" or types.get(n) in ("LONGTEXT", "CHAR(36)"):
                return f"BINARY {left} <=> BINARY {right}"
            return f"{left} <=> {right}"

        return same

    def _apply_keyless(self, cur: Any, ch: TableChanges, schema: TableSchema, ident: str,
                       key: list[str], idx: Sequence[int]) -> None:
        """A table without primary key (its identity may hold NULLs): rows match when
        every identity column matches null-safely (``<=>``; text compared as bytes, so
        trailing spaces count, JSON as JSON). Deletes remove every matching row; upserts
        update the matching rows, else insert one."""
        cols = [c.name for c in schema.columns]
        kinds = converters(schema)
        same = self._same(schema)
        as_json = not self._flavour.get("mariadb", True)  # MySQL's JSON type compares as JSON
        match = " AND ".join(
            same(n, q(n), "CAST(%s AS JSON)" if kinds[n] == "json" and as_json else "%s")
            for n in key)
        non_key = [n for n in cols if n not in key]
        for i in idx:
            row = ch.rows[i]
            kv = [to_db(row.get(n), kinds[n]) for n in key]
            if ch.ops[i] == DELETE:
                cur.execute(f"DELETE FROM {ident} WHERE {match}", kv)
                continue
            if non_key:
                found = cur.execute(
                    f"UPDATE {ident} SET {', '.join(f'{q(n)} = %s' for n in non_key)} "
                    f"WHERE {match}",
                    [to_db(row.get(n), kinds[n]) for n in non_key] + kv)
            else:
                cur.execute(f"SELECT COUNT(*) FROM {ident} WHERE {match}", kv)
                found = int(cur.fetchone()[0])
            if not found:
                cur.execute(f"INSERT INTO {ident} ({', '.join(q(n) for n in cols)}) VALUES "
                            f"({', '.join(['%s'] * len(cols))})",
                            [to_db(row.get(n), kinds[n]) for n in cols])

    def close(self) -> None:
        for conn in self._conns.values():
            with suppress(Exception):  # closing a broken connection
                conn.close()
        self._conns.clear()


FAULT_ENV = "DBLOG_SYNC_FAULT"


def _fault(batch_id: int) -> None:
    """Fault injection for tests (``spark.job.FAULT_ENV``): ``mysql-part:N`` kills the
    sync job (its session: driver, JVM, Python workers) with SIGKILL once a key
    partition of batch ``N`` committed, before the task applies another."""
    import os
    import signal

    if os.environ.get(FAULT_ENV, "") != f"mysql-part:{batch_id}":
        return
    # the job's session first (driver, JVM), then this worker's own group (Spark's
    # daemon puts its workers in a group of their own): the other order kills this
    # process before it reaches the job
    os.killpg(os.getsid(0), signal.SIGKILL)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def mysql_parts_fn(
    dsn: str,
    database: str,
    parts: int,
    batch_id: int,
    start: int,
    end: int,
    schemas: dict[str, TableSchema],
    keyless: dict[str, bool],
    flavour: dict[str, bool],
    markers: list[tuple[int, str, str, str]] | None = None,
    source: str = DEFAULT_SOURCE,
) -> Any:
    """``mapInArrow`` over row events shuffled by their ``part`` column: each key
    partition present in the task applied in one transaction with its progress row
    (``MySqlSink._apply_part``); one ``(part, error)`` row per part. Every part also
    reads the batch's repair ``markers``: the net change of a key a marker drops is a
    delete (``batch.Batch.changes``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not tables:
            return
        ev = pa.concat_tables(tables)
        sink = MySqlSink(dsn, database, parts, source)
        sink._keyless = dict(keyless)
        sink._flavour = dict(flavour)
        out_parts: list[int] = []
        out_errors: list[str | None] = []
        try:
            for part in sorted(pc.unique(ev["part"]).to_pylist()):
                mine = ev.filter(pc.equal(ev["part"], part)).drop_columns(["part"])
                if markers:
                    notes = pa.Table.from_pylist(
                        [{"offset": o, "op": "n", "schema": s, "table": t, "after": a}
                         for o, s, t, a in markers], schema=mine.schema)
                    mine = pa.concat_tables([mine, notes])
                batch = Batch(batch_id, start, end, mine, dict(schemas))
                err: str | None = None
                try:
                    changes = batch.changes()
                    sink._apply_part(batch, part, changes,
                                     {qn: batch.schema_for(c) for qn, c in changes.items()})
                    _fault(batch_id)
                except SinkError as exc:
                    err = exc.message + (f" ({exc.hint})" if exc.hint else "")
                out_parts.append(part)
                out_errors.append(err)
        finally:
            sink.close()
        yield pa.RecordBatch.from_pydict(
            {"part": out_parts, "error": out_errors},
            schema=pa.schema([("part", pa.int32()), ("error", pa.string())]))

    return run
