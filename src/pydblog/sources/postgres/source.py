"""The PostgreSQL log source: a pgoutput logical replication stream as pydblog items.

Invariants:
- Items come in commit order; each transaction's events carry ``PgPosition(commit
  LSN, index)`` (the commit LSN is known at Begin), and end with a ``Commit`` whose
  position carries the end LSN the slot is acknowledged with.
- ``ack`` only ever moves the slot's flush position to a position the caller says is
  durable; nothing else confirms (no feedback from keepalives we did not earn).
- Unchanged TOAST values never reach an event as garbage: with REPLICA IDENTITY FULL
  they are taken from the old row; otherwise the column holds ``UNCHANGED_TOAST`` and
  is listed in ``ChangeEvent.unchanged``.
- An UPDATE that changes the key is emitted as a delete of the old key followed by a
  create of the new one, so materializing the log stays exact.
- A captured table dropped, or dropped and created again, is reset: a transactional
  message, committed with the change that adds the table to the publication again, comes back
  through the stream as a ``RelationReset`` (a truncate), after every event of the old
  relation and before every event of the new one (``_reset_tables``). Resets logged
  but not seen back yet are in the checkpoint and logged again at ``open`` (a standby
  promoted may stream a history without them), each yielded once (``resets``).
- The captured tables are part of the checkpoint (``CAPTURED_KEY``, a ``SourceState``),
  so at start, as at every heartbeat: a table found outside the publication is a new
  relation of a table captured before (``RECREATED``: snapshotted, its rows from before
  it joined are in no event) when it was, else a table new to the capture (``JOINED``);
  and a table captured when the checkpoint was written that no longer exists is
  ``GONE``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import select
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psycopg
import psycopg2
import psycopg2.extras

from pydblog.config import Config, TableMatcher
from pydblog.errors import SourceError, SourceUnavailable
from pydblog.events import BLOCK_EVENTS, UNCHANGED_TOAST, ChangeEvent, InsertRun, Op
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
    StreamItem,
    StreamPassed,
    TableSchema,
    WatermarkSeen,
)
from pydblog.positions import Lsn, PgPosition, Position
from pydblog.sources.postgres import pgoutput as po
from pydblog.sources.postgres import resets, rowdecode, setup, standby
from pydblog.sources.postgres.connect import (
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    connect,
    connect_replication,
    replication_error,
)
from pydblog.sources.postgres.pgoutput import ReplicaIdentity
from pydblog.sources.postgres.relations import (
    TABLE_COLUMNS_SQL,
    RelationState,
    build_relation,
    identity_columns,
)
from pydblog.sources.postgres.types import TypeRegistry

log = logging.getLogger(__name__)

BURST_GRACE_S = 0.0005
"""When the replication socket runs dry after messages, it is read once more this much
later before the stream pauses (flushes the batch, waits in ``select``). A capture that
shares its CPU with the walsender otherwise takes turns with it a few messages at a
time, each turn a wakeup and a pause's work (on one core beside PostgreSQL, into Kafka,
5.7 times slower: docs/performance.md, note 3). It delays a burst's last events by at most
this."""

WATERMARK_PREFIX = "dblog-watermark"
HEARTBEAT_PREFIX = "dblog-heartbeat"
RESET_PREFIX = "dblog-relation-reset"
COPY = "copy"
"""The last field of a reset message logged again at ``open`` (``resets``)."""
CAPTURED_KEY = "pg_captured"
"""Checkpoint ``extra`` key: ``{"captured": [...], "seen": [...], "oids": {...}}``, the
qualified names of the tables captured now and of every table captured so far (sorted),
and each captured table's relation oid; with ``"resets"`` when table resets were
logged that did not come back through the stream yet
(``resets.Unreturned``)."""
REFRESH_ATTEMPTS = 5
"""Publication refreshes tried while captured tables keep being dropped meanwhile."""
HB_RESEND = 3
"""A heartbeat out this many intervals (lost: a server restarted meanwhile) does not
hold back the next one of a busy stream (which also finds a lost connection): one is
sent every HB_RESEND intervals until one comes back."""
IDLE = Idle()
_INSERT, _DELETE = ord("I"), ord("D")
_CREATE = Op.CREATE


def _position_factory() -> Callable[[Lsn, int, Lsn | None, int | None], PgPosition]:
    """``PgPosition(commit_lsn, index, end_lsn, tx_id)`` for the stream's hot path: its
    four slots set directly, not by the frozen dataclass's ``__init__`` (two and a half
    times cheaper: that ``__init__`` goes through ``object.__setattr__`` per field). The
    class itself if it ever has another shape (other fields, a ``__post_init__``)."""
    names = [f.name for f in dataclasses.fields(PgPosition)]
    if names != ["commit_lsn", "index", "end_lsn", "tx_id"] or hasattr(PgPosition, "__post_init__"):
        return PgPosition
    new = object.__new__
    s_lsn, s_index, s_end, s_tx = (getattr(PgPosition, n).__set__ for n in names)

    def position(lsn: Lsn, index: int, end: Lsn | None, tx: int | None) -> PgPosition:
        p: PgPosition = new(PgPosition)
        s_lsn(p, lsn)
        s_index(p, index)
        s_end(p, end)
        s_tx(p, tx)
        return p

    return position


_position = _position_factory()


def _update_events(schema: str, table: str, lsn: Lsn, idx: int, ts: int, tx: int,
                   key: dict[str, Any], old_key: dict[str, Any], before: dict[str, Any] | None,
                   after: dict[str, Any], unchanged: list[str]) -> list[StreamItem]:
    """An UPDATE's events: one ``u`` at ``idx``, or, when it changed the row's key, a
    ``d`` of the old key at ``idx`` then a ``c`` of the new one at ``idx + 1`` (the
    decoder leaves that index free for it)."""
    if old_key != key:
        return [
            ChangeEvent(Op.DELETE, schema, table, _position(lsn, idx, None, tx), ts,
                        old_key, before, None),
            ChangeEvent(Op.CREATE, schema, table, _position(lsn, idx + 1, None, tx), ts,
                        key, None, after, unchanged=tuple(unchanged)),
        ]
    return [ChangeEvent(Op.UPDATE, schema, table, _position(lsn, idx, None, tx), ts,
                        key, before, after, unchanged=tuple(unchanged))]
_new_event = tuple.__new__  # a NamedTuple's own __new__ is a Python function: 4x slower
_EVENT_DEFAULTS = tuple(ChangeEvent._field_defaults[f] for f in ChangeEvent._fields[8:])
"""``ChangeEvent``'s fields after ``after``, at their defaults (the hot path builds the
tuple itself; tests/property/test_native_rows.py checks the result equals the class's)."""
assert ChangeEvent._fields[:8] == ("op", "schema", "table", "position", "ts_ms", "key", "before", "after")
PG_EPOCH_US = 946_684_800_000_000


