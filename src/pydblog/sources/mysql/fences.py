"""MySQL/MariaDB read fences: what a read-only chunk's snapshot saw, as GTID sets.

See ``core.fence`` for the protocol and docs/snapshots.md for the whole argument. A
``GtidFence`` is two GTID states of the server the chunk was read on:

- ``low``: every transaction in it is visible to the read (``visible`` is True);
- ``high``: every transaction visible to the read is in it (the rows are emitted once
  the stream has delivered all of ``high``: ``passed``).

A transaction in neither, or in ``high`` only, is "not known visible": its events drop
their keys from the chunk (always safe: the event and every later one of that key are
in the log). The stream judges by the GTIDs of its own positions: an event's ``gtid``,
and a position's state after its transaction (``BinlogPosition.after_state``, exact
from where capture began, across restarts and failovers: GTIDs name a transaction on
every server that holds it).

How the reader takes them (``sources.mysql.fenced``), in one REPEATABLE READ
transaction on one connection:

- **MySQL** (``gtid_mode = ON``): ``low = @@GLOBAL.gtid_executed`` read *before*
  ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` (which creates the read view), and
  ``high = @@GLOBAL.gtid_owned`` then ``@@GLOBAL.gtid_executed`` read *after* it (their
  union). MySQL commits in three steps, in this order: the binlog write (the GTID is
  then *owned*), the engine commit (the rows become visible), then the GTID moves from
  owned to ``gtid_executed`` (``Gtid_state::update_commit_group`` after
  ``ha_commit_low``, under one lock). So a GTID in ``gtid_executed`` is committed in
  the engine, and visible to any read view created later: ``low`` is safe. A
  transaction visible to the view was committed in the engine before it, so at the
  later read of ``gtid_owned`` its GTID is still owned or already executed, and if it
  leaves owned before the read of ``gtid_executed`` it is in that: ``high`` holds it.
  (``gtid_executed`` alone would not do: the moment between engine commit and the
  GTID update is where a visible transaction is missing from it.)
- **MariaDB**: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` records the binlog
  position ``P`` of its snapshot (``Binlog_snapshot_file`` / ``_position``): MariaDB
  commits in binlog order and takes the snapshot between two commits, so the snapshot
  sees exactly the transactions written before ``P``. ``@@gtid_binlog_pos`` moves when
  the binlog is written (before the engine commit), so: ``low`` = ``@@gtid_binlog_pos``
  read before the binlog's end ``E`` (``SHOW MASTER STATUS``), both before the snapshot,
  and used only if ``P >= E`` (then every transaction in ``low`` is before ``P``:
  visible; else the reads are taken again, and in the end ``low`` is empty); ``high`` =
  ``@@gtid_binlog_pos`` read after the snapshot (a visible transaction was written
  before ``P``, so before that read).

Per key the stream's order is the commit order the window argument needs: a second
writer of a row waits for the first one's row lock, which is held until the first
one's engine commit, after its binlog write; so the second is written to the binlog
later, and cannot be visible without the first.

MariaDB judges a GTID ``d-s-n`` by its domain's sequence number (``d-s'-m`` in the
state covers it iff ``m >= n``): exact where sequence numbers grow in binlog order
within each domain (``gtid_strict_mode`` enforces it; it is what a single primary, or
replication without conflicting writers in one domain, produces).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from pydblog.core.fence import Floor, Lost
from pydblog.events import ChangeEvent
from pydblog.positions import Position
from pydblog.sources.mysql.gtid import GtidState, MySqlGtidSet
from pydblog.sources.mysql.position import BinlogPosition

log = logging.getLogger(__name__)
_OWNER = re.compile(r"#\d+")
_warned = False  # (``_warn_unjudged``: once a process)


def parse_owned(text: str) -> MySqlGtidSet:
    """``@@GLOBAL.gtid_owned`` (``uuid:5#12:7#9,…``: each GTID with its owner thread) as
    a GTID set."""
    return MySqlGtidSet.parse(_OWNER.sub("", text))


def union(a: MySqlGtidSet, b: MySqlGtidSet) -> MySqlGtidSet:
    return MySqlGtidSet.parse(f"{a},{b}")


def _after(position: Position) -> GtidState | None:
    if not isinstance(position, BinlogPosition):
        raise TypeError(f"a GTID fence needs a BinlogPosition, not {position!r}")
    return position.after_state()


def _warn_unjudged(position: Position) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "snapshot reads are not fenced against the changes the stream delivered up to "
            "%s: that position has no GTID state (it was captured with gtid_mode = OFF, or "
            "is a legacy checkpoint), so a snapshot row can be older than such a change "
            "(docs/exactness.md); reads are fenced again from positions with GTID state on",
            position,
        )


def _le(a: GtidState, b: GtidState | None) -> bool:
    return b is not None and a.flavour == b.flavour and a <= b


@dataclass(frozen=True, slots=True)
class GtidFence:
    """A read's GTID fence (see the module docstring): ``low`` visible to it, ``high``
    holding everything visible to it. Both of one flavour."""

    low: GtidState
    high: GtidState

    def __post_init__(self) -> None:
        if self.low.flavour != self.high.flavour or not _le(self.low, self.high):
            raise ValueError(f"not a GTID fence: low {self.low} is not within high {self.high}")

    def visible(self, event: ChangeEvent) -> bool | None:
        gtid = getattr(event.position, "gtid", None)
        if not gtid:
            return None  # no GTID: cannot tell (the key is dropped)
        if self.low.covers(gtid):
            return True
        return None if self.high.covers(gtid) else False

    def settles(self, event: ChangeEvent) -> bool:
        return self.visible(event) is True  # committed stays committed

    def covers(self, floor: Floor) -> bool:
        """The stream's state after the floor's transaction holds every GTID it
        delivered up to there: within ``low``, all of them are visible for good. A
        floor without GTID state is not judged (``_holds``)."""
        return floor.position is not None and self._holds(floor.position)

    def _holds(self, position: Position) -> bool:
        """``position``'s state after its transaction is within ``low``. A position
        without GTID state (a legacy checkpoint, a capture begun with gtid_mode = OFF,
        a file resume MariaDB could not place: ``BINLOG_GTID_POS`` NULL) cannot be
        judged by any fence, and the stream paused by a blocking snapshot delivers no
        later one: holding reads back for it would stall the capture for good. It is
        let through unfenced, with a warning."""
        if not isinstance(position, BinlogPosition):
            return False
        after = position.after_state()
        if after is None:
            _warn_unjudged(position)
            return True
        return _le(after, self.low)

    def in_doubt(self) -> None:
        return None

    def in_commit(self) -> None:
        return None

    def sees_tx(self, tx: int) -> bool:
        return False

    def settles_lost(self, lost: Lost) -> bool:
        """The newest forgotten event's state after its transaction holds every earlier
        one's GTID: within ``low``, all of them are visible for good."""
        last = lost.last_position
        return last is not None and self._holds(last)

    def passed(self, reached: Position) -> bool:
        return _le(self.high, _after(reached))


class Unfenced:
    """The fence of a blocking read that could not be fenced: MySQL whose ``gtid_mode``
    was lowered from ON after ``dblog run`` started (``fences_blocking_reads`` said yes
    then). It claims the read saw everything, so the blocking read is decided as an
    unfenced one (what a capture begun with ``gtid_mode = OFF`` does; docs/exactness.md,
    "Not covered"), instead of rejecting the table. Never used for read-only or fenced
    watermark chunks: those need GTIDs."""

    __slots__ = ()

    def visible(self, event: ChangeEvent) -> bool | None:
        return True

    def settles(self, event: ChangeEvent) -> bool:
        return True

    def covers(self, floor: Floor) -> bool:
        return True

    def in_doubt(self) -> None:
        return None

    def in_commit(self) -> None:
        return None

    def sees_tx(self, tx: int) -> bool:
        return False

    def settles_lost(self, lost: Lost) -> bool:
        return True

    def passed(self, reached: Position) -> bool:
        return True

    def __repr__(self) -> str:
        return "Unfenced()"


UNFENCED = Unfenced()
