"""The MySQL/MariaDB ``LogSource``: row events from the binlog, in commit order.

Invariants:
- Transactions arrive whole and in commit order (the binlog is written at commit). Each
  captured row gets ``BinlogPosition(file, tx_start, index, gtid, gtids, epoch)``; the
  transaction's ``Commit`` is at ``index = number of captured rows`` (see ``position.py``).
- Where the server has GTIDs (MariaDB always; MySQL with ``gtid_mode=ON``) every position
  carries the GTID state before its transaction: known from the start (the state at the
  start offset) and advanced at each GTID event.
- ``open(checkpoint)`` resumes after the checkpoint's position as ``position.py`` says: by
  GTID state when the position has one (any server holding those transactions: a restart
  or a failover to a replica), else by file + offset on the same server. Either way this
  source drops what was already logged and yields nothing at or below
  ``checkpoint.position`` (the runner's own filter is then a no-op).
- The library never reconnects on its own: a lost connection surfaces here and the dump is
  restarted at the start of the open transaction (by GTID where known, so a server behind
  a moved address is followed exactly), dropping what was already yielded.
- ``stream()`` never blocks for long: the server sends a heartbeat every ``idle_s`` when it
  has nothing to send (``Idle`` is yielded then), and ``Idle`` is also yielded when only
  uncaptured events went by for ``idle_s``.
- Transactions without captured rows produce no ``Commit``; their position is offered as a
  ``Heartbeat`` at most every ``heartbeat_interval_s`` and when the server goes idle.
- Read-only snapshots (``read_only``): nothing is written to the server (pydblog's own
  tables are not created: see ``setup.ensure_own_tables``), MySQL must run with
  ``gtid_mode = ON``, and for a second after ``request_progress`` every transaction
  boundary is reported as ``StreamPassed`` (its position's state after the transaction:
  what the stream has delivered, see ``sources.mysql.fences``). ``wakeup`` (any thread)
  makes a ``stream()`` waiting for the server yield ``Idle`` now.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    MariadbGtidListEvent,
    QueryEvent,
    RotateEvent,
    XAPrepareEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from pydblog.config import TableMatcher
from pydblog.errors import SourceError, SourceUnavailable
from pydblog.events import ChangeEvent, Op
from pydblog.ports import (
    Checkpoint,
    ColumnSchema,
    Commit,
    Heartbeat,
    Idle,
    RelationReset,
    ResetKind,
    SchemaChanged,
    SourceState,
    StreamPassed,
    TableSchema,
)
from pydblog.positions import Position
from pydblog.sources.mysql import dumpconn, dumpstart, fastrows
from pydblog.sources.mysql import schema as schema_mod
from pydblog.sources.mysql.connect import (
    ER_MASTER_FATAL_READING_BINLOG,
    ER_PARSE_ERROR,
    UNAVAILABLE,
    Connection,
    MySqlDsn,
    classify,
    connect,
    detail,
    errno,
    is_mariadb,
)
from pydblog.sources.mysql.ddl import DdlKind, parse_ddl
from pydblog.sources.mysql.dumpconn import DUMP_CONNECTION_KEY
from pydblog.sources.mysql.dumpstart import DUMP_SERVER_KEY, DumpConnection, DumpStart
from pydblog.sources.mysql.fenced import gtid_mode_error
from pydblog.sources.mysql.fences import parse_owned
from pydblog.sources.mysql.gtid import GtidState, MariaGtidPos, MySqlGtidSet
from pydblog.sources.mysql.history import (
    HISTORY_KEY,
    SchemaHistory,
    history_mismatch,
    read_baseline,
    signature,
)
from pydblog.sources.mysql.position import BEFORE_TX, BinlogPosition, file_sequence
from pydblog.sources.mysql.resume import GtidResume, plan_resume
from pydblog.sources.mysql.setup import (
    OwnTables,
    check_source,
    ensure_own_tables,
    tables_without_key,
)
from pydblog.sources.mysql.tablemap import (
    DdlLookahead,
    SchemaTable,
    describe,
    may_rename,
    mysql_state_at,
    name_columns,
    read_table,
    type_mismatch,
)
from pydblog.sources.mysql.types import BinlogRowMapper, binlog_column_type
from pydblog.sources.mysql.wake import Wakeup
from pydblog.sources.mysql.xa import (
    XA_KEY,
    PreparedXa,
    Xid,
    parse_statement,
)

log = logging.getLogger(__name__)
"""A DROP TEMPORARY TABLE: a session's own table, never a captured one."""
SETTLE_S = 1.0
"""Longest a fresh MySQL start waits for the GTIDs being committed to be executed."""

"""``Checkpoint.extra`` key of the schema history (servers without binlog_row_metadata)."""
VERIFY_WITHIN_BYTES = 4 << 20
"""A history definition is checked against information_schema when met this close to
the binlog's end (the DDL scan up to the end is cheap there)."""


def _version_number(version: str) -> int:
    """``"5.7.29-log"`` -> ``50729`` (as in ``/*!50729 ... */`` comments)."""
    parts = [*version.split("-", 1)[0].split("."), "0", "0"][:3]
    try:
        major, minor, patch = (int(p) for p in parts)
    except ValueError:
        return 50700
    return major * 10000 + minor * 100 + patch


def _not_the_version_advice(record: logging.LogRecord) -> bool:
    """mysql-replication advises an older version of itself on servers without
    binlog_row_metadata; this source names their columns itself (tablemap.py)."""
    return "use python-mysql-replication version Before" not in record.getMessage()


logging.getLogger("pymysqlreplication").addFilter(_not_the_version_advice)

MAX_RECONNECT_S = 30.0
FL_PREPARED_XA = 64
"""MariaDB GTID event flag: the group is an XA transaction's ``XA PREPARE``."""


class _Reconnect(Exception):
    """The library tried to reconnect by itself (from a position we do not trust)."""


class _OneConnection:
    """``pymysql_wrapper`` for one ``BinLogStreamReader``: one stream and one control
    connection, never a silent second one. MySQL (``mysql``): the stream connection
    learns its server's ``server_uuid`` and, if ``start`` holds there, starts the GTID
    dump at its coordinates (``sources.mysql.dumpstart``)."""

    def __init__(self, *, mysql: bool = False, start: DumpStart | None = None) -> None:
        self.opened: set[str] = set()
        self.mysql = mysql
        self.start = start
        self.server_uuid: str | None = None
        self.started_at: DumpStart | None = None
        self.connection_id: int | None = None  # the stream's server connection id

    def __call__(self, **kwargs: Any) -> Any:
        # The library names some arguments the old way; pymysql warns about those.
        for old, new in (("db", "database"), ("passwd", "password")):
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
        role = "ctl" if kwargs.get("database") == "information_schema" else "stream"
        if role in self.opened:
            raise _Reconnect(role)
        self.opened.add(role)
        if role == "ctl":
            return Connection(**kwargs)
        if not self.mysql:
            conn = Connection(**kwargs)
            self.connection_id = conn.thread_id()
            return conn
        conn = DumpConnection(**kwargs)
        self.connection_id = conn.thread_id()
        try:
            self.server_uuid = dumpstart.server_uuid(conn)
            start = self.start
            if start is not None and start.server_uuid == self.server_uuid and dumpstart.holds(
                conn, start
            ):
                conn.start = self.started_at = start
        except BaseException:
            conn.close()
            raise
        return conn


