"""The embedded log as the source of ``dblog sync``'s Spark stream (``ports.ChangeLogStream``).

Offsets are change-log offsets: ``{"offset": n}`` means "everything below ``n``", and
the batch ``(start, end]`` is exactly the events ``start <= offset < end``. A batch is
cut into contiguous ``OffsetRange``s; an executor reads one from the stored blocks
(``SqliteChangeLogReader.read_range_stored``: no ``LogRecord`` per event) and hands the
decoder each block's bodies as one Arrow string array.

Invariants:
- Offsets are dense, so a range ``[a, b)`` must give exactly ``b - a`` events: a read
  that finds fewer (retention removed events the sync never applied) raises
  ``ChangeLogError`` instead of skipping them, whatever ``allowGaps`` says; a re-read of
  a range gives the same events or fails.
- No state but the available-now target: every call reopens the log read-only from
  ``path`` (SQLite WAL: readers never block the capture).
- Light to import (Spark's planning processes): ``changelog.sqlite`` and pyarrow are
  imported where a method needs them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydblog.errors import ChangeLogError
from pydblog.ports import ChangeLogStream, EncodedValues, LogPartition, SyncOffset

if TYPE_CHECKING:
    from pydblog.changelog.sqlite import SqliteChangeLogReader

MIN_PARTITION_EVENTS = 10_000
"""A batch is split into at most ``parts`` ranges of at least this many events (one
Spark task each): the job passes Spark's default parallelism, so every core decodes
one equal share."""


@dataclass(frozen=True)
class OffsetRange(LogPartition):
    """Events ``start <= offset < end`` of the embedded change log in ``path`` (picklable)."""

    path: str
    start: int
    end: int

    def read(self, batch_events: int) -> Iterator[EncodedValues]:
        """The range in chunks of ``batch_events`` dense offsets (the last one shorter),
        each the bodies of the blocks that hold them, clipped; raises ``ChangeLogError``
        if any offset of the range is missing from the log."""
        import pyarrow as pa

        from pydblog.changelog.sqlite import SqliteChangeLogReader, block_parts

        reader = SqliteChangeLogReader(self.path)
        try:
            pos = self.start
            while pos < self.end:
                stop = min(self.end, pos + batch_events)
                metas: list[str] = []
                arrays: list[Any] = []
                expect = pos
                for first, meta, stored in reader.read_range_stored(pos, stop):
                    entries, texts = block_parts(meta, stored)
                    lo, hi = max(0, pos - first), min(len(entries), stop - first)
                    if lo >= hi:
                        continue
                    if first + lo != expect:
                        break
                    bodies = _body_array(texts)
                    if len(bodies) != len(entries):
                        raise ChangeLogError(
                            f"change log {self.path}: the block at offset {first} holds "
                            f"{len(entries)} meta entries but {len(bodies)} bodies"
                        )
                    metas.extend(entries[lo:hi])
                    arrays.append(bodies.slice(lo, hi - lo))
                    expect += hi - lo
                if expect != stop:
                    raise _gone(self.path, reader, pos, stop, expect - pos)
                yield EncodedValues(pa.concat_arrays(arrays), pos, metas)
                pos = stop
        finally:
            reader.close()


def _gone(path: str, reader: SqliteChangeLogReader, start: int, stop: int, got: int) -> ChangeLogError:
    return ChangeLogError(
        f"change log {path} no longer holds offsets [{start}, {stop}) "
        f"(first offset now {reader.first_offset()}, got {got} events): retention "
        "removed events the sync had not applied",
        hint="raise [log] retention_hours/retention_bytes and re-sync the "
        "targets from a fresh snapshot",
    )


def _body_array(texts: str | list[str]) -> Any:
    """A block's bodies as an Arrow string array: a plain block's stored text is split
    in Arrow (no Python string per event)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(texts, list):
        return pa.array(texts, type=pa.string())
    return pc.list_flatten(pc.split_pattern(pa.array([texts], type=pa.string()), "\n"))


