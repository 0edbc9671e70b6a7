"""What every sink gets for one micro-batch: the events of offsets ``[start, end)``,
their reduce (``reduce.reduce_events``) and each table's schema as of ``end``.

``start``/``end`` identify the batch independently of Spark: offsets are dense, so the
batch's events are exactly ``start <= offset < end``, and a replay of the batch (Spark
re-runs a batch whose commit it did not record) has the same ``start``/``end``. Sinks
record ``end`` (or ``(start, end)``) with their writes to recognise a replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pydblog.ports import TableSchema
from pydblog.spark.reduce import TableChanges, reduce_events
from pydblog.spark.repairs import TablePurge, purges
from pydblog.spark.typemap import infer_schema, merge_schemas


def _ascending(values: pa.ChunkedArray | pa.Array) -> bool:
    n = len(values)
    return n < 2 or bool(pc.all(pc.less(values.slice(0, n - 1), values.slice(1))).as_py())


@dataclass
class Batch:
    batch_id: int
    start: int
    end: int
    events: pa.Table  # in any order (a Kafka log's partitions interleave): ``events_since``
    recorded: dict[str, TableSchema] = field(default_factory=dict)
    _reduced: dict[int, dict[str, TableChanges]] = field(default_factory=dict, repr=False)
    _sorted: bool = field(default=False, repr=False)
    _purges: dict[int, dict[str, TablePurge]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls, batch_id: int, events: pa.Table, schemas: Sequence[tuple[int, TableSchema]]
    ) -> Batch | None:
        """The batch of ``events`` (``None`` if empty); ``schemas`` are the change log's
        recorded ``(from_offset, schema)`` pairs in offset order."""
        if events.num_rows == 0:
            return None
        offsets = events["offset"]
        start = int(pc.min(offsets).as_py())
        end = int(pc.max(offsets).as_py()) + 1
        recorded: dict[str, TableSchema] = {}
        for from_offset, s in schemas:
            if from_offset < end:
                recorded[s.qualified] = merge_schemas(recorded.get(s.qualified), s)
        return cls(batch_id, start, end, events, recorded)

    def changes(self, since: int | None = None) -> dict[str, TableChanges]:
        """The net change of events with ``offset >= since`` (default: the whole batch)."""
        since = self.start if since is None else max(since, self.start)
        cached = self._reduced.get(since)
        if cached is None:
            events = self.events
            if since > self.start:
                events = events.filter(pc.greater_equal(events["offset"], since))
            cached = self._reduced[since] = reduce_events(events)
            self._purges[since] = purges(events, since, cached)  # repairs: spark/repairs.py
        return cached

    def purges(self, since: int | None = None) -> dict[str, TablePurge]:
        """The target deletes of the repairs' range-end markers in the events with
        ``offset >= since`` (``spark.repairs``), per table."""
        since = self.start if since is None else max(since, self.start)
        self.changes(since)
        return self._purges[since]

    def events_since(self, since: int) -> pa.Table:
        """The events with ``offset >= since``, in offset order."""
        if not self._sorted:
            if not _ascending(self.events["offset"]):
                self.events = self.events.sort_by("offset")
            self._sorted = True
        if since <= self.start:
            return self.events
        return self.events.filter(pc.greater_equal(self.events["offset"], since))

    def schema_for(self, changes: TableChanges) -> TableSchema:
        """The recorded schema, or one inferred from the rows (and the first key)."""
        found = self.recorded.get(changes.qualified)
        if found is not None and found.columns:
            return found
        key = sorted(changes.rows[changes.ops.index("d")]) if "d" in changes.ops else []
        upserts = [r for r, op in zip(changes.rows, changes.ops, strict=True) if op == "u"]
        if not key and changes.keys and changes.keys[0]:
            key = list(orjson.loads(changes.keys[0]))
        return infer_schema(changes.schema, changes.table, upserts, key)
