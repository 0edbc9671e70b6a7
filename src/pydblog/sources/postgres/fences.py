"""PostgreSQL read fences: what a read-only chunk's SELECT saw, in the stream's terms.

See ``core.fence`` for the protocol and docs/snapshots.md for the whole argument. The
reader takes, for each chunk, in one REPEATABLE READ transaction (the SELECT and the
first statement share its snapshot S):

- on a primary (``PgXidFence``): ``pg_current_snapshot()`` (S as ``xmin:xmax:xip``) and,
  evaluated after S was taken, ``pg_current_wal_insert_lsn()``. A transaction is
  visible in S iff its xid is below ``xmin``, or below ``xmax`` and not in ``xip``; a
  visible transaction's commit record was inserted before it became visible, so before
  S, so it ends at or before that insert position. The stream has delivered every such
  transaction once it reports a position at or past it. Before the transaction, the
  reader also takes the *running* transactions (``pg_locks``: each holds a lock on its
  own xid until it has become visible). A transaction the stream delivered and S does
  not see (its commit record was flushed, but it still waited, e.g. for a synchronous
  standby's acknowledgement, while the logical stream delivered it) was running then:
  its xid is ``in_doubt``. S ``covers`` the floor (``core.fence.Floor``) iff none of
  those was delivered by the floor (``core.fence.Delivered`` keeps the delivered xids
  no fence has shown visible yet; where it may have forgotten some, iff S sees every
  running transaction that was *committing*, ``in_commit``: waiting for the standby).
  Only with ``synchronous_standby_names`` set (``RUNNING_SQL``): without it no commit
  waits after its record is flushed.
- on a hot standby (``PgLsnFence``; its snapshots list running transactions outside
  ``xip``, so xids cannot decide): ``pg_last_wal_replay_lsn()`` *before* the
  transaction (``low``) and the greater of ``pg_last_wal_receive_lsn()`` and
  ``pg_last_wal_replay_lsn()`` after the SELECT (``end``; the received position alone
  can be behind replay after a restart, and NULL while no WAL is streamed).
  A standby's snapshot sees exactly the commits replayed before it was taken. A commit
  record that starts before ``low`` was replayed before S (``low`` is a replayed
  record's end, records do not straddle it): visible. Any other may or may not be: the
  row's key is dropped (always safe). Every commit S saw was replayed before the
  SELECT ended, so it ends at or before ``end``. The core trusts a standby's
  fence only once ``low`` is past every commit the stream delivered before the table's
  snapshot began (``covers``; ``core.fence.Floor``): the standby may lag the stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydblog.core.fence import Floor, Lost
from pydblog.errors import SourceError
from pydblog.events import ChangeEvent
from pydblog.positions import Lsn, PgPosition, Position

XID_SPAN = 1 << 32

RUNNING_SQL = (
    "SELECT DISTINCT s.xm + d.d - CASE WHEN d.d >= 2147483648 THEN 4294967296 ELSE 0 END, "
    "d.committing FROM (SELECT {xmax}::text::bigint AS xm) s, "
    "LATERAL (SELECT ((l.transactionid::text::bigint - s.xm) % 4294967296 + 4294967296) "
    "% 4294967296 AS d, CASE WHEN l.pid IS NULL THEN EXISTS (SELECT 1 FROM pg_stat_activity w "
    "WHERE w.wait_event = 'SyncRep' AND w.backend_xid IS NULL) "
    "ELSE a.state IS NULL OR a.wait_event IS NOT DISTINCT FROM 'SyncRep' END AS committing "
    "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted "
    "AND (a.state IS NULL OR a.state NOT IN ('idle in transaction', "
    "'idle in transaction (aborted)'))) d"
)
"""A primary's running transactions (``PgXidFence.running``), one row each: the 64-bit
xid (32-bit xids made 64-bit next to ``xmax``) and whether it is *committing*. Every
transaction that has an xid holds an exclusive lock on it (a prepared one too, with no
backend) until after it became visible; ``pg_locks`` shows them to any user. Left out:
the xids of a backend idle in its transaction (``pg_stat_activity.state``): it is not
committing, so none of them was delivered and is still invisible (one it held when
``pg_locks`` was read but that ended before ``state`` was, is visible to the read, taken
later); without them an idle-in-transaction session would hold every floor until it
ended.

