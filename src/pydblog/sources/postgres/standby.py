"""Capture from a PostgreSQL hot standby: logical decoding on a standby (PostgreSQL 16+).

``[source] dsn`` may name a hot standby (``pg_is_in_recovery()``): the slot is created
there, the stream and (unless ``[snapshot] read_dsn`` says otherwise) the chunk reads
come from there, and nothing is written to the standby. What a primary's capture writes
cannot be written there, so:

- snapshots must be read-only (``[snapshot] watermark = "read-only"``);
- the publication must exist (created on the primary; the standby has it once it has
  replayed it);
- heartbeats and table resets (``pg_logical_emit_message``) are logged on the primary
  given as ``[source] primary_dsn``, which then also keeps the publication's table list,
  exactly as a primary's capture does. They come back through the standby's stream.
- Without ``primary_dsn`` the slot still advances: at idle moments the stream yields a
  ``Heartbeat`` at the walsender's sent position (``beat_position``; the same place a
  heartbeat message there would have: every transaction that committed before it has
  been delivered, every later one commits at or after it). The captured tables are
  then fixed at the first start (the publication's tables that ``tables`` matches):
  a captured table dropped, renamed or created again, or a matching table added to the
  publication later, would need a reset ordered in the stream, which only a message
  logged on the primary gives. Capture stops at the first sign of one (a Relation
  message of an unknown relation, a captured table gone from the standby's catalog at
  a heartbeat, or the difference at start) with ``TableSetChanged``, naming the table
  and the fix; it never logs rows of a relation it could not reset.

Read-only chunks read on the standby that streams are fenced by ``PgLsnFence``
(``fences``): the standby's walsender decodes only WAL the standby has replayed
(``GetXLogReplayRecPtr``), and a commit is visible to the standby's snapshots once
replayed, so the stream never delivers a commit a later read cannot see: the fence's
floor is always covered (``wait_replayed`` returns at once).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import psycopg

from pydblog.config import Config, TableMatcher, redact_dsn
from pydblog.errors import SourceError, SourceUnavailable
from pydblog.positions import Lsn, PgPosition
from pydblog.sources.postgres import setup
from pydblog.sources.postgres.connect import connect

log = logging.getLogger(__name__)

MIN_VERSION = 160000
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"
REPLAY_WAIT_S = 10.0
"""How long ``connect_primary`` waits for the standby to replay the primary's WAL before
it tells a lower ``wal_level`` there from the slot it invalidated."""
NUDGE_S = 0.2
"""How often ``pg_log_standby_snapshot()`` runs on the primary while a slot is being
created on the standby."""


FAILOVER_HINT = (
    "After a failover: once the standby in [source] dsn is promoted, capture goes on from "
    "it at the next retry (primary_dsn is then not used: remove it); if another server "
    "was promoted, make the standby stream from it and point [source] primary_dsn at it")


class Promoted(SourceUnavailable):
    """``[source] dsn`` was a standby when the source opened and is a primary now (it
    was promoted: a failover). Retriable: the service opens the source again, and it
    opens as a primary's capture (``check_promoted``)."""


class TableSetChanged(SourceError):
    """Capture from a standby without ``primary_dsn`` met a change of the captured
    tables that needs a reset it cannot log (module docstring). Fatal."""


