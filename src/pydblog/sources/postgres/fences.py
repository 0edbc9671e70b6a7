"""PostgreSQL read fences: what a read-only chunk's SELECT saw, in the stream's terms.

See ``core.fence`` for the protocol and docs/snapshots.md for the whole argument. The
reader takes, for each chunk, in one REPEATABLE READ transaction (the SELECT and the
first statement share its snapshot S):

- on a primary (``PgXidFence``): ``pg_current_snapshot()`` (S as ``xmin:xmax:xip``) and,
  evaluated after S was taken, ``pg_current_wal_insert_lsn()``. A transaction is
  visible in S iff its xid is below ``xmin``, or below ``xmax`` and not in ``xip``; a
  visible transaction's commit record was inserted before it became visible, so before
  S, so it ends at or before that insert position. The stream has delivered every such
  transaction once it reports a position at or past it.
- on a hot standby (``PgLsnFence``; its snapshots list running transactions outside
  ``xip``, so xids cannot decide): ``pg_last_wal_replay_lsn()`` *before* the
  transaction (``low``) and ``pg_last_wal_receive_lsn()`` after the SELECT (``end``).
  A standby's snapshot sees exactly the commits replayed before it was taken. A commit
  record that starts before ``low`` was replayed before S (``low`` is a replayed
  record's end, records do not straddle it): visible. Any other may or may not be: the
  row's key is dropped (always safe). The standby replays only WAL it has received and
  flushed, so every commit S saw ends at or before ``end``. The core trusts a standby's
  fence only once ``low`` is past every commit the stream delivered before the table's
  snapshot began (``covers``; ``core.fence.Floor``): the standby may lag the stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydblog.core.fence import Lost
from pydblog.events import ChangeEvent
from pydblog.positions import Lsn, PgPosition, Position

XID_SPAN = 1 << 32


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

    @classmethod
    def parse(cls, snapshot: str, insert_lsn: str) -> PgXidFence:
        """From ``pg_current_snapshot()::text`` and ``pg_current_wal_insert_lsn()::text``."""
        xmin, xmax, xip = snapshot.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x),
                   record_end(Lsn.parse(insert_lsn).value))

    def full(self, xid: int) -> int:
        """A 32-bit xid from the stream as the 64-bit xid nearest to ``xmax``."""
        delta = (xid - self.xmax) % XID_SPAN
        return self.xmax + delta - (XID_SPAN if delta >= XID_SPAN // 2 else 0)

    def _sees(self, xid: int) -> bool:
        full = self.full(xid)
        return full < self.xmin or (full < self.xmax and full not in self.xip)

    def visible(self, event: ChangeEvent) -> bool | None:
        tx = getattr(event.position, "tx_id", None)
        return self._sees(tx) if isinstance(tx, int) else None

    def settles(self, event: ChangeEvent) -> bool:
        return self.visible(event) is True  # a visible commit stays visible

    def covers(self, position: Position) -> bool:
        """Assumed on a primary: a commit the stream delivered before the table was
        watched is visible by the time a chunk is read (not proven while a commit waits
        for a synchronous standby: see docs/snapshots.md, read-only limits)."""
        return True

    def settles_lost(self, lost: Lost) -> bool:
        return lost.max_tx is not None and self.full(lost.max_tx) < self.xmin

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

    def covers(self, position: Position) -> bool:
        """The standby had replayed ``position``'s commit record (and so every earlier
        one) before the read: a lagging standby does not, and its rows may predate
        commits the stream delivered long ago."""
        return isinstance(position, PgPosition) and position.commit_lsn.value < self.low_lsn

    def settles_lost(self, lost: Lost) -> bool:
        last = lost.last_position
        return last is not None and self.covers(last)

    def passed(self, reached: Position) -> bool:
        return _reached(reached) >= self.end_lsn
