"""The ``dblog`` Spark Python Data Source: a change log (any ``[log] type``) as a table/stream.

``spark.readStream.format("dblog").option("log", cfg.log.model_dump_json()).load()``
(or ``.option("path", DIR)`` for an embedded log; ``spark.read`` for a batch) yields one
row per change-log event with the columns of ``EVENT_SCHEMA_DDL``.

This module knows Spark, not the backends: it reaches the log only through the ports
``ChangeLogStream`` (offsets, splitting a batch into partitions, given by
``changelog.open_stream`` from the ``[log]`` option's ``type``) and ``LogPartition``
(read in the executors), and decodes what a partition gives (``decode``). A new backend
needs nothing here.

Invariants:
- Stream offsets are the backend's (``ports.SyncOffset``, JSON in Spark's checkpoint);
  the events between two offsets are fixed, so a replayed batch re-reads the same
  events or fails (``ChangeLogError``) when the log no longer holds them.
- No state lives in the driver: the offset methods run in a separate Python worker and
  ``read`` runs in executors; both reopen the change log from the options. The only
  state in the stream reader is the backend's (the availableNow target, a Kafka plan
  that ``partitions`` reuses), which Spark asks for in the same worker that later calls
  ``latestOffset``/``partitions``.
- ``maxEventsPerTrigger`` bounds a batch (``ReadMaxRows``); with ``Trigger.AvailableNow``
  the reader drains up to the log's end at query start, in batches of that size.
- This module imports neither pyarrow nor the decoder (``decode.py``, loaded by
  ``read`` in the executors) nor a backend before it is asked for one: the Python
  processes Spark starts one after another to plan a query (``create_data_source``,
  the streaming planner) import only this.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

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

from pydblog.changelog import open_stream
from pydblog.errors import ChangeLogError
from pydblog.spark.eventschema import EVENT_COLUMNS, EVENT_SCHEMA_DDL

if TYPE_CHECKING:
    from pydblog.ports import ChangeLogStream, LogPartition, SyncOffset

NAME = "dblog"

DEFAULT_MAX_EVENTS = 2_000_000
DEFAULT_PARTITIONS = 2
"""A batch is split for ``numPartitions`` (option) cores, one or more Spark tasks each
(the backend decides: ``ChangeLogStream.partitions``); the job sets it to Spark's
default parallelism so that every core decodes one equal share."""


def _read(part: LogPartition | None, packed: bool, columns: list[str],
          route: str | None = None) -> Iterator[Any]:
    """The executor side of ``read``: Arrow batches of ``part`` (``decode``, imported
    here so that the planning processes never load it)."""
    if part is None:  # Spark's stand-in partition of a batch read with none
        return iter(())
    from pydblog.spark import decode

    if packed:
        return decode.read_packed(part, decode.columns_schema(columns), route)
    return decode.read_range(part)


def _part(partition: InputPartition) -> LogPartition | None:
    """The backend's partition that ``partitions`` wrapped (Spark wants an
    ``InputPartition``); a bare one as is."""
    if type(partition) is InputPartition:
        value: LogPartition | None = partition.value
        return value
    return partition  # type: ignore[return-value]


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


def _log_json(options: dict[str, str]) -> str:
    """The ``[log]`` config as JSON: option ``log``, or ``path`` (a log directory: the
    ``[log]`` table with only ``path``, i.e. the default type)."""
    raw = options.get("log")
    if raw:
        return raw
    path = options.get("path")
    if path:
        return json.dumps({"path": path})
    raise ChangeLogError(
        "the dblog data source needs option 'log' (the [log] config as JSON) or 'path' "
        "(an embedded change log's directory)",
        hint='.option("log", cfg.log.model_dump_json()) or .option("path", "./dblog-data")',
    )


def _allow_gaps(options: dict[str, str]) -> bool:
    raw = options.get("allowgaps", "false").lower()
    if raw not in ("true", "false"):
        raise ChangeLogError(f"allowGaps must be true or false, got {raw!r}")
    return raw == "true"


def _open(options: dict[str, str]) -> ChangeLogStream:
    return open_stream(_log_json(options), allow_gaps=_allow_gaps(options))


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


def _bounded(bound: str, start: SyncOffset, end: SyncOffset) -> SyncOffset:
    """``consistent = true`` (option ``bound``): ``end`` cut back to the last whole
    transaction committed at or below the time of the source's round
    (``spark.rounds.plan_batch``; ``start`` while the source waits for the others to
    finish the round). Planned here, so Spark's offset log fixes the cut and a replay
    re-reads the same batch."""
    from pydblog.spark.rounds import plan_batch

    return plan_batch(bound, start, end)


class DblogDataSource(DataSource):
    """Options: ``log`` (the ``[log]`` config as JSON: ``cfg.log.model_dump_json()``) or
    ``path`` (an embedded log's directory); ``maxEventsPerTrigger`` (streaming, default
    2000000), ``startingOffset`` (``earliest`` (default), ``latest`` or, for the embedded
    log, an offset), ``numPartitions`` (the cores a batch's reads are split for, default
    2), for batch reads ``startOffset``/``endOffset`` (as ``startingOffset``);
    ``packed`` (``true``: rows of ``PACKED_SCHEMA``, one per ~20k events, instead of one
    per event) with ``columns`` (the packed columns, comma-separated; all by default);
    ``allowGaps`` (``true``: events a backend finds removed from its storage, i.e. a
    compacted Kafka topic, are accepted, for readers that need only each key's newest
    event; default ``false``: they fail the read)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return PACKED_SCHEMA_DDL if _packed(_lower(self.options)) else EVENT_SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return DblogBatchReader(_lower(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DblogStreamReader(_lower(self.options))


WARM_UP_NAME = "dblog_warm_up"


class WarmUpDataSource(DataSource):
    """A batch source of no rows. Reading it once (``job.warm_up_workers``) starts the
    Python process in which Spark plans a Python data source's reads
    (``plan_data_source_read``'s daemon: an interpreter importing pyspark, 1-1.5 s on 2
    busy cores); the daemon stays, and a streaming query's first batch, which plans
    its read there too, forks a worker from it instead of starting one."""

    @classmethod
    def name(cls) -> str:
        return WARM_UP_NAME

    def schema(self) -> str:
        return "id BIGINT"

    def reader(self, schema: StructType) -> DataSourceReader:
        return _NoRows()


class _NoRows(DataSourceReader):
    def read(self, partition: InputPartition) -> Iterator[Any]:
        return iter(())


class DblogBatchReader(DataSourceReader):
    """The whole log as it is when the query is planned (``startOffset``/``endOffset``
    options narrow it)."""

    def __init__(self, options: dict[str, str]) -> None:
        options = _lower(options)
        self.stream = _open(options)
        self.parts = _partitions(options)
        self.packed = _packed(options)
        self.columns = _columns(options) if self.packed else list(EVENT_COLUMNS)
        self.start = self.stream.initial_offset(options.get("startoffset", "earliest"))
        end = options.get("endoffset")
        self.end = (self.stream.initial_offset(end) if end is not None
                    else self.stream.latest_offset(self.start, None))

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(p) for p in self.stream.partitions(self.start, self.end, self.parts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(_part(partition), self.packed, self.columns)


class DblogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        options = _lower(options)
        self.stream = _open(options)
        self.max_events = _max_events(options)
        self.parts = _partitions(options)
        self.packed = _packed(options)
        self.columns = _columns(options) if self.packed else list(EVENT_COLUMNS)
        self.starting = options.get("startingoffset", "earliest")
        self.route = options.get("route")
        self.bound = options.get("bound")

    def initialOffset(self) -> SyncOffset:
        return self.stream.initial_offset(self.starting)

    def prepareForTriggerAvailableNow(self) -> None:
        self.stream.prepare_available_now()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_events)

    def latestOffset(self, start: SyncOffset, limit: ReadLimit) -> SyncOffset:
        max_events: int | None = self.max_events
        if isinstance(limit, ReadMaxRows):
            max_events = int(limit.max_rows)
        elif isinstance(limit, ReadAllAvailable):
            max_events = None
        end = self.stream.latest_offset(start, max_events)
        if self.bound is not None:
            end = _bounded(self.bound, start, end)
        return end

    def reportLatestOffset(self) -> SyncOffset | None:
        return self.stream.report_latest_offset()

    def partitions(self, start: SyncOffset, end: SyncOffset) -> Sequence[InputPartition]:
        return [InputPartition(p) for p in self.stream.partitions(start, end, self.parts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(_part(partition), self.packed, self.columns, self.route)

    def commit(self, end: SyncOffset) -> None:
        self.stream.commit(end)

    def stop(self) -> None:
        # A backend may keep clients open across the query's plans (Kafka's planner).
        self.stream.close()

