"""Binlog positions: ``(epoch, binlog file, transaction start offset, index in transaction)``,
with the GTID state that lets another server resume there.

Ordering invariants:
- Ordering is by ``(epoch, file sequence number, pos, index)``. ``pos`` is the byte offset
  in ``file`` where the event's *transaction* starts (its GTID event, or ``BEGIN`` where
  GTIDs are off), so every event of one transaction shares ``(file, pos)`` and differs by
  ``index`` (0-based, in binlog order). Within one server's binlog and one epoch this is a
  total order that follows commit order.
- ``epoch`` counts the GTID resumes in this change log's history. Binlog coordinates mean
  something on one server only: a replica promoted to primary has other file names and
  offsets. So every time the source resumes *by GTID* (after a restart, a failover, or a
  lost connection) it yields positions of the next epoch, which sort above everything
  logged before, whatever that server's coordinates are. Within an epoch every position
  comes from one binlog dump, so coordinates are comparable. ``epoch`` is 0 for file
  resumes and for change logs written before GTID resume existed.
- The ``Commit`` of a transaction with ``n`` captured events is at index ``n``: above all
  of its events, below every event of the next transaction (which starts at a larger
  offset or in a later file).
- Index ``BEFORE_TX`` (a large negative number; ``-1`` in logs written before it) marks
  "before anything at this offset": the position where a fresh capture begins (a
  ``Heartbeat``), below every event of a transaction starting there. It leaves room for
  rows placed after it (``base.index + 1 + k``: a read-only or blocking snapshot of an
  idle database right after a fresh start) below that transaction's index 0.

GTID invariants:
- ``gtid`` is the transaction's GTID as the server prints it (MariaDB ``domain-server-seq``,
  MySQL ``uuid:n``), or None where GTIDs are off (or at a fresh start's ``BEFORE_TX``).
- ``gtids`` is the server's GTID state *before* this position's transaction (MariaDB: one
  GTID per domain, like ``gtid_binlog_pos``; MySQL: the executed GTID set), or None where
  it is not known (GTIDs off; a MySQL log written before GTID resume). The state *after*
  the transaction is ``after_state()`` (= ``gtids.advance(gtid)``). It does not take part
  in ordering.

Resume invariants ("continue after position p"):
- With ``p.gtids`` (and a server with GTIDs): ask the server for every transaction after
  ``p.gtids`` (the server, not the coordinates, decides where that is: exact on any server
  holding these transactions) and drop the items of transaction ``p.gtid`` at index
  ``<= p.index`` (its already-logged part; at a ``Commit`` position that is all of it).
  Items of other transactions are never dropped: the server sends only transactions not
  in ``p.gtids``, and among those only ``p.gtid`` can have been logged already. Resuming
  from the state *before* the transaction (rather than after) is what makes one rule exact
  for a checkpoint inside a transaction, at its end, and at snapshot rows placed after a
  watermark inside it. Everything yielded is in epoch ``p.epoch + 1``, so the runner's own
  ``<= checkpoint`` filter drops nothing of it.
- Without ``p.gtids``: restart the binlog dump at ``(p.file, p.pos)`` (the start of p's
  transaction) on the same server and drop every item at or below ``p``; positions stay
  in ``p.epoch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydblog.positions import register_position
from pydblog.sources.mysql.gtid import GtidState, parse_gtid_state

BEFORE_TX = -(1 << 62)
"""The index of a position before every event of the transaction at its offset."""


def file_sequence(name: str) -> int:
    """The numeric suffix of a binlog file name (``mariadb-bin.000012`` -> 12)."""
    _, _, suffix = name.rpartition(".")
    try:
        return int(suffix)
    except ValueError:
        raise ValueError(
            f"not a binlog file name: {name!r} (expected e.g. 'binlog.000001')"
        ) from None


@dataclass(frozen=True, eq=False, slots=True)
class BinlogPosition:
    """An event's place in a MySQL/MariaDB binlog (see the module docstring)."""

    kind: ClassVar[str] = "mysql"
    commit_time_unit_ms: ClassVar[int] = 1000  # the binlog stamps whole seconds
    file: str
    pos: int
    index: int = 0
    gtid: str | None = None
    gtids: GtidState | None = None
    epoch: int = 0

    def _key(self) -> tuple[int, int, int, int]:
        return (self.epoch, file_sequence(self.file), self.pos, self.index)

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        return self._key() < other._key()

    def __le__(self, other: Any) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        return self._key() <= other._key()

    def __gt__(self, other: Any) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        return self._key() > other._key()

    def __ge__(self, other: Any) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        return self._key() >= other._key()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BinlogPosition):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def with_index(self, index: int) -> BinlogPosition:
        return BinlogPosition(self.file, self.pos, index, self.gtid, self.gtids, self.epoch)

    def after_state(self) -> GtidState | None:
        """The GTID state once this position's transaction is complete."""
        if self.gtids is None:
            return None
        return self.gtids.advance(self.gtid) if self.gtid else self.gtids

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "file": self.file,
            "pos": self.pos,
            "i": self.index,
        }
        if self.gtid is not None:
            out["gtid"] = self.gtid
        if self.gtids is not None:
            out["gtids"] = str(self.gtids)
        if self.epoch:
            out["e"] = self.epoch
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        state = data.get("gtids")
        return cls(
            str(data["file"]),
            int(data["pos"]),
            int(data.get("i", 0)),
            data.get("gtid"),
            parse_gtid_state(str(state)) if state is not None else None,
            int(data.get("e", 0)),
        )

    def source_fields(self) -> dict[str, Any]:
        return {"file": self.file, "pos": self.pos, "gtid": self.gtid, "index": self.index}

    @property
    def tx_key(self) -> tuple[str, int, str | None]:
        """What ``source_fields`` holds besides ``index``: equal for every event of one
        transaction (``events.encode_event`` keeps their envelope text by it)."""
        return (self.file, self.pos, self.gtid)

    def __str__(self) -> str:
        gtid = f" gtid {self.gtid}" if self.gtid else ""
        after = self.after_state()
        state = f" (GTID state after its transaction: {after})" if after is not None else ""
        epoch = f" epoch {self.epoch}" if self.epoch else ""
        return f"{self.file}:{self.pos}#{self.index}{gtid}{epoch}{state}"


register_position(BinlogPosition)


@dataclass(slots=True)
class OpenTx:
    """The transaction being read: its rows are at ``position(0 .. count - 1)``, its
    ``Commit`` at ``position(count)``."""

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
    xa: list[Any] | None = None

    def position(self, index: int) -> BinlogPosition:
        return BinlogPosition(self.file, self.start, index, self.gtid, self.gtids, self.epoch)
