"""The small interfaces the parts of pydblog talk through.

Commit order (the correctness contract, invariant 5 of docs/architecture.md):

1. ``ChangeLogWriter.append(events, checkpoint)`` commits the events *and* the
   checkpoint that describes them (source position, snapshot progress) atomically
   and durably;
2. ``StateStore.save(checkpoint)`` then records the same checkpoint;
3. only then is the source acknowledged (slot ``flush_lsn``, binlog position).

A crash between 1 and 2 is repaired at start: the change log's checkpoint wins (the
state store's is never newer with its own log; one that is means another or a damaged
log, and the start is refused: ``capture.runner.resume_from``). Events at or below the
checkpoint's position are skipped when the source sends them again, so each lands in
the change log once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

import orjson

from pydblog.events import ChangeEvent, ChunkRow, Encoded
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

    def complete_ms(self, written_ms: int) -> int:
        """The source time a change log is complete up to when this checkpoint, outside
        any transaction, was written at ``written_ms`` (the capture's clock: every commit
        before it is logged): ``written_ms``, or the end of the second before it for a
        source whose commit times are whole seconds (``commit_time_unit_ms`` of its
        position: MySQL/MariaDB stamp a commit later in that second with its start)."""
        unit = int(getattr(self.position, "commit_time_unit_ms", 1))
        return written_ms if unit <= 1 else written_ms // unit * unit - 1

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
class ColumnSchema:
    """One column as the source declares it. ``type`` is the source's SQL type
    (``numeric(10,2)``, ``text[]``); ``logical`` is pydblog's source-independent type
    (see docs/types.md), what sinks derive their column types from."""

    name: str
    type: str
    logical: str
    nullable: bool = True


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A captured table's columns and key, as recorded in the change log whenever it
    is first seen or changes; it applies to the events from ``from_offset`` on."""

    schema: str
    table: str
    columns: tuple[ColumnSchema, ...]
    key: tuple[str, ...]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "table": self.table,
            "columns": [
                {"name": c.name, "type": c.type, "logical": c.logical, "nullable": c.nullable}
                for c in self.columns
            ],
            "key": list(self.key),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableSchema:
        return cls(
            data["schema"],
            data["table"],
            tuple(ColumnSchema(c["name"], c["type"], c["logical"], c.get("nullable", True))
                  for c in data["columns"]),
            tuple(data["key"]),
        )


@dataclass(frozen=True, slots=True)
class LogRecord:
    offset: int
    table: str
    op: str
    ts_ms: int
    body: bytes


class ChangeLogWriter(Protocol):
    def append(
        self,
        events: Sequence[Encoded],
        checkpoint: Checkpoint,
        schemas: Sequence[TableSchema] = (),
    ) -> int:
        """Durably append ``events`` (single events, or ``EncodedBlock``s of several),
        ``checkpoint`` and new table ``schemas`` (which apply from the first of these
        events on) in one commit.

        Returns the next offset (one past the last written). Offsets are dense and
        assigned in the order given.
        """
        ...

    def last_checkpoint(self) -> Checkpoint | None:
        """The checkpoint of the last committed ``append`` (``None`` for a new log)."""
        ...

    def schemas(self, table: str | None = None) -> list[tuple[int, TableSchema]]:
        """Recorded ``(from_offset, schema)`` pairs in offset order."""
        ...

    def claim(self, epoch: int) -> None:
        """High availability: see ``FencedChangeLog.claim`` (both backends fence)."""
        ...

    def enforce_retention(self, max_age_ms: int | None, max_bytes: int | None) -> int:
        """Apply the log's own retention (a backend whose storage does that itself, such
        as Kafka, does nothing); returns how many events went."""
        ...

    def close(self) -> None: ...


class ChangeLogReader(Protocol):
    def read(
        self, from_offset: int, limit: int, tables: Sequence[str] | None = None
    ) -> list[LogRecord]:
        """Records with ``offset >= from_offset`` in offset order, at most ``limit``."""
        ...

    def first_offset(self) -> int: ...

    def schemas(self, table: str | None = None) -> list[tuple[int, TableSchema]]:
        """Recorded ``(from_offset, schema)`` pairs in offset order."""
        ...

    def next_offset(self) -> int:
        """One past the last committed offset (0 for an empty log)."""
        ...

    def follow(
        self, from_offset: int, poll_s: float = 0.2, tables: Sequence[str] | None = None
    ) -> Iterator[LogRecord]: ...

    def last_checkpoint(self) -> Checkpoint | None: ...

    def describe(self) -> dict[str, Any]:
        """What ``dblog status`` shows of the log (location, size, offsets, lag)."""
        ...

    def close(self) -> None: ...


