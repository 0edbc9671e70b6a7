"""Binlog positions: ``(binlog file, transaction start offset, index in transaction)``.

Invariants:
- Ordering is by ``(file sequence number, pos, index)``. ``pos`` is the byte offset in
  ``file`` where the event's *transaction* starts (its GTID event, or ``BEGIN`` where GTIDs
  are off), so every event of one transaction shares ``(file, pos)`` and differs by
  ``index`` (0-based, in binlog order). Within one server's binlog this is a total order.
- The ``Commit`` of a transaction with ``n`` captured events is at index ``n``: above all of
  its events, below every event of the next transaction (which starts at a larger offset
  or in a later file).
- Index ``-1`` marks "before anything at this offset": the position where a fresh capture
  begins (a ``Heartbeat``), below every event of a transaction starting there.
- Resuming "after position p" means: restart the binlog dump at ``(p.file, p.pos)`` (the
  start of p's transaction) and drop every item at or below ``p``.
- ``gtid`` is the transaction's GTID as the server prints it (MariaDB ``domain-server-seq``,
  MySQL ``uuid:n``), or None where GTIDs are off. It is carried for the envelope and for
  operators; it does not take part in ordering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydblog.positions import register_position


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
    file: str
    pos: int
    index: int = 0
    gtid: str | None = None

    def _key(self) -> tuple[int, int, int]:
        return (file_sequence(self.file), self.pos, self.index)

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
        return BinlogPosition(self.file, self.pos, index, self.gtid)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "file": self.file,
            "pos": self.pos,
            "i": self.index,
        }
        if self.gtid is not None:
            out["gtid"] = self.gtid
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(str(data["file"]), int(data["pos"]), int(data.get("i", 0)), data.get("gtid"))

    def source_fields(self) -> dict[str, Any]:
        return {"file": self.file, "pos": self.pos, "gtid": self.gtid, "index": self.index}

    def __str__(self) -> str:
        gtid = f" gtid {self.gtid}" if self.gtid else ""
        return f"{self.file}:{self.pos}#{self.index}{gtid}"


register_position(BinlogPosition)
