"""The MySQL/MariaDB ``SnapshotReader``: keyset chunks and watermark writes.

Invariants:
- Every SELECT runs in ``START TRANSACTION READ ONLY`` with a statement timeout (MariaDB
  ``SET STATEMENT max_statement_time=… FOR``, MySQL ``MAX_EXECUTION_TIME`` hint); filters
  are applied inside that transaction, so they cannot write.
- Chunk rows are mapped exactly as the binlog path maps them (``types.SelectMapper``), and
  key values handed back as bounds are mapped back to SQL parameters (``types.key_param``).
- Keyset order is the index order with NULLs first (MySQL's). Rows whose (single-column,
  surrogate) key is NULL are all returned by the first chunk (``after is None``), whatever
  ``limit`` says: a keyset cannot page inside a run of equal NULL keys.
- ``write_watermark`` commits on its own (autocommit) and arrives in the binlog as an
  UPDATE of the watermark table's one row (``id = 1``), new value in ``after["value"]``.
- ``read_chunk_fenced`` (read-only snapshots) reads a whole chunk, every SELECT of it,
  in one consistent-snapshot transaction and returns the GTID fence of that snapshot
  (``sources.mysql.fences``); it writes nothing.
- Concurrent windows (``core.flight``, ``ports.ConcurrentReader``): ``fork`` gives a
  reader on a connection of its own (one per chunk in flight; closed by this reader's
  ``close``), ``chunk_bounds`` finds range boundaries with keyset ``LIMIT 1 OFFSET
  step - 1`` queries (the key columns only). A reader object is used by one thread at a
  time for chunk reads; ``fork`` may be called from several threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pymysql

from pydblog.config import TableMatcher
from pydblog.core.sizing import default_parallelism
from pydblog.errors import SignalError, SourceError, SourceUnavailable
from pydblog.ports import (
    BlockingFencer,
    ConcurrentReader,
    FencedReader,
    IntegerKeyReader,
    RequestScoped,
    SnapshotReader,
    TableInfo,
    TableSchema,
    WindowFencer,
)
from pydblog.sources import intkeys
from pydblog.sources.mysql import schema as schema_mod
from pydblog.sources.mysql import textrows
from pydblog.sources.mysql.connect import (
    ER_BAD_FIELD,
    ER_PARSE_ERROR,
    ER_QUERY_TIMEOUT_MYSQL,
    ER_READ_ONLY_TRANSACTION,
    ER_STATEMENT_TIMEOUT_MARIADB,
    UNAVAILABLE,
    MySqlDsn,
    classify,
    connect,
    detail,
    errno,
    is_mariadb,
)
from pydblog.sources.mysql.fenced import open_fenced
from pydblog.sources.mysql.fences import GtidFence, Unfenced
from pydblog.sources.mysql.replica import catch_up, check_replica, source_state
from pydblog.sources.mysql.setup import OwnTables
from pydblog.sources.mysql.types import ColumnType, SelectMapper, key_param, quote_ident

T = TypeVar("T")
Run = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
"""Runs one SELECT (with its parameters) inside a read-only transaction."""
TIMEOUTS = {ER_STATEMENT_TIMEOUT_MARIADB, ER_QUERY_TIMEOUT_MYSQL}
log = logging.getLogger(__name__)
IDLE_PING_S = 60.0
# A source's semi-sync switch: the semisync_master plugin's name and semisync_source's
# (MySQL 8.0.26+; 8.4 has only this one).
SEMI_SYNC_SOURCE = frozenset({"rpl_semi_sync_master_enabled", "rpl_semi_sync_source_enabled"})


class _FilterRejected(Exception):
    def __init__(self, cause: pymysql.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Table:
    """A table's SELECT mapping and its key columns' types (cached per table and key)."""

    def __init__(self, info: TableInfo, cols: Sequence[ColumnType]) -> None:
        by_name = {c.name: c for c in cols}
        self.info = info
        self.mapper = SelectMapper.build(cols)
        self.key_cols = [by_name[k] for k in info.key]
        self.name = f"{quote_ident(info.schema)}.{quote_ident(info.table)}"


class _CommitOrder:
    """Shared by a reader and its forks. ``watch``: ``fences_watermark_windows`` said
    no because MySQL ran with ``binlog_order_commits = ON``; each table start (``max_key``)
    then checks it still does. ``blocking_only``: ``fences_blocking_reads`` said yes on
    MySQL (its fenced reads are blocking reads only: ``open_fenced``'s fallback)."""

    __slots__ = ("blocking_only", "warned", "watch")

    def __init__(self) -> None:
        self.watch = False
        self.warned = False
        self.blocking_only = False


class MySqlSnapshotReader(
    SnapshotReader, ConcurrentReader, IntegerKeyReader, FencedReader, WindowFencer, BlockingFencer, RequestScoped,
):
    """Chunk reads and watermark writes on their own connection (see module docstring)."""

    def __init__(
        self,
        dsn: MySqlDsn,
        *,
        matcher: TableMatcher,
        own: OwnTables,
        statement_timeout_ms: int = 60_000,
        connect_timeout_s: float = 10.0,
        parallelism: int | None = None,
        source: MySqlDsn | None = None,
    ) -> None:
        """``parallelism``: ``[snapshot] parallelism`` (None: a default, see
        ``parallelism()``). ``source``: ``dsn`` is a replica of this source
        (``[snapshot] read_dsn``, read-only snapshots only; ``sources.mysql.replica``
        checks it on each new connection, and fences leave out its own GTIDs)."""
        self.dsn = dsn
        self.source = source
        self._local: str | None = None  # the replica's own GTID name (sources.mysql.replica)
        self._src: Any = None  # on a replica: a connection to the source (its GTID state)
        self._catalog: Any = None  # the source, listing tables (own lock)
        self._catalog_lock = threading.Lock()
        self.db = dsn.database
        self.matcher = matcher
        self.own = own
        self.statement_timeout_ms = statement_timeout_ms
        self.connect_timeout_s = connect_timeout_s
        self._conn: Any = None
        self._used = 0.0
        self._mariadb = True
        self._lock = threading.RLock()
        self._fenced = False  # inside a read-only chunk's transaction: no own transactions
        self._tables: dict[tuple[str, tuple[str, ...]], _Table] = {}
        self._pks: dict[str, tuple[str, ...]] = {}  # table -> primary key (() without one)
        self._parallelism = parallelism
        self._forks: list[MySqlSnapshotReader] = []
        self._order = _CommitOrder()
        self._asked: float | None = None  # when the driver's current request began
        self._waited_at: float | None = None  # the last replica wait's source state read then
        self.replica_waits = 0
        """Waits for the read replica (``_catch_up``) so far (tests, benchmarks)."""
        textrows.install()  # chunk rows parsed in C (the same rows as PyMySQL's)

    # -- connection ------------------------------------------------------------------------
    def _connection(self) -> Any:
        """The reader's connection; after a minute unused it is pinged (and reopened if
        the server closed it, e.g. after wait_timeout)."""
        now = time.monotonic()
        if self._conn is not None and now - self._used > IDLE_PING_S:
            try:
                self._conn.ping(reconnect=False)
            except pymysql.Error:
                self._reset()
        if self._conn is None:
            conn = connect(self.dsn, timeout_s=self.connect_timeout_s, text_values=True)
            try:
                if self.source is not None:
                    self._local = check_replica(
                        conn, self.source, self.dsn.redacted, self.connect_timeout_s
                    )
            except BaseException:
                with contextlib.suppress(pymysql.Error):
                    conn.close()
                raise
            self._conn = conn
            self._mariadb = is_mariadb(conn)
        self._used = now
        return self._conn

    def begin_request(self) -> None:
        """The driver starts one snapshot request on this reader (``_catch_up``: one wait
        for the replica covers every read of it)."""
        self._asked = time.monotonic()

    def _reset(self) -> None:
        self._waited_at = None  # (a new connection may reach another server)
        if self._conn is not None:
            with contextlib.suppress(pymysql.Error):
                self._conn.close()
        self._conn = None

    def _timed(self, sql: str) -> str:
        if self._mariadb:
            return (
                f"SET STATEMENT max_statement_time={self.statement_timeout_ms / 1000:.3f} FOR {sql}"
            )
        return sql.replace(
            "SELECT ", f"SELECT /*+ MAX_EXECUTION_TIME({self.statement_timeout_ms}) */ ", 1
        )

    def _read_only(
        self, sql: str, params: Sequence[Any], *, doing: str, raw: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run one SELECT in a READ ONLY transaction with the statement timeout.

        ``raw``: server-side refusals (not connection losses or timeouts) are raised as
        ``_FilterRejected`` for the caller to word. Inside ``read_chunk_fenced`` the
        SELECT runs in its transaction, and errors are raised as they come (that read is
        retried as a whole)."""
        return self._in_read_only(lambda run: run(sql, params), doing=doing, raw=raw)

    def _in_read_only(
        self,
        work: Callable[[Run], T],
        *,
        doing: str,
        raw: bool = False,
    ) -> T:
        """``work(run)`` in one READ ONLY transaction, ``run(sql, params)`` running a
        SELECT of it with the statement timeout; a lost connection is reopened and the
        whole ``work`` run again once (so it must only read). Errors as ``_read_only``."""
        if self._fenced:
            def fenced_run(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                with self._conn.cursor() as cur:
                    cur.execute(self._timed(sql), tuple(params) if params else None)
                    return list(cur.fetchall())
            return work(fenced_run)
        for attempt in (1, 2):
            with self._lock:
                conn = self._connection()
                try:
                    with conn.cursor() as cur:
                        def run(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
                            cur.execute(self._timed(sql), tuple(params) if params else None)
                            return list(cur.fetchall())
                        cur.execute("START TRANSACTION READ ONLY")
                        try:
                            return work(run)
                        finally:
                            conn.rollback()
                except pymysql.Error as exc:
                    code = errno(exc)
                    if code in UNAVAILABLE and attempt == 1:
                        self._reset()
                        continue
                    if code in UNAVAILABLE:
                        self._reset()
                    elif raw and code not in TIMEOUTS:
                        raise _FilterRejected(exc) from None
                    raise self._error(exc, doing) from None
        raise AssertionError("unreachable")

    def _error(self, exc: pymysql.Error, doing: str) -> Exception:
        code = errno(exc)
        if code in TIMEOUTS:
            return SourceUnavailable(
                f"{doing} exceeded the statement timeout ({self.statement_timeout_ms} ms)",
                hint="raise [snapshot] statement_timeout_ms or lower chunk_size",
            )
        return classify(exc, self.dsn, doing)

    def fences_watermark_windows(self) -> bool:
        """Watermark chunks are read fenced too (``CoreSettings.fenced``) where commits
        can become visible out of binlog order: MySQL with ``binlog_order_commits =
        OFF`` (each session then commits in the engine on its own after its group's
        binlog write, so a watermark L written after a transaction's binlog entry can
        be visible, and the chunk read, before that transaction is). Elsewhere commits
        become visible in binlog order (MariaDB always; MySQL with the default ``ON``),
        also while a semi-synchronous commit waits for its replica: L then cannot commit
        before it (tests/mysql/test_semisync.py). Fencing needs ``gtid_mode = ON``;
        without it the hazard stays (logged as a warning; docs/snapshots.md)."""
        if self._mariadb_server():
            return False
        try:
            with self._lock, self._connection().cursor() as cur:
                cur.execute("SELECT @@GLOBAL.binlog_order_commits, @@GLOBAL.gtid_mode")
                ordered, mode = cur.fetchone()
        except pymysql.Error as exc:
            self._reset()
            raise self._error(exc, "reading binlog_order_commits") from None
        if int(ordered or 0):
            self._order.watch = True
            return False
        if str(mode).upper() != "ON":
            log.warning(
                "binlog_order_commits is OFF and gtid_mode is %s on %s: a watermark chunk can "
                "read a row older than a commit the binlog already holds (turn "
                "binlog_order_commits ON, or gtid_mode ON so that chunks are fenced)",
                mode, self.dsn.redacted,
            )
            return False
        return True

    def fences_blocking_reads(self) -> bool:
        """Blocking reads (table starts and chunks) are fenced
        (``CoreSettings.fenced_blocking``) wherever GTIDs allow: MariaDB always, MySQL
        with ``gtid_mode = ON``. The stream can deliver a commit before it is visible:
        with semi-synchronous replication and ``rpl_semi_sync_master_wait_point =
        AFTER_SYNC`` (MySQL's default wait point) a commit is written to the binlog and
        sent to every binlog reader, then waits for a replica's acknowledgement before
        its engine commit (tests/mysql/test_semisync.py); and without it there is the
        moment between a group's binlog write and its engine commit. A watermark window
        is ordered after such a commit (its L commits after it); a blocking read, with
        the stream paused, is not, and a row it missed would land, older, after that
        commit's event for good. Fenced, the read cannot decide while such a commit is
        invisible and is read again (docs/snapshots.md, "Fenced blocking reads").
        Checked at the capture's start, so a server that turns semi-sync on at runtime
        is covered too. MySQL without GTIDs cannot be fenced: a warning if semi-sync is
        on there (as a source: ``SEMI_SYNC_SOURCE``)."""
        if self._mariadb_server():
            return True
        try:
            with self._lock, self._connection().cursor() as cur:
                cur.execute("SELECT @@GLOBAL.gtid_mode")
                (mode,) = cur.fetchone()
                if str(mode).upper() == "ON":
                    self._order.blocking_only = True
                    return True
                # semisync_master (5.7, 8.0) or semisync_source (8.0.26+; 8.4: only it)
                cur.execute("SHOW GLOBAL VARIABLES LIKE 'rpl_semi_sync_%_enabled'")
                rows = cur.fetchall()
        except pymysql.Error as exc:
            self._reset()
            raise self._error(exc, "reading gtid_mode") from None
        if any(str(name).lower() in SEMI_SYNC_SOURCE and str(value).upper() in ("ON", "1")
               for name, value in rows):
            log.warning(
                "semi-synchronous replication is on and gtid_mode is %s on %s: a blocking "
                "snapshot can read a row older than a commit the binlog already holds (one "
                "waiting for its replica's acknowledgement), and the change log keeps it "
                "(set gtid_mode ON so that blocking reads are fenced, or use incremental "
                "snapshots)", mode, self.dsn.redacted,
            )
        return False

    def _check_order(self, info: TableInfo, ordered: Any, mode: Any) -> None:
        """At a table start of a capture whose watermark windows are not fenced because
        MySQL had ``binlog_order_commits = ON`` at its start: if it is OFF now (``SET
        GLOBAL``), this table's chunks could read a row older than a commit the binlog
        already holds (``fences_watermark_windows``). With ``gtid_mode = ON`` a restart
        fences them: the table is rejected, saying so; without, as at a start: a warning.
        (Checked per table start, with its max key: tables already being read when the
        variable changes keep unfenced windows to their end.)"""
        if int(ordered or 0):
            return
        if str(mode).upper() == "ON":
            raise SourceError(
                f"binlog_order_commits was turned OFF on {self.dsn.redacted} after dblog run "
                f"started: the chunks of {info.qualified} would not be fenced, and commits can "
                "now become visible out of binlog order",
                hint="restart dblog run (it then fences watermark chunks) and signal the "
                "snapshot again, or SET GLOBAL binlog_order_commits = ON",
            )
        if not self._order.warned:
            self._order.warned = True
            log.warning(
                "binlog_order_commits was turned OFF on %s and gtid_mode is %s: a watermark "
                "chunk can read a row older than a commit the binlog already holds (turn "
                "binlog_order_commits ON, or gtid_mode ON and restart so that chunks are "
                "fenced)", self.dsn.redacted, mode,
            )

    def _mariadb_server(self) -> bool:
        with self._lock:
            self._connection()
            return self._mariadb

    # -- SnapshotReader ----------------------------------------------------------------------
    def captured_tables(self) -> list[str]:
        """The captured tables that exist now, listed on the source (with a read replica
        too: authoritative, a table created there before the stream's start is listed,
        and a ``mode = "initial"`` snapshot must read it), on a connection and lock of
        their own: the capture thread calls this for every signal, and must never wait
        for a lagging replica (tests/mysql/test_read_replica.py) nor for a chunk read
        holding ``self._lock`` while it waits on the server, up to
        ``statement_timeout_ms`` (tests/mysql/test_signal_during_chunk.py); the chunks'
        definitions wait (``table_info``)."""
        names = self._list_on_source()
        return [
            f"{self.db}.{t}"
            for t in names
            if self.matcher(f"{self.db}.{t}") and f"{self.db}.{t}" not in self.own.qualified
        ]

    def table_info(self, qualified: str, surrogate_key: str | None = None) -> TableInfo | None:
        """Columns, types and key of ``database.table`` (None if it does not exist).

        ``key`` is the primary key, or ``(surrogate_key,)`` when given (``SignalError`` if
        that is not a column); ``()`` for a table without either."""
        db, _, table = qualified.rpartition(".")
        db = db or self.db
        if not self._fenced:
            self._wait_replica()  # a lagging replica's definition may be older than the stream's
        with self._lock:
            try:
                with self._connection().cursor() as cur:
                    cols = schema_mod.table_columns(cur, db, table, self._mariadb)
                    pk = schema_mod.primary_key(cur, db, table) if cols else ()
            except pymysql.Error as exc:
                raise self._error(exc, f"reading the definition of {qualified}") from None
        if not cols:
            return None
        names = tuple(c.name for c in cols)
        self._pks[f"{db}.{table}"] = tuple(pk)
        if surrogate_key is not None:
            if surrogate_key not in names:
                raise SignalError(
                    f"surrogate-key {surrogate_key!r} is not a column of {qualified} "
                    f"(columns: {', '.join(names)})"
                )
            pk = (surrogate_key,)
        # The row identity: the primary key, else every column (as the binlog reader
        # keys a table's events); a surrogate key only orders the chunks.
        identity = tuple(self._pks[f"{db}.{table}"]) or names
        info = TableInfo(db, table, names, tuple(c.column_type for c in cols), pk, identity)
        self._tables[(info.qualified, info.key)] = _Table(info, cols)
        return info

    def table_schema(self, qualified: str) -> TableSchema | None:
        db, _, table = qualified.rpartition(".")
        self._wait_replica()
        with self._lock, self._connection().cursor() as cur:
            return schema_mod.table_schema(cur, db or self.db, table, self._mariadb)

    def _table(self, info: TableInfo) -> _Table:
        """The cached mapping for ``info`` (reloaded when the table's columns changed)."""
        cached = self._tables.get((info.qualified, info.key))
        if cached is not None and cached.info == info:
            return cached
        with self._lock:
            try:
                with self._connection().cursor() as cur:
                    cols = schema_mod.table_columns(cur, info.schema, info.table, self._mariadb)
            except pymysql.Error as exc:
                raise self._error(exc, f"reading the definition of {info.qualified}") from None
        names = {c.name for c in cols}
        if not cols or any(k not in names for k in info.key):
            raise SignalError(f"table {info.qualified} or its key columns no longer exist")
        table = _Table(info, cols)
        self._tables[(info.qualified, info.key)] = table
        return table

    def check_filter(self, info: TableInfo, condition: str) -> None:
        """Validate ``condition``: EXPLAIN it, then evaluate it on one row, both inside a
        READ ONLY transaction (a function that writes fails there)."""
        t = self._table(info)
        try:
            self._read_only(
                f"EXPLAIN SELECT 1 FROM {t.name} WHERE ({condition})",
                (),
                doing="checking a snapshot filter",
                raw=True,
            )
            self._read_only(
                f"SELECT 1 FROM {t.name} WHERE ({condition}) LIMIT 1",
                (),
                doing="checking a snapshot filter",
                raw=True,
            )
        except _FilterRejected as exc:
            code = errno(exc.cause)
            what = {
                ER_PARSE_ERROR: "does not parse",
                ER_BAD_FIELD: "names an unknown column",
                ER_READ_ONLY_TRANSACTION: "tries to write",
            }.get(code or 0, "is rejected by the server")
            raise SignalError(
                f"filter {condition!r} on {info.qualified} {what}: {detail(exc.cause)}"
            ) from None

    def max_key(self, info: TableInfo, condition: str | None) -> tuple[Any, ...] | None:
        t = self._table(info)
        if not t.key_cols:
            raise SignalError(f"table {info.qualified} has no primary key: give a surrogate-key")
        if not self._fenced:  # (a fenced read has caught up already)
            self._wait_replica()  # a lagging replica's max would miss rows older than the stream
        keys = _key_mapper(t, info)
        desc = ", ".join(f"{quote_ident(k)} DESC" for k in info.key)
        where = f" WHERE ({condition})" if condition else ""
        sql = f"SELECT {keys.select_list} FROM {t.name}{where} ORDER BY {desc} LIMIT 1"
        watch = self._order.watch and not self._fenced

        def work(run: Run) -> tuple[list[tuple[Any, ...]], tuple[Any, ...] | None]:
            found = run(sql, ())
            if not watch:
                return found, None
            return found, run("SELECT @@GLOBAL.binlog_order_commits, @@GLOBAL.gtid_mode", ())[0]

        rows, order = self._in_read_only(work, doing=f"reading the max key of {info.qualified}")
        if order is not None:
            self._check_order(info, *order)
        if not rows:
            return None
        mapped = keys.map(rows[0])
        return tuple(mapped[k] for k in info.key)

    # -- concurrent windows (ports.ConcurrentReader) -------------------------------------
    def parallelism(self) -> int:
        """``[snapshot] parallelism``, else a default from the machine and the server:
        half the machine's cores (at least 2, at most 4), and no more than a tenth of
        the server's free connections (``max_connections - Threads_connected``)."""
        if self._parallelism is not None:
            return self._parallelism
        try:
            with self._lock, self._connection().cursor() as cur:
                cur.execute("SELECT @@GLOBAL.max_connections")
                limit = int(cur.fetchone()[0])
                cur.execute("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
                row = cur.fetchone()
                used = int(row[1]) if row else 0
        except pymysql.Error as exc:
            self._reset()
            raise self._error(exc, "reading the server's connection limit") from None
        return default_parallelism(os.cpu_count(), limit - used)

    def fork(self) -> MySqlSnapshotReader:
        """Another reader of the same server on a connection of its own (for one chunk
        in flight at a time); closed by this reader's ``close``. Thread-safe."""
        child = MySqlSnapshotReader(
            self.dsn, matcher=self.matcher, own=self.own,
            statement_timeout_ms=self.statement_timeout_ms,
            connect_timeout_s=self.connect_timeout_s, parallelism=1, source=self.source,
        )
        child._order = self._order
        with self._lock:
            self._forks.append(child)
        return child

    def chunk_bounds(
        self,
        info: TableInfo,
        after: tuple[Any, ...] | None,
        max_key: tuple[Any, ...],
        step: int,
        count: int,
        condition: str | None,
    ) -> list[tuple[Any, ...]]:
        """The keys of the ``step``-th, ``2·step``-th, ... row with ``after < key <=
        max_key`` (and ``condition``), at most ``count``, ascending, mapped as chunk keys.

        One READ ONLY transaction of up to ``count`` keyset queries, each ``SELECT key
        ... WHERE key > previous bound AND key <= max_key ORDER BY key LIMIT 1 OFFSET
        step - 1``: only the key columns are selected, and each query walks ``step``
        index entries from where the previous one stopped (MySQL 5.7 has no window
        functions for one query). Fewer than ``count`` keys: the range's end is near."""
        t = self._table(info)
        if not t.key_cols:
            raise SignalError(f"table {info.qualified} has no primary key: give a surrogate-key")
        keys = _key_mapper(t, info)
        order = ", ".join(quote_ident(k) for k in info.key)
        offset = max(0, int(step) - 1)

        def work(run: Run) -> list[tuple[Any, ...]]:
            out: list[tuple[Any, ...]] = []
            prev = after
            for _ in range(count):
                params: list[Any] = []
                where = [] if prev is None else [
                    _compare(t.key_cols, prev, strict=True, greater=True, params=params)
                ]
                where.append(_compare(t.key_cols, max_key, strict=False, greater=False,
                                      params=params))
                clause = " AND ".join(where)
                if condition:
                    cond = condition.replace("%", "%%") if params else condition
                    clause = f"({clause}) AND ({cond})"
                rows = run(
                    f"SELECT {keys.select_list} FROM {t.name} WHERE {clause} "
                    f"ORDER BY {order} LIMIT 1 OFFSET {offset}",
                    params,
                )
                if not rows:
                    break
                mapped = keys.map(rows[0])
                prev = tuple(mapped[k] for k in info.key)
                out.append(prev)
            return out

        return self._in_read_only(work, doing=f"reading chunk bounds of {info.qualified}")

    def integer_key(self, info: TableInfo) -> bool:
        """The chunk key is one integer column, signed or unsigned
        (``ports.IntegerKeyReader``)."""
        if len(info.key) != 1 or not intkeys.enabled():
            return False
        (col,) = self._table(info).key_cols
        return col.data_type in intkeys.MYSQL_TYPES and not col.column_type.startswith("tinyint(1)")

    def read_chunk(
        self,
        info: TableInfo,
        after: tuple[Any, ...] | None,
        max_key: tuple[Any, ...],
        limit: int,
        condition: str | None,
    ) -> list[dict[str, Any]]:
        t = self._table(info)
        if not t.key_cols:
            raise SignalError(f"table {info.qualified} has no primary key: give a surrogate-key")
        if not self._fenced:
            self._wait_replica()  # (a blocking snapshot's rows must be as new as the stream)
        params: list[Any] = []
        where: list[str] = []
        if after is None and len(t.key_cols) == 1 and t.key_cols[0].nullable:
            nulls = self._select(
                t, f"{quote_ident(t.key_cols[0].name)} IS NULL", [], condition, None, info
            )
            if nulls:
                return nulls
        if after is not None:
            where.append(_compare(t.key_cols, after, strict=True, greater=True, params=params))
        where.append(_compare(t.key_cols, max_key, strict=False, greater=False, params=params))
        rows = self._select(t, " AND ".join(where), params, condition, limit, info)
        pk = self._pks.get(info.qualified)
        if len(rows) == limit and len(t.key_cols) == 1 and pk is not None and info.key != pk:
            # A surrogate key may repeat: extend the chunk to the end of its last key's
            # group, so paging (``after < key``) neither skips nor repeats a row.
            last = rows[-1][t.key_cols[0].name]
            params = []
            where = [] if after is None else [
                _compare(t.key_cols, after, strict=True, greater=True, params=params)
            ]
            where.append(_compare(t.key_cols, (last,), strict=False, greater=False, params=params))
            rows = self._select(t, " AND ".join(where), params, condition, None, info)
        return rows

    def read_chunk_fenced(
        self,
        info: TableInfo,
        after: tuple[Any, ...] | None,
        max_key: tuple[Any, ...],
        limit: int,
        condition: str | None,
    ) -> tuple[list[dict[str, Any]], GtidFence | Unfenced]:
        """``read_chunk`` in one consistent-snapshot transaction, with the GTID fence of
        its snapshot (``sources.mysql.fences``). Writes nothing."""
        return self._fenced_read(
            info, f"reading a chunk of {info.qualified}",
            lambda: self.read_chunk(info, after, max_key, limit, condition),
        )

    def max_key_fenced(
        self, info: TableInfo, condition: str | None
    ) -> tuple[tuple[Any, ...] | None, GtidFence | Unfenced]:
        """``max_key`` fenced as ``read_chunk_fenced`` is (a read-only table start)."""
        return self._fenced_read(
            info, f"reading the max key of {info.qualified}", lambda: self.max_key(info, condition)
        )

    def _fenced_read(
        self, info: TableInfo, doing: str, read: Callable[[], T]
    ) -> tuple[T, GtidFence | Unfenced]:
        self._table(info)  # the column mapping, read before the snapshot's transaction
        for attempt in (1, 2):
            with self._lock:
                conn = self._connection()
                try:
                    with conn.cursor() as cur:
                        if self.source is not None:
                            self._catch_up(cur)
                        fence = open_fenced(cur, self._mariadb, self.dsn.redacted, self._local,
                                            self._order.blocking_only)
                        self._fenced = True
                        try:
                            rows = read()
                        finally:
                            self._fenced = False
                            with contextlib.suppress(pymysql.Error):
                                conn.rollback()
                        return rows, fence
                except pymysql.Error as exc:
                    code = errno(exc)
                    if code in UNAVAILABLE:
                        self._reset()
                        if attempt == 1:
                            continue
                    raise self._error(exc, doing) from None
        raise AssertionError("unreachable")

    def _wait_replica(self) -> None:
        """On a replica: ``_catch_up`` on the reader's connection (no-op on the source)."""
        if self.source is None:
            return
        for attempt in (1, 2):
            with self._lock:
                try:
                    with self._connection().cursor() as cur:
                        self._catch_up(cur)
                    return
                except pymysql.Error as exc:
                    self._reset()
                    if errno(exc) in UNAVAILABLE and attempt == 1:
                        continue
                    raise self._error(exc, "waiting for the read replica") from None

    def _catch_up(self, cur: Any) -> None:
        """On a replica: wait until it has applied everything the source has binlogged
        so far (``sources.mysql.replica`` says why), on the source's own connection.

        Once per request (``begin_request``): a wait for the source's state ``S`` read
        after the request began covers every later read of that request on the same
        connection (what a read needs is everything binlogged before it was asked for;
        ``S`` holds that, and the replica's applied state only grows). So a chunk waits
        once, in ``table_info``, not again in its read. A new connection waits again."""
        assert self.source is not None
        asked, waited = self._asked, self._waited_at
        if asked is not None and waited is not None and waited >= asked:
            return
        t0 = time.monotonic()
        try:
            if self._src is None:
                self._src = connect(self.source, timeout_s=self.connect_timeout_s)
            with self._src.cursor() as scur:
                state = source_state(scur, self._mariadb)
        except pymysql.Error as exc:
            self._close_source()
            raise classify(exc, self.source, "reading the source's GTID state") from None
        catch_up(cur, self._mariadb, state, self.statement_timeout_ms / 1000, self.dsn.redacted)
        self._waited_at = t0
        self.replica_waits += 1

    def _list_on_source(self) -> list[str]:
        """``self.db``'s tables as the source lists them (``captured_tables``), on the
        catalog connection (to the source: ``self.source`` with a read replica, else
        ``self.dsn``)."""
        where = self.source if self.source is not None else self.dsn
        with self._catalog_lock:
            for attempt in (1, 2):
                try:
                    if self._catalog is None:
                        self._catalog = connect(where, timeout_s=self.connect_timeout_s)
                    with self._catalog.cursor() as cur:
                        return schema_mod.list_tables(cur, self.db)
                except pymysql.Error as exc:
                    self._close_catalog()
                    if errno(exc) in UNAVAILABLE and attempt == 1:
                        continue
                    raise classify(exc, where, "listing the captured tables") from None
        raise AssertionError("unreachable")

    def _close_catalog(self) -> None:
        if self._catalog is not None:
            with contextlib.suppress(pymysql.Error):
                self._catalog.close()
        self._catalog = None

    def _close_source(self) -> None:
        if self._src is not None:
            with contextlib.suppress(pymysql.Error):
                self._src.close()
        self._src = None

    def read_keys(self, info: TableInfo, keys: Sequence[tuple[Any, ...]]) -> list[dict[str, Any]]:
        """The rows of these identities (``info.key``), in key order (a key re-read)."""
        t = self._table(info)
        if not keys:
            return []
        params: list[Any] = []
        where = " OR ".join(
            "(" + " AND ".join(_eq(c, v, params) for c, v in zip(t.key_cols, k, strict=True)) + ")"
            for k in keys
        )
        return self._select(t, where, params, None, None, info)

    def _select(
        self,
        t: _Table,
        where: str,
        params: list[Any],
        condition: str | None,
        limit: int | None,
        info: TableInfo,
    ) -> list[dict[str, Any]]:
        if condition:
            # pymysql formats the query with %-placeholders when there are parameters.
            cond = condition.replace("%", "%%") if params else condition
            where = f"({where}) AND ({cond})"
        order = ", ".join(quote_ident(k) for k in info.key)
        sql = f"SELECT {t.mapper.select_list} FROM {t.name} WHERE {where} ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self._read_only(sql, params, doing=f"reading a chunk of {info.qualified}")
        return t.mapper.map_rows(rows)

    def write_watermark(self, watermark_id: str) -> None:
        db, table = self.own.watermark
        sql = f"UPDATE {quote_ident(db)}.{quote_ident(table)} SET value = %s WHERE id = 1"
        for attempt in (1, 2):
            with self._lock:
                try:
                    conn = self._connection()
                    with conn.cursor() as cur:
                        cur.execute(sql, (watermark_id,))
                        if cur.rowcount == 0:
                            cur.execute(
                                f"INSERT INTO {quote_ident(db)}.{quote_ident(table)} (id, value) "
                                "VALUES (1, %s) ON DUPLICATE KEY UPDATE value = VALUES(value)",
                                (watermark_id,),
                            )
                    conn.commit()
                    return
                except pymysql.Error as exc:
                    if errno(exc) in UNAVAILABLE and attempt == 1:
                        self._reset()
                        continue
                    raise self._error(exc, "writing a watermark") from None

    def close(self) -> None:
        with self._lock:
            forks, self._forks = self._forks, []
            self._reset()
            self._close_source()
        with self._catalog_lock:
            self._close_catalog()
        for child in forks:
            child.close()


def _key_mapper(t: _Table, info: TableInfo) -> SelectMapper:
    """The SELECT mapping of ``info``'s key columns only (as chunk rows map them)."""
    at = [t.mapper.columns.index(k) for k in info.key]
    return SelectMapper(
        tuple(info.key), tuple(t.mapper.exprs[i] for i in at), tuple(t.mapper.convs[i] for i in at)
    )


def _compare(
    cols: Sequence[ColumnType],
    values: Sequence[Any],
    *,
    strict: bool,
    greater: bool,
    params: list[Any],
) -> str:
    """Row comparison ``(k1, k2, …) > / <= (v1, v2, …)`` expanded into ORs of equalities
    (index friendly on MariaDB too), with NULL ordered before every value."""
    disjuncts: list[str] = []
    for i, col in enumerate(cols):
        parts: list[str] = []
        for c, v in zip(cols[:i], values[:i], strict=True):
            parts.append(_eq(c, v, params))
        last = i == len(cols) - 1
        op_strict = strict or not last
        parts.append(_order(col, values[i], greater=greater, strict=op_strict, params=params))
        disjuncts.append("(" + " AND ".join(parts) + ")")
    return "(" + " OR ".join(disjuncts) + ")"


def _eq(col: ColumnType, value: Any, params: list[Any]) -> str:
    q = quote_ident(col.name)
    if value is None:
        return f"{q} IS NULL"
    ph, p = key_param(col, value)
    params.append(p)
    return f"{q} = {ph}"


def _order(col: ColumnType, value: Any, *, greater: bool, strict: bool, params: list[Any]) -> str:
    q = quote_ident(col.name)
    if value is None:  # NULL sorts first
        if greater:
            return f"{q} IS NOT NULL" if strict else "TRUE"
        return "FALSE" if strict else f"{q} IS NULL"
    ph, p = key_param(col, value)
    params.append(p)
    if greater:
        return f"{q} {'>' if strict else '>='} {ph}"
    cmp = f"{q} {'<' if strict else '<='} {ph}"
    return f"({q} IS NULL OR {cmp})" if col.nullable else cmp