_RUN_OPS = {"I": Op.CREATE, "U": Op.UPDATE, "D": Op.DELETE, "u": Op.UPDATE, "d": Op.DELETE}
"""A native run's op by its kind (``_pgrow.Tails``: lowercase, with the old row)."""


def _take_run(acc: Any, lsn: Lsn, idx: int, ts_ms: int, tx_id: int) -> InsertRun:
    """The Inserts (or key-keeping Updates, or Deletes) ``acc`` holds
    (``rowdecode.tails``), from index ``idx``."""
    rel, count, text, kind = acc.take()
    return _new_run(InsertRun, (rel.schema, rel.table, lsn, idx, tx_id, ts_ms, count, text,
                                _RUN_OPS[kind]))


_new_run = tuple.__new__


class PgLogSource:
    connector = "postgresql"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.src = cfg.source
        self.db = ""
        self.signal_table = cfg.snapshot.signal_table
        self.watermark_table = cfg.snapshot.watermark_table
        # Read-only snapshots: no table is created or written (a capture user with the
        # REPLICATION attribute and SELECT is enough); a signal table an administrator
        # created is still published and read.
        self.read_only = cfg.snapshot.watermark == "read-only"
        self._matcher: TableMatcher = cfg.source.table_matcher()
        self._meta: psycopg.Connection[Any] | None = None
        self._repl: psycopg2.extras.LogicalReplicationConnection | None = None
        self._cur: Any = None
        self._types: TypeRegistry | None = None
        self._relations: dict[int, RelationState] = {}
        # The captured relations as the native row decoder takes them (``rowdecode``).
        self._specs: dict[int, rowdecode.Spec] = {}
        # The captured relations whose Inserts (and Updates without an old row) are
        # encoded straight into change-log tails (``rowdecode.fast_spec``: every
        # captured table but the signal and watermark tables, whose events the runner
        # routes), and at most how many
        # consecutive row changes one ``InsertRun`` holds.
        self._fast_specs: dict[int, rowdecode.FastSpec] = {}
        self.run_rows = BLOCK_EVENTS
        self._captured: list[str] = []
        # Every table captured, in this session or (from the checkpoint) an earlier
        # one; whether the runner is to be handed them (a ``SourceState``).
        self._seen: set[str] = set()
        # Each captured table's relation (``pg_class.oid``), and whether ``_captured``
        # is known (a checkpoint without the list, before the first refresh: not).
        self._oids: dict[str, int] = {}
        self._known = False
        # Resets logged and not seen back in the stream yet (``resets``), and those the
        # refresh transaction in progress logged.
        self._unreturned = resets.Unreturned()
        self._logging: list[resets.Reset] = []
        self._report = True
        self._acked: int = 0
        self._from_ack: int | None = None  # the checkpoint's ack LSN at ``open``
        # Monotonic times start at -inf, never 0.0: monotonic time counts from the
        # machine's boot, and on a machine up for less than the heartbeat interval a 0.0
        # held the first heartbeat (the first checkpoint of an idle source) back until
        # the interval had passed since boot.
        self._last_hb = -math.inf
        self._hb_out = False  # a heartbeat sent has not come back through the stream yet
        self._hb_sent = -math.inf  # when the last heartbeat was sent
        self._wake: tuple[int, int] | None = None  # self-pipe: wakeup() -> stream yields Idle
        self._passed = 0  # the last WAL end reported as StreamPassed
        self._asked = -math.inf  # when request_progress last asked for a keepalive
        self._warned: set[str] = set()
        # Capture from a hot standby (``standby``): the primary of ``primary_dsn`` (the
        # publication, heartbeats and resets are written there), or without it the
        # fixed table set and the heartbeats at the walsender's sent position.
        self.standby = False
        self._primary: psycopg.Connection[Any] | None = None
        self._fixed: standby.FixedTables | None = None
        self._beat_lsn = 0
        self._beat_due = False

    # -- setup --------------------------------------------------------------------
    @property
    def captured_tables(self) -> list[str]:
        return list(self._captured)

    def open(self, checkpoint: Checkpoint | None) -> None:
        meta = connect(self.src.dsn, timeout_s=self.src.connect_timeout_s)
        self._meta = meta
        self.db = meta.info.dbname
        setup.check_server(meta)
        self.standby = standby.in_recovery(meta)
        if self.standby:
            standby.check(meta, self.cfg)
        # Before anything is written or the slot created, and before ``primary_dsn`` is
        # checked (a primary restarted with wal_level = replica invalidated the slot: that
        # is the news): a lost slot must not be replaced silently
        # (``setup.check_slot_continues``).
        pos = checkpoint.position if checkpoint is not None else None
        acked = pos.ack_lsn.value if isinstance(pos, PgPosition) else None
        self._from_ack = acked
        setup.check_slot_continues(meta, self.src.slot, acked)
        if self.standby:
            if self.src.primary_dsn is not None and self._primary is None:
                self._primary = standby.connect_primary(self.cfg, meta, acked=acked)
            elif self.src.primary_dsn is None:
                self._fixed = standby.FixedTables(meta, self.cfg)
        elif self.src.primary_dsn is not None:
            log.warning("[source] primary_dsn is ignored: [source] dsn is not a standby (a "
                        "primary, or a standby promoted since): heartbeats, table resets "
                        "and the publication are kept on [source] dsn. Remove primary_dsn")
        if not self.read_only:
            setup.ensure_own_tables(meta, self.signal_table, self.watermark_table)
        raw = checkpoint.extra.get(CAPTURED_KEY) if checkpoint is not None else None
        if isinstance(raw, dict):
            self._captured = [str(t) for t in raw.get("captured") or ()]
            self._seen.update(str(t) for t in raw.get("seen") or ())
            self._oids = {str(t): int(o) for t, o in (raw.get("oids") or {}).items()}
            self._unreturned = resets.Unreturned.load(raw)
            self._known = True
        self._refresh_publication()
        if self.standby:
            created = standby.ensure_slot(meta, self.src.slot, self._primary)
        else:
            created = setup.ensure_slot(meta, self.src.slot)
        if created:
            # A new slot streams nothing logged before it: the resets logged so far
            # (this refresh's, at a first start) never come back through it.
            self._unreturned = resets.Unreturned()
        self._types = TypeRegistry.load(meta)
        repl = connect_replication(self.src.dsn, timeout_s=self.src.connect_timeout_s)
        self._repl = repl
        cur = repl.cursor()
        try:
            cur.start_replication(
                slot_name=self.src.slot,
                decode=False,
                start_lsn=0,
                status_interval=10,
                options={
                    "proto_version": "1",
                    "publication_names": self.src.publication,
                    "messages": "true",
                },
            )
        except psycopg2.Error as exc:
            raise self._stream_error(exc) from None
        self._cur = cur
        self._last_hb = -math.inf  # first idle moment sends a heartbeat: a position to start from
        if self._wake is None:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            self._wake = (r, w)

    def _refresh_publication(self) -> None:
        self.refresh_tables(force=True)

    def refresh_tables(self, *, force: bool = False) -> None:
        """Pick up tables created since start that match ``tables`` (captured from the
        moment they are added to the publication), and reset (``_reset_tables``) tables
        dropped, or dropped and created again under their name: a drop takes a table out
        of the publication, so a table captured before (``force``, at start: any table)
        that is missing from it is a new relation.

        One transaction: the reset messages commit with the publication change, or not
        at all. A table dropped while this runs (listed, then gone before the ALTER
        PUBLICATION: it may even look re-created, having left the publication) makes the
        ALTER fail; the transaction is rolled back and the tables listed again.
        On a standby: on the primary (``primary_dsn``), else ``_fixed_tables``."""
        if self._fixed is not None:
            self._fixed_tables(force)
            return
        if self.standby and self._primary is not None:
            # Not on the old primary once ``dsn`` was promoted: the promoted server's
            # stream would never bring the resets back, yet the checkpoint would count
            # them done (``_captured_state``). The source opens again as a primary's.
            assert self._meta is not None
            standby.check_promoted(self._meta, self.cfg)
        meta = self._writes
        for attempt in range(REFRESH_ATTEMPTS):
            self._logging = []
            try:
                with meta.transaction():
                    again = self._log_again() if force else False
                    names, oids = self._refresh(force)
                break
            except psycopg.OperationalError as exc:
                self._check_writes(exc)
                raise
            except setup.TableDropped as exc:
                if attempt < REFRESH_ATTEMPTS - 1:
                    log.info("tables changed while refreshing the publication (%s): listing again", exc)
                    continue
                what = (f"captured tables kept being dropped while dblog refreshed its "
                        f"publication ({REFRESH_ATTEMPTS} attempts; the last: {exc.message})")
                if force:  # at start: nothing is captured without the publication
                    raise setup.TableDropped(
                        what, hint="start dblog again once the tables stop being dropped "
                        "(a running capture retries on its own)") from None
                # A heartbeat's: its transaction rolled back (no reset logged, the
                # publication unchanged), and the next heartbeat lists the tables again.
                log.warning("%s: the publication was not refreshed; the next heartbeat "
                            "tries again", what)
                return
        else:  # pragma: no cover (the loop breaks or returns)
            return
        self._known = True
        if self._logging:
            self._unreturned.logged(self._logging)
            self._logging = []
            self._report = True
        if again:
            self._report = True
        if names is not None or oids != self._oids:
            if names is not None:
                self._captured = names
                self._seen.update(names)
            self._oids = oids
            self._report = True

    @property
    def _writes(self) -> psycopg.Connection[Any]:
        """Where the publication is kept and resets and heartbeats are logged: the
        source, or a standby's primary (``primary_dsn``)."""
        conn = self._primary or self._meta
        assert conn is not None
        return conn

    def _fixed_tables(self, force: bool) -> None:
        """A standby's capture without ``primary_dsn`` (``standby.FixedTables``): the
        tables at start, checked against the checkpoint's (later, ``_heartbeat``
        checks that they are still there)."""
        fixed = self._fixed
        assert fixed is not None
        if not force:
            return
        own = {self.signal_table, self.watermark_table}
        names, oids = fixed.tables(self._matcher, own, self._warned)
        if self._known:
            fixed.check_start(self._captured, self._oids, names, oids)
        self._known = True
        self._captured, self._oids = names, oids
        self._seen.update(names)
        self._report = True

    def _refresh(self, force: bool) -> tuple[list[str] | None, dict[str, int]]:
        """``refresh_tables``' work, inside its transaction: the captured tables, or None
        when nothing changed, and their relations.

        A table renamed (``ALTER TABLE … RENAME``) stays in the publication under its
        new name: a captured table renamed away is ``GONE`` (its rows leave the old
        name), and a relation found in the publication under a matching name it was not
        captured under (renamed onto it, also onto a captured name whose relation was
        another) is a new relation there, reset as ``RECREATED`` (truncated, then
        snapshotted: its rows were logged under another name, or not at all)."""
        meta = self._writes
        own = {self.signal_table, self.watermark_table}
        listed = setup.list_tables(meta, self._matcher, own)
        tables = setup.publishable(listed, self._warned)
        names = [t.qualified for t in tables]
        published = setup.published_tables(meta, self.src.publication)
        joining = [] if published is None else [t for t in names if t not in published]
        oids = {t.qualified: t.oid for t in tables}
        # In a FOR ALL TABLES publication (``published`` None: membership never
        # changes, a new relation is published from its creation) a captured name
        # whose relation changed (created again), a name now held by a relation
        # captured under another one (renamed onto it), and a name captured before
        # that is back (found gone at a refresh, created again: its first rows may
        # have committed before that refresh's truncate) are reset all the same: the
        # events of the new relation published before the reset are truncated with
        # the old rows, and it is snapshotted again.
        before = set(self._oids.values())
        moved = [t for t in names if self._oids.get(t, oids[t]) != oids[t]
                 or (self._known and t not in self._captured
                     and (t in self._seen or oids[t] in before))] \
            if published is None else [
            t for t in names if t in published
            and ((self._known and t not in self._captured)
                 or self._oids.get(t, oids[t]) != oids[t])]
        if published is None and force and self._known:
            # FOR ALL TABLES (its membership tells nothing): at start a table the
            # checkpoint did not capture (the `tables` setting widened, a primary key
            # added meanwhile) joins all the same: its rows are in no event, so with
            # mode = "initial" it is snapshotted, as in a FOR TABLE publication.
            joining = [t for t in names if t not in self._captured and t not in moved]
        present = {t.qualified for t in listed}
        gone = [t for t in self._captured if t not in present]
        if force:
            # At start the captured tables are the checkpoint's: one that still exists
            # and that the configuration no longer matches is only no longer captured.
            gone = [t for t in gone if not setup.table_exists(meta, t)]
        if names == self._captured and not joining and not moved and not force:
            return None, oids
        for t in moved:
            log.warning("table %s: another relation under this name (renamed onto it, or "
                        "created again in a FOR ALL TABLES publication); its rows were "
                        "logged under another name, if at all", t)
        self._reset_tables(moved, ResetKind.RECREATED)
        # A table captured before (in this session, or an earlier one) that joins is a
        # new relation under its name; at start (``force``) any other joining table is
        # reset too (created, or re-created before it was ever captured, meanwhile).
        self._reset_tables([t for t in joining if t in self._seen], ResetKind.RECREATED)
        if force:
            self._reset_tables([t for t in joining if t not in self._seen], ResetKind.JOINED)
        self._reset_tables(gone, ResetKind.GONE)
        if self.read_only:
            own = {t for t in own if setup.table_exists(meta, t)}
        setup.ensure_publication(meta, self.src.publication, [*names, *sorted(own)],
                                 [t.qualified for t in tables if t.partitioned], self._warned)
        return names, oids

    def _reset_tables(self, tables: list[str], kind: ResetKind) -> None:
        """A reset message per table, committed with (so, in the stream, before any
        event published by) the publication change: a table
        joins it with a relation whose rows the log has not described (created, or
        dropped and created again, since the last refresh: a drop takes a table out of
        the publication), or a captured table is gone. The old relation's events all
        committed before the drop, so before the message; the new one's are published
        only after the publication changes, so after it."""
        for qualified in tables:
            log.info("table %s: %s, logging a truncate (and snapshotting it)", qualified, kind.value)
            reset = resets.Reset(uuid.uuid4().hex[:16], qualified, kind.value)
            self._emit_reset(reset)
            self._logging.append(reset)

    def _emit_reset(self, reset: resets.Reset, copy: bool = False) -> None:
        """Log ``reset``'s message (``[schema, table, kind, id]``, and ``"copy"`` when
        it is logged again: ``resets``), in the refresh's transaction."""
        fields = [*setup.split_name(reset.table), reset.kind, reset.id]
        payload = orjson.dumps([*fields, COPY] if copy else fields).decode()
        self._writes.execute("SELECT pg_logical_emit_message(true, %s, %s)", (RESET_PREFIX, payload))

    def _log_again(self) -> bool:
        """At ``open``, first in its refresh's transaction: the resets the checkpoint
        says were logged and not seen back (``resets``), logged again here in their
        order, with their ids. Their messages may have been written where this stream
        never reads (the old primary of a standby promoted since, or WAL it did not
        receive before its promotion); if they come after all, the copies are
        skipped. Whether there were any."""
        again = self._unreturned.to_log_again()
        for reset in again:
            log.info("table %s: its %s reset was logged before and has not come back "
                     "through the stream yet (logged on a server this stream may not read, "
                     "e.g. before a promotion): logging it again", reset.table, reset.kind)
            self._emit_reset(reset, copy=True)
        return bool(again)

    # -- stream -------------------------------------------------------------------
    def stream(self) -> Iterator[StreamItem]:
        cur = self._cur
        assert cur is not None and self._repl is not None
        fileno = self._repl.fileno()
        assert self._wake is not None  # created by open()
        wake = self._wake[0]
        interval = self.src.heartbeat_interval_s
        handlers = self._handlers()
        native = rowdecode.decoder()
        specs = self._specs
        # Runs of Inserts or Updates encoded in C (``InsertRun``): taken before any
        # other item.
        acc = rowdecode.tails(self.run_rows) if native is not None else None
        fast = self._fast_specs
        unchanged = po.UNCHANGED
        begin: po.Begin | None = None
        lsn: Lsn = Lsn(0)
        idx = 0
        ts_ms = 0
        tx_id = 0
        if self._report:  # the set as ``open`` left it, before the stream's first event
            yield self._captured_state()
        burst = False  # messages came since the stream last paused
        while True:
            try:
                msg = cur.read_message()
                if msg is None and burst:
                    burst = False
                    time.sleep(BURST_GRACE_S)
                    msg = cur.read_message()
            except psycopg2.Error as exc:
                raise self._stream_error(exc) from None
            if msg is None:
                if acc is not None and acc.count:
                    run = _take_run(acc, lsn, idx, ts_ms, tx_id)
                    idx += run.size
                    yield run
                if begin is None and self._report:
                    yield self._captured_state()
                now = time.monotonic()
                if now - self._last_hb >= interval:
                    self._heartbeat()
                    self._last_hb = now
                if begin is None and cur.wal_end > self._passed:
                    # Outside a transaction the last message was a commit (its end), a
                    # keepalive (the walsender's sent position: every commit before it
                    # has been decoded and sent) or a message (its start).
                    self._passed = cur.wal_end
                    yield StreamPassed(PgPosition(Lsn(self._passed), 0, Lsn(self._passed)))
                if self._beat_due and begin is None and cur.wal_end > self._beat_lsn:
                    # A standby without primary_dsn logs no heartbeat: the walsender's
                    # sent position is one (``standby.beat_position``).
                    self._beat_lsn = cur.wal_end
                    self._beat_due = False
                    yield Heartbeat(standby.beat_position(self._beat_lsn))
                yield IDLE
                with contextlib.suppress(InterruptedError):
                    ready, _, _ = select.select([fileno, wake], [], [], min(0.05, interval))
                    if wake in ready:
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake, 4096)
                        yield IDLE  # someone has work for the runner between stream reads
                continue
            burst = True
            payload = msg.payload
            if acc is not None:
                n = acc.add(payload, fast)
                if n > 0:
                    if acc.full:
                        run = _take_run(acc, lsn, idx, ts_ms, tx_id)
                        idx += run.size
                        yield run
                    continue
                if acc.count:  # another message: the run before it goes first
                    run = _take_run(acc, lsn, idx, ts_ms, tx_id)
                    idx += run.size
                    yield run
                    if n < 0 and acc.add(payload, fast) > 0:  # another table's, or kind's
                        if acc.full:
                            run = _take_run(acc, lsn, idx, ts_ms, tx_id)
                            idx += run.size
                            yield run
                        continue
            if native is not None:
                # A captured relation's row change, decoded into row dicts in C (None:
                # another message, or one the Python path decides: ``rowdecode``).
                d = native(payload, specs, unchanged)
                if d is not None:
                    if d[0] == _INSERT:  # the hot path, inline
                        rel = d[1]
                        after = d[2]
                        assert after is not None
                        yield _new_event(ChangeEvent, (
                            _CREATE, rel.schema, rel.table, _position(lsn, idx, None, tx_id),
                            ts_ms, d[6], None, after,
                            *_EVENT_DEFAULTS))
                        idx += 1
                    else:
                        for item in self._native_change(d, lsn, idx, ts_ms, tx_id):
                            idx += 1
                            yield item
                    continue
            m = po.decode(payload)
            kind = type(m)
            if kind is po.Begin:
                begin = m  # type: ignore[assignment]
                assert begin is not None
                lsn = Lsn(begin.final_lsn)
                idx = 0
                ts_ms = (begin.commit_ts_us) // 1000
                tx_id = begin.xid
                continue
            if kind is po.Commit:
                c: po.Commit = m  # type: ignore[assignment]
                begin = None
                if self._report:
                    # A reset came back in this transaction: the checkpoint written at
                    # its Commit no longer keeps it (``resets``).
                    yield self._captured_state()
                yield Commit(PgPosition(Lsn(c.commit_lsn), idx, Lsn(c.end_lsn), tx_id), c.commit_ts_us // 1000)
                now = time.monotonic()
                if (not self._hb_out or now - self._hb_sent >= HB_RESEND * interval) \
                        and now - self._last_hb >= interval:
                    # A stream never idle (a steady load) refreshes the publication too,
                    # at the heartbeat's return: one heartbeat in flight at a time (a
                    # backlog's catch-up would otherwise get one per interval at its end).
                    self._heartbeat()
                    self._last_hb = time.monotonic()
                continue
            handler = handlers.get(kind)
            if handler is None:
                continue
            for item in handler(m, lsn, idx, ts_ms, tx_id, begin is not None, msg.data_start):
                if type(item) is not SchemaChanged:
                    idx += 1
                yield item
            if self._report and begin is None:
                # The runner refreshed the publication at a heartbeat (a message
                # between transactions): the new set goes into the checkpoint now, not
                # at the next idle moment, which a busy stream may not reach for long.
                yield self._captured_state()

    def _captured_state(self) -> SourceState:
        """The captured tables for the checkpoint (``CAPTURED_KEY``), yielded at a
        transaction boundary after every refresh that changed them: before the reset
        messages that refresh committed come back through the stream, so a restart from
        any later checkpoint neither misses a change of the set nor resets a table a
        second time (the reset messages are replayed from the slot, not emitted again)."""
        self._report = False
        return SourceState(CAPTURED_KEY, {"captured": sorted(self._captured),
                                          "seen": sorted(self._seen),
                                          "oids": dict(sorted(self._oids.items())),
                                          **self._unreturned.dump()})

    def _handlers(self) -> dict[type, Any]:
        return {
            po.Insert: self._on_insert,
            po.Update: self._on_update,
            po.Delete: self._on_delete,
            po.Truncate: self._on_truncate,
            po.Relation: self._on_relation,
            po.Message: self._on_message,
            po.Type: self._on_type,
        }

    def _row(self, rel: RelationState, values: po.TupleData) -> dict[str, Any]:
        return rel.row(values)

    def _on_insert(self, m: po.Insert, lsn: Lsn, idx: int, ts: int, tx: int, _in_tx: bool, _ds: int) -> list[StreamItem]:
        rel = self._relations[m.relation_oid]
        if not rel.captured:
            return []
        new = m.new
        after = rel.row(new)
        names = rel.names
        key = {names[i]: after[names[i]] for i in rel.key_idx}
        return [ChangeEvent(Op.CREATE, rel.schema, rel.table, PgPosition(lsn, idx, None, tx), ts,
                            key, None, after)]

    def _on_update(self, m: po.Update, lsn: Lsn, idx: int, ts: int, tx: int, _in_tx: bool, _ds: int) -> list[StreamItem]:
        rel = self._relations[m.relation_oid]
        if not rel.captured:
            return []
        new = m.new
        old = m.old
        unchanged: list[str] = []
        if po.UNCHANGED in new:
            vals = list(new)
            for i, v in enumerate(vals):
                if v is po.UNCHANGED:
                    if old is not None and not m.old_is_key_only and old[i] is not po.UNCHANGED:
                        vals[i] = old[i]
                    else:
                        unchanged.append(rel.names[i])
            new = tuple(vals)
        after = self._row(rel, new)
        for name in unchanged:
            after[name] = UNCHANGED_TOAST
        key = rel.key_of(tuple(after.values()))
        before: dict[str, Any] | None = None
        old_key = key
        if old is not None:
            if m.old_is_key_only:
                before = _key_row(rel, old)
                old_key = before
            else:
                before = self._row(rel, old)
                old_key = rel.key_of(tuple(before.values()))
        return _update_events(rel.schema, rel.table, lsn, idx, ts, tx, key, old_key, before,
                              after, unchanged)

    def _on_delete(self, m: po.Delete, lsn: Lsn, idx: int, ts: int, tx: int, _in_tx: bool, _ds: int) -> list[StreamItem]:
        rel = self._relations[m.relation_oid]
        if not rel.captured:
            return []
        old = m.old
        if m.old_is_key_only:
            before = _key_row(rel, old)
            key = before
        else:
            before = self._row(rel, old)
            key = rel.key_of(tuple(before.values()))
        return [ChangeEvent(Op.DELETE, rel.schema, rel.table, PgPosition(lsn, idx, None, tx), ts,
                            key, before, None)]

    def _native_change(self, d: rowdecode.Decoded, lsn: Lsn, idx: int, ts: int, tx: int) -> list[StreamItem]:
        """An Update or Delete the native decoder decoded (``rowdecode``): the events
        ``_on_update``/``_on_delete`` give for the same message, from its row dicts."""
        kind, rel, new, old, key_only, n_unchanged, _ = d
        keys = rel.key_names
        if kind == _DELETE:
            assert old is not None
            if key_only:
                before = {n: None if old[n] is po.UNCHANGED else old[n] for n in keys}
                key = before
            else:
                before = old
                key = {n: old[n] for n in keys}
            return [ChangeEvent(Op.DELETE, rel.schema, rel.table, _position(lsn, idx, None, tx), ts,
                                key, before, None)]
        after = new
        assert after is not None
        unchanged: list[str] = []
        if n_unchanged:
            for name in rel.names:
                if after[name] is po.UNCHANGED:
                    if old is not None and not key_only and old[name] is not po.UNCHANGED:
                        after[name] = old[name]
                    else:
                        unchanged.append(name)
            for name in unchanged:
                after[name] = UNCHANGED_TOAST
        key = {n: after[n] for n in keys}
        before_: dict[str, Any] | None = None
        old_key = key
        if old is not None:
            if key_only:
                before_ = {n: None if old[n] is po.UNCHANGED else old[n] for n in keys}
                old_key = before_
            else:
                before_ = old
                old_key = {n: old[n] for n in keys}
        return _update_events(rel.schema, rel.table, lsn, idx, ts, tx, key, old_key, before_,
                              after, unchanged)

    def _on_truncate(self, m: po.Truncate, lsn: Lsn, idx: int, ts: int, tx: int, _in_tx: bool, _ds: int) -> list[StreamItem]:
        out: list[StreamItem] = []
        for oid in m.relation_oids:
            rel = self._relations.get(oid)
            if rel is None or not rel.captured:
                continue
            out.append(ChangeEvent(Op.TRUNCATE, rel.schema, rel.table,
                                   PgPosition(lsn, idx + len(out), None, tx), ts))
        return out

    def _on_relation(self, m: po.Relation, *_: Any) -> list[StreamItem]:
        assert self._meta is not None and self._types is not None
        qualified = f"{m.namespace}.{m.name}"
        own = qualified in (self.signal_table, self.watermark_table)
        # A partition's own Relation message comes beside its root's (pgoutput sends both
        # when publishing via the root); its changes come under the root: not captured.
        captured = own or (self._matcher(qualified) and not self._is_partition(m.oid))
        missing = [c.type_oid for c in m.columns if not self._types.known(c.type_oid)]
        if missing:
            self._types.refresh(self._meta, missing)
        pk = self._primary_key(m.oid)
        rel = build_relation(m, self._types, pk, captured)
        prev = self._relations.get(m.oid)
        self._relations[m.oid] = rel
        if rel.captured:
            self._specs[m.oid] = rowdecode.spec(rel)
        else:
            self._specs.pop(m.oid, None)
        if rel.captured and not own:
            self._fast_specs[m.oid] = rowdecode.fast_spec(rel)
        else:
            self._fast_specs.pop(m.oid, None)
        if self._fixed is not None and not own:
            try:
                self._fixed.check_relation(m.oid, qualified, captured)
            except standby.TableSetChanged:
                # A table created on the standby after its promotion comes here before
                # the next heartbeat's check: then the source opens again as a
                # primary's capture (``Promoted``), which resets the table.
                if self.standby:
                    standby.check_promoted(self._meta, self.cfg)
                raise
        if own or not captured:
            return []
        if prev is not None and prev.table_schema == rel.table_schema:
            return []
        return [SchemaChanged(rel.table_schema)]

    def _on_type(self, m: po.Type, *_: Any) -> list[StreamItem]:
        assert self._meta is not None and self._types is not None
        self._types.refresh(self._meta, [m.oid])
        return []

    def _on_message(self, m: po.Message, lsn: Lsn, idx: int, ts: int, tx: int, in_tx: bool, data_start: int) -> list[StreamItem]:
        if m.prefix == WATERMARK_PREFIX:
            pos = PgPosition(lsn, idx, None, tx) if in_tx else _between(m.lsn)
            return [WatermarkSeen(m.content.decode(), pos)]
        if m.prefix == HEARTBEAT_PREFIX and not in_tx:
            self._hb_out = False
            return [Heartbeat(_between(m.lsn))]
        if m.prefix == RESET_PREFIX and in_tx:
            schema, table, kind, *rid = orjson.loads(m.content)
            if rid:  # (a message of an older version has no id: always yielded)
                copy = rid[1:] == [COPY]
                new, changed = self._unreturned.came_back(str(rid[0]), copy)
                if changed:
                    self._report = True  # handed on before the Commit (``stream``)
                if not new:
                    log.info("table %s.%s: a copy of a %s reset logged again at a start, "
                             "whose original came back already: skipped", schema, table, kind)
                    return []
            if not self._matcher(f"{schema}.{table}"):
                return []
            event = ChangeEvent(Op.TRUNCATE, schema, table, PgPosition(lsn, idx, None, tx), ts)
            return [RelationReset(event, ResetKind(kind))]
        return []

    def table_schema(self, schema: str, table: str) -> TableSchema | None:
        """The table's schema from the catalog, as its pgoutput Relation message would
        give it (``relations.build_relation``): for a table whose first logged events
        are snapshot rows. Generated columns are left out (not published)."""
        assert self._meta is not None and self._types is not None
        rows = self._meta.execute(
            TABLE_COLUMNS_SQL,
            (schema, table),
        ).fetchall()
        if not rows:
            return None
        missing = [int(r[2]) for r in rows if not self._types.known(int(r[2]))]
        if missing:
            self._types.refresh(self._meta, missing)
        names = tuple(str(r[0]) for r in rows)
        pk = tuple(str(r[0]) for r in sorted((r for r in rows if r[3] is not None), key=lambda r: r[3]))
        index = tuple(str(r[0]) for r in rows if r[4] is not None and r[5] == ReplicaIdentity.INDEX)
        types = self._types
        return TableSchema(
            schema,
            table,
            tuple(
                ColumnSchema(str(r[0]), types.sql_type(int(r[2]), int(r[6])),
                             types.logical_type(int(r[2])), r[0] not in pk and r[0] not in index)
                for r in rows
            ),
            identity_columns(names, pk, index),
        )

    def _is_partition(self, oid: int) -> bool:
        assert self._meta is not None
        row = self._meta.execute("SELECT relispartition FROM pg_class WHERE oid = %s", (oid,)).fetchone()
        return bool(row and row[0])

    def _primary_key(self, oid: int) -> list[str]:
        assert self._meta is not None
        rows = self._meta.execute(
            """
            SELECT a.attname FROM pg_index i
            JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
            WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord
            """,
            (oid,),
        ).fetchall()
        return [r[0] for r in rows]

    def _heartbeat(self) -> None:
        """A non-transactional message: lets the slot advance while captured tables are
        idle. A standby's capture without ``primary_dsn`` checks that its tables are
        still there instead, and yields a heartbeat at the next idle moment (``stream``).
        A standby's capture first checks that the standby was not promoted meanwhile
        (``standby.check_promoted``: the source is then opened again, as a primary's)."""
        if self.standby:
            assert self._meta is not None
            standby.check_promoted(self._meta, self.cfg)
        if self._fixed is not None:
            self._fixed.check_present(self._captured)
            self._beat_due = True
            return
        try:
            self._writes.execute("SELECT pg_logical_emit_message(false, %s, '')", (HEARTBEAT_PREFIX,))
            self._hb_sent = time.monotonic()
            self._hb_out = True
        except psycopg.Error as exc:
            self._check_writes(exc)
            log.warning("heartbeat failed: %s", str(exc).strip())

    def _stream_error(self, exc: psycopg2.Error) -> SourceError:
        """The replication stream's error. One that no retry helps (``replication_error``:
        an invalidated slot's "can no longer get changes", or a standby's "requires
        wal_level >= logical on the primary") is first checked against the slot: if it
        was invalidated, the error is ``setup.check_slot_continues``', naming the LSN
        after which changes are missing (the last one acknowledged durable), as at
        ``open``."""
        err = replication_error(exc, self.src.slot)
        if exc.pgcode == OBJECT_NOT_IN_PREREQUISITE_STATE and self._meta is not None:
            acked = self._acked or self._from_ack
            try:
                setup.check_slot_continues(self._meta, self.src.slot, acked)
            except SourceError as named:
                return named
            except psycopg.Error:  # (the server's own message, then)
                with contextlib.suppress(psycopg.Error):
                    self._meta.rollback()
        return err

    def _check_writes(self, exc: psycopg.Error) -> None:
        """Raise ``SourceUnavailable`` when ``exc`` broke the connection heartbeats,
        resets and the publication are written on (a restart of the server, an idle
        timeout): the service opens the source again, and with it that connection
        (``open``, ``standby.connect_primary``). Left alone, heartbeats would fail
        forever, and no drop or re-creation of a table would be noticed again."""
        conn = self._writes
        if not (conn.closed or conn.broken):
            return
        which = "[source] primary_dsn" if self._primary is not None else "[source] dsn"
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceUnavailable(
            f"the connection to {which} was lost ({detail}): reconnecting",
            hint=f"is the server of {which} running and reachable?") from None

    # -- ack ----------------------------------------------------------------------
    def ack(self, position: Position) -> None:
        assert isinstance(position, PgPosition)
        lsn = position.ack_lsn.value
        if lsn <= self._acked or self._cur is None:
            return
        try:
            self._cur.send_feedback(write_lsn=lsn, flush_lsn=lsn, force=True)
        except psycopg2.Error as exc:
            raise replication_error(exc, self.src.slot) from None
        self._acked = lsn

    def keepalive(self) -> None:
        """Tell the server we are alive while the stream is paused (blocking snapshot),
        so wal_sender_timeout does not end the connection."""
        if self._cur is not None:
            try:
                self._cur.send_feedback(force=True)
            except psycopg2.Error as exc:
                raise replication_error(exc, self.src.slot) from None

    def request_progress(self) -> None:
        """Ask the walsender for a keepalive (its reply carries how far it has sent), at
        most every 20 ms: a read-only snapshot's rows wait for the stream to pass their
        fence, which an idle stream would otherwise report only every few seconds.
        Confirms nothing (the feedback repeats the positions already acknowledged)."""
        now = time.monotonic()
        self._passed = 0  # the next idle moment reports the WAL end, even if unchanged
        if self._cur is None or now - self._asked < 0.02:
            return
        self._asked = now
        try:
            self._cur.send_feedback(reply=True)
        except psycopg2.Error as exc:
            raise replication_error(exc, self.src.slot) from None

    def lag_bytes(self) -> int | None:
        return slot_lag(self._meta, self.src.slot) if self._meta is not None else None

    def wakeup(self) -> None:
        """Make a ``stream()`` waiting for the server yield ``Idle`` now (thread-safe:
        the snapshot worker calls it when a chunk is read, so the runner can hand it the
        next request at once instead of at the next message or after 50 ms)."""
        if self._wake is not None:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake[1], b"w")

    def close(self) -> None:
        for c in (self._repl, self._meta, self._primary):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
        self._repl = None
        self._meta = None
        self._primary = None
        if self._wake is not None:
            for fd in self._wake:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake = None