def plan_partitions(path: str, start: int, end: int, parts: int) -> list[OffsetRange]:
    """``[start, end)`` in at most ``parts`` contiguous, nearly equal ranges of at least
    ``MIN_PARTITION_EVENTS`` events (unless the batch is smaller)."""
    n = end - start
    if n <= 0:
        return []
    parts = max(1, min(parts, -(-n // MIN_PARTITION_EVENTS)))
    size = -(-n // parts)
    return [OffsetRange(path, a, min(end, a + size)) for a in range(start, end, size)]


class SqliteStream(ChangeLogStream):
    """The embedded log in ``path`` as a Spark stream's source."""

    dense = True

    def __init__(self, path: str) -> None:
        self.path = path
        self.target: int | None = None

    @classmethod
    def from_json(cls, log_json: str) -> SqliteStream:
        """From the ``[log]`` config as JSON (only ``path`` is read; default
        ``./dblog-data``, as ``LogConfig``'s)."""
        raw = json.loads(log_json)
        return cls(str(raw.get("path") or "./dblog-data"))

    def _bounds(self) -> tuple[int, int]:
        from pydblog.changelog.sqlite import SqliteChangeLogReader

        reader = SqliteChangeLogReader(self.path)
        try:
            return reader.first_offset(), reader.next_offset()
        finally:
            reader.close()

    def initial_offset(self, starting: str) -> SyncOffset:
        if starting == "earliest":
            return {"offset": self._bounds()[0]}
        if starting == "latest":
            return {"offset": self._bounds()[1]}
        try:
            return {"offset": int(starting)}
        except ValueError:
            raise ChangeLogError(
                f"the embedded change log's starting offset must be earliest, latest or an "
                f"offset, got {starting!r}"
            ) from None

    def prepare_available_now(self) -> None:
        self.target = self._bounds()[1]

    def latest_offset(self, start: SyncOffset, max_events: int | None) -> SyncOffset:
        begin = int(start["offset"])
        end = self._bounds()[1] if self.target is None else self.target
        if max_events is not None:
            end = min(end, begin + max_events)
        return {"offset": max(begin, end)}

    def report_latest_offset(self) -> SyncOffset | None:
        return {"offset": self._bounds()[1]}

    def events_end(self) -> int:
        return self._bounds()[1]

    def partitions(self, start: SyncOffset, end: SyncOffset, parts: int) -> Sequence[LogPartition]:
        return plan_partitions(self.path, int(start["offset"]), int(end["offset"]), parts)

    def commit(self, end: SyncOffset) -> None:
        """Nothing to release: the change log's retention is time/size based."""

    def warm_up(self) -> None:
        import pyarrow.compute  # noqa: F401 - what a read needs besides the decoder

        from pydblog.changelog import sqlite  # noqa: F401

    def close(self) -> None:
        """Nothing is kept open: every call opened and closed its reader."""


def _meta_times(meta: str, first: int, last: int) -> list[int]:
    from pydblog.changelog.sqlite import _GS, _RS, _US

    if meta.startswith(_GS):
        entry = meta.split(_GS)[1]
        return [int(entry.split(_US)[2])] * (last - first + 1)
    return [int(e.split(_US)[2]) for e in meta.split(_RS)]


def commit_times(path: str, start: int, end: int) -> list[int]:
    """The source commit time of every event ``start <= offset < end`` (from the blocks'
    meta entries: no body is read)."""
    from pydblog.changelog.sqlite import SqliteChangeLogReader

    reader = SqliteChangeLogReader(path)
    try:
        if not reader.ready() or end <= start:
            return []
        rows = reader._conn.execute(
            "SELECT first_offset, last_offset, meta FROM blocks WHERE last_offset >= ? "
            "AND first_offset < ? ORDER BY first_offset", (start, end)).fetchall()
    finally:
        reader.close()
    out: list[int] = []
    for first, last, meta in rows:
        times = _meta_times(meta, first, last)
        lo, hi = max(0, start - first), min(len(times), end - first)
        out.extend(times[lo:hi])
    return out


def log_complete_ms(path: str) -> int | None:
    """How far the embedded log at ``path`` is complete, in source time: its newest
    event's commit time minus one (a transaction logged later may commit in the same
    millisecond, or second on MySQL/MariaDB; and while the capture's checkpoint is
    inside the newest transaction, that one goes on), or the capture's last checkpoint
    outside a transaction (heartbeat) when later; None for an empty log without
    checkpoint."""
    from pydblog.changelog.sqlite import SqliteChangeLogReader

    reader = SqliteChangeLogReader(path)
    try:
        if not reader.ready():
            return None
        row = reader._conn.execute(
            "SELECT first_offset, last_offset, meta FROM blocks ORDER BY first_offset DESC "
            "LIMIT 1").fetchone()
        newest = None if row is None else _meta_times(row[2], row[0], row[1])[-1] - 1
        hb = reader.heartbeat()  # None inside a transaction
        beat = None if hb is None else hb[0]
    finally:
        reader.close()
    if newest is None:
        return beat
    return newest if beat is None else max(newest, beat)


def consistent_end(path: str, start: int, end: int, low: int) -> int:
    """``consistent = true``: the end of the longest prefix of ``[start, end)`` whose
    commit times are at or below ``low`` (``core.drainer.consistent_cut``)."""
    from pydblog.core.drainer import consistent_cut

    return start + consistent_cut(commit_times(path, start, end), low)
