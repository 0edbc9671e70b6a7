"""Where a MySQL/MariaDB capture resumes, and what it drops there, IO-free: after a
checkpoint ``plan_resume`` decides (the checkpoint's position and what is known of the
server in, a plan out), after a lost connection ``plan_reconnect`` (where the stream
stood in, a plan out); ``Delivered`` applies a plan's drop rules to the items read
again. ``MySqlLogSource`` checks a plan against the server and starts its dump.

The rules are ``position.py``'s resume invariants:

- with a GTID state (the server has GTIDs and the checkpoint a non-empty state of its
  flavour): a GTID dump of every transaction after the state, in epoch ``p.epoch + 1``,
  dropping the already-logged part (index ``<= p.index``) of transaction ``p.gtid``
  only; MySQL may start reading at the checkpoint's coordinates when the checkpoint
  recorded the server its epoch's dump read (``dumpstart``), MariaDB never needs to;
- otherwise: a dump of ``p.file`` from ``p.pos`` (the start of ``p``'s transaction,
  never below 4, the first event after the file header) on the same server, in epoch
  ``p.epoch``, dropping every item at or below ``p``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydblog.events import RowRun
from pydblog.sources.mysql import dumpstart
from pydblog.sources.mysql.dumpstart import DumpStart
from pydblog.sources.mysql.gtid import GtidState
from pydblog.sources.mysql.position import BinlogPosition, OpenTx

FIRST_EVENT = 4
"""The offset of a binlog file's first event (after its 4-byte magic number)."""


@dataclass(frozen=True)
class GtidResume:
    """Ask the server for every transaction after ``state``."""

    state: GtidState
    epoch: int
    """The epoch of every position yielded (one above the checkpoint's)."""
    skip_tx: Mapping[str, int]
    """GTID -> drop that transaction's items up to this index (its logged part)."""
    delivered: BinlogPosition | None
    """The checkpoint's position when nothing of it is read again (a checkpoint between
    transactions: the stream has delivered its state already); None otherwise."""
    start: DumpStart | None
    """Where a MySQL dump may start reading (``dumpstart``); None: the server finds it."""


@dataclass(frozen=True)
class FileResume:
    """Read ``file`` from ``offset`` on the server that wrote the checkpoint."""

    file: str
    offset: int
    epoch: int
    skip_upto: BinlogPosition | None
    """Drop every item at or below this position (already logged); None: nothing."""
    state: GtidState | None
    """The GTID state at ``offset`` as far as the checkpoint knows it (an empty state);
    None: ask the server."""


def plan_resume(
    pos: BinlogPosition, state: GtidState | None, *, mariadb: bool, dump_record: Any
) -> GtidResume | FileResume:
    """Where to resume after ``pos``, the checkpoint's position. ``state``: its GTID
    state in the server's flavour, None where the server has no GTIDs; ``dump_record``:
    the checkpoint's record of the server its epoch's dump read (``DUMP_SERVER_KEY``)."""
    if state:
        start = None if mariadb else dumpstart.from_record(
            dump_record, pos.epoch, pos.file, pos.pos, pos.gtid
        )
        return GtidResume(
            state=state,
            epoch=pos.epoch + 1,
            skip_tx={pos.gtid: pos.index} if pos.gtid else {},
            delivered=None if pos.gtid else pos,
            start=start,
        )
    return FileResume(
        file=pos.file,
        offset=max(pos.pos, FIRST_EVENT),
        epoch=pos.epoch,
        skip_upto=pos,
        state=state,
    )