def in_recovery(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def check_promoted(conn: psycopg.Connection[Any], cfg: Config) -> None:
    """Raise ``Promoted`` if the standby ``conn`` (``[source] dsn``) is no longer in
    recovery. Its logical slot and the stream survive a promotion (PostgreSQL 16+), so
    nothing else tells: heartbeats and resets would go on being logged on the old
    primary (``primary_dsn``), whose WAL the promoted server never sees, or, without
    it, a table re-created on the new primary would stop the capture. Opened again,
    the source captures from ``dsn`` as from any primary: heartbeats, resets and the
    publication there, ``primary_dsn`` unused (docs/snapshots.md, "Promotion")."""
    try:
        promoted = not in_recovery(conn)
    except psycopg.Error as exc:
        raise _query_failed(conn, exc, "checking that it is still a standby") from None
    if promoted:
        extra = (" [source] primary_dsn is no longer used (remove it from the configuration)"
                 if cfg.source.primary_dsn is not None else "")
        raise Promoted(
            f"[source] dsn ({redact_dsn(cfg.source.dsn)}) was a hot standby and is a "
            "primary now (promoted): capture goes on from it as from a primary, its "
            "heartbeats, table resets and publication kept there." + extra)


def _query_failed(conn: psycopg.Connection[Any], exc: psycopg.Error, what: str
                  ) -> SourceUnavailable:
    """A retriable error for a check's query on ``[source] dsn`` that failed: the
    connection lost, or a query error on a live one (a recovery-conflict cancel on a
    standby): the source is opened again either way."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if conn.closed or conn.broken:
        return SourceUnavailable(f"the connection to [source] dsn was lost ({detail}): "
                                 "reconnecting")
    return SourceUnavailable(f"{what} failed on [source] dsn ({detail}): retrying")


def check(conn: psycopg.Connection[Any], cfg: Config) -> None:
    """What capture from this standby needs and the standby can tell: PostgreSQL 16+,
    read-only snapshots, ``hot_standby_feedback``, the publication."""
    version = conn.info.server_version
    if version < MIN_VERSION:
        raise SourceError(
            f"[source] dsn is a hot standby of PostgreSQL {version // 10000}; logical "
            "decoding on a standby needs PostgreSQL 16 or newer",
            hint="point [source] dsn at the primary and set [snapshot] read_dsn to the "
            "standby: chunk reads go to the standby, the stream comes from the primary",
        )
    if cfg.snapshot.watermark != "read-only":
        raise SourceError(
            f"[source] dsn is a hot standby, where nothing can be written, and [snapshot] "
            f"watermark = {cfg.snapshot.watermark!r} writes to the source",
            hint='set [snapshot] watermark = "read-only" (each chunk is fenced by its own '
            "snapshot; signals go to the capture through the API or Kafka)",
        )
    row = conn.execute("SHOW hot_standby_feedback").fetchone()
    if row is None or row[0] != "on":
        raise SourceError(
            "hot_standby_feedback is off on the standby: the primary's vacuum may remove "
            "catalog rows the standby's slot still needs, which invalidates the slot",
            hint="set hot_standby_feedback = on on the standby (and primary_slot_name, a "
            "physical slot on the primary, so that it holds while the standby is "
            "disconnected), then reload it",
        )
    pub = cfg.source.publication
    row = conn.execute("SELECT to_jsonb(p) ->> 'pubviaroot' FROM pg_publication p "
                       "WHERE pubname = %s", (pub,)).fetchone()
    if row is None:
        raise SourceError(
            f"publication {pub!r} does not exist on the standby (a standby cannot create it)",
            hint=f"on the primary, in database {conn.info.dbname!r}, run: CREATE PUBLICATION "
            f"{pub} FOR ALL TABLES WITH (publish_via_partition_root = true) (or FOR TABLE "
            "<the tables> WITH (...)); the standby has it once it has replayed it",
        )
    if row[0] != "true" and cfg.source.primary_dsn is None:
        # Without it a partitioned table's changes come under its leaves, which are not
        # captured (only roots are): they would be dropped. With primary_dsn the
        # publication is set so there (``setup.ensure_publication``).
        matcher = cfg.source.table_matcher()
        parted = [f"{n}.{c}" for n, c in conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.relkind = 'p' AND NOT c.relispartition "
            "ORDER BY 1, 2").fetchall() if matcher(f"{n}.{c}")]
        conn.commit()
        if parted:
            raise SourceError(
                f"publication {pub!r} does not publish partitioned tables by their root "
                f"(publish_via_partition_root is off), and {', '.join(parted)} "
                f"{'is' if len(parted) == 1 else 'are'} partitioned: their changes would "
                "come under the partitions' names and not be captured",
                hint=f"on the primary run: ALTER PUBLICATION {pub} SET "
                "(publish_via_partition_root = true) (or set [source] primary_dsn, which "
                "does it)",
            )


def connect_primary(cfg: Config, standby: psycopg.Connection[Any], *,
                    acked: int | None = None) -> psycopg.Connection[Any]:
    """The ``[source] primary_dsn`` connection, checked to be this standby's primary
    (same system identifier, not in recovery, same database: a logical message is
    decoded only by slots of its own database, ``wal_level = logical``).

    A primary restarted with a lower ``wal_level`` makes the standby invalidate its
    logical slots once it replays that change: then the slot's error (``acked``: the
    checkpoint's ack LSN, ``setup.check_slot_continues``) is raised, not the setting's,
    after waiting (at most ``REPLAY_WAIT_S``) for the standby to replay the primary's
    WAL so far."""
    dsn = cfg.source.primary_dsn
    assert dsn is not None
    try:
        conn = connect(dsn, timeout_s=cfg.source.connect_timeout_s,
                       setting="[source] primary_dsn")
    except SourceUnavailable as exc:
        # Retried (once capture ran): after a failover, until the configuration changes.
        raise SourceUnavailable(exc.message, hint=f"{exc.hint} {FAILOVER_HINT}") from None
    where = redact_dsn(dsn)
    try:
        if in_recovery(conn):
            raise SourceError(f"[source] primary_dsn ({where}) is a standby too",
                              hint="point primary_dsn at the primary the standby streams from")
        if conn.info.dbname != standby.info.dbname:
            raise SourceError(
                f"[source] primary_dsn names database {conn.info.dbname!r}, dsn "
                f"{standby.info.dbname!r}",
                hint="both must name the same database (logical messages are per database)")
        ids = []
        for c in (conn, standby):
            try:
                row = c.execute("SELECT system_identifier FROM pg_control_system()").fetchone()
                ids.append(row[0] if row else None)
            except psycopg.Error:  # not allowed to read it: the check is skipped
                c.rollback()
                ids.append(None)
        if None in ids:
            log.warning(
                "[source] primary_dsn (%s): not checked to be the standby's primary (the "
                "role may not read pg_control_system() on %s): make sure it is, or "
                "heartbeats and resets go to a server whose WAL the standby never sees. "
                "To have it checked: GRANT EXECUTE ON FUNCTION pg_control_system() TO the "
                "role (or GRANT pg_monitor)", where,
                " and ".join(n for n, i in zip(("the primary", "the standby"), ids, strict=True)
                             if i is None))
        elif ids[0] != ids[1]:
            raise SourceError(
                f"[source] primary_dsn ({where}) is not the primary of the standby in dsn "
                "(another system identifier)",
                hint="point primary_dsn at the primary the standby streams from")
        row = conn.execute("SHOW wal_level").fetchone()
        if row is None or row[0] != "logical":
            _wait_replayed(standby, conn)
            setup.check_slot_continues(standby, cfg.source.slot, acked)
            raise SourceError(
                f"wal_level is {row[0] if row else '?'!r} on the primary; logical decoding "
                "on a standby needs 'logical' there",
                hint="set wal_level = logical on the primary and restart it")
    except BaseException:
        conn.close()
        raise
    return conn


def _wait_replayed(standby: psycopg.Connection[Any], primary: psycopg.Connection[Any]) -> None:
    """Until the standby has replayed the primary's WAL written so far (at most
    ``REPLAY_WAIT_S``)."""
    row = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    deadline = time.monotonic() + REPLAY_WAIT_S
    while time.monotonic() < deadline:
        done = standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                               (row[0],)).fetchone()
        if done is None or done[0] is not False:  # (NULL: not replaying at all)
            return
        time.sleep(0.05)


def ensure_slot(conn: psycopg.Connection[Any], slot: str,
                primary: psycopg.Connection[Any] | None) -> bool:
    """``setup.ensure_slot`` on the standby. Creating a slot there waits for the primary
    to log its running transactions: with a primary, ``pg_log_standby_snapshot()`` runs
    there every ``NUDGE_S`` until the slot exists; without, the primary's background
    writer logs them every 15 s while it is busy (an idle primary may not: said in the
    log before the wait)."""
    exists = conn.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    if exists is not None:
        return setup.ensure_slot(conn, slot)
    done = threading.Event()
    nudger = None
    if primary is not None:
        nudger = threading.Thread(target=_nudge, args=(primary, done), daemon=True,
                                  name="dblog-standby-slot")
        nudger.start()
    else:
        log.warning(
            "creating replication slot %s on the standby: this waits until the primary logs "
            "its running transactions (every 15 s while it is busy). If it does not end, run "
            "SELECT pg_log_standby_snapshot() on the primary, or set [source] primary_dsn", slot)
    try:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    except psycopg.Error as exc:
        detail = str(exc).strip().splitlines()[0]
        if exc.sqlstate == OBJECT_NOT_IN_PREREQUISITE_STATE:
            raise SourceError(
                f"cannot create replication slot {slot!r} on the standby: {detail}",
                hint="set wal_level = logical on the primary (and restart it); the standby "
                "needs wal_level = logical and hot_standby_feedback = on too") from None
        raise SourceError(f"cannot create replication slot {slot!r} on the standby: {detail}",
                          hint="grant the role REPLICATION") from None
    finally:
        done.set()
        if nudger is not None:
            nudger.join()
    return True


def _nudge(primary: psycopg.Connection[Any], done: threading.Event) -> None:
    while not done.is_set():
        try:
            primary.execute("SELECT pg_log_standby_snapshot()")
        except psycopg.Error as exc:
            log.warning("SELECT pg_log_standby_snapshot() on the primary failed (%s): the "
                        "slot's creation waits for the primary's background writer",
                        str(exc).strip().splitlines()[0])
            with contextlib.suppress(psycopg.Error):
                primary.rollback()
            return
        done.wait(NUDGE_S)


def beat_position(wal_end: int) -> PgPosition:
    """A heartbeat at the walsender's sent position ``wal_end`` (outside a transaction):
    placed as a heartbeat message ending there would be (``source._between``)."""
    return PgPosition(Lsn(wal_end - 1), 0, Lsn(wal_end))


class FixedTables:
    """The captured tables of a standby's capture without ``primary_dsn`` (module
    docstring): fixed at the first start; ``check_*`` raise ``TableSetChanged``."""

    def __init__(self, conn: psycopg.Connection[Any], cfg: Config) -> None:
        self.conn = conn
        self.publication = cfg.source.publication
        self.relations: dict[int, str] = {}
        """Every published relation ``tables`` matched at start (oid -> name)."""

    def tables(self, matcher: TableMatcher, own: set[str], warned: set[str]
             ) -> tuple[list[str], dict[str, int]]:
        """The captured tables (and their relations) from the standby's catalog: the
        publishable ones that are published and matched; the published matched
        relations go into ``relations``. Warns (once each) about matched tables the
        publication leaves out."""
        listed = setup.list_tables(self.conn, matcher, own)
        published = setup.published_tables(self.conn, self.publication)
        self.conn.commit()
        inside = [t for t in listed if published is None or t.qualified in published]
        for t in listed:
            if t not in inside and t.qualified not in warned:
                warned.add(t.qualified)
                log.warning(
                    "table %s matches [source] tables but is not in publication %s: it is NOT "
                    "captured. To capture it, on the primary run ALTER PUBLICATION %s ADD "
                    "TABLE %s, and set [source] primary_dsn (its rows need a snapshot, "
                    "ordered in the stream by a reset logged on the primary)",
                    t.qualified, self.publication, self.publication, t.qualified)
        self.relations = {t.oid: t.qualified for t in inside}
        tables = setup.publishable(inside, warned)
        return [t.qualified for t in tables], {t.qualified: t.oid for t in tables}

    def check_start(self, captured: list[str], oids: dict[str, int], names: list[str],
                    now: dict[str, int]) -> None:
        """At start with a checkpoint: the tables it captured are the ones captured now."""
        for t in sorted(set(captured) | set(names)):
            if t not in names:
                raise _changed(t, "no longer exists or left the publication")
            if t not in captured:
                raise _changed(t, "was added to the publication (or created)")
            if t in oids and oids[t] != now[t]:
                raise _changed(t, "was dropped and created again")

    def check_relation(self, oid: int, qualified: str, captured: bool) -> None:
        """A Relation message: a captured relation under another name (renamed), or a
        captured name for a relation not published and matched at start."""
        known = self.relations.get(oid)
        if known is not None and known != qualified:
            raise _changed(known, f"was renamed to {qualified}")
        if captured and known is None:
            raise _changed(qualified, "is a relation the capture did not start with "
                           "(created, created again, renamed onto this name, or added to "
                           "the publication since)")

    def check_present(self, captured: list[str]) -> None:
        """At a heartbeat: every captured table still exists on the standby."""
        try:
            names = {f"{s}.{t}" for s, t in self.conn.execute(
                "SELECT n.nspname, c.relname FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY(%s)",
                (list(self.relations),)).fetchall()}
            self.conn.commit()
        except psycopg.Error as exc:
            raise _query_failed(self.conn, exc, "checking the captured tables") from None
        for t in captured:
            if t not in names:
                raise _changed(t, "was dropped or renamed")


def _changed(table: str, what: str) -> TableSetChanged:
    return TableSetChanged(
        f"captured table {table} {what}: capture from a standby without [source] "
        "primary_dsn cannot log the reset that keeps the log exact",
        hint="set [source] primary_dsn to the primary (dblog then logs the table's reset "
        "there, and keeps the publication's tables) and start dblog again",
    )
