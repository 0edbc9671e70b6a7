"""Source positions as ordered, serializable types.

Invariants:
- Every change event has a position, and positions are totally ordered within one
  source: ``a < b`` iff ``a`` was committed before ``b`` (or comes first in the same
  transaction).
- ``encode`` / ``decode_position`` round-trip exactly; the encoded form is what the
  change log and the state store persist.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self

import orjson


@dataclass(frozen=True, order=True, slots=True)
class Lsn:
    """A PostgreSQL WAL location (a 64-bit byte position), printed as ``X/Y``."""

    value: int

    @classmethod
    def parse(cls, text: str) -> Lsn:
        hi, _, lo = text.partition("/")
        if not lo:
            raise ValueError(f"not an LSN: {text!r} (expected e.g. '16/B374D848')")
        return cls((int(hi, 16) << 32) | int(lo, 16))

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __int__(self) -> int:
        return self.value

    def __sub__(self, other: Lsn) -> int:
        return self.value - other.value


class Position(Protocol):
    """What every source position offers: ordering, persistence, envelope fields."""

    kind: ClassVar[str]

    def __lt__(self, other: Any, /) -> bool: ...
    def __le__(self, other: Any, /) -> bool: ...

    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self: ...

    def source_fields(self) -> dict[str, Any]:
        """Fields this position contributes to an event's ``source`` block."""
        ...

    def with_index(self, index: int) -> Self:
        """The same place in the log with another index in its transaction (snapshot
        rows are placed right after their watermark this way)."""
        ...


@dataclass(frozen=True, eq=False, slots=True)
class PgPosition:
    """``(commit_lsn, index)``: an event's place in PostgreSQL's commit order.

    ``index`` is the event's 0-based index in its transaction. pgoutput delivers whole
    transactions in commit order, so this is a total order. Snapshot rows take their
    high watermark's commit LSN and the index after it. ``end_lsn`` (the LSN just past
    the commit record, what the slot is acknowledged with) is carried but not compared.
    """

    kind: ClassVar[str] = "pg"
    commit_time_unit_ms: ClassVar[int] = 1  # commit times: milliseconds
    commit_lsn: Lsn
    index: int = 0
    end_lsn: Lsn | None = None
    tx_id: int | None = None

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, PgPosition):
            return NotImplemented
        return (self.commit_lsn.value, self.index) < (other.commit_lsn.value, other.index)

    def __le__(self, other: Any) -> bool:
        if not isinstance(other, PgPosition):
            return NotImplemented
        return (self.commit_lsn.value, self.index) <= (other.commit_lsn.value, other.index)

    def __gt__(self, other: Any) -> bool:
        if not isinstance(other, PgPosition):
            return NotImplemented
        return (self.commit_lsn.value, self.index) > (other.commit_lsn.value, other.index)

    def __ge__(self, other: Any) -> bool:
        if not isinstance(other, PgPosition):
            return NotImplemented
        return (self.commit_lsn.value, self.index) >= (other.commit_lsn.value, other.index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PgPosition):
            return NotImplemented
        return (self.commit_lsn.value, self.index) == (other.commit_lsn.value, other.index)

    def __hash__(self) -> int:
        return hash((self.commit_lsn.value, self.index))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "lsn": self.commit_lsn.value, "i": self.index}
        if self.end_lsn is not None:
            out["end"] = self.end_lsn.value
        if self.tx_id is not None:
            out["tx"] = self.tx_id
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        end = data.get("end")
        return cls(
            Lsn(int(data["lsn"])),
            int(data.get("i", 0)),
            Lsn(int(end)) if end is not None else None,
            data.get("tx"),
        )

    def source_fields(self) -> dict[str, Any]:
        return {"lsn": self.commit_lsn.value, "txId": self.tx_id, "index": self.index}

    def with_index(self, index: int) -> PgPosition:
        return PgPosition(self.commit_lsn, index, self.end_lsn, self.tx_id)

    @property
    def ack_lsn(self) -> Lsn:
        """The LSN up to which the slot may be confirmed once this event is durable."""
        return self.end_lsn if self.end_lsn is not None else self.commit_lsn


_KINDS: dict[str, type[Any]] = {"pg": PgPosition}
_MODULES = {"mysql": "pydblog.sources.mysql.position"}
"""Where the other sources' position types live: imported (and so registered) on the
first decode of their kind, so a process that reads a change log without opening the
source (`dblog tail`/`status`/`snapshot --wait`, the sync's readers of a Kafka log,
whose commits carry checkpoints) decodes them too."""


def register_position(cls: type[Any]) -> type[Any]:
    """Register another source's position type for ``decode_position``."""
    _KINDS[cls.kind] = cls
    return cls


def encode_position(pos: Position) -> str:
    return orjson.dumps(pos.to_json()).decode()


def decode_position(text: str | bytes | dict[str, Any]) -> Position:
    data = text if isinstance(text, dict) else orjson.loads(text)
    kind = data.get("kind") if isinstance(data, dict) else None
    module = _MODULES.get(kind) if isinstance(kind, str) else None
    if module is not None and kind not in _KINDS:
        importlib.import_module(module)  # registers its kind
    try:
        cls = _KINDS[data["kind"]]
    except KeyError as exc:
        raise ValueError(f"unknown position kind in {data!r}") from exc
    pos: Position = cls.from_json(data)
    return pos