@dataclass(slots=True)
class Delivered:
    """What a resume drops again (module docstring): every item at or below ``upto``
    (a file resume, until an item above it passes), and the items of transaction ``g``
    at index ``<= tx[g]`` (GTID resumes: kept across reconnects, GTIDs are unique, so a
    reconnect before the resumed transaction was read again still drops its logged
    part). ``last`` is the last position let through."""

    upto: BinlogPosition | None = None
    tx: dict[str, int] = field(default_factory=dict)
    last: BinlogPosition | None = None

    def drop(self, pos: Any) -> bool:
        """Whether the item at ``pos`` (None: an item without a position, never
        dropped) was delivered already; else it is the last delivered one."""
        if pos is None:
            return False
        if self.upto is not None:
            if pos <= self.upto:
                return True
            self.upto = None
        if isinstance(pos, BinlogPosition):
            # GTIDs are unique: only the resumed transaction's logged part matches.
            limit = self.tx.get(pos.gtid) if pos.gtid else None
            if limit is not None and pos.index <= limit:
                return True
            self.last = pos
        return False

    def run(self, run: RowRun) -> RowRun | None:
        """``run`` without the events ``drop`` drops (None: all of them), moving on as
        ``drop`` of each of its events in turn would."""
        first = run.first
        if self.upto is None and (not first.gtid or first.gtid not in self.tx):
            self.last = first.with_index(first.index + run.size - 1)  # (nothing to drop)
            return run
        dropped = None
        for i in range(run.size):
            pos = first.with_index(first.index + i)
            if not self.drop(pos):
                break
            dropped = pos
        rest = run if dropped is None else run.past(dropped)
        if rest is not None:
            self.last = first.with_index(first.index + run.size - 1)
        return rest

    def logged(self, pos: BinlogPosition) -> bool:
        """``drop``'s rule without moving on: whether ``pos`` is at or below what a
        resume already logged."""
        if self.upto is not None and pos <= self.upto:
            return True
        limit = self.tx.get(pos.gtid) if pos.gtid else None
        return limit is not None and pos.index <= limit

    def pending(self, state: GtidState | None) -> bool:
        """Whether a GTID resume's transaction (whose logged part is dropped) is not in
        ``state`` (the stream's, None: unknown) yet, i.e. not read yet."""
        if not self.tx:
            return False
        return state is None or not all(state.covers(g) for g in self.tx)


@dataclass(frozen=True)
class StreamAt:
    """Where a binlog stream stood when its dump was lost."""

    gtid_mode: bool
    """The server writes GTIDs for every transaction."""
    mariadb: bool
    epoch: int
    file: str
    last_end: int
    """The end of the last event read in ``file`` (the next event's start)."""
    gtids: GtidState | None
    """The GTID state after the last GTID event read (None: unknown)."""
    tx: OpenTx | None
    """The transaction being read, if any."""
    last_done: BinlogPosition | None
    """The last finished transaction's ``Commit`` position (or a start's)."""
    server_uuid: str | None
    """The server a MySQL GTID dump read (None: not known, or not such a dump)."""


def plan_reconnect(at: StreamAt, delivered: Delivered) -> GtidResume | FileResume:
    """Where to reopen a lost dump: at the start of the open transaction (or after the
    last one), by GTID where the state there is known and not empty (a new epoch;
    MySQL cannot ask for "everything"), else by coordinates on the same server. What
    was delivered stays dropped: the open transaction's delivered part, and whatever a
    resume had not passed yet (``delivered``)."""
    tx, last, pending = at.tx, delivered.last, delivered.upto
    state: GtidState | None = None
    skip: tuple[str, int] | None = None
    if at.gtid_mode:
        if tx is None:
            state = at.gtids
        elif tx.gtids is not None and tx.gtid:
            done = last.index if last is not None and last.gtid == tx.gtid else -1
            state, skip = tx.gtids, (tx.gtid, done)
    if state:
        skip_tx = dict(delivered.tx)
        for s in (skip, (pending.gtid, pending.index) if pending and pending.gtid else None):
            if s is not None:
                skip_tx[s[0]] = max(skip_tx.get(s[0], -1), s[1])
        return GtidResume(
            state=state,
            epoch=at.epoch + 1,
            skip_tx=skip_tx,
            delivered=None,
            start=_reconnect_start(at),
        )
    file, offset = (tx.file, tx.start) if tx is not None else (at.file, at.last_end)
    return FileResume(
        file=file,
        offset=offset,
        epoch=at.epoch,
        skip_upto=max((p for p in (pending, last) if p is not None), default=None),
        state=tx.gtids if tx is not None else at.gtids,
    )


def _reconnect_start(at: StreamAt) -> DumpStart | None:
    """MySQL: where a reconnect's GTID dump may start reading (``dumpstart``): the open
    transaction's start, else the last finished one's (its GTID is in the resume state,
    so the server skips it), in the lost dump's binlog."""
    if at.mariadb or at.server_uuid is None:
        return None
    pos = at.tx.position(0) if at.tx is not None else at.last_done
    if pos is None or not pos.gtid or pos.epoch != at.epoch:
        return None
    return DumpStart(pos.file, pos.pos, pos.gtid, at.server_uuid)