def _key_row(rel: RelationState, old: po.TupleData) -> dict[str, Any]:
    """The key columns of a key-only old tuple ('K': the other columns are NULL)."""
    out: dict[str, Any] = {}
    for i in rel.key_idx:
        v = old[i]
        out[rel.names[i]] = rel.converters[i](v) if isinstance(v, str) else None
    return out


def slot_lag(conn: psycopg.Connection[Any], slot: str) -> int | None:
    row = conn.execute(
        "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
        "ELSE pg_current_wal_lsn() END - confirmed_flush_lsn "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def _between(message_lsn: int) -> PgPosition:
    """The position of a non-transactional message (a heartbeat), acknowledging
    ``message_lsn``. PostgreSQL reports such a message at the *end* of its record, which
    is where the next record starts: a transaction delivered after the message may
    have exactly that commit LSN (its changes written before the message, its commit
    record right after it), and its first event is at ``(message_lsn, 0)``. So the
    message sorts at ``message_lsn - 1`` (inside its own record: no commit LSN there):
    after every transaction delivered before it (their commit records lie before the
    message's record), before every one delivered after it, and so do the positions
    placed right after it (snapshot rows, ``(message_lsn - 1, 1..)``)."""
    return PgPosition(Lsn(message_lsn - 1), 0, Lsn(message_lsn))
