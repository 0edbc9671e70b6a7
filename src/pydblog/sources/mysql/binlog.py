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
- ``stream()`` never blocks for long: ``Idle`` is yielded whenever the connection has
  nothing to read right now (the runner flushes its batch then, instead of waiting for it
  to age), the server sends a heartbeat every ``idle_s`` when it has nothing to send
  (``Idle`` again), and ``Idle`` is also yielded when only uncaptured events went by for
  ``idle_s``.
- Transactions without captured rows produce no ``Commit``; their position is offered as a
  ``Heartbeat`` at most every ``heartbeat_interval_s`` and when the server goes idle.
- Read-only snapshots (``read_only``): nothing is written to the server (pydblog's own
  tables are not created: see ``setup.ensure_own_tables``), MySQL must run with
  ``gtid_mode = ON``, and for a second after ``request_progress`` every transaction
  boundary is reported as ``StreamPassed`` (its position's state after the transaction:
  what the stream has delivered, see ``sources.mysql.fences``). ``wakeup`` (any thread)
  makes a ``stream()`` waiting for the server yield ``Idle`` now.

This module is the stream loop (binlog events in, items out) and its wiring; the parts
live in their own modules: ``rowevents`` (rows events to change events), ``xa``
(``XaGroups``: XA groups held to their commit), ``history`` (``TableNames``: column
names and the schema history where TABLE_MAPs carry none), ``resume`` (where a restart
or a reconnect reads from and what it drops again, IO-free), ``server`` (what the server
says about its binlog and GTIDs), ``dumpstart``/``dumpconn`` (the dump's connection).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator
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
from pydblog.events import ChangeEvent, Op, RowRun
from pydblog.ports import (
    Checkpoint,
    Commit,
    Heartbeat,
    Idle,
    RelationReset,
    ResetKind,
    SourceState,
    StreamPassed,
    TableSchema,
)
from pydblog.positions import Position
from pydblog.sources.mysql import dumpconn, dumpstart, fastrows, rawrows
from pydblog.sources.mysql import schema as schema_mod
from pydblog.sources.mysql import server as srv
from pydblog.sources.mysql.connect import (
    ER_MASTER_FATAL_READING_BINLOG,
    UNAVAILABLE,
    MySqlDsn,
    StreamConnection,
    classify,
    connect,
    detail,
    errno,
    is_mariadb,
)
from pydblog.sources.mysql.ddl import DdlKind, parse_ddl
from pydblog.sources.mysql.dumpconn import DUMP_CONNECTION_KEY
from pydblog.sources.mysql.dumpstart import (
    DUMP_SERVER_KEY,
    DumpConnection,
    DumpStart,
    OneConnection,
    Reconnect,
)
from pydblog.sources.mysql.fenced import gtid_mode_error
from pydblog.sources.mysql.gtid import GtidState, MariaGtidPos
from pydblog.sources.mysql.history import HISTORY_KEY, TableNames, load_history
from pydblog.sources.mysql.position import BEFORE_TX, BinlogPosition, OpenTx
from pydblog.sources.mysql.rawrows import MariaGtid, RawRows, TableMap, Xid
from pydblog.sources.mysql.resume import (
    Delivered,
    FileResume,
    GtidResume,
    StreamAt,
    plan_reconnect,
    plan_resume,
)
from pydblog.sources.mysql.rowevents import RowEvents
from pydblog.sources.mysql.setup import (
    OwnTables,
    check_source,
    ensure_own_tables,
    warn_keyless,
)
from pydblog.sources.mysql.wake import Wakeup
from pydblog.sources.mysql.xa import XA_KEY, PreparedXa, XaGroups

log = logging.getLogger(__name__)

MAX_RECONNECT_S = 30.0
FL_PREPARED_XA = 64
"""MariaDB GTID event flag: the group is an XA transaction's ``XA PREPARE``."""


def _not_the_version_advice(record: logging.LogRecord) -> bool:
    """mysql-replication advises an older version of itself on servers without
    binlog_row_metadata; this source names their columns itself (tablemap.py)."""
    return "use python-mysql-replication version Before" not in record.getMessage()


logging.getLogger("pymysqlreplication").addFilter(_not_the_version_advice)


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
        self._map_read: TableMap | None = None  # the TABLE_MAP packet handed to the library
        self._file = ""
        self._last_end = 4
        self._tx: OpenTx | None = None
        self._delivered = Delivered()  # what a resume drops again (resume.py)
        self._gtid_mode = False  # the server writes GTIDs for every transaction
        self._gtids: GtidState | None = None  # state after the last GTID event read
        self._dump_state: GtidState | None = None  # what the current GTID dump asked for
        self._epoch = 0
        self._last_done: BinlogPosition | None = None  # the last finished transaction
        self._last_hb: BinlogPosition | None = None
        self._last_hb_time = -math.inf  # (monotonic time: 0.0 is the machine's boot)
        self._rows = RowEvents(self.db, own, matcher, False, self._cursor)
        # Column names where TABLE_MAPs carry none (MySQL < 8.0.14), with the schema
        # history where the source keeps one (history.py).
        self._names = TableNames(None, self._cursor, self._rows.tracked, dsn.redacted)
        self._opening_state: SourceState | None = None
        self._xa = XaGroups()  # prepared XA transactions held to their commit (xa.py)
        # MySQL GTID dumps: the current one's connection wrapper (its server_uuid, and
        # whether it started at a checkpoint's coordinates), recorded once per dump.
        self._dump: OneConnection | None = None
        self._dump_recorded = True
        # Every dump's connection wrapper: its server connection id, recorded once per
        # dump (``dumpconn``) and ended before the next dump starts.
        self._stream_conn: OneConnection | None = None
        self._conn_recorded = True

    # -- LogSource ---------------------------------------------------------------------
    @property
    def run_rows(self) -> int:
        """At most this many rows per ``RowRun`` (``ports.RunBatching``; 0, the
        default: one ``ChangeEvent`` per row)."""
        return self._rows.run_rows

    @run_rows.setter
    def run_rows(self, value: int) -> None:
        self._rows.run_rows = value

    def open(self, checkpoint: Checkpoint | None) -> None:
        try:
            self._open(checkpoint)
        except BaseException:
            self.close()
            raise

    def _open(self, checkpoint: Checkpoint | None) -> None:
        fastrows.install()
        self._ctl = connect(self.dsn, timeout_s=self.connect_timeout_s)
        self.mariadb = self._rows.mariadb = is_mariadb(self._ctl)
        check_source(self._ctl, self.dsn)
        ensure_own_tables(self._ctl, self.dsn, self.own, read_only=self.read_only)
        with self._cursor() as cur:
            names = [t for t in schema_mod.list_tables(cur, self.db) if self.matcher(f"{self.db}.{t}")]
        warn_keyless(self._ctl, self.db, names)
        with self._cursor() as cur:
            mode = "ON" if self.mariadb else srv.gtid_mode(cur)
        self._gtid_mode = mode.upper() == "ON"
        if self.read_only and not self._gtid_mode:
            raise gtid_mode_error(self.dsn.redacted, mode)
        pos = checkpoint.position if checkpoint is not None else None
        if pos is not None and not isinstance(pos, BinlogPosition):
            raise SourceError(
                f"the change log's position {pos!r} is not a MySQL binlog position",
                hint="this log directory was written by another source type; use a fresh [log] path",
            )
        with self._cursor() as cur:
            raw = checkpoint.extra.get(HISTORY_KEY) if checkpoint is not None else None
            self._names.history = load_history(cur, self.mariadb, raw, self._rows.tracked)
        if checkpoint is not None and pos is not None:
            self._xa = XaGroups(PreparedXa.load(checkpoint.extra.get(XA_KEY), pos))
        previous = dumpconn.recorded(checkpoint.extra.get(DUMP_CONNECTION_KEY)) if checkpoint else None
        if previous is not None:  # a frozen ex-leader's dump would hold ours silent
            self._end_dump(previous)
        if pos is None:
            self._fresh_start()
            return
        assert checkpoint is not None  # (pos is its position)
        state = srv.own_flavour(pos.gtids, self.mariadb, self.dsn.redacted) if self._gtid_mode else None
        plan = plan_resume(
            pos, state,
            mariadb=self.mariadb, dump_record=checkpoint.extra.get(DUMP_SERVER_KEY),
        )
        if isinstance(plan, GtidResume):
            # By GTID: the server finds the transactions after the state, whatever its
            # file names. A new epoch: these coordinates may not compare with the old ones.
            if plan.delivered is not None:  # (read-only fences may wait for its state)
                self._last_done = plan.delivered
            with self._cursor() as cur:
                missing = srv.holds_through(cur, pos)
            if missing is not None:
                raise self._gtid_dump_error(
                    missing, "it has not executed every transaction the change log holds"
                )
            self._follow(plan)
            return
        with self._cursor() as cur:
            srv.require_file(cur, pos, self.dsn.redacted)
        self._last_done = pos
        if plan.state is None:
            plan = FileResume(plan.file, plan.offset, plan.epoch, plan.skip_upto,
                              self._state_at(plan.file, plan.offset))
        self._follow(plan)

    def _fresh_start(self) -> None:
        """Capture from the binlog's end (no checkpoint)."""
        try:
            with self._cursor() as cur:
                cur.execute("XA RECOVER")
                self._xa.recovered(list(cur.fetchall()), self.dsn.redacted)
        except SourceError as exc:  # a bonus check: not allowed is not fatal
            log.debug("XA RECOVER failed: %s", exc)
        with self._cursor() as cur:
            file, offset, _ = srv.master_status(cur, self.dsn.redacted)
        executed, start = self._settled_executed(file, offset)
        if self._names.history is not None:
            with self._cursor() as cur:
                names = [(self.db, t) for t in schema_mod.list_tables(cur, self.db)]
            names += [self.own.signal, self.own.watermark]
            dbs = {self.db, self.own.signal[0], self.own.watermark[0]}
            self._opening_state = self._names.baseline(names, dbs, file, offset)
        if executed:
            # MySQL: capture starts after the executed GTID set (no scan of the current
            # binlog file for the set at an offset). Where that set holds every
            # transaction before ``offset`` (``settled_executed``) the server starts
            # reading there; else it finds the place itself, and a transaction it sends
            # may lie before ``offset`` (written, not yet executed, when the status was
            # read): the dump is the next epoch, above the start position whatever its
            # coordinates.
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

    def _settled_executed(self, file: str, offset: int) -> tuple[GtidState | None, DumpStart | None]:
        """MySQL with GTIDs: ``server.settled_executed``; ``(None, None)`` elsewhere."""
        if self.mariadb or not self._gtid_mode:
            return None, None
        with self._cursor() as cur:
            return srv.settled_executed(cur, file, offset)

    def _follow(self, plan: GtidResume | FileResume) -> None:
        """Start the dump a resume plan says, dropping what it says is delivered."""
        self._epoch = plan.epoch
        if isinstance(plan, GtidResume):
            self._delivered.tx = dict(plan.skip_tx)
            self._delivered.upto = None
            self._start_gtid_dump(plan.state, plan.start)
        else:
            self._delivered.upto = plan.skip_upto
            self._start_dump(plan.file, plan.offset, plan.state)

    def stream(self) -> Iterator[Any]:
        last_yield = time.monotonic()
        if self._wake is None:
            self._wake = Wakeup()
        if self._opening_state is not None:  # a fresh start's schema history
            yield self._opening_state
            self._opening_state = None
        if self._xa.opening is not None:  # a fresh start's XA transactions prepared then
            yield self._xa.opening
            self._xa.opening = None
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
            if not self._wake.wait(conn, 0.0):
                # Nothing to read right now: the runner flushes what it holds (as
                # PostgreSQL's source lets it between reads) instead of waiting for its
                # batch to age, then the wait.
                yield Idle()
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
                if type(item) is RowRun:
                    item = self._delivered.run(item)
                    if item is None:
                        continue
                elif self._drop(item):
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
            with self._cursor() as cur:
                return srv.bytes_after(srv.binlog_sizes(cur), self._file, self._last_end)
        except pymysql.Error:
            return None

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
        with self._cursor() as cur:
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

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        """``_ctl_cursor`` under the control connection's lock (any thread)."""
        with self._ctl_lock, self._ctl_cursor() as cur:
            yield cur

    def _state_at(self, file: str, offset: int) -> GtidState | None:
        """The GTID state at ``(file, offset)`` (``server.state_at``); None where GTIDs
        are off or it cannot be known."""
        if not self._gtid_mode:
            return None
        with self._cursor() as cur:
            return srv.state_at(cur, self.mariadb, file, offset)

    def _dump_settings(self) -> dict[str, Any]:
        settings = self.dsn.settings(timeout_s=self.connect_timeout_s, database=False)
        # A silent connection must not hang us: heartbeats come every idle_s.
        settings["read_timeout"] = max(30, int(self.idle_s * 20))
        return settings

    def _start_dump(self, file: str, offset: int, state: GtidState | None) -> None:
        """Dump from binlog coordinates; ``state`` is the GTID state there (if known)."""
        self._dump = None
        self._dump_recorded = True
        self._stream_conn = OneConnection()
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
        self._rows.mappers.clear()
        self._names.reset()

    def _start_gtid_dump(self, state: GtidState, start: DumpStart | None = None) -> None:
        """Dump every transaction after ``state`` (MariaDB ``@slave_connect_state``,
        MySQL COM_BINLOG_DUMP_GTID). The server starts with a Rotate to the file where
        that is; coordinates are read from the events as usual. MySQL: at ``start``'s
        coordinates where they hold (``sources.mysql.dumpstart``)."""
        self._dump = self._stream_conn = OneConnection(mysql=not self.mariadb, start=start)
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
        self._rows.mappers.clear()
        self._names.reset()

    def _fetch(self) -> Any:
        deadline = time.monotonic() + MAX_RECONNECT_S
        while True:
            try:
                event = self._raw_rows()
                if event is None:
                    event = self._reader.fetchone()
                if event is not None:
                    return event
                problem: BaseException = SourceUnavailable("the server ended the binlog dump")
            except Reconnect as exc:
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

    def _raw_rows(self) -> RawRows | TableMap | Xid | MariaGtid | None:
        """The next packet as a rows event ``RowEvents.raw`` takes (``rawrows``), or as a
        TABLE_MAP equal to the one the library last read for its table (whose Table the
        table's mapper still holds: nothing to read again), or None: the packet, if one
        was read, is handed back for the library to read."""
        self._map_read = None
        reader = self._reader
        conn = getattr(reader, "_stream_connection", None)
        if (type(conn) is not StreamConnection and type(conn) is not DumpConnection) or (
                conn._sock is None or conn.held is not None or not self._rows.run_rows):
            return None
        checksum = getattr(reader, "_BinLogStreamReader__use_checksum", None)
        if type(checksum) is not bool:  # not the library this was written against
            return None
        packet = conn._read_packet()
        data = packet._data
        post_header = getattr(reader, "_BinLogStreamReader__post_header_lengths", None)
        raw = rawrows.parse(data, checksum, post_header)
        if raw is not None:
            if self._rows.known(raw.table_id, reader.table_map):
                return raw
        else:
            found = rawrows.table_map(data, checksum, post_header)
            if found is not None:
                if self._rows.same_map(found.table_id, found.body, reader.table_map):
                    return found
                self._map_read = found  # the library reads it: ``_handle`` records it
            else:
                edge = rawrows.boundary(data, checksum)
                if edge is not None:
                    return edge
        conn.held = packet
        return None

    def _dump_error(self, exc: pymysql.Error) -> SourceError:
        if errno(exc) == ER_MASTER_FATAL_READING_BINLOG and self._dump_state is not None:
            return self._gtid_dump_error(self._dump_state, detail(exc))
        return srv.dump_error(exc, self.dsn, self._file, self._last_end)

    def _gtid_dump_error(self, state: GtidState, message: str) -> SourceError:
        """The server refused to send the transactions after ``state``: say why, as far
        as its GTID variables tell (behind us, or purged), and what to do."""
        why = ""
        try:
            with self._cursor() as cur:
                why = srv.diagnose_state(cur, state)
        except (SourceError, pymysql.Error) as exc:  # the diagnosis is a bonus
            log.debug("could not diagnose the GTID state: %s", exc)
        return srv.gtid_dump_error(self.dsn.redacted, state, message, why)

    def _restart(self) -> None:
        """Reopen the dump where ``plan_reconnect`` says (resume.py)."""
        if self._reader is not None:
            with contextlib.suppress(pymysql.Error):
                self._reader.close()
        lost = self._stream_conn.connection_id if self._stream_conn is not None else None
        if lost is not None:  # its server thread may still be blocked in a write
            self._end_dump(lost)
        at = StreamAt(
            gtid_mode=self._gtid_mode, mariadb=self.mariadb, epoch=self._epoch,
            file=self._file, last_end=self._last_end, gtids=self._gtids, tx=self._tx,
            last_done=self._last_done,
            server_uuid=self._dump.server_uuid if self._dump is not None else None,
        )
        try:
            self._follow(plan_reconnect(at, self._delivered))
        except pymysql.Error as exc:
            log.warning("reconnect failed: %s", exc)

    def _end_dump(self, connection_id: int) -> None:
        """End the dump on server connection ``connection_id`` (``dumpconn``), best effort."""
        try:
            with self._cursor() as cur:
                dumpconn.end_dump(cur, connection_id)
        except SourceError as exc:
            log.warning("could not end the previous binlog dump (connection %d): %s",
                        connection_id, exc)

    # -- events --------------------------------------------------------------------------
    def _drop(self, item: Any) -> bool:
        return self._delivered.drop(getattr(item, "position", None))

    def _handle(self, event: Any) -> Iterator[Any]:
        kind = type(event)
        if kind is TableMap:  # the same as the table's last one: read already
            if event.log_pos > 0:
                self._last_end = event.log_pos
            return
        if kind is Xid or kind is MariaGtid:  # as XidEvent / MariadbGtidEvent below
            start = self._last_end
            if event.log_pos > 0:
                self._last_end = event.log_pos
            if kind is Xid:
                yield from self._end_tx(event.timestamp * 1000)
            else:
                self._tx = self._gtid_tx(event, event.log_pos, start, not event.flags & 1)
                if event.flags & FL_PREPARED_XA:
                    self._tx.xa = []
            return
        raw = kind is RawRows
        if raw:
            end = event.log_pos
        else:
            end = int(getattr(event.packet, "log_pos", 0) or 0) if hasattr(event, "packet") else 0
        start = self._last_end  # where this event begins: a transaction's resume point
        if end > 0 and not isinstance(event, HeartbeatLogEvent | RotateEvent):
            self._last_end = end  # before yielding: the consumer may stop at any item
        if raw or isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
            begin = lambda ts_ms: self._begin_if_needed(start, ts_ms)  # noqa: E731
            items = self._rows.raw(event, begin) if raw else self._rows.rows(event, begin)
            tx = self._tx
            if tx is not None and tx.xa is not None:
                held = tx.xa
                for item in items:
                    if type(item) is RowRun:
                        held.extend(item.events())  # until the group's end says when it commits
                    elif type(item) is ChangeEvent:
                        held.append(item)  # until the group's end says when it commits
                    else:
                        yield item
                return
            yield from items
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
            # The end of an XA transaction's first group: ``one_phase`` (MySQL's ``XA
            # COMMIT ... ONE PHASE``) commits here like any transaction; otherwise an
            # ``XA PREPARE``, whose rows are held to a later group (``XaGroups``).
            if not event.one_phase and self._tx is not None:
                xid = (int(event.xid_format_id), bytes(event.xid_gtrid), bytes(event.xid_bqual))
                yield from self._xa.prepared(self._tx, xid)
            yield from self._end_tx(event.timestamp * 1000)
        elif isinstance(event, QueryEvent):
            yield from self._query(event, start)
        elif isinstance(event, RotateEvent):
            self._file = event.next_binlog
            self._last_end = event.position
            self._rows.mappers.clear()
            return
        elif isinstance(event, TableMapEvent):
            self._rows.table_map(event)
            read, self._map_read = self._map_read, None
            self._rows.map_read(event.table_id, read.body if read is not None
                                and read.table_id == event.table_id else None)
            table = event.table_map.get(event.table_id)
            unnamed = table is not None and any(not c.name for c in table.columns)
            if unnamed and self._names.name(table, self._file, start):
                yield self._names.state(None)
            if table is not None:
                self._rows.adopt(event.table_id, table)
        elif isinstance(event, HeartbeatLogEvent):
            if self._tx is None:
                self._read_to_end()
                yield from self._heartbeat(force=True)
            yield Idle()

    def _gtid_tx(self, event: Any, end: int, start: int, explicit: bool) -> OpenTx:
        """A transaction opened by its GTID event (the library's, or ``rawrows``'); the
        GTID state moves past it."""
        size = (event.event_size if type(event) is MariaGtid
                else int(getattr(event.packet, "event_size", 0) or 0))
        if end > 0 and size > 0:
            start = end - size  # exact even where the server skipped events before it
        before = self._gtids
        gtid = str(event.gtid)
        if before is not None and self._gtid_mode:
            self._gtids = before.advance(gtid)
        return OpenTx(self._file, start, gtid, explicit, event.timestamp * 1000, before, self._epoch)

    def _begin_if_needed(self, start: int, ts_ms: int) -> OpenTx:
        if self._tx is None:
            self._tx = OpenTx(self._file, start, None, False, ts_ms, self._gtids, self._epoch)
        return self._tx

    def _query(self, event: Any, start: int) -> Iterator[Any]:
        query = str(event.query).strip()
        head = query[:10].upper()
        ts_ms = event.timestamp * 1000
        if head.startswith("BEGIN"):
            self._begin_if_needed(start, ts_ms).explicit = True
            return
        if head.startswith("XA START") or head.startswith("XA BEGIN"):
            XaGroups.starts(self._begin_if_needed(start, ts_ms))
            return
        if head.startswith("XA END"):
            # Not the end of the group: an XA_PREPARE event (or, on MariaDB before 10.5,
            # an "XA COMMIT ... ONE PHASE" query) follows and says what it is.
            return
        if head.startswith("XA COMMIT") or head.startswith("XA ROLLBAC"):
            # Two-phase: a group of its own; one phase: the group's own rows commit here.
            ends = XaGroups.two_phase_end(query, self._tx)
            if ends is not None:
                tx = self._begin_if_needed(start, ts_ms)
                yield from self._xa.resolved(tx, ends[0], ends[1], ts_ms)
            yield from self._end_tx(ts_ms)
            return
        if head.startswith("COMMIT") or head.startswith("ROLLBACK"):
            yield from self._end_tx(ts_ms)
            return
        tx = self._begin_if_needed(start, ts_ms)
        default_db = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema)
        if self._names.history is not None:
            pos = tx.position(tx.count)
            yield from self._names.ddl(pos, query, default_db, self._delivered.logged(pos))
        ddl = parse_ddl(query, default_db)
        if ddl is not None:
            # A TEMPORARY table's name may shadow a captured table's: never it.
            kind = DdlKind.DROP if ddl.or_replace and not ddl.temporary else ddl.kind
            yield from self._ddl(tx, kind, () if ddl.temporary else ddl.tables, ts_ms,
                                 recreated=ddl.or_replace)
        if not tx.explicit:
            yield from self._end_tx(ts_ms)

    def _ddl(
        self, tx: OpenTx, kind: DdlKind, tables: tuple[tuple[str, str], ...], ts_ms: int,
        recreated: bool = False,
    ) -> Iterator[Any]:
        """``recreated``: a DROP that is MariaDB's CREATE OR REPLACE TABLE (the table is
        dropped and a new one made under its name: truncated, then snapshotted, as a table
        re-created while dblog runs; ``CREATE OR REPLACE ... SELECT`` rows follow as row
        events and the snapshot re-reads them, harmlessly)."""
        for db, table in tables:
            self._rows.forget(db, table)
            self._names.forget((db, table))
            if not self._rows.captured(db, table):
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
                if self._rows.captured(db, old):
                    yield self._reset(tx, db, old, ResetKind.GONE, ts_ms)
                if self._rows.captured(new_db, new):
                    log.warning("table %s.%s: renamed from %s.%s; logging a truncate and "
                                "snapshotting it", new_db, new, db, old)
                    yield self._reset(tx, new_db, new, ResetKind.RECREATED, ts_ms)
        # The next TABLE_MAP of a changed table carries its new columns; SchemaChanged
        # is yielded then, before its first row event.
        self._rows.mappers.clear()

    def _reset(self, tx: OpenTx, db: str, table: str, kind: ResetKind, ts_ms: int) -> RelationReset:
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
        return self._delivered.pending(self._gtids)

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