@dataclass(slots=True)
class _Tx:
    """The transaction being read."""

    file: str
    start: int
    gtid: str | None
    explicit: bool  # inside BEGIN..COMMIT (or a MariaDB non-standalone GTID group)
    ts_ms: int
    gtids: GtidState | None  # the GTID state before this transaction
    epoch: int
    count: int = 0
    # An XA transaction's group (XA START, or MariaDB's FL_PREPARED_XA): its captured
    # rows, held until the group says whether it commits here (one phase) or later.
    xa: list[ChangeEvent] | None = None

    def position(self, index: int) -> BinlogPosition:
        return BinlogPosition(self.file, self.start, index, self.gtid, self.gtids, self.epoch)


@dataclass(slots=True)
class _Mapper:
    table: Any  # the library's Table of the TABLE_MAP this mapper was built for
    rows: BinlogRowMapper
    key: tuple[str, ...]
    kind: str  # "captured" | "own" | "skip"
    label: tuple[str, str]  # (schema, table) put on the events
    table_schema: TableSchema | None


class MySqlLogSource:
    """Reads one server's binlog for one database (see the module docstring)."""

    connector = "mysql"

    def __init__(
        self,
        dsn: MySqlDsn,
        *,
        server_id: int,
        matcher: TableMatcher,
        own: OwnTables,
        heartbeat_interval_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        idle_s: float = 0.2,
        read_only: bool = False,
    ) -> None:
        self.dsn = dsn
        self.db = dsn.database
        self.server_id = server_id
        self.matcher = matcher
        self.own = own
        self.heartbeat_interval_s = heartbeat_interval_s
        self.connect_timeout_s = connect_timeout_s
        self.idle_s = idle_s
        self.read_only = read_only
        self.mariadb = False
        self._wake: Wakeup | None = None
        self._progress_until = 0.0  # report StreamPassed at boundaries until then
        self._progress_now = False  # ... and at the next boundary even if unchanged
        self._passed_at: BinlogPosition | None = None
        self._ctl: Any = None
        self._ctl_lock = threading.Lock()
        self._reader: Any = None
        self._file = ""
        self._last_end = 4
        self._tx: _Tx | None = None
        self._skip_upto: BinlogPosition | None = None  # file resume: drop at or below
        # GTID resume: gtid -> drop its items up to this index. Kept across reconnects
        # (GTIDs are unique): a reconnect before the resumed transaction was read again
        # must still drop its logged part.
        self._skip_tx: dict[str, int] = {}
        self._gtid_mode = False  # the server writes GTIDs for every transaction
        self._gtids: GtidState | None = None  # state after the last GTID event read
        self._dump_state: GtidState | None = None  # what the current GTID dump asked for
        self._epoch = 0
        self._last_yielded: BinlogPosition | None = None
        self._last_done: BinlogPosition | None = None  # the last finished transaction
        self._last_hb: BinlogPosition | None = None
        self._last_hb_time = -math.inf  # (monotonic time: 0.0 is the machine's boot)
        self._mappers: dict[int, _Mapper] = {}
        self._json_cols: dict[tuple[str, str], frozenset[str]] = {}
        self._nullable: dict[int, bytes] = {}
        self._schemas: dict[tuple[str, str], TableSchema] = {}  # as last yielded
        # Where TABLE_MAPs carry no column names (MySQL < 8.0.14): the schema history
        # (history.py; None where the binlog has the names), and the definitions in use,
        # dropped at each DDL on their table (see tablemap.py): (definition, appended,
        # from the history).
        self._history: SchemaHistory | None = None
        self._defs: dict[tuple[str, str], tuple[SchemaTable, bool, bool]] = {}
        self._lookahead = DdlLookahead()
        self._opening_state: SourceState | None = None
        self._xa = PreparedXa()  # prepared XA transactions held to their commit (xa.py)
        self._opening_xa: SourceState | None = None
        # MySQL GTID dumps: the current one's connection wrapper (its server_uuid, and
        # whether it started at a checkpoint's coordinates), recorded once per dump.
        self._dump: _OneConnection | None = None
        self._dump_recorded = True
        # Every dump's connection wrapper: its server connection id, recorded once per
        # dump (``dumpconn``) and ended before the next dump starts.
        self._stream_conn: _OneConnection | None = None
        self._conn_recorded = True

    # -- LogSource ---------------------------------------------------------------------
    def open(self, checkpoint: Checkpoint | None) -> None:
        try:
            self._open(checkpoint)
        except BaseException:
            self.close()
            raise

    def _open(self, checkpoint: Checkpoint | None) -> None:
        fastrows.install()
        self._ctl = connect(self.dsn, timeout_s=self.connect_timeout_s)
        self.mariadb = is_mariadb(self._ctl)
        check_source(self._ctl, self.dsn)
        ensure_own_tables(self._ctl, self.dsn, self.own, read_only=self.read_only)
        self._warn_keyless()
        self._gtid_mode = self._server_has_gtids()
        if self.read_only and not self._gtid_mode:
            raise gtid_mode_error(self.dsn.redacted, self._gtid_mode_value())
        pos = checkpoint.position if checkpoint is not None else None
        if pos is not None and not isinstance(pos, BinlogPosition):
            raise SourceError(
                f"the change log's position {pos!r} is not a MySQL binlog position",
                hint="this log directory was written by another source type; use a fresh [log] path",
            )
        self._history = self._load_history(checkpoint)
        if checkpoint is not None and pos is not None:
            self._xa = PreparedXa.load(checkpoint.extra.get(XA_KEY), pos)
        previous = dumpconn.recorded(checkpoint.extra.get(DUMP_CONNECTION_KEY)) if checkpoint else None
        if previous is not None:  # a frozen ex-leader's dump would hold ours silent
            self._end_dump(previous)
        if pos is None:
            self._warn_prepared_xa()
            file, offset, _ = self._master_status()
            executed, start = self._settled_executed(file, offset)
            if self._history is not None:
                self._baseline(self._history, file, offset)
            if executed:
                # MySQL: capture starts after the executed GTID set (no scan of the
                # current binlog file for the set at an offset). Where that set holds
                # every transaction before ``offset`` (``_settled_executed``) the server
                # starts reading there; else it finds the place itself, and a transaction
                # it sends may lie before ``offset`` (written, not yet executed, when the
                # status was read): the dump is the next epoch, above the start position
                # whatever its coordinates.
                self._last_done = BinlogPosition(file, offset, BEFORE_TX, None, executed)
                self._epoch = 1
                self._start_gtid_dump(executed, start)
                return
            state = self._state_at(file, offset)
            # Where capture begins, offered at once as a Heartbeat so that the runner
            # checkpoints it: a restart before the first transaction resumes here.
            # BEFORE_TX sorts below every event of a transaction starting at ``offset``.
            self._last_done = BinlogPosition(file, offset, BEFORE_TX, None, state)
            self._start_dump(file, offset, state)
            return
        assert checkpoint is not None  # (pos is its position)
        plan = plan_resume(
            pos, self._own_flavour(pos.gtids) if self._gtid_mode else None,
            mariadb=self.mariadb, dump_record=checkpoint.extra.get(DUMP_SERVER_KEY),
        )
        if isinstance(plan, GtidResume):
            # By GTID: the server finds the transactions after the state, whatever its
            # file names. A new epoch: these coordinates may not compare with the old ones.
            self._epoch = plan.epoch
            self._skip_tx = dict(plan.skip_tx)
            if plan.delivered is not None:  # (read-only fences may wait for its state)
                self._last_done = plan.delivered
            self._require_executed(pos)
            self._start_gtid_dump(plan.state, plan.start)
            return
        self._require_file(pos)
        self._epoch = plan.epoch
        self._skip_upto = self._last_done = plan.skip_upto
        state = plan.state if plan.state is not None else self._state_at(plan.file, plan.offset)
        self._start_dump(plan.file, plan.offset, state)

    def stream(self) -> Iterator[Any]:
        last_yield = time.monotonic()
        if self._wake is None:
            self._wake = Wakeup()
        if self._opening_state is not None:  # a fresh start's schema history
            yield self._opening_state
            self._opening_state = None
        if self._opening_xa is not None:  # a fresh start's XA transactions prepared then
            yield self._opening_xa
            self._opening_xa = None
        for item in self._heartbeat(force=True):
            if not self._drop(item):
                yield item
        while True:
            if self._progress_until and self._tx is None:
                # Not subject to ``_drop``: after a resume the last transaction read may
                # be the checkpoint's own (wholly logged, so dropped as an item), and on
                # an idle server it stays the last; the stream has still delivered it.
                passed = self._stream_passed()
                if passed is not None:
                    yield passed
            conn = getattr(self._reader, "_stream_connection", None)
            if not self._wake.wait(conn, self.idle_s):
                last_yield = time.monotonic()
                yield Idle()
                continue
            event = self._fetch()
            record = self._dump_record()
            if record is not None:  # before any item of this dump (its epoch)
                yield record
            conn_record = self._conn_record()
            if conn_record is not None:
                yield conn_record
            for item in self._handle(event):
                if self._drop(item):
                    continue
                last_yield = time.monotonic()
                yield item
            if time.monotonic() - last_yield >= self.idle_s:
                last_yield = time.monotonic()
                yield Idle()

    def _dump_record(self) -> SourceState | None:
        """Once per MySQL GTID dump, when connected: which server's coordinates this
        epoch's positions are (``sources.mysql.dumpstart``)."""
        dump = self._dump
        if self._dump_recorded or dump is None or dump.server_uuid is None:
            return None
        self._dump_recorded = True
        at = dump.started_at
        if at is not None and at.gtid is not None:
            log.info("GTID resume reads the binlog from the checkpoint's coordinates %s:%d "
                     "(transaction %s)", at.file, at.offset, at.gtid)
        elif at is not None:
            log.info("GTID dump starts at the binlog's end %s:%d", at.file, at.offset)
        return SourceState(DUMP_SERVER_KEY, dumpstart.record(self._epoch, dump.server_uuid))

    def _conn_record(self) -> SourceState | None:
        """Once per dump, when connected: its server connection id (``dumpconn``)."""
        wrapper = self._stream_conn
        if self._conn_recorded or wrapper is None or wrapper.connection_id is None:
            return None
        self._conn_recorded = True
        return SourceState(DUMP_CONNECTION_KEY, dumpconn.record(wrapper.connection_id))

    @property
    def dump_started_at(self) -> DumpStart | None:
        """Where the current GTID dump started reading, if at a checkpoint's
        coordinates (else the server found the place from the GTID set alone)."""
        return self._dump.started_at if self._dump is not None else None

    def ack(self, position: Position) -> None:
        """MySQL has no server-side acknowledgement: the runner's state store keeps the
        position, and a restart resumes from it."""

    def lag_bytes(self) -> int | None:
        """Bytes of binlog written after the last event read (summed over files)."""
        if self._ctl is None or not self._file:
            return None
        try:
            with self._ctl_lock, self._ctl_cursor() as cur:
                cur.execute("SHOW BINARY LOGS")
                logs = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
        except pymysql.Error:
            return None
        here = file_sequence(self._file)
        lag = 0
        for name, size in logs:
            seq = file_sequence(name)
            if seq == here:
                lag += max(0, size - self._last_end)
            elif seq > here:
                lag += size
        return lag

    def request_progress(self) -> None:
        """A read-only chunk waits for the stream to pass its fence: report each
        transaction boundary as ``StreamPassed`` for the next second (from the runner's
        thread)."""
        self._progress_until = time.monotonic() + 1.0
        self._progress_now = True

    def wakeup(self) -> None:
        """Make a ``stream()`` waiting for the server yield ``Idle`` now (thread-safe)."""
        wake = self._wake
        if wake is not None:
            wake.set()

    def _stream_passed(self) -> StreamPassed | None:
        done = self._last_done
        if done is None or time.monotonic() > self._progress_until:
            self._progress_until = 0.0
            return None
        if done == self._passed_at and not self._progress_now:
            return None
        self._progress_now = False
        self._passed_at = done
        return StreamPassed(done)

    def close(self) -> None:
        self._wake = None  # its pipe closes once no thread holds it (wake.py)
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._ctl is not None:
            with contextlib.suppress(pymysql.Error):
                self._ctl.close()
            self._ctl = None

    # -- extras for the runner -----------------------------------------------------------
    def table_schema(self, schema: str, table: str) -> TableSchema | None:
        """The table's current columns and key (for the change log's schema records)."""
        with self._ctl_lock, self._ctl_cursor() as cur:
            return schema_mod.table_schema(cur, schema, table, self.mariadb)

    # -- connection ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _ctl_cursor(self) -> Iterator[Any]:
        """A cursor on the control connection, reconnected if the server dropped it (an
        idle connection is closed after wait_timeout); errors as pydblog errors."""
        try:
            try:
                self._ctl.ping(reconnect=False)
            except pymysql.Error:
                with contextlib.suppress(pymysql.Error):
                    self._ctl.close()
                self._ctl = connect(self.dsn, timeout_s=self.connect_timeout_s)
            with self._ctl.cursor() as cur:
                yield cur
        except pymysql.Error as exc:
            raise classify(exc, self.dsn, "a metadata query") from None

    def _master_status(self) -> tuple[str, int, str]:
        """``(file, offset, Executed_Gtid_Set)`` (MySQL's GTID set, ``""`` on MariaDB)."""
        with self._ctl_lock, self._ctl_cursor() as cur:
            try:
                cur.execute("SHOW MASTER STATUS")
            except pymysql.Error as exc:  # MySQL 8.4 renamed it
                if errno(exc) != ER_PARSE_ERROR:
                    raise
                cur.execute("SHOW BINARY LOG STATUS")
            row = cur.fetchone()
        if row is None:
            raise SourceError(
                f"MySQL at {self.dsn.redacted} has no binary log",
                hint="start the server with --log-bin",
            )
        executed = str(row[4]) if len(row) > 4 and row[4] is not None else ""
        return str(row[0]), int(row[1]), executed

    def _warn_prepared_xa(self) -> None:
        """A fresh start: XA transactions prepared now have their rows in the binlog
        before the start position, and commit later in a group without rows (``xa.py``):
        if they change captured tables, those changes are not in the change log (and a
        snapshot chunk read before their commit reads the rows as before them). ``XA
        RECOVER`` lists them (all of them on MariaDB and MySQL 5.7; MySQL 8 shows
        others' only with XA_RECOVER_ADMIN): warned about now, and again when one of
        them commits (``PreparedXa.before_start``, kept in the checkpoint)."""
        try:
            with self._ctl_lock, self._ctl_cursor() as cur:
                cur.execute("XA RECOVER")
                rows = cur.fetchall()
        except SourceError as exc:  # a bonus check: not allowed is not fatal
            log.debug("XA RECOVER failed: %s", exc)
            return
        if self._xa.recovered(list(rows), self.dsn.redacted):
            self._opening_xa = SourceState(XA_KEY, self._xa.to_json())

    def _server_has_gtids(self) -> bool:
        """MariaDB writes a GTID for every event group; MySQL only with gtid_mode=ON."""
        if self.mariadb:
            return True
        with self._ctl_lock, self._ctl_cursor() as cur:
            cur.execute("SELECT @@GLOBAL.gtid_mode")
            row = cur.fetchone()
        return row is not None and str(row[0]).upper() == "ON"

    def _gtid_mode_value(self) -> str:
        with self._ctl_lock, self._ctl_cursor() as cur:
            cur.execute("SELECT @@GLOBAL.gtid_mode")
            row = cur.fetchone()
        return str(row[0]) if row else "unknown"

    def _empty_state(self) -> GtidState:
        return MariaGtidPos() if self.mariadb else MySqlGtidSet()

    def _own_flavour(self, state: GtidState | None) -> GtidState | None:
        """A checkpoint's state in this server's flavour (an empty one reads back as
        MariaDB's); a state of the other flavour is an error."""
        if state is None:
            return None
        if not state:
            return self._empty_state()
        if state.flavour != self._empty_state().flavour:
            raise SourceError(
                f"the change log's GTID state {state} is a {state.flavour} state, but "
                f"{self.dsn.redacted} is {self._empty_state().flavour}",
                hint="point [source] dsn at the server this log was captured from (or a "
                "replica of it), or start with a fresh [log] path and snapshot the tables",
            )
        return state

    def _state_at(self, file: str, offset: int) -> GtidState | None:
        """The GTID state at ``(file, offset)``, an event-group boundary (None where
        GTIDs are off or it cannot be known). MariaDB computes it from its binlog
        (``BINLOG_GTID_POS``). MySQL has no such function: the file's ``Previous_gtids``
        plus the GTIDs of the groups before ``offset`` (``mysql_state_at``). (Not
        ``SHOW MASTER STATUS``'s ``Executed_Gtid_Set``: MySQL reads it a moment before
        the file and offset, and a transaction committing in between would be missing
        from the state for good.)"""
        if not self._gtid_mode:
            return None
        with self._ctl_lock, self._ctl_cursor() as cur:
            if not self.mariadb:
                return mysql_state_at(cur, file, offset)
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, offset))
            row = cur.fetchone()
        if row is None or row[0] is None:
            return None
        return MariaGtidPos.parse(str(row[0]))

    def _settled_executed(
        self, file: str, offset: int
    ) -> tuple[MySqlGtidSet | None, DumpStart | None]:
        """MySQL fresh start: ``(gtid_executed, where its dump may start)``, the set read
        (again, for up to ``SETTLE_S``) until it holds every GTID owned after the
        binlog's end ``(file, offset)`` was read. A transaction written before that end
        was then owned or executed, and stays in the set once executed, so the set
        holds every transaction before ``offset``: a dump from ``offset`` asking for
        the transactions not in it sends exactly what the server would find itself
        (``sources.mysql.dumpstart``). Not settled in time: no start (the server
        finds the place). ``(None, None)`` on MariaDB, with GTIDs off, or while the set
        is empty (a dump cannot ask for "everything")."""
        if self.mariadb or not self._gtid_mode:
            return None, None
        deadline = time.monotonic() + SETTLE_S
        with self._ctl_lock, self._ctl_cursor() as cur:
            cur.execute("SELECT @@GLOBAL.server_uuid, @@GLOBAL.gtid_owned")
            uuid, owned_text = cur.fetchone()
            owned = parse_owned(str(owned_text or ""))
            while True:
                cur.execute("SELECT @@GLOBAL.gtid_executed")
                executed = MySqlGtidSet.parse(str(cur.fetchone()[0] or ""))
                if owned <= executed or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
        if not executed:
            return None, None
        if not owned <= executed:
            return executed, None
        return executed, DumpStart(file, offset, None, str(uuid).lower())

    def _require_executed(self, pos: BinlogPosition) -> None:
        """The server must hold every transaction the change log holds, up to and
        including the checkpoint's own (which is read again). MySQL would otherwise send
        "every transaction not in the state" and skip whatever the server applies later
        that the state names (a replica behind, or one promoted without them); and the
        resumed transaction must come, or Heartbeats stay held back (``_heartbeat``)."""
        after = pos.after_state()
        if after is None:
            return
        with self._ctl_lock, self._ctl_cursor() as cur:
            if isinstance(after, MySqlGtidSet):
                cur.execute("SELECT @@GLOBAL.gtid_executed")
                row = cur.fetchone()
                ok = after <= MySqlGtidSet.parse(str(row[0] or "") if row else "")
            else:
                cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
                row = cur.fetchone()
                have = MariaGtidPos.parse(str(row[0] or "") if row else "")
                ok = pos.gtid is None or have.covers(pos.gtid)
        if not ok:
            raise self._gtid_dump_error(
                after, "it has not executed every transaction the change log holds"
            )

    def _require_file(self, pos: BinlogPosition) -> None:
        with self._ctl_lock, self._ctl_cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            names = {str(r[0]) for r in cur.fetchall()}
        if pos.file not in names:
            gtid = f" (GTID {pos.gtid})" if pos.gtid else ""
            raise SourceError(
                f"binlog file {pos.file} holding the last logged position {pos}{gtid} is no "
                f"longer on the server at {self.dsn.redacted}: changes after it are lost",
                hint="keep binlogs longer (binlog_expire_logs_seconds / expire_logs_days); "
                "start with a fresh [log] path and snapshot the tables again",
            )

    def _dump_settings(self) -> dict[str, Any]:
        settings = self.dsn.settings(timeout_s=self.connect_timeout_s, database=False)
        # A silent connection must not hang us: heartbeats come every idle_s.
        settings["read_timeout"] = max(30, int(self.idle_s * 20))
        return settings

    def _start_dump(self, file: str, offset: int, state: GtidState | None) -> None:
        """Dump from binlog coordinates; ``state`` is the GTID state there (if known)."""
        self._dump = None
        self._dump_recorded = True
        self._stream_conn = _OneConnection()
        self._conn_recorded = False
        self._reader = BinLogStreamReader(
            connection_settings=self._dump_settings(),
            server_id=self.server_id,
            blocking=True,
            resume_stream=True,
            log_file=file,
            log_pos=offset,
            slave_heartbeat=self.idle_s,
            filter_non_implemented_events=False,
            pymysql_wrapper=self._stream_conn,
            enable_logging=False,
        )
        self._file = file
        self._last_end = offset
        self._tx = None
        self._gtids = state
        self._dump_state = None
        self._mappers.clear()
        self._defs.clear()
        self._lookahead.reset()

    def _start_gtid_dump(self, state: GtidState, start: DumpStart | None = None) -> None:
        """Dump every transaction after ``state`` (MariaDB ``@slave_connect_state``,
        MySQL COM_BINLOG_DUMP_GTID). The server starts with a Rotate to the file where
        that is; coordinates are read from the events as usual. MySQL: at ``start``'s
        coordinates where they hold (``sources.mysql.dumpstart``)."""
        self._dump = self._stream_conn = _OneConnection(mysql=not self.mariadb, start=start)
        self._dump_recorded = False
        self._conn_recorded = False
        self._reader = BinLogStreamReader(
            connection_settings=self._dump_settings(),
            server_id=self.server_id,
            blocking=True,
            auto_position=str(state),
            is_mariadb=self.mariadb,
            slave_heartbeat=self.idle_s,
            filter_non_implemented_events=False,
            pymysql_wrapper=self._dump,
            enable_logging=False,
        )
        self._file = ""
        self._last_end = 4
        self._tx = None
        self._gtids = state
        self._dump_state = state
        self._mappers.clear()
        self._defs.clear()
        self._lookahead.reset()

    def _fetch(self) -> Any:
        deadline = time.monotonic() + MAX_RECONNECT_S
        while True:
            try:
                event = self._reader.fetchone()
                if event is not None:
                    return event
                problem: BaseException = SourceUnavailable("the server ended the binlog dump")
            except _Reconnect as exc:
                problem = exc
            except pymysql.Error as exc:
                if errno(exc) not in UNAVAILABLE and errno(exc) is not None:
                    raise self._dump_error(exc) from None
                problem = exc
            if time.monotonic() > deadline:
                raise SourceUnavailable(
                    f"lost the binlog stream from MySQL at {self.dsn.redacted}: {problem}"
                )
            log.warning("binlog stream interrupted (%s); resuming", problem)
            time.sleep(0.5)
            self._restart()

    def _dump_error(self, exc: pymysql.Error) -> SourceError:
        if errno(exc) == ER_MASTER_FATAL_READING_BINLOG and self._dump_state is not None:
            return self._gtid_dump_error(self._dump_state, detail(exc))
        if errno(exc) == ER_MASTER_FATAL_READING_BINLOG:
            return SourceError(
                f"MySQL at {self.dsn.redacted} cannot send the binlog from "
                f"{self._file}:{self._last_end}: {exc.args[1] if len(exc.args) > 1 else exc}",
                hint="the binlog may have been purged; start with a fresh [log] path and "
                "snapshot the tables again",
            )
        return classify(exc, self.dsn, "reading the binlog")

    def _gtid_dump_error(self, state: GtidState, message: str) -> SourceError:
        """The server refused to send the transactions after ``state``: say why, as far
        as its GTID variables tell (behind us, or purged), and what to do."""
        why = ""
        try:
            why = self._diagnose_state(state)
        except (SourceError, pymysql.Error) as exc:  # the diagnosis is a bonus
            log.debug("could not diagnose the GTID state: %s", exc)
        return SourceError(
            f"MySQL at {self.dsn.redacted} cannot send the binlog after GTID state {state}"
            f"{why}: {message}",
            hint="if this server is a replica that has not applied these transactions yet, "
            "wait until it has caught up and start again; if the binlogs holding them were "
            "purged (or this server never had them), changes after them are lost: start "
            "with a fresh [log] path and snapshot the tables again",
        )

    def _diagnose_state(self, state: GtidState) -> str:
        with self._ctl_lock, self._ctl_cursor() as cur:
            if isinstance(state, MariaGtidPos):
                cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
                have = MariaGtidPos.parse(str(cur.fetchone()[0] or ""))
                cur.execute("SHOW BINARY LOGS")
                first = str(cur.fetchone()[0])
                cur.execute("SELECT BINLOG_GTID_POS(%s, 4)", (first,))
                oldest = MariaGtidPos.parse(str(cur.fetchone()[0] or ""))
                for d, _, n in state.domains:
                    theirs = have.seq(d)
                    if theirs is None or theirs < n:
                        return f" (the server is behind it: its binlog ends at {have})"
                    start = oldest.seq(d)
                    if start is not None and start > n:
                        return f" (purged: the server's oldest binlog {first} starts at {oldest})"
                return ""
            cur.execute("SELECT @@GLOBAL.gtid_executed, @@GLOBAL.gtid_purged")
            executed, purged = (MySqlGtidSet.parse(str(v or "")) for v in cur.fetchone())
            if not state <= executed:
                return f" (the server is behind it: it has executed {executed})"
            if not purged <= state:
                return f" (purged: the server has purged {purged})"
            return ""

    def _restart(self) -> None:
        """Reopen the dump at the start of the open transaction (or after the last one):
        by GTID where the state there is known (a new epoch), else by coordinates."""
        if self._reader is not None:
            with contextlib.suppress(pymysql.Error):
                self._reader.close()
        lost = self._stream_conn.connection_id if self._stream_conn is not None else None
        if lost is not None:  # its server thread may still be blocked in a write
            self._end_dump(lost)
        resume = self._gtid_resume_point()
        pending = self._skip_upto  # a file resume's skip not passed yet
        if resume is not None:
            state, skip = resume
            start = self._reconnect_start()
            self._epoch += 1
            for s in (skip, (pending.gtid, pending.index) if pending and pending.gtid else None):
                if s is not None:
                    self._skip_tx[s[0]] = max(self._skip_tx.get(s[0], -1), s[1])
            self._skip_upto = None
            try:
                self._start_gtid_dump(state, start)
            except pymysql.Error as exc:
                log.warning("reconnect failed: %s", exc)
            return
        if self._tx is not None:
            file, offset = self._tx.file, self._tx.start
        else:
            file, offset = self._file, self._last_end
        self._skip_upto = max(
            (p for p in (pending, self._last_yielded) if p is not None), default=None
        )
        known = self._tx.gtids if self._tx is not None else self._gtids
        try:
            self._start_dump(file, offset, known)
        except pymysql.Error as exc:
            log.warning("reconnect failed: %s", exc)

    def _end_dump(self, connection_id: int) -> None:
        """End the dump on server connection ``connection_id`` (``dumpconn``), best effort."""
        try:
            with self._ctl_lock, self._ctl_cursor() as cur:
                dumpconn.end_dump(cur, connection_id)
        except SourceError as exc:
            log.warning("could not end the previous binlog dump (connection %d): %s",
                        connection_id, exc)

    def _reconnect_start(self) -> DumpStart | None:
        """MySQL: where a reconnect's GTID dump may start reading (``dumpstart``): the
        open transaction's start, else the last finished one's (its GTID is in the
        resume state, so the server skips it), in the lost dump's binlog."""
        dump = self._dump
        if self.mariadb or dump is None or dump.server_uuid is None:
            return None
        at = self._tx.position(0) if self._tx is not None else self._last_done
        if at is None or not at.gtid or at.epoch != self._epoch:
            return None
        return DumpStart(at.file, at.pos, at.gtid, dump.server_uuid)

    def _gtid_resume_point(self) -> tuple[GtidState, tuple[str, int] | None] | None:
        """``(state, skip)`` to resume the current stream by GTID, or None."""
        if not self._gtid_mode:
            return None
        tx = self._tx
        if tx is None:
            state, skip = self._gtids, None
        elif tx.gtids is not None and tx.gtid:
            last = self._last_yielded
            done = last.index if last is not None and last.gtid == tx.gtid else -1
            state, skip = tx.gtids, (tx.gtid, done)
        else:
            return None
        if not state:  # unknown, or empty (MySQL cannot ask for "everything")
            return None
        return state, skip

    # -- events --------------------------------------------------------------------------
    def _drop(self, item: Any) -> bool:
        pos = getattr(item, "position", None)
        if pos is None:
            return False
        if self._skip_upto is not None:
            if pos <= self._skip_upto:
                return True
            self._skip_upto = None
        if isinstance(pos, BinlogPosition):
            # GTIDs are unique: only the resumed transaction's logged part matches.
            limit = self._skip_tx.get(pos.gtid) if pos.gtid else None
            if limit is not None and pos.index <= limit:
                return True
            self._last_yielded = pos
        return False

    def _handle(self, event: Any) -> Iterator[Any]:
        end = int(getattr(event.packet, "log_pos", 0) or 0) if hasattr(event, "packet") else 0
        start = self._last_end  # where this event begins: a transaction's resume point
        if end > 0 and not isinstance(event, HeartbeatLogEvent | RotateEvent):
            self._last_end = end  # before yielding: the consumer may stop at any item
        if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
            tx = self._tx
            if tx is not None and tx.xa is not None:
                held = tx.xa
                for item in self._rows(event, start):
                    if type(item) is ChangeEvent:
                        held.append(item)  # until the group's end says when it commits
                    else:
                        yield item
                return
            yield from self._rows(event, start)
        elif isinstance(event, MariadbGtidEvent):
            standalone = bool(event.flags & 1)
            self._tx = self._gtid_tx(event, end, start, not standalone)
            if event.flags & FL_PREPARED_XA:
                self._tx.xa = []  # MariaDB 10.5+ writes no XA START query
        elif isinstance(event, GtidEvent):
            self._tx = self._gtid_tx(event, end, start, False)
        elif isinstance(event, MariadbGtidListEvent):
            # At a binlog file's start (and where a GTID dump starts): the state there.
            if self._gtids is None and self._gtid_mode and self._tx is None:
                self._gtids = MariaGtidPos.parse(",".join(g.gtid for g in event.gtid_list))
        elif isinstance(event, XidEvent):
            yield from self._end_tx(event.timestamp * 1000)
        elif isinstance(event, XAPrepareEvent):
            yield from self._xa_prepare(event)
        elif isinstance(event, QueryEvent):
            yield from self._query(event, start)
        elif isinstance(event, RotateEvent):
            self._file = event.next_binlog
            self._last_end = event.position
            self._mappers.clear()
            return
        elif isinstance(event, TableMapEvent):
            self._nullable[event.table_id] = bytes(event.null_bitmask)
            table = event.table_map.get(event.table_id)
            unnamed = table is not None and any(not c.name for c in table.columns)
            if unnamed and self._name_table(table, start):
                yield self._history_state(None)
        elif isinstance(event, HeartbeatLogEvent):
            if self._tx is None:
                self._read_to_end()
                yield from self._heartbeat(force=True)
            yield Idle()

    def _gtid_tx(self, event: Any, end: int, start: int, explicit: bool) -> _Tx:
        """A transaction opened by its GTID event; the GTID state moves past it."""
        size = int(getattr(event.packet, "event_size", 0) or 0)
        if end > 0 and size > 0:
            start = end - size  # exact even where the server skipped events before it
        before = self._gtids
        gtid = str(event.gtid)
        if before is not None and self._gtid_mode:
            self._gtids = before.advance(gtid)
        return _Tx(self._file, start, gtid, explicit, event.timestamp * 1000, before, self._epoch)

    def _begin_if_needed(self, start: int, ts_ms: int) -> _Tx:
        if self._tx is None:
            self._tx = _Tx(self._file, start, None, False, ts_ms, self._gtids, self._epoch)
        return self._tx

    def _query(self, event: Any, start: int) -> Iterator[Any]:
        query = str(event.query).strip()
        head = query[:10].upper()
        ts_ms = event.timestamp * 1000
        if head.startswith("BEGIN"):
            self._begin_if_needed(start, ts_ms).explicit = True
            return
        if head.startswith("XA START") or head.startswith("XA BEGIN"):
            tx = self._begin_if_needed(start, ts_ms)
            tx.explicit = True
            tx.xa = []
            return
        if head.startswith("XA END"):
            # Not the end of the group: an XA_PREPARE event (or, on MariaDB before 10.5,
            # an "XA COMMIT ... ONE PHASE" query) follows and says what it is.
            return
        if head.startswith("XA COMMIT") or head.startswith("XA ROLLBAC"):
            yield from self._xa_end(query, start, ts_ms)
            return
        if head.startswith("COMMIT") or head.startswith("ROLLBACK"):
            yield from self._end_tx(ts_ms)
            return
        tx = self._begin_if_needed(start, ts_ms)
        default_db = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema)
        if self._history is not None:
            yield from self._history_ddl(tx, query, default_db)
        ddl = parse_ddl(query, default_db)
        if ddl is not None:
            # A TEMPORARY table's name may shadow a captured table's: never it.
            kind = DdlKind.DROP if ddl.or_replace and not ddl.temporary else ddl.kind
            yield from self._ddl(tx, kind, () if ddl.temporary else ddl.tables, ts_ms,
                                 recreated=ddl.or_replace)
        if not tx.explicit:
            yield from self._end_tx(ts_ms)

    def _xa_prepare(self, event: Any) -> Iterator[Any]:
        """The end of an XA transaction's first group (``xa.py``). ``one_phase`` (MySQL's
        ``XA COMMIT ... ONE PHASE``): committed here, like any transaction. Otherwise an
        ``XA PREPARE``: its rows are in the binlog now but become visible (or vanish)
        only at a later, separate ``XA COMMIT`` / ``XA ROLLBACK`` group, so they are held
        (``PreparedXa``) and logged there, at that group's position, as one transaction.
        The checkpoint carries them from here on (``SourceState`` at this group): a
        restart or kill -9 before their commit finds them in it, one before this group
        reads the group again."""
        ts_ms = event.timestamp * 1000
        tx = self._tx
        if event.one_phase or tx is None:
            yield from self._end_tx(ts_ms)
            return
        held, tx.xa = tx.xa or [], None
        tx.count = 0  # none of them is at this group's position
        if held:
            xid: Xid = (int(event.xid_format_id), bytes(event.xid_gtrid), bytes(event.xid_bqual))
            self._xa.hold(xid, str(tx.position(0)), held)
            yield SourceState(XA_KEY, self._xa.to_json(), tx.position(0))
        yield from self._end_tx(ts_ms)

    def _xa_end(self, query: str, start: int, ts_ms: int) -> Iterator[Any]:
        """An ``XA COMMIT`` / ``XA ROLLBACK`` query. Two-phase, it is a group of its own
        (``xa.py``): a COMMIT logs the rows its PREPARE held, at this group's positions
        (index 0..n-1, its ``Commit`` at n: the commit is where they become visible, so
        snapshot windows and read fences judge them there); a ROLLBACK forgets them.
        Either way the checkpoint's held transactions change at this group (a restart
        before its ``Commit`` is durable reads it again, with the rows still held).
        ``XA COMMIT ... ONE PHASE`` (MariaDB before 10.5) ends its own group."""
        parsed = parse_statement(query)
        tx = self._tx
        if parsed is None or (tx is not None and tx.xa is not None):
            yield from self._end_tx(ts_ms)  # one phase: the group's own rows commit here
            return
        verb, xid, _ = parsed
        tx = self._begin_if_needed(start, ts_ms)
        rows, changed = self._xa.resolve(verb, xid, str(tx.position(0)))
        for ev in rows:
            yield ev._replace(position=tx.position(tx.count), ts_ms=ts_ms)
            tx.count += 1
        if changed:
            yield SourceState(XA_KEY, self._xa.to_json(), tx.position(tx.count))
        yield from self._end_tx(ts_ms)

    def _ddl(
        self, tx: _Tx, kind: DdlKind, tables: tuple[tuple[str, str], ...], ts_ms: int,
        recreated: bool = False,
    ) -> Iterator[Any]:
        """``recreated``: a DROP that is MariaDB's CREATE OR REPLACE TABLE (the table is
        dropped and a new one made under its name: truncated, then snapshotted, as a table
        re-created while dblog runs; ``CREATE OR REPLACE ... SELECT`` rows follow as row
        events and the snapshot re-reads them, harmlessly)."""
        for db, table in tables:
            self._json_cols.pop((db, table), None)
            self._defs.pop((db, table), None)
            if not self._captured(db, table):
                continue
            if kind == DdlKind.TRUNCATE:
                yield ChangeEvent(Op.TRUNCATE, db, table, tx.position(tx.count), ts_ms)
                tx.count += 1
            elif kind == DdlKind.DROP:
                reset = ResetKind.RECREATED if recreated else ResetKind.GONE
                yield self._reset(tx, db, table, reset, ts_ms)
        if kind == DdlKind.RENAME or (kind == DdlKind.ALTER and len(tables) == 2):
            # (old, new) pairs: the old name's rows leave it; the new name's relation
            # had its rows logged under the old name (or not at all): truncated and
            # snapshotted there (``ports.RelationReset``).
            for (db, old), (new_db, new) in zip(tables[0::2], tables[1::2], strict=False):
                if self._captured(db, old):
                    yield self._reset(tx, db, old, ResetKind.GONE, ts_ms)
                if self._captured(new_db, new):
                    log.warning("table %s.%s: renamed from %s.%s; logging a truncate and "
                                "snapshotting it", new_db, new, db, old)
                    yield self._reset(tx, new_db, new, ResetKind.RECREATED, ts_ms)
        # The next TABLE_MAP of a changed table carries its new columns; SchemaChanged
        # is yielded then, before its first row event.
        self._mappers.clear()

    def _reset(self, tx: _Tx, db: str, table: str, kind: ResetKind, ts_ms: int) -> RelationReset:
        """A truncate of ``table`` at the DDL's place in the binlog (after every row
        event of the old relation, before every one of the new), as a reset."""
        event = ChangeEvent(Op.TRUNCATE, db, table, tx.position(tx.count), ts_ms)
        tx.count += 1
        return RelationReset(event, kind)

    def _end_tx(self, ts_ms: int) -> Iterator[Any]:
        held = self._tx.xa if self._tx is not None else None
        if held:  # an XA transaction committed in its own group (one phase)
            yield from held
        tx, self._tx = self._tx, None
        if tx is None:
            return
        done = tx.position(tx.count)
        self._last_done = done
        if tx.count:
            yield Commit(done, ts_ms)
            self._passed_at = done  # the runner takes a Commit as progress too
            self._last_hb = done
            self._last_hb_time = time.monotonic()
        else:
            yield from self._heartbeat(force=False)

    def _resume_pending(self) -> bool:
        """Whether a GTID resume's transaction (whose logged part is dropped) has not been
        read yet. Until it has, no Heartbeat: the server may send transactions it does not
        know we have before it (a replica's own, at the start of its binlog), and a
        checkpoint at one of those (state before it: without the resumed transaction)
        would make the next resume send the resumed transaction again, logged part and
        all."""
        if not self._skip_tx:
            return False
        state = self._gtids
        return state is None or not all(state.covers(g) for g in self._skip_tx)

    def _read_to_end(self) -> None:
        """With GTIDs off, an idle dump's place moves to the end of what it has read
        (``BEFORE_TX`` at that offset: below every event of a transaction starting
        there, so a file resume from it drops nothing unread). A checkpoint there says
        every transaction before that offset is logged, which is how a reader without
        GTIDs (``dblog verify``) tells that the capture has passed the binlog's end it
        saw. With GTIDs the last transaction's position already says so (its state)."""
        done = self._last_done
        if self._gtid_mode or done is None or self._last_end <= 0:
            return
        at = BinlogPosition(self._file, self._last_end, BEFORE_TX, None, done.gtids, self._epoch)
        if at > done:
            self._last_done = at

    def _heartbeat(self, *, force: bool) -> Iterator[Any]:
        done = self._last_done
        if done is None or (self._last_hb is not None and done <= self._last_hb):
            return
        if self._resume_pending():
            return
        now = time.monotonic()
        if force or now - self._last_hb_time >= self.heartbeat_interval_s:
            self._last_hb = done
            self._last_hb_time = now
            yield Heartbeat(done)

    # -- rows ----------------------------------------------------------------------------
    def _name_table(self, table: Any, start: int) -> bool:
        """Name a TABLE_MAP's columns (no binlog_row_metadata) from the schema history,
        else from information_schema where that is the rows' own definition (see
        tablemap.py); SourceError when neither is. True if the history changed."""
        key = (str(table.schema), str(table.table))
        if not self._tracked(*key):
            return False  # never decoded
        where = f"{self._file}:{start}"
        changed = False
        cached = self._defs.get(key)
        if cached is None:
            cached, changed = self._definition(key, start, where)
            self._defs[key] = cached
        defn, appended, from_history = cached
        why = type_mismatch(table.columns, defn, appended)
        if why is not None:
            self._defs.pop(key, None)
            if from_history:
                raise history_mismatch(key, where, self.dsn.redacted, why)
            raise self._stale_table(key, where, why)
        name_columns(table.columns, defn)
        pk = defn.primary_key
        table.primary_key = pk[0] if len(pk) == 1 else (tuple(pk) if pk else "")
        return changed

    def _definition(
        self, key: tuple[str, str], start: int, where: str
    ) -> tuple[tuple[SchemaTable, bool, bool], bool]:
        """``((definition, appended, from the history), history changed)``."""
        history = self._history
        entry = history.tables.get(key) if history is not None else None
        if entry is not None:
            if history is None or not self._near_end(start):
                return (entry, False, True), False
            # Nearly caught up: information_schema is checked against the history where
            # no DDL on the table lies ahead (then it describes these rows exactly).
            with self._ctl_lock, self._ctl_cursor() as cur:
                if self._lookahead.ahead(cur, (self._file, start), *key):
                    return (entry, False, True), False
                found = read_table(cur, *key)
            if found is None or signature(found) == signature(entry):
                return (entry, False, True), False
            log.warning(
                "the schema history's columns of %s.%s differ from information_schema's, "
                "with no DDL on it ahead in the binlog (a DDL was read wrongly); using "
                "information_schema's from %s on: history %s, information_schema %s",
                *key, where, signature(entry), signature(found),
            )
            history.put(key, found)
            return (found, False, False), True
        with self._ctl_lock, self._ctl_cursor() as cur:
            found = read_table(cur, *key)
            ahead = self._lookahead.ahead(cur, (self._file, start), *key)
        risky = [d for d in ahead if may_rename(*d)]
        if found is None or risky:
            now = "no longer exists" if found is None else "now has another definition"
            later = f" (later in the binlog: {describe(risky)})" if risky else ""
            lost = history.lost.get(key) if history is not None else None
            since = f"; the schema history lost its columns at: {lost}" if lost else ""
            raise self._stale_table(key, where, f"the table {now}{later}{since}")
        # Harmless ALTERs ahead (ADD COLUMN, ADD INDEX, ...): columns may have been
        # appended since these rows.
        appended = any(kind == DdlKind.ALTER for kind, _ in ahead)
        if history is not None and not ahead:
            history.put(key, found)  # exact: these rows' own definition
            return (found, appended, False), True
        return (found, appended, False), False

    def _near_end(self, start: int) -> bool:
        """Whether less than ``VERIFY_WITHIN_BYTES`` of binlog follow ``start`` in the
        current file (then scanning them for DDL is cheap)."""
        if not self._file:
            return False
        with self._ctl_lock, self._ctl_cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            logs = [(str(r[0]), int(r[1])) for r in cur.fetchall()]
        here = file_sequence(self._file)
        rest = sum(
            size - start if file_sequence(name) == here else size
            for name, size in logs
            if file_sequence(name) >= here
        )
        return rest < VERIFY_WITHIN_BYTES

    # -- schema history (servers without binlog_row_metadata) -----------------------------
    def _tracked(self, db: str, table: str) -> bool:
        """Tables whose rows this source decodes: the captured ones and its own."""
        return self._captured(db, table) or (db, table) in (self.own.signal, self.own.watermark)

    def _load_history(self, checkpoint: Checkpoint | None) -> SchemaHistory | None:
        """The schema history the checkpoint carries (None where the binlog has column
        names); an empty one for a change log written without it (tables are then read
        from information_schema when met, as tablemap.py allows)."""
        with self._ctl_lock, self._ctl_cursor() as cur:
            cur.execute("SHOW GLOBAL VARIABLES LIKE 'binlog_row_metadata'")
            if self.mariadb or cur.fetchone() is not None:
                return None
            cur.execute("SELECT @@version")
            version = _version_number(str(cur.fetchone()[0]))
        raw = checkpoint.extra.get(HISTORY_KEY) if checkpoint is not None else None
        return SchemaHistory.load(raw, version, self._tracked)

    def _baseline(self, history: SchemaHistory, file: str, offset: int) -> None:
        """A fresh start: every tracked table's definition at ``(file, offset)``, read
        from information_schema. A table with DDL in the binlog after ``offset`` (run
        while this was read) is left out: it is read when met, under tablemap.py's rules."""
        with self._ctl_lock, self._ctl_cursor() as cur:
            names = [(self.db, t) for t in schema_mod.list_tables(cur, self.db)]
            names += [self.own.signal, self.own.watermark]
            read_baseline(
                cur, history, [k for k in dict.fromkeys(names) if self._tracked(*k)],
                {self.db, self.own.signal[0], self.own.watermark[0]},
                lambda key: bool(self._lookahead.ahead(cur, (file, offset), *key)),
            )
        self._lookahead.reset()
        self._opening_state = self._history_state(None)

    def _history_state(self, position: BinlogPosition | None) -> SourceState:
        assert self._history is not None
        return SourceState(HISTORY_KEY, self._history.to_json(), position)

    def _logged(self, pos: BinlogPosition) -> bool:
        """Whether ``pos`` is at or below what a resume already logged (``_drop``'s
        rule, without moving on): a DDL there is in the checkpoint's history already."""
        if self._skip_upto is not None and pos <= self._skip_upto:
            return True
        limit = self._skip_tx.get(pos.gtid) if pos.gtid else None
        return limit is not None and pos.index <= limit

    def _history_ddl(self, tx: _Tx, query: str, default_db: str) -> Iterator[Any]:
        """Move the schema history past a QUERY event; a DDL on a tracked table gives a
        ``SourceState`` at its own position (also when nothing changed: the checkpoint
        must pass it, or a definition read later from information_schema, which already
        has it, would get it applied again after a restart)."""
        history = self._history
        assert history is not None
        pos = tx.position(tx.count)
        if self._logged(pos):
            return
        applied = history.follow(query, default_db, self._tracked, pos)
        for key in applied.touched:
            self._defs.pop(key, None)
        if applied.touched:
            yield self._history_state(pos)

    def _stale_table(self, key: tuple[str, str], where: str, why: str) -> SourceError:
        return SourceError(
            f"cannot decode the rows of {key[0]}.{key[1]} at {where} in the binlog of MySQL "
            f"at {self.dsn.redacted}: this server does not write column names into the "
            f"binlog (no binlog_row_metadata before MySQL 8.0.14), and information_schema no "
            f"longer describes these rows: {why}",
            hint="the table's columns were renamed, moved, dropped or changed while capture "
            "was behind; on MySQL 5.7 change columns only while capture is caught up "
            "(docs/mysql.md, 'MySQL 5.7'), or use MySQL 8.0.14+ with "
            "binlog_row_metadata=FULL. To go on: start with a fresh [log] path and snapshot "
            "the tables again",
        )

    def _captured(self, db: str, table: str) -> bool:
        qualified = f"{db}.{table}"
        return db == self.db and qualified not in self.own.qualified and self.matcher(qualified)

    def _mapper(self, event: Any) -> _Mapper:
        table = event.table_map[event.table_id]
        cached = self._mappers.get(event.table_id)
        if cached is not None and cached.table is table:
            return cached
        db, name = event.schema, event.table
        label = (db, name)
        if db != self.db:
            kind = "skip"
        elif (db, name) == self.own.signal:
            kind, label = "own", self.own.signal_label
        elif (db, name) == self.own.watermark:
            kind, label = "own", self.own.watermark_label
        else:
            kind = "captured" if self.matcher(f"{db}.{name}") else "skip"
        json_cols: frozenset[str] = frozenset()
        if kind != "skip" and self.mariadb:
            json_cols = self._json_columns(db, name)
        pk = table.primary_key
        key = (pk,) if isinstance(pk, str) and pk else tuple(pk or ())
        if not key:  # the row identity without a primary key: every column (TableInfo)
            key = tuple(c.name for c in table.columns if c.name is not None)
        ts = None
        if kind == "captured":
            ts = self._binlog_schema(event.table_id, db, name, table.columns, json_cols, key)
        mapper = _Mapper(
            table, BinlogRowMapper.build(table.columns, json_cols), key, kind, label, ts
        )
        self._mappers[event.table_id] = mapper
        return mapper

    def _binlog_schema(
        self,
        table_id: int,
        db: str,
        name: str,
        columns: list[Any],
        json_cols: frozenset[str],
        key: tuple[str, ...],
    ) -> TableSchema:
        nulls = self._nullable.get(table_id, b"")
        cols = []
        for i, col in enumerate(columns):
            sql_type, logical = binlog_column_type(col, col.name in json_cols)
            nullable = bool(nulls[i // 8] & (1 << (i % 8))) if i // 8 < len(nulls) else True
            cols.append(ColumnSchema(col.name, sql_type, logical, nullable))
        return TableSchema(db, name, tuple(cols), key)

    def _json_columns(self, db: str, table: str) -> frozenset[str]:
        found = self._json_cols.get((db, table))
        if found is None:
            with self._ctl_lock, self._ctl_cursor() as cur:
                found = schema_mod.json_columns(cur, db, table, self.mariadb)
            self._json_cols[(db, table)] = found
        return found

    def _rows(self, event: Any, start: int) -> Iterator[Any]:
        if event.table_id not in event.table_map:
            return
        mapper = self._mapper(event)
        if mapper.kind == "skip":
            return
        ts = mapper.table_schema
        if ts is not None and self._schemas.get(mapper.label) != ts:
            self._schemas[mapper.label] = ts
            yield SchemaChanged(ts)
        tx = self._begin_if_needed(start, event.timestamp * 1000)
        ts_ms = event.timestamp * 1000
        (db, name), key = mapper.label, mapper.key
        rows = mapper.rows
        if isinstance(event, WriteRowsEvent):
            for r in event.rows:
                after = rows.map(r["values"], r["none_sources"])
                yield ChangeEvent(
                    Op.CREATE,
                    db,
                    name,
                    tx.position(tx.count),
                    ts_ms,
                    {k: after[k] for k in key} if key else None,
                    None,
                    after,
                )
                tx.count += 1
        elif isinstance(event, DeleteRowsEvent):
            for r in event.rows:
                before = rows.map(r["values"], r["none_sources"])
                yield ChangeEvent(
                    Op.DELETE,
                    db,
                    name,
                    tx.position(tx.count),
                    ts_ms,
                    {k: before[k] for k in key} if key else None,
                    before,
                    None,
                )
                tx.count += 1
        else:
            for r in event.rows:
                before = rows.map(r["before_values"], r["before_none_sources"])
                after = rows.map(r["after_values"], r["after_none_sources"])
                new_key = {k: after[k] for k in key} if key else None
                old_key = {k: before[k] for k in key} if key else None
                if old_key != new_key:
                    # A key change is a delete of the old key and a create of the new one.
                    yield ChangeEvent(
                        Op.DELETE, db, name, tx.position(tx.count), ts_ms, old_key, before, None
                    )
                    tx.count += 1
                    yield ChangeEvent(
                        Op.CREATE, db, name, tx.position(tx.count), ts_ms, new_key, None, after
                    )
                else:
                    yield ChangeEvent(
                        Op.UPDATE, db, name, tx.position(tx.count), ts_ms, new_key, before, after
                    )
                tx.count += 1

    def _warn_keyless(self) -> None:
        with self._ctl_lock, self._ctl_cursor() as cur:
            names = [
                t for t in schema_mod.list_tables(cur, self.db) if self.matcher(f"{self.db}.{t}")
            ]
        for t in tables_without_key(self._ctl, self.db, names):
            log.warning(
                "table %s.%s has no primary key: its events are keyed by the whole row "
                "(rows that are equal in every column cannot be told apart) and a snapshot "
                "needs a surrogate key; add a primary key to capture it fully",
                self.db,
                t,
            )
