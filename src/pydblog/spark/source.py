"""The ``dblog`` Spark Python Data Source: the embedded change log as a table/stream.

``spark.readStream.format("dblog").option("path", DIR).load()`` (or ``spark.read``)
yields one row per change-log event with the columns of ``EVENT_SCHEMA``.

Invariants:
- Stream offsets are change-log offsets: ``{"offset": n}`` means "everything below
  ``n``". A micro-batch ``(start, end]`` in Spark's terms is exactly the events with
  ``start <= offset < end``.
- Offsets are dense, so a partition ``[a, b)`` must return exactly ``b - a`` rows. A read
  that finds fewer (retention removed events the sync never applied) fails loudly instead
  of skipping them; a batch re-read therefore returns exactly the same rows or fails.
- No state lives in the driver: the offset methods run in a separate Python worker and
  ``read`` runs in executors; both reopen the change log from the ``path`` option. The
  only state in the stream reader is the availableNow target, which Spark asks for in the
  same worker that later calls ``latestOffset``.
- ``maxEventsPerTrigger`` bounds a batch (``ReadMaxRows``); with ``Trigger.AvailableNow``
  the reader drains up to the log's end at query start, in batches of that size.
- This module imports neither pyarrow nor the decoder (``decode.py``, loaded by
  ``read`` in the executors): the Python processes Spark starts one after another to
  plan a query (``create_data_source``, the streaming planner) import only this.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.errors import ChangeLogError

NAME = "dblog"

EVENT_SCHEMA_DDL = (
    "offset BIGINT, op STRING, schema STRING, table STRING, key STRING, before STRING, "
    "after STRING, unchanged ARRAY<STRING>, ts_ms BIGINT, source_ts_ms BIGINT, "
    "snapshot STRING, connector STRING, db STRING, lsn BIGINT, tx_id BIGINT, "
    "tx_index BIGINT, position STRING"
)
"""Row schema. ``key``/``before``/``after`` are JSON text (null when absent);
``ts_ms`` is the time the capture logged the event, ``source_ts_ms`` the source commit
time; ``lsn``/``tx_id``/``tx_index`` are PostgreSQL position fields (null for other
sources) and ``position`` is every source position field as JSON (any connector)."""

EVENT_COLUMNS = tuple(c.split()[0] for c in EVENT_SCHEMA_DDL.split(", "))
"""The columns of ``EVENT_SCHEMA_DDL`` (``decode.ARROW_SCHEMA``) in order."""

DEFAULT_MAX_EVENTS = 500_000
MIN_PARTITION_EVENTS = 10_000
DEFAULT_PARTITIONS = 2
"""A batch is split into ``numPartitions`` (option) input partitions of at least
``MIN_PARTITION_EVENTS`` events, one Spark task each; the job sets it to Spark's default
parallelism so that every core decodes one equal share."""


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Events ``start <= offset < end`` of the change log in ``path`` (picklable)."""

    path: str
    start: int
    end: int


def _read(part: OffsetRange, packed: bool, columns: list[str]) -> Iterator[Any]:
    """The executor side of ``read``: Arrow batches of ``part`` (``decode``, imported
    here so that the planning processes never load it)."""
    from pydblog.spark import decode

    if packed:
        return decode.read_packed(part, decode.columns_schema(columns))
    return decode.read_range(part)