Committing (``PgXidFence.committing``): the backend waits for a synchronous standby
(``wait_event = 'SyncRep'``: its commit record is flushed, so the stream may have
delivered it, and it stays invisible until the standby answers), or its state is
unknown; a prepared transaction (no backend) iff some backend without an xid of its own
waits for the standby (a ``COMMIT PREPARED`` does; which one it commits is not shown).
One executing a statement (a batch job) or prepared and left (``PREPARE TRANSACTION``
never committed) has no commit record yet: it was not delivered. What the stream may
have delivered before the core knew (``core.fence.Delivered.forgotten``) is judged by
these, not by every running one (they held a restarted snapshot for as long as they
lived). The moments around the wait (between the commit record's flush and the wait,
and between the standby's answer and leaving the proc array) are microseconds, assumed
shorter than the stream's delivery, the core's watch and the read's request together,
as without a synchronous standby (below). Wait states of other roles' sessions need
``pg_read_all_stats`` (``stats_grant_error``).

Only read when ``synchronous_standby_names`` is set: without it no commit waits after
its record is flushed, and a commit is visible as soon as its backend leaves the proc
array, microseconds after its record was flushed (assumed shorter than the stream's
delivery, the core's watch and the read's start together)."""



def snapshot_sql(server_version: int) -> tuple[str, str]:
    """The current snapshot as ``xmin:xmax:xip`` text with 64-bit xids, and its
    ``xmax``: ``pg_current_snapshot()`` from PostgreSQL 13 on; before, the older
    ``txid_current_snapshot()`` (also 64-bit, epoch included, the same text), which
    PostgreSQL 13 deprecated but keeps."""
    if server_version >= 130000:
        return "pg_current_snapshot()", "pg_snapshot_xmax(pg_current_snapshot())"
    return "txid_current_snapshot()", "txid_snapshot_xmax(txid_current_snapshot())"


def running_sql(server_version: int) -> str:
    """``RUNNING_SQL`` with the snapshot functions of ``server_version``."""
    return RUNNING_SQL.replace("{xmax}", snapshot_sql(server_version)[1])


SYNC_COLUMNS = (
    "current_setting('synchronous_standby_names') <> '', "
    "pg_has_role('pg_read_all_stats', 'USAGE'), current_user"
)
"""Whether commits may wait for a synchronous standby, whether the role sees other
roles' wait states (``RUNNING_SQL``; superusers and ``pg_monitor`` members do), and
its name."""


def stats_grant_error(user: str) -> SourceError:
    """A fenced read on a primary with synchronous standbys, by a role that cannot see
    other roles' wait states: it could not tell a commit waiting for the standby from
    a session executing a statement, and would wait for every one of them to end."""
    return SourceError(
        f"with synchronous_standby_names set, fenced snapshot reads must tell which "
        f"sessions wait for the synchronous standby, and role {user!r} cannot see other "
        "roles' wait states (pg_stat_activity)",
        hint=f"GRANT pg_read_all_stats TO {user} (or GRANT pg_monitor TO {user}), then "
        "signal the snapshot again",
    )


def record_end(insert_lsn: int, block_size: int = 8192, segment_size: int = 16 << 20) -> int:
    """The end of the last WAL record inserted, given ``pg_current_wal_insert_lsn()``:
    at the start of a page that function skips the page header (24 bytes, 40 at a
    segment's start), where the last record's end (what the walsender reports after
    decoding it) does not."""
    if insert_lsn % segment_size == 40:
        return insert_lsn - 40
    if insert_lsn % block_size == 24:
        return insert_lsn - 24
    return insert_lsn


def _reached(reached: Position) -> int:
    if not isinstance(reached, PgPosition):
        raise TypeError(f"a PostgreSQL fence needs a PgPosition, not {reached!r}")
    return reached.ack_lsn.value


@dataclass(frozen=True, slots=True)
class PgXidFence:
    """A primary's read: its snapshot (64-bit xids) and the WAL position after it."""

    xmin: int
    xmax: int
    xip: frozenset[int]
    end_lsn: int
    running: frozenset[int] = frozenset()
    """64-bit xids running just before the read (module docstring)."""
    committing: frozenset[int] | None = None
    """Those of ``running`` that were committing (``RUNNING_SQL``); None: not known
    (every running one counts)."""

    @classmethod
    def parse(cls, snapshot: str, insert_lsn: str, running: Iterable[str | int] = (),
              committing: Iterable[str | int] | None = None) -> PgXidFence:
        """From ``pg_current_snapshot()::text``, ``pg_current_wal_insert_lsn()::text``
        and the running and committing xids (64-bit; ``RUNNING_SQL``)."""
        xmin, xmax, xip = snapshot.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x),
                   record_end(Lsn.parse(insert_lsn).value), frozenset(int(x) for x in running),
                   None if committing is None else frozenset(int(x) for x in committing))

    def full(self, xid: int) -> int:
        """A 32-bit xid from the stream as the 64-bit xid nearest to ``xmax``."""
        delta = (xid - self.xmax) % XID_SPAN
        return self.xmax + delta - (XID_SPAN if delta >= XID_SPAN // 2 else 0)

    def _sees(self, xid: int) -> bool:
        return self._sees_full(self.full(xid))

    def _sees_full(self, full: int) -> bool:
        return full < self.xmin or (full < self.xmax and full not in self.xip)

    def visible(self, event: ChangeEvent) -> bool | None:
        tx = getattr(event.position, "tx_id", None)
        return self._sees(tx) if isinstance(tx, int) else None

    def settles(self, event: ChangeEvent) -> bool:
        return self.visible(event) is True  # a visible commit stays visible

    def covers(self, floor: Floor) -> bool:
        """The read sees every transaction the stream delivered up to the floor: none
        of those it doubts was delivered by then (if the floor forgot which were: it
        sees every one that was committing)."""
        if floor.forgotten:
            return not self.in_commit()
        return self.in_doubt().isdisjoint(floor.xids)

    def in_doubt(self) -> frozenset[int]:
        """The running transactions (as 32-bit stream xids) the read does not see."""
        return frozenset(x & (XID_SPAN - 1) for x in self.running if not self._sees_full(x))

    def in_commit(self) -> frozenset[int]:
        """Of ``in_doubt``, those that were committing (``RUNNING_SQL``): the only
        ones the stream may have delivered before the read was requested."""
        if self.committing is None:
            return self.in_doubt()
        return frozenset(x & (XID_SPAN - 1) for x in self.committing if not self._sees_full(x))

    def sees_tx(self, tx: int) -> bool:
        return self._sees(tx)

    def settles_lost(self, lost: Lost) -> bool:
        """The read sees every lost event's transaction: judged by their own xids (or,
        past ``LOST_XIDS``, their range: below ``xmax`` and no running one inside it).
        Not by ``xmin``: an open transaction that was never delivered (idle in
        transaction, an orphaned prepared one) holds ``xmin`` below them for as long
        as it lives. Only an old state without ids or range falls back to ``xmin``."""
        if lost.max_tx is None:
            return False
        if lost.xids is not None:
            return all(self._sees(x) for x in lost.xids)
        high = self.full(lost.max_tx)
        if lost.min_tx is None:
            return high < self.xmin
        low = self.full(lost.min_tx)
        return low <= high < self.xmax and not any(low <= x <= high for x in self.xip)

    def passed(self, reached: Position) -> bool:
        return _reached(reached) >= self.end_lsn


@dataclass(frozen=True, slots=True)
class PgLsnFence:
    """A hot standby's read: replayed before it (``low_lsn``), received after (``end_lsn``)."""

    low_lsn: int
    end_lsn: int

    def visible(self, event: ChangeEvent) -> bool | None:
        position = event.position
        if not isinstance(position, PgPosition):
            return None
        return True if position.commit_lsn.value < self.low_lsn else None

    def settles(self, event: ChangeEvent) -> bool:
        return self.visible(event) is True  # replay never goes back

    def covers(self, floor: Floor) -> bool:
        """The standby had replayed the floor's commit record (and so every earlier
        one) before the read: a lagging standby does not, and its rows may predate
        commits the stream delivered long ago."""
        return floor.position is not None and self._replayed(floor.position)

    def _replayed(self, position: Position) -> bool:
        return isinstance(position, PgPosition) and position.commit_lsn.value < self.low_lsn

    def in_doubt(self) -> None:
        return None

    def in_commit(self) -> None:
        return None

    def sees_tx(self, tx: int) -> bool:
        return False

    def settles_lost(self, lost: Lost) -> bool:
        last = lost.last_position
        return last is not None and self._replayed(last)

    def passed(self, reached: Position) -> bool:
        return _reached(reached) >= self.end_lsn