class StateStore(Protocol):
    def load(self) -> Checkpoint | None: ...

    def save(self, checkpoint: Checkpoint) -> None: ...


# -- the sync's reads -------------------------------------------------------------------
# What ``dblog sync``'s Spark data source (``spark.source``) needs from a change log,
# besides the schemas (``ChangeLogReader.schemas``). ``changelog.open_stream`` gives the
# backend's ``ChangeLogStream`` by ``[log] type``; Spark's code knows no backend.
# ``ChangeLogStream`` runs in the short-lived Python processes Spark starts to plan a
# query and each micro-batch (keep its imports light: no pyarrow, no config models); a
# ``LogPartition`` is pickled to an executor and read there with nothing else.

SyncOffset = dict[str, Any]
"""A position in a change log as Spark's checkpoint stores it: JSON-able, its form the
backend's own (the embedded log: ``{"offset": n}``). A micro-batch ``(start, end]`` is
the events a backend places between two of them; the same two always mean the same
events (a replayed batch re-reads exactly what it read)."""


@dataclass(frozen=True, slots=True)
class EncodedValues:
    """Some events of a ``LogPartition``, as the decoder (``spark.decode``) takes them.

    ``bodies``: the envelopes' JSON texts (a pyarrow string array; ``dblog tail``'s
    form, possibly without ``op``/``ts_ms``, which ``metas`` then gives). ``first``: the
    events are the dense offsets ``first, first + 1, ...`` in order; ``None``: each body
    carries its own ``"offset"`` (then in any order across partitions). ``metas``: one
    ``table US op US ts_ms`` entry per body (``None``: every body has its ``op`` and
    ``ts_ms``)."""

    bodies: Any
    first: int | None = None
    metas: Sequence[str] | None = None


class LogPartition(Protocol):
    """One Spark task's share of a micro-batch: picklable and self-contained (where the
    log is, which events, the gap rule), read in an executor."""

    def read(self, batch_events: int) -> Iterator[EncodedValues]:
        """Exactly the partition's events, in chunks of about ``batch_events`` (each
        body once; a backend whose offsets are dense gives them in offset order). Raises
        ``ChangeLogError`` naming the fix when events of the range are gone (retention,
        a compacted topic) unless the backend was opened to allow gaps."""
        ...


class ChangeLogStream(Protocol):
    """A change log as the source of a Spark stream: the planner's side (offsets,
    splitting a batch into ``LogPartition``s) and the executors' start-up."""

    dense: bool
    """Every partition's events are one dense offset range and a batch's partitions tile
    the batch's range exactly (what ``spark.decode.unpack`` can check); False when a
    partition's events carry their own offsets (Kafka's partitions interleave)."""

    def initial_offset(self, starting: str) -> SyncOffset:
        """Where a new query starts: ``"earliest"``, ``"latest"`` or a backend's own
        position (the embedded log: an offset). Raises ``ChangeLogError`` for a value
        the backend does not understand."""
        ...

    def prepare_available_now(self) -> None:
        """Fix the log's current end as the end of every later ``latest_offset``
        (``Trigger.AvailableNow``)."""
        ...

    def latest_offset(self, start: SyncOffset, max_events: int | None) -> SyncOffset:
        """The end of the next batch after ``start``: at most ``max_events`` events
        (``None``: no limit; a backend may round up to a whole commit) and not past the
        end fixed by ``prepare_available_now``. ``start`` itself when there is nothing
        new (no empty batch)."""
        ...

    def report_latest_offset(self) -> SyncOffset | None:
        """The log's end for Spark's progress report (``None``: not known cheaply)."""
        ...

    def events_end(self) -> int:
        """The log's end as it is now: the global offset of its next event (``dblog
        sync --available-now``'s progress bar)."""
        ...

    def partitions(self, start: SyncOffset, end: SyncOffset, parts: int) -> Sequence[LogPartition]:
        """The events of the batch ``(start, end]`` as partitions for about ``parts``
        cores; a pure function of the log and the offsets (a replayed batch is the same
        batch)."""
        ...

    def commit(self, end: SyncOffset) -> None:
        """Spark applied everything up to ``end`` (monitoring, release; best effort)."""
        ...

    def warm_up(self) -> None:
        """Load what ``LogPartition.read`` needs into this process (an executor's Python
        worker at the job's start), so that the first batch does not wait for it."""
        ...

    def close(self) -> None:
        """Release what the planner kept open (Spark stops the stream); the stream may
        be pickled (an executor's copy of the reader) without it."""
        ...