def plan_partitions(
    path: str, start: int, end: int, parts: int = DEFAULT_PARTITIONS
) -> list[OffsetRange]:
    """``[start, end)`` in at most ``parts`` contiguous, nearly equal ranges."""
    n = end - start
    if n <= 0:
        return []
    parts = max(1, min(parts, -(-n // MIN_PARTITION_EVENTS)))
    size = -(-n // parts)
    return [OffsetRange(path, a, min(end, a + size)) for a in range(start, end, size)]


def _partitions(options: dict[str, str]) -> int:
    raw = options.get("numpartitions", str(DEFAULT_PARTITIONS))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ChangeLogError(f"numPartitions must be a positive integer, got {raw!r}")
    return value


PACKED_SCHEMA_DDL = "first_offset BIGINT, end_offset BIGINT, events BINARY"
"""Schema with option ``packed = true``: one row per decoded Arrow batch of at most
~20k events, ``events`` an LZ4-compressed Arrow IPC stream of the ``columns`` option's
columns (all by default); ``decode.unpack`` restores the rows (``decode.PACKED_SCHEMA``)."""


def _columns(options: dict[str, str]) -> list[str]:
    raw = options.get("columns")
    if raw is None:
        return list(EVENT_COLUMNS)
    names = [c.strip() for c in raw.split(",") if c.strip()]
    unknown = [n for n in names if n not in EVENT_COLUMNS]
    if not names or unknown:
        raise ChangeLogError(
            f"columns must name columns of the dblog source, got {raw!r}",
            hint="any of: " + ", ".join(EVENT_COLUMNS),
        )
    return names


def _packed(options: dict[str, str]) -> bool:
    raw = options.get("packed", "false").lower()
    if raw not in ("true", "false"):
        raise ChangeLogError(f"packed must be true or false, got {raw!r}")
    return raw == "true"


def _lower(options: Any) -> dict[str, str]:
    """Spark option names are case-insensitive: readers see them lower-cased."""
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _path(options: dict[str, str]) -> str:
    path = options.get("path")
    if not path:
        raise ChangeLogError(
            "the dblog data source needs option 'path' (the change log directory)",
            hint='spark.readStream.format("dblog").option("path", "./dblog-data")',
        )
    return path


def _max_events(options: dict[str, str]) -> int:
    raw = options.get("maxeventspertrigger")
    if raw is None:
        return DEFAULT_MAX_EVENTS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ChangeLogError(f"maxEventsPerTrigger must be a positive integer, got {raw!r}")
    return value


class DblogDataSource(DataSource):
    """Options: ``path`` (required), ``maxEventsPerTrigger`` (streaming, default
    500000), ``startingOffset`` (``earliest`` (default), ``latest`` or a number),
    ``numPartitions`` (input partitions per batch, default 2), for batch reads
    ``startOffset``/``endOffset``; ``packed`` (``true``: rows of ``PACKED_SCHEMA``, one
    per ~20k events, instead of one per event) with ``columns`` (the packed columns,
    comma-separated; all by default)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return PACKED_SCHEMA_DDL if _packed(_lower(self.options)) else EVENT_SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return DblogBatchReader(_lower(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DblogStreamReader(_lower(self.options))


class DblogBatchReader(DataSourceReader):
    """The whole log as it is when the query is planned (``startOffset``/``endOffset``
    options narrow it)."""

    def __init__(self, options: dict[str, str]) -> None:
        options = _lower(options)
        self.path = _path(options)
        self.parts = _partitions(options)
        self.packed = _packed(options)
        self.columns = _columns(options) if self.packed else list(EVENT_COLUMNS)
        reader = SqliteChangeLogReader(self.path)
        try:
            first, nxt = reader.first_offset(), reader.next_offset()
        finally:
            reader.close()
        self.start = int(options.get("startoffset", first))
        self.end = int(options.get("endoffset", nxt))

    def partitions(self) -> Sequence[InputPartition]:
        return plan_partitions(self.path, self.start, self.end, self.parts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        return _read(partition, self.packed, self.columns)


class DblogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        options = _lower(options)
        self.path = _path(options)
        self.max_events = _max_events(options)
        self.parts = _partitions(options)
        self.packed = _packed(options)
        self.columns = _columns(options) if self.packed else list(EVENT_COLUMNS)
        self.starting = options.get("startingoffset", "earliest")
        self.target: int | None = None

    def _bounds(self) -> tuple[int, int]:
        reader = SqliteChangeLogReader(self.path)
        try:
            return reader.first_offset(), reader.next_offset()
        finally:
            reader.close()

    def initialOffset(self) -> dict[str, int]:
        first, nxt = self._bounds()
        if self.starting == "earliest":
            return {"offset": first}
        if self.starting == "latest":
            return {"offset": nxt}
        return {"offset": int(self.starting)}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._bounds()[1]

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_events)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        begin = int(start["offset"])
        end = self._bounds()[1] if self.target is None else self.target
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + int(limit.max_rows))
        elif not isinstance(limit, ReadAllAvailable):
            end = min(end, begin + self.max_events)
        return {"offset": max(begin, end)}

    def reportLatestOffset(self) -> dict[str, int]:
        return {"offset": self._bounds()[1]}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return plan_partitions(self.path, int(start["offset"]), int(end["offset"]), self.parts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        return _read(partition, self.packed, self.columns)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the change log's retention is time/size based."""
