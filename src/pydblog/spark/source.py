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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
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
from pydblog.ports import LogRecord

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

ARROW_SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("op", pa.string()),
        ("schema", pa.string()),
        ("table", pa.string()),
        ("key", pa.string()),
        ("before", pa.string()),
        ("after", pa.string()),
        ("unchanged", pa.list_(pa.string())),
        ("ts_ms", pa.int64()),
        ("source_ts_ms", pa.int64()),
        ("snapshot", pa.string()),
        ("connector", pa.string()),
        ("db", pa.string()),
        ("lsn", pa.int64()),
        ("tx_id", pa.int64()),
        ("tx_index", pa.int64()),
        ("position", pa.string()),
    ]
)

DEFAULT_MAX_EVENTS = 500_000
MIN_PARTITION_EVENTS = 10_000
DEFAULT_PARTITIONS = 2
"""A batch is split into ``numPartitions`` (option) input partitions of at least
``MIN_PARTITION_EVENTS`` events, one Spark task each; the job sets it to Spark's default
parallelism so that every core decodes one equal share."""
ARROW_BATCH_EVENTS = 20_000

_SOURCE_NON_POSITION = frozenset({"connector", "db", "schema", "table", "ts_ms", "snapshot"})


def _dump(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def records_to_arrow(records: Sequence[LogRecord]) -> pa.RecordBatch:
    """Decode change-log records into one Arrow batch of ``ARROW_SCHEMA``."""
    cols: dict[str, list[Any]] = {f.name: [] for f in ARROW_SCHEMA}
    offset, op, schema, table = cols["offset"], cols["op"], cols["schema"], cols["table"]
    key, before, after, unchanged = cols["key"], cols["before"], cols["after"], cols["unchanged"]
    ts, sts, snap, conn, db = (
        cols["ts_ms"],
        cols["source_ts_ms"],
        cols["snapshot"],
        cols["connector"],
        cols["db"],
    )
    lsn, txid, txi, pos = cols["lsn"], cols["tx_id"], cols["tx_index"], cols["position"]
    loads, dumps = orjson.loads, orjson.dumps
    for rec in records:
        env = loads(rec.body)
        src = env.get("source") or {}
        offset.append(rec.offset)
        op.append(env.get("op", rec.op))
        schema.append(src.get("schema"))
        table.append(src.get("table"))
        k = env.get("key")
        key.append(None if k is None else dumps(k, option=orjson.OPT_SORT_KEYS).decode())
        b = env.get("before")
        before.append(None if b is None else dumps(b).decode())
        a = env.get("after")
        after.append(None if a is None else dumps(a).decode())
        unchanged.append(env.get("unchanged"))
        ts.append(env.get("ts_ms", rec.ts_ms))
        sts.append(src.get("ts_ms"))
        snap.append(src.get("snapshot"))
        conn.append(src.get("connector"))
        db.append(src.get("db"))
        lsn.append(src.get("lsn"))
        txid.append(src.get("txId"))
        txi.append(src.get("index"))
        pos.append(dumps({k: v for k, v in src.items() if k not in _SOURCE_NON_POSITION}).decode())
    return pa.RecordBatch.from_arrays(
        [pa.array(cols[f.name], type=f.type) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA
    )


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Events ``start <= offset < end`` of the change log in ``path`` (picklable)."""

    path: str
    start: int
    end: int


def read_range(part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Exactly the events of ``part``, in offset order, as Arrow batches; raises
    ``ChangeLogError`` if any offset of the range is missing from the log."""
    reader = SqliteChangeLogReader(part.path)
    try:
        pos = part.start
        while pos < part.end:
            stop = min(part.end, pos + ARROW_BATCH_EVENTS)
            records = reader.read_range(pos, stop)
            if len(records) != stop - pos:
                first = reader.first_offset()
                raise ChangeLogError(
                    f"change log {part.path} no longer holds offsets [{pos}, {stop}) "
                    f"(first offset now {first}, got {len(records)} events): retention "
                    "removed events the sync had not applied",
                    hint="raise [log] retention_hours/retention_bytes and re-sync the "
                    "targets from a fresh snapshot",
                )
            yield records_to_arrow(records)
            pos = stop
    finally:
        reader.close()


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
    ``numPartitions`` (input partitions per batch, default 2), and for batch reads
    ``startOffset``/``endOffset``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return EVENT_SCHEMA_DDL

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
        reader = SqliteChangeLogReader(self.path)
        try:
            first, nxt = reader.first_offset(), reader.next_offset()
        finally:
            reader.close()
        self.start = int(options.get("startoffset", first))
        self.end = int(options.get("endoffset", nxt))

    def partitions(self) -> Sequence[InputPartition]:
        return plan_partitions(self.path, self.start, self.end, self.parts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(partition)


class DblogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        options = _lower(options)
        self.path = _path(options)
        self.max_events = _max_events(options)
        self.parts = _partitions(options)
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

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the change log's retention is time/size based."""
