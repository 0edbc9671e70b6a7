"""The small interfaces the parts of pydblog talk through.

Commit order (the correctness contract, invariant 5 of the architecture):

1. ``ChangeLogWriter.append(events, checkpoint)`` commits the events *and* the
   checkpoint that describes them (source position, snapshot progress) atomically
   and durably;
2. ``StateStore.save(checkpoint)`` then records the same checkpoint;
3. only then is the source acknowledged (slot ``flush_lsn``, binlog position).

A crash between 1 and 2 is repaired at start: the newer of the change log's and the
state store's checkpoint wins. Events at or below the checkpoint's position are
skipped when the source sends them again, so each lands in the change log once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from pydblog.events import EncodedEvent
from pydblog.positions import Position, decode_position, encode_position


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where capture stands: the last source position logged (or acknowledged, for
    heartbeats), and the opaque snapshot progress stored with it."""

    position: Position | None
    snapshot: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "position": self.position.to_json() if self.position is not None else None,
                "snapshot": self.snapshot,
                "extra": self.extra,
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes | str) -> Checkpoint:
        data = orjson.loads(raw)
        pos = data.get("position")
        return cls(
            decode_position(pos) if pos is not None else None,
            data.get("snapshot"),
            data.get("extra") or {},
        )

    def is_newer_than(self, other: Checkpoint | None) -> bool:
        if other is None or other.position is None:
            return self.position is not None
        if self.position is None:
            return False
        return bool(other.position < self.position)

    def position_text(self) -> str | None:
        return encode_position(self.position) if self.position is not None else None


@dataclass(frozen=True, slots=True)
class LogRecord:
    offset: int
    table: str
    op: str
    ts_ms: int
    body: bytes


class ChangeLogWriter(Protocol):
    def append(self, events: Sequence[EncodedEvent], checkpoint: Checkpoint) -> int:
        """Durably append ``events`` and ``checkpoint`` in one commit.

        Returns the next offset (one past the last written). Offsets are dense and
        assigned in the order given.
        """
        ...

    def last_checkpoint(self) -> Checkpoint | None: ...

    def close(self) -> None: ...


class ChangeLogReader(Protocol):
    def read(
        self, from_offset: int, limit: int, tables: Sequence[str] | None = None
    ) -> list[LogRecord]:
        """Records with ``offset >= from_offset`` in offset order, at most ``limit``."""
        ...

    def first_offset(self) -> int: ...

    def next_offset(self) -> int:
        """One past the last committed offset (0 for an empty log)."""
        ...

    def follow(
        self, from_offset: int, poll_s: float = 0.2, tables: Sequence[str] | None = None
    ) -> Iterator[LogRecord]: ...

    def close(self) -> None: ...


class StateStore(Protocol):
    def load(self) -> Checkpoint | None: ...

    def save(self, checkpoint: Checkpoint) -> None: ...