# -- sources ---------------------------------------------------------------------------
# A source turns a database's log into one flat, ordered stream of items. Row events
# of captured tables, of the signal table and of the watermark table all come through
# as ``ChangeEvent``s (the runner routes the last two to the snapshot core and never
# logs them). ``Commit`` closes a transaction and is the point the source may be
# acknowledged once everything before it is durable.


@dataclass(frozen=True, slots=True)
class Commit:
    """End of a source transaction. ``position`` is the ack point (e.g. the PostgreSQL
    commit's end LSN inside a ``PgPosition``); every event of the transaction is at or
    below it."""

    position: Position
    ts_ms: int


@dataclass(frozen=True, slots=True)
class WatermarkSeen:
    """A watermark written by the chunk reader came back through the log (message form;
    the table form arrives as an UPDATE of the watermark table)."""

    id: str
    position: Position


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The log moved on with nothing to capture; ``position`` may be acknowledged once
    everything before it is durable."""

    position: Position


@dataclass(frozen=True, slots=True)
class StreamPassed:
    """Outside a transaction: the stream has delivered every transaction that committed
    at or before ``position`` (e.g. a PostgreSQL keepalive's WAL end). Only read-only
    snapshots use it (``core.fence``); it is never acknowledged."""

    position: Position


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing arrived for a short while (lets the runner flush and run timers)."""


@dataclass(frozen=True, slots=True)
class SourceState:
    """State the source needs back after a restart (MySQL 5.7's schema history): every
    checkpoint the runner writes after this item carries ``value`` as ``extra[key]``,
    and ``open(checkpoint)`` gets it back. With a ``position`` (the DDL that changed
    it) the checkpoint moves there too, so a restart never reads that DDL again; without
    one the state is valid from the runner's current position on."""

    key: str
    value: Any
    position: Position | None = None




@dataclass(frozen=True, slots=True)
class SchemaChanged:
    """A captured table's schema as the log now describes it. Yielded before the
    first event of a table in a session and after every change of its columns; the
    runner records it in the change log when it differs from the last one recorded."""

    table_schema: TableSchema


class ResetKind(Enum):
    """Why a table was reset (``RelationReset``)."""

    GONE = "gone"  # dropped: no relation has the name any more
    RECREATED = "recreated"  # dropped and created again while dblog ran
    JOINED = "joined"  # found at start outside the capture (created or re-created meanwhile)


@dataclass(frozen=True, slots=True)
class RelationReset:
    """A captured table's name now names another relation (or none): ``event`` is a
    truncate of the table, in stream order after every event of the old relation and
    before every event of the new one. The runner logs it (materializing the log drops
    the old rows) and restarts the table's snapshot (its progress described the old
    relation)."""

    event: ChangeEvent
    kind: ResetKind


StreamItem = Any  # ChangeEvent | Commit | WatermarkSeen | Heartbeat | Idle | SchemaChanged | StreamPassed | RelationReset


@dataclass(frozen=True, slots=True)
class TableInfo:
    """What the chunk reader knows of a table; ``types`` are SQL type names used for casts.

    Two different sets of columns (the row-identity model, see docs/exactness.md):

    - ``identity``: the table's **row identity**, the columns that name a row in events
      (the envelope's ``key``), in chunk windows (what a stream event drops from a chunk)
      and in the sinks (what a MERGE or upsert matches on). Decided once per table by the
      source: PostgreSQL ``REPLICA IDENTITY USING INDEX`` -> that index's columns (also
      with a primary key: deletes carry only those); else the primary key; else every
      column (``REPLICA IDENTITY FULL``, or a table that has nothing better), matched
      null-safely. MySQL: the primary key, else every column.
    - ``key``: the **chunk key** the keyset SELECTs page by: the primary key, else a
      unique not-null identity index, else the surrogate key a snapshot asked for. A
      surrogate key only orders chunks; it never replaces the identity.

    Empty ``identity`` (older callers) means "the same as ``key``".
    """

    schema: str
    table: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    key: tuple[str, ...]
    identity: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.identity:
            object.__setattr__(self, "identity", self.key)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def with_key(self, key: tuple[str, ...], identity: tuple[str, ...] = ()) -> TableInfo:
        """The same table chunked by ``key`` (identity kept unless given)."""
        return TableInfo(self.schema, self.table, self.columns, self.types, key,
                         identity or self.identity)


class LogSource(Protocol):
    connector: str
    db: str

    def open(self, checkpoint: Checkpoint | None) -> None:
        """Check the source's setup (clear ``SourceError`` naming each problem), create
        what is missing (slot, publication, signal/watermark tables) and start reading
        after what ``checkpoint`` says was already logged."""
        ...

    def stream(self) -> Iterator[StreamItem]:
        """Items in source commit order; yields ``Idle`` when nothing arrived for a
        while, so the caller is never blocked for long."""
        ...

    def ack(self, position: Position) -> None:
        """Everything at or below ``position`` is durable downstream."""
        ...

    def lag_bytes(self) -> int | None: ...

    def close(self) -> None: ...


# What some log sources can do besides ``LogSource``; the runner asks with ``isinstance``.
@runtime_checkable
class Wakeable(Protocol):
    """A source whose stream waits in a way another thread can end early."""

    def wakeup(self) -> None:
        """Make a waiting ``stream`` return to its caller soon (thread-safe)."""
        ...


@runtime_checkable
class RunBatching(Protocol):
    """A source that encodes runs of row events into change-log blocks itself."""

    run_rows: int
    """At most this many rows per run (the runner sets it from ``batch_max_events``)."""


@runtime_checkable
class RefreshesTables(Protocol):
    def refresh_tables(self) -> None:
        """Re-read which tables are captured (new partitions, publication changes)."""
        ...


@runtime_checkable
class DescribesTables(Protocol):
    def table_schema(self, schema: str, table: str) -> TableSchema | None:
        """The table's schema from the source's catalog, as the stream would describe
        it (None: no such table)."""
        ...


@runtime_checkable
class ProgressRequesting(Protocol):
    def request_progress(self) -> None:
        """Report ``StreamPassed`` at transaction boundaries for a while (read-only
        snapshots wait for it)."""
        ...


@runtime_checkable
class KeepsAlive(Protocol):
    def keepalive(self) -> None:
        """Keep the replication connection alive while the stream is not read (a
        blocking snapshot)."""
        ...


class SnapshotReader(Protocol):
    """The IO a snapshot needs from a source: runs on its own connection, read-only
    transactions with a statement timeout for every SELECT."""

    def captured_tables(self) -> list[str]: ...

    def table_info(self, qualified: str, surrogate_key: str | None = None) -> TableInfo | None:
        ...

    def check_filter(self, info: TableInfo, condition: str) -> None:
        """Raise ``SignalError`` if ``condition`` does not parse or tries to write."""
        ...

    def max_key(self, info: TableInfo, condition: str | None) -> tuple[Any, ...] | None: ...

    def read_chunk(
        self,
        info: TableInfo,
        after: tuple[Any, ...] | None,
        max_key: tuple[Any, ...],
        limit: int,
        condition: str | None,
    ) -> Sequence[ChunkRow]:
        """Rows with ``after < key <= max_key`` in key order, at most ``limit``, values
        mapped exactly as the log stream maps them: dicts of JSON values, or
        ``EncodedRow``s whose JSON is byte for byte ``orjson.dumps`` of those dicts and
        whose event key is the table's identity (``TableInfo.identity``)."""
        ...

    def read_keys(self, info: TableInfo, keys: Sequence[tuple[Any, ...]]) -> Sequence[ChunkRow]:
        """The rows whose ``info.key`` (here the identity columns) equals one of ``keys``
        (values in ``info.key`` order, JSON-mapped as events carry them), in key order,
        mapped as ``read_chunk`` maps rows: a key-level re-read (``core.rereads``)."""
        ...

    def write_watermark(self, watermark_id: str) -> None:
        """Commit a watermark that will come back through the log."""
        ...

    def close(self) -> None: ...


# -- high availability ------------------------------------------------------------------
# One leader per capture pipeline, elected through a small port so that ZooKeeper, a
# PostgreSQL advisory lock (and later etcd or Kubernetes leases) are interchangeable.
# Leadership alone never makes a write safe (a leader can freeze, lose its session and
# wake up): each term has an ``epoch`` that only grows, and the change log refuses
# writes of any epoch but the newest that claimed it (``FencedChangeLog``).


class Lease(Protocol):
    """One term of leadership.

    ``epoch`` is strictly greater than the epoch of every earlier term of this election
    (it is incremented atomically with holding the leadership). ``check`` raises
    ``LeadershipLost`` unless the backend confirmed this term within the last part of
    the session timeout (a local, monotonic deadline: a process frozen past it fails the
    check when it wakes, before the backend tells it anything)."""

    epoch: int

    def check(self) -> None: ...

    def release(self) -> None:
        """Give leadership up now (idempotent); a standby takes over at once."""
        ...


class Election(Protocol):
    def campaign(self, stop: Any) -> Lease | None:
        """Block until this member leads (its ``Lease``) or ``stop`` (a
        ``threading.Event``) is set (``None``). Raises ``ElectionUnavailable`` only if
        the backend cannot be reached at all; otherwise it keeps trying."""
        ...

    def leader(self) -> str | None:
        """The current leader's member name, as far as the backend knows (status)."""
        ...

    def close(self) -> None: ...


class FencedChangeLog(Protocol):
    """A change log writer that takes part in fencing (the embedded log; Kafka with a
    transactional producer whose epoch is bumped by the new leader)."""

    def claim(self, epoch: int) -> None:
        """Make ``epoch`` the log's owner from now on: every later ``append`` of an older
        epoch fails with ``Fenced``. Raises ``Fenced`` if a newer epoch already claimed
        it. The check that an ``append`` still owns the log is made in the same atomic
        commit as the append."""
        ...


@runtime_checkable
class ConcurrentReader(Protocol):
    """A ``SnapshotReader`` that can read several chunks at once, each in its own window
    (``core.flight``): ``fork`` gives another reader on connections of its own (closed
    by this reader's ``close``), ``chunk_bounds`` cuts a key range into chunks."""

    def parallelism(self) -> int:
        """How many chunks to read at once (``[snapshot] parallelism``, else a default)."""
        ...

    def fork(self) -> SnapshotReader:
        """Another reader of the same source, on its own connections, reading each chunk
        in one SELECT (it does not split chunks itself)."""
        ...

    def chunk_bounds(
        self,
        info: TableInfo,
        after: tuple[Any, ...] | None,
        max_key: tuple[Any, ...],
        step: int,
        count: int,
        condition: str | None,
    ) -> list[tuple[Any, ...]]:
        """The keys of the ``step``-th, ``2·step``-th, ... row with ``after < key <=
        max_key`` (and ``condition``), at most ``count``, ascending, mapped as chunk keys
        are (index only where the database can)."""
        ...


@runtime_checkable
class IntegerKeyReader(Protocol):
    """A ``ConcurrentReader`` that can tell a single-column integer chunk key: its ranges
    are then cut by arithmetic (``core.intsplit``) instead of by ``chunk_bounds``
    queries, after the first."""

    def integer_key(self, info: TableInfo) -> bool:
        """``info.key`` is one column of an integer type of the database (signed or
        unsigned, any width), whose values chunk keys carry as JSON integers; False
        when ``PYDBLOG_INT_RANGES=0`` (``sources.intkeys``: benchmarks compare both)."""
        ...


@runtime_checkable
class FencedReader(Protocol):
    """A ``SnapshotReader`` that can read chunks for read-only snapshots (``[snapshot]
    watermark = "read-only"``): no watermark, the read's ``core.fence.ReadFence``
    instead."""

    def read_chunk_fenced(
        self,
        info: TableInfo,
        after: tuple[Any, ...] | None,
        max_key: tuple[Any, ...],
        limit: int,
        condition: str | None,
    ) -> tuple[Sequence[ChunkRow], Any]:
        """``read_chunk``'s rows and the ``ReadFence`` of the snapshot that read them."""
        ...

    def max_key_fenced(
        self, info: TableInfo, condition: str | None
    ) -> tuple[tuple[Any, ...] | None, Any]:
        """``max_key`` and the ``ReadFence`` of the snapshot that read it."""
        ...


@runtime_checkable
class ReplayWaiter(Protocol):
    """A ``FencedReader`` that may lag the stream (a hot standby) and can wait for it."""

    def wait_replayed(self, position: Position) -> bool:
        """Wait (bounded) until a read would see every commit up to ``position`` (its
        own included); True if it would, False on timeout. At once on a primary."""
        ...


@runtime_checkable
class FencedKeyReader(Protocol):
    """A ``FencedReader`` that can also re-read keys (``core.rereads``) in read-only
    snapshots (sources whose events can carry unchanged columns: PostgreSQL)."""

    def read_keys_fenced(
        self, info: TableInfo, keys: Sequence[tuple[Any, ...]]
    ) -> tuple[Sequence[ChunkRow], Any]:
        """``read_keys``' rows and the ``ReadFence`` of the snapshot that read them."""
        ...


@runtime_checkable
class WindowFencer(Protocol):
    """A ``SnapshotReader`` that can hand a ``ReadFence`` with watermark windows' rows
    where the source needs it (``CoreSettings.fenced``)."""

    def fences_watermark_windows(self) -> bool:
        """Every watermark window's rows come with the fence of their read (the source
        can make commits visible out of log order; asked once, at start)."""
        ...


@runtime_checkable
class BlockingFencer(Protocol):
    """A ``SnapshotReader`` that can hand a ``ReadFence`` with blocking reads' rows
    where the source needs it (``CoreSettings.fenced_blocking``)."""

    def fences_blocking_reads(self) -> bool:
        """Every blocking read's rows come with the fence of their read (the stream can
        deliver a commit before it is visible; asked once, at start)."""
        ...


@runtime_checkable
class RequestScoped(Protocol):
    """A ``SnapshotReader`` that wants to know when a snapshot request starts (a
    replica's reader waits for the source's state once per request, not per read)."""

    def begin_request(self) -> None:
        """A snapshot request starts on this reader; its reads follow."""
        ...


# -- capability declarations -------------------------------------------------------------
# A reader declares the optional capabilities above by subclassing their Protocols
# (``class MySqlSnapshotReader(ConcurrentReader, FencedReader, ...)``): mypy then checks
# its methods against each Protocol where the class is defined, and the driver asks
# ``isinstance(reader, FencedReader)`` (``runtime_checkable``), never ``hasattr``.

# -- the running capture, as the API reads it -------------------------------------------
# The HTTP API (``api``) reads the capture's state through these views, never through the
# capture's classes (``capture.runner.Runner`` implements ``RunnerView``): the API threads
# only read, each a single attribute or a call that takes no lock the capture holds long.


class StatusView(Protocol):
    """The capture's last status (``capture.status.StatusWriter``)."""

    @property
    def latest(self) -> dict[str, Any] | None:
        """Position, rate and snapshot progress as last written, at most ~1 s old; None
        before the first write."""
        ...

    @property
    def started_at(self) -> float:
        """When this capture (runner) started, in seconds since the epoch."""
        ...


class WriterView(Protocol):
    """The change log writer thread (``capture.writer.BatchWriter``)."""

    def backlog(self) -> int:
        """Batches handed to the writer and not appended yet."""
        ...

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the writer thread, None while it writes."""
        ...


class RunnerView(Protocol):
    """One capture run (``capture.runner.Runner``) as the API sees it."""

    @property
    def opened(self) -> bool:
        """The source's stream opened (the capture is not stuck starting)."""
        ...

    @property
    def status(self) -> StatusView: ...

    @property
    def writer(self) -> WriterView: ...

    @property
    def source(self) -> LogSource: ...
