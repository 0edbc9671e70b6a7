"""Kafka as the change log: Debezium-shaped topics, exactly once, checkpoint in Kafka.

Topics (``P`` = ``[log] topic_prefix``; names outside ``[A-Za-z0-9._-]`` get ``_``):

- ``P.<schema>.<table>``: one per captured table, created with ``[log] partitions``.
  Message key = the event key as JSON (``{"id":7}``), partitioned by librdkafka's
  ``murmur2_random`` (Java's default partitioner: the same key, the same partition as a
  Java producer would choose), so each key's events stay in order. Value = the envelope
  ``dblog tail`` prints (``offset`` first). Headers: ``dblog.source`` (the envelope's
  ``source`` block: the source position), ``dblog.writer`` (``generation:writer-id``).
  With ``[log] value_format`` ``json-schema`` or ``avro`` key and value are in that
  Kafka Connect format (``formats``: Debezium's schemas) and the envelope rides in the
  ``dblog.event`` header, which readers take (``event_value``).
  A table's topic holds what Debezium's holds: ``c``, ``u``, ``d``, ``r`` events, and
  truncates (``op: t``, one keyless message in partition 0) only with ``[log]
  truncates = "include"`` (Debezium's ``skipped.operations = none``; by default they go
  to ``P.__dblog.truncates``, as Debezium's default skips them). With ``tombstones`` a
  delete is followed by a null-valued message of the same key (for compaction).
  Logs written before notifications had their own topic hold a table's notifications
  and truncates in every partition of its topic (copies in partitions > 0 marked
  ``dblog.fanout``): readers still read them, skipping the copies.
- ``P.__dblog.checkpoint`` (one partition, never compacted): one message per commit,
  ``{"gen", "w", "a", "b", "cp", "ends", ...}``: the commit's global offsets
  ``a <= offset < b``, the checkpoint (source position, snapshot progress), and the
  end offset of every data partition the commit wrote (``ends``, only those).
- ``P.__dblog.schemas``: the table schemas as they change; ``P.__dblog.notifications``:
  every snapshot notification, shaped as Debezium's Kafka notification channel sends
  them (``notification_value``), the envelope in the ``dblog.event`` header.

Notifications and truncates have global offsets like every event: the checkpoint
topic's cuts order them with the data (readers merge every partition by offset), so
no table topic needs a message that Debezium's would not hold.

Exactly once. Every ``append`` is one Kafka transaction of the producer whose
``transactional.id`` is ``[log] transactional_id`` (default ``dblog-P``): data
messages, then ``flush`` (every data message acknowledged), then the partitions' end
offsets, then the checkpoint message, ``flush`` again, then the commit. The delivery
reports are checked against the partitions first (``KafkaChangeLog._copies``: a broker
that answers a retried produce as a duplicate without offsets, or appends it twice,
aborts the commit rather than making an event vanish or show twice). The checkpoint message is thus
never in Kafka unless every message it describes is; it is the commit record readers
trust, not the broker's transaction markers (the test broker, Tansu, does not hide
aborted records from ``read_committed`` consumers; real Kafka does, and then the same
rules give the same answer).

Readers (``KafkaChangeLogReader``, the Spark source) read the checkpoint topic in order
and, per data partition, only offsets below the ``ends`` of a valid checkpoint, keeping
a record only if its ``dblog.writer`` header names the writer of the first valid
checkpoint whose end is above the record's offset (``Span``). Where that checkpoint
lists the partition in ``runs`` (``first``: every offset ``first <= o < end`` is one of
its records, as its delivery reports showed: no aborted record, no other writer's in
between; the notification topic gets none: its values are not envelopes), the records are taken by offset without reading headers (the
sync's fast path); a partition a commit shares with anything else is checked record by
record. A writer session has a generation
``gen`` (one more than any in the topic, or the HA fencing epoch if larger) and a random
id ``w``, and opens with a begin message; a checkpoint message is valid iff its
``(gen, w)`` is the owner: the owner changes to a message with a higher ``gen``, and
messages of any other writer (a crashed session's aborted transaction, a fenced
zombie) are ignored; an HA claim's *fence* message changes the owner without being a
commit (``KafkaChangeLog.claim``). Global offsets are dense: a new session continues at the last
valid checkpoint's ``b``.

Invariants:
- ``append`` returns only once Kafka acknowledged the commit: the capture acknowledges
  the source (slot, binlog) only after that.
- The last valid checkpoint (``last_checkpoint``) can be read from Kafka alone, by any
  host: a capture elsewhere resumes there.
- Per partition, valid records are in global-offset order; at every valid checkpoint
  all partitions are consistent (every event below its ``b`` is readable below ``ends``).
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from pydblog import failpoints
from pydblog.changelog import kafka_native
from pydblog.errors import ChangeLogError, ChangeLogUnavailable, ConfigError, DblogError, Fenced
from pydblog.events import TAIL_SEP, Encoded, EncodedBlock, EncodedEvent
from pydblog.ports import ChangeLogReader, ChangeLogWriter, Checkpoint, LogRecord, TableSchema

if TYPE_CHECKING:
    from pydblog.config import LogConfig

log = logging.getLogger(__name__)

INTERNAL = "__dblog"
HEADER_SOURCE = "dblog.source"
HEADER_WRITER = "dblog.writer"
HEADER_FANOUT = "dblog.fanout"
"""Marked the copies of a truncate or table notification that logs written before
notifications had their own topic held in every partition but 0 (readers skip them)."""
HEADER_EVENT = "dblog.event"
"""The event's envelope (``{"offset": ...}``), which readers take instead of the value:
on a notification-topic message (the value is Debezium's notification shape), and on
every table record of a log with a Kafka Connect ``[log] value_format`` (``event_value``)."""
RECOVERY_WINDOW = 2000
KNOWN_EVERY = RECOVERY_WINDOW // 4
"""A writer that knows every data partition's last valid end puts them all into its
begin message and into every ``KNOWN_EVERY``-th commit (``CommitRecord.known``), so a
later session's recovery window holds them: its first commit to a partition outside
the window need not read the whole checkpoint topic (``KafkaChangeLog._valid_end``)."""
KNOWN_MAX_PARTITIONS = 20_000
"""Above this many data partitions the ends are not written (~40 bytes each: the
checkpoint message's 1 MB limit)."""
"""Recovery reads this many of the checkpoint topic's last messages: the newest
session's begin message is among them unless it committed more than that since (then
its first message in the window is taken as the owner)."""
TIMEOUT_S = 30.0
STALL_S = 5.0
FIRST_STALL_S = 1.0
FETCH_WAITS_MS = (5, 100, 500, 2000, 5000)
"""A read that gets nothing for ``STALL_S`` although the partition has records past its
position reads on with the next of these fetch waits (``_Client._storage_stall``); a
bounded read (every partition's end known) that got no record at all since it began
gives up the shortest wait after ``FIRST_STALL_S`` already (the storage stall answers a
read's first fetch with nothing, for good; a broker that is merely slow rarely takes
that long for a first fetch: up to ~1.1 s seen at a load of 9 on 2 cores). The first
step is kept for the process and the broker (``_LEARNED_WAITS``), and only the time
spent waiting for the broker counts: not the time the read's caller held it (a
``dblog sync`` reader waiting for the decode to catch up)."""
_LEARNED_WAITS: dict[str, int] = {}
"""The fetch wait each broker (bootstrap servers) is read with in this process, once a
read found the shortest too short (every reader thread and Spark task makes its own
``_Client``: each paid the stall again before). Only the first step is shared
(``FETCH_WAITS_MS[1]``): a client that needs longer waits steps on by itself, so that
one slow spell of the broker's storage does not leave every later read of the process
waiting seconds per fetch (Tansu answers a fetch with no records only after its whole
wait: the end of every read)."""
_LEARNED_LOCK = threading.Lock()
BULK_FETCH_WAIT_MS = 100
"""The fetch wait of a client made for bulk reads (``_Client(bulk=True)``: a ``dblog
sync`` task reading committed ranges, every record of which the broker holds). A fetch
wait only delays a fetch that finds no records, so with a broker that answers as soon as
it has records (Apache Kafka) it costs nothing here. A broker that answers a fetch with
only what it gathered within the wait (Tansu 0.6, ~5-7 ms of its CPU per fetch of a
large partition) is asked far fewer times: with 5 ms most fetches of a 333k-record
partition came back with nothing or one record batch."""
READ_PREFETCH = {"fetch.max.bytes": 8 * 1024 * 1024, "max.partition.fetch.bytes": 8 * 1024 * 1024,
                 "queued.min.messages": 50_000, "fetch.queue.backoff.ms": 10}
"""Reads are bounded (``read_range``'s ``hi``): librdkafka's default prefetch (100,000
messages, fetches of up to 50 MB) made a reader of 50k records (a ``dblog sync`` task's
piece of a partition) fetch and parse up to ~50k more past its end, and the broker
serve them. Smaller fetches (2 MB) saved more CPU but waited longer for Tansu's
answers. Once the queue holds ``queued.min.messages`` librdkafka pauses the partition's
fetches for ``fetch.queue.backoff.ms`` (default 1 s) even after the reader has emptied
the queue: a 99k-record read stalled 0.8-1.0 s in the middle (1.5-1.8 s in all, 0.7-0.8 s
with 10 ms). A fetch returns at most ``max.partition.fetch.bytes`` of a partition
(librdkafka's default 1 MB: a read of one partition waited for one broker round trip
per ~1 MB). ``[log.kafka]`` settings win."""
TRANSACTION_TIMEOUT_MS = 60_000
"""The capture's producer's ``transaction.timeout.ms`` (``[log.kafka]`` wins): a real
Kafka aborts a transaction that has been open this long (a capture killed in the middle
of a commit), which is when a read_committed read that waits at it goes on."""
HELD_RECHECK_S = 1.0
"""A stalled read that finds a partition's last stable offset below its high watermark
(an open transaction) looks again after this: held by it if the high watermark has not
moved (a live writer's transactions come and go; a dead capture's stays)."""
HELD_LOG_S = 15.0
"""How often a read held by an open transaction says so again."""
_BAD_TOPIC_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def _kafka() -> Any:
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError:
        raise ChangeLogError(
            "[log] type = \"kafka\" needs the Kafka client (confluent-kafka), which is not installed",
            hint="pip install 'pydblog[kafka]'",
        ) from None
    return confluent_kafka


def data_topic(prefix: str, qualified: str) -> str:
    """``P.<schema>.<table>`` (Debezium's naming; invalid characters become ``_``)."""
    return _BAD_TOPIC_CHARS.sub("_", f"{prefix}.{qualified}")


def checkpoint_topic(prefix: str) -> str:
    return f"{prefix}.{INTERNAL}.checkpoint"


def schemas_topic(prefix: str) -> str:
    return f"{prefix}.{INTERNAL}.schemas"


def notifications_topic(prefix: str) -> str:
    """Every snapshot notification, as Debezium's Kafka notification channel sends them
    (``notification_value``)."""
    return f"{prefix}.{INTERNAL}.notifications"


def truncates_topic(prefix: str) -> str:
    """Truncates under ``[log] truncates = "skip"``: out of the tables' topics, for
    pydblog's own readers (the envelope, as a table topic would hold it)."""
    return f"{prefix}.{INTERNAL}.truncates"


def notification_value(text: str) -> tuple[bytes, bytes]:
    """``(key, value)`` of a notification in the notification topic, from its envelope
    (``events.ChangeEvent.envelope``'s JSON), in the shape of Debezium's Kafka
    notification channel (``notification.sink.topic.name``): key ``{"id": ...}``, value
    ``{"id", "aggregate_type", "type", "additional_data", "timestamp"}``. ``id`` is the
    signal's id (as Debezium's incremental snapshot notifications carry the
    execute-snapshot signal's); ``additional_data`` is a map of strings as Debezium's
    (a list of strings joined with ``", "``, other values as JSON text, nulls left
    out); ``timestamp`` is the envelope's ``ts_ms``. pydblog's readers read the
    envelope itself, from the ``dblog.event`` header."""
    env = orjson.loads(text)
    note = env.get("notification") or {}
    ident = str(note.get("signal_id") or "")
    data: dict[str, str] = {}
    for name, v in (note.get("additional_data") or {}).items():
        if v is None:
            continue
        if isinstance(v, str):
            data[name] = v
        elif isinstance(v, list) and all(isinstance(x, str) for x in v):
            data[name] = ", ".join(v)
        else:
            data[name] = orjson.dumps(v).decode()
    value = {"id": ident, "aggregate_type": note.get("aggregate_type"), "type": note.get("type"),
             "additional_data": data, "timestamp": env.get("ts_ms")}
    return orjson.dumps({"id": ident}), orjson.dumps(value)


def client_config(cfg: LogConfig, **extra: Any) -> dict[str, Any]:
    """Settings for any Kafka client: bootstrap servers and ``[log.kafka]`` (security,
    tuning); ``extra`` first so that the user's settings win."""
    assert cfg.bootstrap_servers is not None
    conf: dict[str, Any] = {"bootstrap.servers": cfg.bootstrap_servers,
                            "logger": logging.getLogger("pydblog.kafka.client"), **extra}
    conf.update(cfg.kafka)
    return conf


def make_client(factory: Callable[[dict[str, Any]], Any], conf: dict[str, Any],
                cfg: LogConfig) -> Any:
    """``factory(conf)``: a confluent-kafka ``Producer``, ``Consumer`` or ``AdminClient``.
    A setting librdkafka refuses (an unknown key, a bad value, settings that conflict:
    ``[log.kafka]``) is a ``ConfigError`` naming it (exit code 2), not a Kafka error a
    retry could cure."""
    k = _kafka()
    try:
        return factory(conf)
    except k.KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], k.KafkaError) else None
        if err is None or err.code() != k.KafkaError._INVALID_ARG:
            raise
        raise bad_setting(cfg, err.str()) from None


def bad_setting(cfg: LogConfig, why: str) -> ConfigError:
    """The error for settings librdkafka refused with ``why``, naming the ``[log.kafka]``
    keys it is about (by name, or by their value: librdkafka names an alias's canonical
    key, ``compression.codec`` for ``compression.type``); secret values are masked."""
    from pydblog.config import _SECRET_SETTING

    for key, value in cfg.kafka.items():
        if _SECRET_SETTING.search(key) and str(value):
            why = why.replace(str(value), "***")
    named = [key for key, value in cfg.kafka.items()
             if any(f"{q}{key}{q}" in why for q in '"`')
             or (not _SECRET_SETTING.search(key) and f'"{value}"' in why)]
    where = ", ".join(f'"{key}"' for key in named) if named else "a setting"
    return ConfigError(
        f"[log.kafka] {where}: the Kafka client (librdkafka) refuses it: {why}",
        hint="fix or remove it in the [log.kafka] table of the config; its keys and values "
             "are librdkafka's (CONFIGURATION.md of librdkafka)",
    )


_PRODUCER_ONLY = ("compression.", "linger.", "batch.", "queue.buffering", "acks",
                  "enable.idempotence", "transaction", "partitioner", "message.timeout",
                  "delivery.timeout", "retries", "retry.backoff")


def _for_consumer(conf: dict[str, Any]) -> dict[str, Any]:
    """Drop producer-only settings (librdkafka warns about each otherwise)."""
    return {k: v for k, v in conf.items() if not k.startswith(_PRODUCER_ONLY)}


def _prefix(cfg: LogConfig) -> str:
    assert cfg.topic_prefix is not None
    return cfg.topic_prefix


def _unavailable(what: str, cfg: LogConfig, exc: BaseException) -> DblogError:
    k = _kafka()
    err = exc.args[0] if exc.args and isinstance(exc.args[0], k.KafkaError) else None
    if err is not None and err.code() in (
        k.KafkaError._FENCED, k.KafkaError.PRODUCER_FENCED,
        k.KafkaError.INVALID_PRODUCER_EPOCH,
    ):
        return Fenced(
            f"another capture took over the change log on {cfg.bootstrap_servers} ({err.str()})",
            hint="only one `dblog run` may write a topic prefix; this one stops",
        )
    if err is None and isinstance(exc, SystemError):
        # confluent-kafka, when the broker goes away inside a transaction, can raise
        # "_PyErr_SetObject: exception <class 'str'> is not a BaseException subclass":
        # its own error, garbled; what happened is the connection's loss.
        log.debug("Kafka client error during %s: %s", what, exc)
        return ChangeLogUnavailable(
            f"Kafka at {cfg.bootstrap_servers}: {what} failed: the broker stopped answering "
            "in the middle of it (connection lost)",
            hint="the capture retries from the last checkpoint in Kafka once the broker is back",
        )
    detail = err.str() if err is not None else str(exc)
    return ChangeLogUnavailable(f"Kafka at {cfg.bootstrap_servers}: {what} failed: {detail}")


def transaction_timeout_s(cfg: LogConfig) -> float:
    """The capture's ``transaction.timeout.ms`` in seconds (``[log.kafka]``, else
    ``TRANSACTION_TIMEOUT_MS``): readers share the capture's ``[log]`` config."""
    raw = cfg.kafka.get("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS)
    try:
        return max(0.0, float(raw) / 1000)
    except (TypeError, ValueError):
        return TRANSACTION_TIMEOUT_MS / 1000


@dataclass
class _Held:
    """One read's partitions that an open transaction holds (``_Client._stalled``)."""

    seen: dict[tuple[str, int], int] = field(default_factory=dict)
    """The partitions whose last stable offset was below their high watermark (this)
    at the last look."""
    until: float = 0.0
    """The read waits until then at least (monotonic time; 0: no such wait): while
    partitions are held, for the transaction's end; once it ended, ``TIMEOUT_S`` more
    (the read's own timeout ran out while it waited)."""
    holding: bool = False  # partitions were held at the last look
    told: float = -math.inf  # when the read last said so (monotonic: 0.0 is the boot)


def checkpoint_topic_exists(cfg: LogConfig) -> bool:
    client = _Client(cfg)
    try:
        return client.partitions(checkpoint_topic(_prefix(cfg))) > 0
    finally:
        client.close()


# -- the checkpoint topic's messages -------------------------------------------------------


@dataclass(slots=True)
class CommitRecord:
    """One checkpoint-topic message: a writer session's commit (or its begin)."""

    gen: int
    writer: str
    start: int  # global offsets start <= offset < end
    end: int
    checkpoint: Checkpoint | None
    ends: dict[str, dict[str, int]]  # topic -> partition (text) -> end offset
    begin: bool = False
    epoch: int | None = None
    kafka_offset: int = -1
    runs: dict[str, dict[str, int]] = field(default_factory=dict)
    """topic -> partition (text) -> first offset, for the partitions whose records of
    this commit are exactly the offsets ``first <= o < end`` (every one of them a record
    of this commit; never the notification topic's, whose envelopes are in headers):
    readers take those without looking at headers.
    Partitions not listed are checked record by record (``dblog.writer`` header)."""
    known: dict[str, dict[str, int]] | None = None
    """Every data partition's last valid end before this commit, as its writer knew
    them all (``KNOWN_EVERY``; readers ignore it: only the writer's recovery uses it)."""
    fence: bool = False
    """A claim's fence (``KafkaChangeLog.claim``): it makes its session the owner (no
    older session's later message is valid) but is no commit: the last commit, the next
    offset and the checkpoint stay those of the valid commit before it."""

    @property
    def writer_tag(self) -> str:
        return f"{self.gen}:{self.writer}"

    def to_bytes(self) -> bytes:
        head = orjson.dumps({
            "v": 1, "gen": self.gen, "w": self.writer, "a": self.start, "b": self.end,
            "begin": self.begin, "epoch": self.epoch, "ends": self.ends,
            **({"runs": self.runs} if self.runs else {}),
            **({"known": self.known} if self.known is not None else {}),
            **({"fence": True} if self.fence else {}),
            "ts": int(time.time() * 1000),
        })
        cp = self.checkpoint.to_bytes() if self.checkpoint is not None else b"null"
        return head[:-1] + b',"cp":' + cp + b"}"

    @classmethod
    def from_bytes(cls, raw: bytes, kafka_offset: int) -> CommitRecord:
        d = orjson.loads(raw)
        cp = d.get("cp")
        return cls(
            int(d["gen"]), str(d["w"]), int(d["a"]), int(d["b"]),
            Checkpoint.from_bytes(orjson.dumps(cp)) if cp is not None else None,
            {t: {p: int(o) for p, o in parts.items()} for t, parts in d.get("ends", {}).items()},
            bool(d.get("begin")), d.get("epoch"), kafka_offset,
            {t: {p: int(o) for p, o in parts.items()} for t, parts in d.get("runs", {}).items()},
            {t: {p: int(o) for p, o in parts.items()} for t, parts in d["known"].items()}
            if d.get("known") is not None else None,
            bool(d.get("fence")),
        )


@dataclass(frozen=True, slots=True)
class Span:
    """One valid commit's part of a data partition: the offsets from the previous valid
    commit's end there up to ``end``. If the commit listed a run (``first >= 0``), the
    valid records are exactly ``first <= o < end`` (no header needed); otherwise a record
    in the span is valid iff its ``dblog.writer`` header is ``tag`` (a crashed session's
    aborted records, a fenced writer's and the transaction markers are not)."""

    end: int
    first: int
    tag: str

    def valid(self, offset: int, tag: str | None) -> bool:
        if self.first >= 0:
            return self.first <= offset < self.end
        return offset < self.end and tag is not None and tag == self.tag


def _span_end(span: Span) -> int:
    return span.end


@dataclass
class CommitLog:
    """The valid commits as read so far, in checkpoint-topic order (see the module
    docstring for the owner rule), and per data partition the ``spans`` (one per valid
    commit that wrote it) that decide which records are valid.

    For seeking, ``bounds`` holds every valid commit's end ``b`` (ascending) and
    ``history`` per data partition the pairs ``(b, end offset)`` of the valid commits
    that wrote it. ``cut(x)`` at a commit boundary ``x`` is exact: a valid record with
    global offset ``< x`` lies below ``cut(x)`` in its partition, one with offset
    ``>= x`` at or above it (it was written by a later commit)."""

    owner: tuple[int, int, str] | None = None  # (epoch, gen, writer)
    max_gen: int = 0
    max_epoch: int = 0
    read_to: int = 0  # the checkpoint topic's offset after the last message applied
    last: CommitRecord | None = None
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    bounds: list[int] = field(default_factory=list)
    history: dict[tuple[str, int], tuple[list[int], list[int]]] = field(default_factory=dict)
    spans: dict[tuple[str, int], list[Span]] = field(default_factory=dict)
    track: bool = True
    """False: keep only the owner, the last commit and the partitions' ends (memory
    independent of the number of commits: ``KafkaLogFigures``); no seeking, no
    validity."""
    floor: int = 0
    """``forget`` dropped what only reads below this commit boundary need: ``cut``,
    ``window``, ``span`` and ``valid`` answer as before for offsets ``>= floor`` (and
    Kafka offsets at or above ``cut(floor)``); ``first_complete`` and ``history`` below
    it are gone (0: nothing forgotten)."""

    whole: bool = False
    """``recover_commits`` read the checkpoint topic from its start (the writer then
    knows every partition's last valid end)."""

    def apply(self, rec: CommitRecord) -> bool:
        """Take one message; True if it is valid."""
        self.max_gen = max(self.max_gen, rec.gen)
        self.max_epoch = max(self.max_epoch, rec.epoch or 0)
        self.read_to = max(self.read_to, rec.kafka_offset + 1)
        key = (rec.epoch or 0, rec.gen, rec.writer)
        if self.owner is None or key[:2] > self.owner[:2]:
            self.owner = key
        elif key != self.owner:
            return False
        if rec.fence:
            return True
        self.last = rec
        tag = rec.writer_tag
        if not self.track:
            for topic, parts in rec.ends.items():
                for p, end in parts.items():
                    tp = (topic, int(p))
                    self.ends[tp] = max(end, self.ends.get(tp, 0))
            return True
        if not self.bounds or rec.end > self.bounds[-1]:
            self.bounds.append(rec.end)
        for topic, parts in rec.ends.items():
            for p, end in parts.items():
                tp = (topic, int(p))
                prev = self.ends.get(tp, 0)
                if end <= prev:
                    continue
                self.ends[tp] = end
                bs, es = self.history.setdefault(tp, ([], []))
                if bs and bs[-1] == rec.end:
                    es[-1] = end
                else:
                    bs.append(rec.end)
                    es.append(end)
                first = rec.runs.get(topic, {}).get(p, -1)
                self.spans.setdefault(tp, []).append(
                    Span(end, first if prev <= first < end else -1, tag))
        return True

    @property
    def next_offset(self) -> int:
        return self.last.end if self.last is not None else 0

    def cut(self, offset: int) -> dict[tuple[str, int], int]:
        """Per data partition, the end offset after the last valid commit whose end is
        ``<= offset``: no valid record below it has a global offset ``>= offset``; at a
        commit boundary, every record with a smaller global offset lies below it (see
        the class docstring). Partitions no such commit wrote start at 0."""
        out: dict[tuple[str, int], int] = {}
        for tp, (bs, es) in self.history.items():
            i = bisect.bisect_right(bs, offset)
            if i:
                out[tp] = es[i - 1]
        return out

    def window(self, offset: int, size: int) -> tuple[int, int]:
        """Commit boundaries ``lo <= offset < hi`` around ``offset`` with ``hi`` the first
        boundary at or past ``offset + size`` (or the log's end): reading each partition
        from ``cut(lo)`` to ``cut(hi)`` gives exactly the events ``lo <= o < hi``
        (``offset < next_offset``)."""
        bounds = self.bounds
        i = bisect.bisect_right(bounds, offset)
        lo = bounds[i - 1] if i else 0
        j = bisect.bisect_left(bounds, offset + max(size, 1), lo=i)
        hi = bounds[j] if j < len(bounds) else self.next_offset
        return lo, hi

    def forget(self, before: int) -> None:
        """Drop the commits that reads at global offsets ``>= floor`` no longer need,
        ``floor`` being the last commit boundary ``<= before``: the boundaries below
        it, per partition the history entries before the last one at or below it (that
        one is ``cut(floor)`` there) and the spans ending at or below that cut. What is
        kept grows with the commits from ``floor`` on, not with the whole log (a
        follower that moves ``before`` along holds a bounded window)."""
        i = bisect.bisect_right(self.bounds, before)
        if i <= 1:
            return
        floor = self.bounds[i - 1]
        del self.bounds[:i - 1]
        for tp, (bs, es) in self.history.items():
            j = bisect.bisect_right(bs, floor)  # entries [0, j) end at or below floor
            if j > 1:
                del bs[:j - 1]
                del es[:j - 1]
            spans = self.spans.get(tp)
            if j and spans:
                del spans[:bisect.bisect_right(spans, es[0], key=_span_end)]
        self.floor = max(self.floor, floor)

    def first_complete(self, lows: Mapping[tuple[str, int], int]) -> int:
        """The first commit boundary from which on every valid record is at or above its
        partition's low watermark (``lows``: what retention kept): where a reader of a
        log whose beginning was deleted can start without a gap."""
        first = 0
        for tp, low in lows.items():
            hist = self.history.get(tp)
            if low <= 0 or hist is None:
                continue
            bs, es = hist
            i = bisect.bisect_left(es, low)  # the first commit that ends at or above low
            first = max(first, bs[i] if i < len(bs) else bs[-1])
        return first

    def span(self, tp: tuple[str, int], offset: int) -> Span | None:
        """The valid commit whose records in ``tp`` lie around ``offset`` (the first
        span ending above it), or None (past every valid commit)."""
        spans = self.spans.get(tp)
        if not spans:
            return None
        i = bisect.bisect_right(spans, offset, key=_span_end)
        return spans[i] if i < len(spans) else None

    def valid(self, tp: tuple[str, int], offset: int, tag: str | None) -> bool:
        """Whether the record at ``offset`` of ``tp`` with writer ``tag`` is committed
        (``Span.valid``; ``tag`` is only needed where the commit listed no run)."""
        span = self.span(tp, offset)
        return span is not None and span.valid(offset, tag)


def commit_ends(
    delivered: Mapping[tuple[str, int], Sequence[int]], no_run: Iterable[tuple[str, int]],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """A commit's ``ends`` and ``runs`` from its delivery reports: per data partition
    ``[lowest offset, highest offset, records]`` (``no_run``: partitions whose records
    readers must look at, the notification topic's: its values are not envelopes). The
    end is one past the highest offset; the partition has a run from the lowest if its
    records fill every offset in between (offsets are unique in a partition, so then
    nothing else lies there) and it is not in ``no_run``."""
    ends: dict[str, dict[str, int]] = {}
    runs: dict[str, dict[str, int]] = {}
    skip = set(no_run)
    for (topic, part), (first, last, count) in delivered.items():
        ends.setdefault(topic, {})[str(part)] = last + 1
        if count == last + 1 - first and (topic, part) not in skip:
            runs.setdefault(topic, {})[str(part)] = first
    return ends, runs


def _one_partition(msgs: list[Any], tp: tuple[str, int], hi: int | None) -> list[Any] | None:
    """A ``consume`` batch of a one-partition read, cut at ``hi``, if it holds only data
    messages of ``tp`` (checked a column at a time: no Python code per message), else
    None (the caller looks at each message)."""
    import confluent_kafka

    msg = confluent_kafka.Message
    if any(map(msg.error, msgs)) or set(map(msg.partition, msgs)) != {tp[1]} or set(
            map(msg.topic, msgs)) != {tp[0]}:
        return None
    if hi is None or msgs[-1].offset() < hi:
        return msgs
    return msgs[:bisect.bisect_left([m.offset() for m in msgs], hi)]


def _eof_ends(offset: int, hi: int | None) -> bool:
    """Whether an end-of-partition event at ``offset`` ends a read up to ``hi`` (None: to
    the end). A bounded read's ``hi`` is one past a record of a committed transaction
    (``commit_ends``): the broker holds every offset below it, so an end below ``hi`` is
    the broker not showing them yet (Tansu on S3 reports a partition's end behind it; a
    read_committed end stops at another producer's open transaction), never the end of
    what is read: the read goes on (the position check, ``_storage_stall`` and the read
    timeout apply). Trusted, it ended the read early, the records below ``hi`` missing
    (tests/kafka/test_bounded_read.py)."""
    return hi is None or offset >= hi


def _header(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> bytes | None:
    for k, v in headers or ():
        if k == name:
            return v
    return None


def event_value(m: Any) -> bytes | None:
    """A data message's event as pydblog's JSON envelope (``parse_value`` reads it): the
    ``dblog.event`` header of a record in a Kafka Connect format, else the value (the
    ``json`` format; a null value, a tombstone, stays null)."""
    value: bytes | None = m.value()
    if value is None:
        return None
    headers = m.headers()
    if headers and len(headers) > 2:
        event = _header(headers, HEADER_EVENT)
        if event is not None:
            return event
    return value


class _Client:
    """The Kafka clients a log needs: an admin client and a consumer for bounded reads
    (``read_range``), with the topic metadata cached."""

    def __init__(self, cfg: LogConfig, native: bool = False, uncommitted: bool = False,
                 bulk: bool = False) -> None:
        self.k = _kafka()
        self.uncommitted = uncommitted  # read open transactions' records too (the writer's check)
        self.cfg = cfg
        self.prefix = _prefix(cfg)
        self._admin: Any = None
        self._consumer: Any = None
        # ``read_values`` by ``kafka_native`` (its consumer then has no logger); it reads
        # values only, so not for a Kafka Connect format (the event is in a header)
        self.formatted = cfg.value_format != "json"
        self.native = native and not self.formatted and kafka_native.available()
        self._client_id = ""
        self._partitions: dict[str, int] = {}
        self._consumer_topics: set[str] = set()  # topics whose metadata the consumer has
        self.fetched = 0  # messages ``read_range`` returned (how much a read cost)
        self._consumer_wait = 0  # the fetch wait the open consumer was made with
        self._own_wait = 0  # a longer wait this client stepped to (``_storage_stall``)
        # bulk: reads of records the broker holds (``BULK_FETCH_WAIT_MS``)
        self._base_wait = BULK_FETCH_WAIT_MS if bulk else FETCH_WAITS_MS[0]

    @property
    def fetch_wait_ms(self) -> int:
        """The fetch wait a new consumer gets: ``FETCH_WAITS_MS[0]`` (low latency: Tansu
        does not answer a waiting fetch early; ``BULK_FETCH_WAIT_MS`` for a bulk client)
        unless a read of this process found it too short for the broker's storage
        (``_storage_stall``)."""
        return max(self._own_wait, self._base_wait,
                   _LEARNED_WAITS.get(str(self.cfg.bootstrap_servers), FETCH_WAITS_MS[0]))

    @property
    def admin(self) -> Any:
        """The admin client, made on first use (a read of given offsets needs none)."""
        if self._admin is None:
            self._admin = make_client(
                self.k.admin.AdminClient, _for_consumer(client_config(self.cfg)), self.cfg)
        return self._admin

    def consumer(self) -> Any:
        if self._consumer is None:
            self._consumer_wait = self.fetch_wait_ms
            conf = _for_consumer(client_config(
                self.cfg,
                **{"group.id": f"dblog-reader-{uuid.uuid4().hex[:8]}",
                   "enable.auto.commit": False,
                   "isolation.level": "read_uncommitted" if self.uncommitted else "read_committed",
                   "auto.offset.reset": "error", "fetch.wait.max.ms": self._consumer_wait,
                   "enable.partition.eof": True, **READ_PREFETCH},
            ))
            if self.native:
                conf, self._client_id = kafka_native.consumer_config(conf)
            self._consumer = make_client(self.k.Consumer, conf, self.cfg)
        return self._consumer

    def _read_consumer(self) -> Any:
        """The consumer a read starts with: re-made if another reader of the process
        learned a longer fetch wait since it was made (``_storage_stall``): else this
        read, too, got nothing until it had waited ``STALL_S`` out."""
        if self._consumer is not None and self._consumer_wait < self.fetch_wait_ms:
            self._consumer.close()
            self._consumer = None
            self._consumer_topics = set()
        return self.consumer()

    def partitions(self, topic: str, refresh: bool = False) -> int:
        """Partition count (0: no such topic)."""
        if refresh or topic not in self._partitions:
            # All topics: asking for one by name makes some brokers (Tansu) create it.
            try:
                md = self.admin.list_topics(timeout=TIMEOUT_S)
            except self.k.KafkaException as exc:
                raise _unavailable("reading metadata", self.cfg, exc) from None
            for name, t in md.topics.items():
                if t.error is None and t.partitions:
                    self._partitions[name] = len(t.partitions)
        return self._partitions.get(topic, 0)

    def ensure_topics(self, topics: Iterable[str], partitions: int) -> None:
        """Create the topics that are missing (``partitions`` each; internal topics 1)."""
        missing = [t for t in set(topics) if t not in self._partitions and not self.partitions(t)]
        if not missing:
            return
        new = [
            self.k.admin.NewTopic(
                t, 1 if f".{INTERNAL}." in t else partitions, self.cfg.replication_factor,
                config={"retention.ms": "-1"} if t in (checkpoint_topic(self.prefix),
                                                      schemas_topic(self.prefix)) else {},
            )
            for t in missing
        ]
        for topic, fut in self.admin.create_topics(new, request_timeout=TIMEOUT_S).items():
            try:
                fut.result()
            except self.k.KafkaException as exc:
                if exc.args[0].code() != self.k.KafkaError.TOPIC_ALREADY_EXISTS:
                    raise ChangeLogError(
                        f"cannot create topic {topic} on {self.cfg.bootstrap_servers}: {exc.args[0].str()}",
                        hint="create it yourself or grant the capture's principal CREATE",
                    ) from None
        deadline = time.monotonic() + TIMEOUT_S
        for t in missing:
            while not self.partitions(t, refresh=True):
                if time.monotonic() > deadline:
                    raise ChangeLogUnavailable(f"topic {t} was created but does not show up")
                time.sleep(0.05)

    def last_stable(self, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Each partition's last stable offset (read_committed's end: below the first
        record of an open transaction, if any; Tansu answers 0 for a partition that
        holds one)."""
        if not tps:
            return {}
        k = self.k
        got = self._list_offsets(tps, k.admin.OffsetSpec.latest(), k.IsolationLevel.READ_COMMITTED)
        return {tp: max(0, o) for tp, o in got.items()}

    def _list_offsets(self, tps: Sequence[tuple[str, int]], spec: Any,
                      isolation: Any = None) -> dict[tuple[str, int], int]:
        """The broker's list-offsets answer for each partition. A retriable error (a
        partition whose leader is not elected yet or just moved: "not leader", "leader
        not available", "unknown topic or partition" for a topic a moment old) is asked
        again until ``TIMEOUT_S``; any other error, or one still there then, is
        ``ChangeLogUnavailable``."""
        k = self.k
        deadline = time.monotonic() + TIMEOUT_S
        pause = 0.02
        while True:
            try:
                kw = {} if isolation is None else {"isolation_level": isolation}
                got = self.admin.list_offsets(
                    {k.TopicPartition(t, p): spec for t, p in tps}, request_timeout=TIMEOUT_S, **kw)
                return {(tp.topic, tp.partition): f.result().offset for tp, f in got.items()}
            except k.KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], k.KafkaError) else None
                again = err is not None and (err.retriable() or err.code() in (
                    k.KafkaError.NOT_LEADER_FOR_PARTITION, k.KafkaError.LEADER_NOT_AVAILABLE,
                    k.KafkaError.UNKNOWN_TOPIC_OR_PART))  # (the admin client calls them final)
                if not again or time.monotonic() + pause > deadline:
                    raise _unavailable("listing offsets", self.cfg, exc) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def watermarks(self, tps: Sequence[tuple[str, int]], committed: bool = False) -> dict[tuple[str, int], tuple[int, int]]:
        """(low, high) offsets of each partition, in one request per broker."""
        if not tps:
            return {}
        k = self.k
        spec = k.admin.OffsetSpec
        iso = k.IsolationLevel.READ_COMMITTED if committed else k.IsolationLevel.READ_UNCOMMITTED
        his = self._list_offsets(tps, spec.latest(), iso)
        los = self._list_offsets(tps, spec.earliest())
        return {tp: (max(0, los[tp]), max(0, his[tp])) for tp in his}

    def read_range(self, ranges: Mapping[tuple[str, int], tuple[int, int | None]],
                   to_now: bool = False) -> Iterator[Any]:
        """Every message with ``lo <= offset < hi`` of each partition (per partition in
        offset order), as confluent-kafka ``Message``s; ``hi = None``: to the end (the
        fetch's end-of-partition; a broker's list-offsets answer is not trusted: Tansu's
        lags behind on S3 storage and counts batches in memory).

        ``to_now``: a read to the end also ends once it is past where the partition ended
        when the read began (its high watermark then; if that is not past ``lo``, one
        record or marker past ``lo``) and a ``consume`` finds nothing more fetched, if no
        end-of-partition event came first: records appended since may come with it, the
        rest is the caller's next read. For readers that come back for more (a
        follower's checkpoint-topic reads): a read that has to see an end-of-partition
        event never ends while the partition grows within every fetch wait (Tansu
        answers a fetch at the end only after its whole wait, with the records that came
        meanwhile: an idle capture's heartbeat commits outpaced a follower whose fetch
        wait storage stalls had stepped up). Records are never cut at that point: Tansu's
        high watermark on S3 lags the partition's end by up to ~16 offsets for good (it
        moves in steps), and a follower of an idle capture would wait that many commits
        for the last one."""
        for batch in self.read_batches(ranges, to_now):
            yield from batch

    def read_batches(self, ranges: Mapping[tuple[str, int], tuple[int, int | None]],
                     to_now: bool = False) -> Iterator[list[Any]]:
        """``read_range`` a list of messages at a time (one ``consume`` call's worth).

        ``todo[tp][0]`` follows the read: the offset after the last record returned. A
        consumer re-made by ``_storage_stall`` starts there (its ``position()`` says
        nothing until it returned a record), and a record below it (returned already) is
        dropped: no record twice."""
        todo = {tp: r for tp, r in ranges.items() if r[1] is None or r[1] > r[0]}
        if not todo:
            return
        now_ends: dict[tuple[str, int], int] = {}  # ``to_now``: see ``_now_done``
        if to_now and any(hi is None for _, hi in todo.values()):
            opens = sorted(tp for tp, (_, hi) in todo.items() if hi is None)
            marks = self.watermarks(opens)
            now_ends = {tp: max(marks[tp][1], todo[tp][0] + 1) for tp in opens}
        k = self.k
        c = self._read_consumer()
        self._know_topics(c, {t for t, _ in todo})
        c.assign([k.TopicPartition(t, p, lo) for (t, p), (lo, _) in todo.items()])
        deadline = time.monotonic() + TIMEOUT_S
        stalled_at = time.monotonic() + self._first_stall_s(todo)
        held = _Held()  # partitions an open transaction holds (``_stalled``)
        single = next(iter(todo)) if len(todo) == 1 else None
        try:
            while todo:
                # A short wait: consume() returns only at 10,000 messages or the timeout.
                msgs = c.consume(10_000, 0.01)
                if msgs and single is not None and single in todo:
                    nxt, hi = todo[single]
                    out = _one_partition(msgs, single, hi)
                    if out is not None:
                        deadline = time.monotonic() + TIMEOUT_S
                        stalled_at = time.monotonic() + STALL_S
                        at_hi = len(out) < len(msgs)
                        if out and out[0].offset() < nxt:  # returned already
                            out = out[bisect.bisect_left([m.offset() for m in out], nxt):]
                        if out:
                            todo[single] = (out[-1].offset() + 1, hi)
                            self.fetched += len(out)
                            yield out
                            # waiting for the caller is not waiting for the broker
                            deadline = time.monotonic() + TIMEOUT_S
                            stalled_at = time.monotonic() + STALL_S
                        if hi is not None and (at_hi or todo[single][0] >= hi):
                            del todo[single]
                        elif hi is not None:
                            self._check_positions(c, todo)
                        continue
                if not msgs:
                    self._check_positions(c, todo)
                    if now_ends:
                        self._now_done(c, todo, now_ends)
                    if todo and time.monotonic() > stalled_at:
                        c, stalled_at = self._stalled(c, todo, held, deadline)
                    if todo and time.monotonic() > max(deadline, held.until):
                        raise self._timed_out(todo, held, deadline)
                    continue
                deadline = time.monotonic() + TIMEOUT_S
                stalled_at = time.monotonic() + STALL_S
                done = []
                out = []
                for m in msgs:
                    if m.error() is not None:
                        if m.error().code() == k.KafkaError._PARTITION_EOF:
                            # The broker's end: the end of a read to the end, not of one
                            # to ``hi`` below it (``_eof_ends``).
                            eof_tp = (m.topic(), m.partition())
                            if _eof_ends(m.offset(), todo.get(eof_tp, (0, None))[1]):
                                done.append(eof_tp)
                            continue
                        if m.error().code() in (k.KafkaError._AUTO_OFFSET_RESET,
                                                k.KafkaError.OFFSET_OUT_OF_RANGE):
                            raise self._deleted(m, todo)
                        raise _unavailable("reading", self.cfg, k.KafkaException(m.error()))
                    tp = (m.topic(), m.partition())
                    r = todo.get(tp)
                    if r is None:
                        continue
                    off = m.offset()
                    nxt, hi = r
                    if off < nxt:  # returned already
                        continue
                    if hi is not None and off >= hi:
                        done.append(tp)
                        continue
                    out.append(m)
                    todo[tp] = (off + 1, hi)
                    if hi is not None and off + 1 >= hi:
                        done.append(tp)
                if out:
                    self.fetched += len(out)
                    yield out
                    deadline = time.monotonic() + TIMEOUT_S
                    stalled_at = time.monotonic() + STALL_S
                finished = [k.TopicPartition(t, p) for t, p in set(done) if (t, p) in todo]
                for tp in finished:
                    del todo[(tp.topic, tp.partition)]
                if finished and todo:
                    c.incremental_unassign(finished)
                if not done and todo:
                    self._check_positions(c, todo)
        finally:
            c.unassign()

    def read_values(self, tp: tuple[str, int], lo: int, hi: int) -> Iterator[kafka_native.RawBatch]:
        """``read_batches({tp: (lo, hi)})`` a ``kafka_native.RawBatch`` at a time: the
        same messages (data messages with ``lo <= offset < hi``, in offset order) and the
        same errors, without a Python object per message; ``todo[tp][0]`` follows the read
        as in ``read_batches``. Needs ``native``."""
        if hi <= lo:
            return
        assert self.native, "read_values needs a client made with native=True"
        import numpy as np  # the spark extra's, as is every caller of this

        k = self.k
        c = self._read_consumer()
        self._know_topics(c, {tp[0]})
        c.assign([k.TopicPartition(tp[0], tp[1], lo)])
        todo: dict[tuple[str, int], tuple[int, int | None]] = {tp: (lo, hi)}
        deadline = time.monotonic() + TIMEOUT_S
        stalled_at = time.monotonic() + self._first_stall_s(todo)
        held = _Held()  # partitions an open transaction holds (``_stalled``)
        try:
            while todo:
                b = kafka_native.consume(c, self._client_id, 10_000, 0.01)
                done = False
                for _, code, topic, part, offset, why in b.errors:
                    if code == k.KafkaError._PARTITION_EOF:
                        done = done or _eof_ends(offset, hi)
                    elif code in (k.KafkaError._AUTO_OFFSET_RESET, k.KafkaError.OFFSET_OUT_OF_RANGE):
                        raise self._deleted_at(topic, part, offset, why, todo)
                    else:
                        raise _unavailable("reading", self.cfg, k.KafkaException(k.KafkaError(code, why)))
                if len(b):
                    if (b.partitions != tp[1]).any():
                        raise ChangeLogError(f"a read of {tp} got records of another partition")
                    deadline = time.monotonic() + TIMEOUT_S
                    stalled_at = time.monotonic() + STALL_S
                    nxt = todo[tp][0]
                    # below nxt: returned already (a consumer re-made by _storage_stall)
                    skip = int(np.searchsorted(b.offsets, nxt)) if int(b.offsets[0]) < nxt else 0
                    cut = int(np.searchsorted(b.offsets, hi))
                    if skip or cut < len(b):
                        start = int(b.lengths[:skip].clip(min=0).sum())
                        size = int(b.lengths[:cut].clip(min=0).sum())
                        done = done or cut < len(b)
                        b = kafka_native.RawBatch(b.data[start:size], b.lengths[skip:cut], b.offsets[skip:cut],
                                                  b.partitions[skip:cut], [])
                    if len(b):
                        todo[tp] = (int(b.offsets[-1]) + 1, hi)
                        self.fetched += len(b)
                        yield b
                        # waiting for the caller is not waiting for the broker
                        deadline = time.monotonic() + TIMEOUT_S
                        stalled_at = time.monotonic() + STALL_S
                        done = done or int(b.offsets[-1]) + 1 >= hi
                if done:
                    return
                self._check_positions(c, todo)
                if not len(b) and todo:
                    if time.monotonic() > stalled_at:
                        c, stalled_at = self._stalled(c, todo, held, deadline)
                    if time.monotonic() > max(deadline, held.until):
                        raise self._timed_out(todo, held, deadline)
        finally:
            c.unassign()

    def _know_topics(self, c: Any, topics: set[str]) -> None:
        """Ask for the metadata of ``topics`` the consumer has not seen before assigning
        them: librdkafka otherwise looks a newly assigned topic up on its own timer, and a
        consumer's second topic waited ~0.7 s for its first record (the first ~0.1 s), on
        Tansu; asked here, ~0.05 s. By name: a consumer's metadata request creates no
        topic. Best effort: on failure the assignment looks them up itself."""
        for topic in sorted(topics - self._consumer_topics):
            try:
                c.list_topics(topic, timeout=TIMEOUT_S)
            except self.k.KafkaException:
                return
            self._consumer_topics.add(topic)

    def _first_stall_s(self, todo: Mapping[tuple[str, int], tuple[int, int | None]]) -> float:
        """How long a read that got no record yet waits before ``_storage_stall``
        (``FIRST_STALL_S``: bounded, with the shortest fetch wait)."""
        bounded = all(hi is not None for _, hi in todo.values())
        return FIRST_STALL_S if bounded and self._consumer_wait == FETCH_WAITS_MS[0] else STALL_S

    def _stalled(self, c: Any, todo: dict[tuple[str, int], tuple[int, int | None]], held: _Held,
                 deadline: float) -> tuple[Any, float]:
        """A read that got nothing for a while (``deadline``: ``TIMEOUT_S`` after it last
        got a record): is an open transaction holding a partition, or the broker's
        storage (``_storage_stall``)? Returns the consumer to read on with and when to
        look again.

        A partition whose last stable offset is below its high watermark holds an open
        transaction (a read_committed read stops at its first record; Tansu reports 0
        as the last stable offset then, a real Kafka the transaction's first offset):
        held by it when its high watermark has not moved since the last look (a live
        capture's transactions commit within a commit's time and the partition grows;
        a killed one's stays open). The read then waits for it: until it commits or the
        broker aborts it, ``transaction.timeout.ms`` after it began
        (``transaction_timeout_s``), so up to that plus ``TIMEOUT_S`` from now, and says
        so by name every ``HELD_LOG_S``. It is not a storage stall: no longer fetch wait
        (the 'too short' warning said so before, the wait was learned for the process,
        and the read timed out after ``TIMEOUT_S``, before the broker's abort)."""
        now = time.monotonic()
        highs = {tp: hw for tp, (_, hw) in self.watermarks(list(todo)).items()}
        stable = self.last_stable(list(todo))
        opened = {tp: hw for tp, hw in highs.items() if stable[tp] < hw}
        holding = sorted(tp for tp, hw in opened.items() if held.seen.get(tp) == hw)
        fresh = {tp for tp in opened if tp not in held.seen}  # looked at again soon
        held.seen = opened
        if not holding:
            if held.holding:  # it ended: the read's own timeout starts again
                held.until = now + TIMEOUT_S
            held.holding = False
            held.told = -math.inf
        else:
            timeout = transaction_timeout_s(self.cfg)
            if not held.holding:
                held.holding = True
                held.until = now + timeout + TIMEOUT_S
            if now - held.told >= HELD_LOG_S:
                held.told = now
                log.warning(
                    "Kafka at %s: %s holds an open transaction below the end of this read "
                    "(its last stable offset is below its high watermark, %d; nothing read for "
                    "%.0f s). A capture killed in the middle of a commit leaves one: it ends when "
                    "the transaction commits or when the broker aborts it, transaction.timeout.ms "
                    "(%.0f s) after it began, and the read waits for that (at most %.0f s more). "
                    "Starting `dblog run` again aborts it at once (its producer has the same "
                    "transactional.id)",
                    self.cfg.bootstrap_servers,
                    ", ".join(f"{t} partition {p}" for t, p in holding[:3]), highs[holding[0]],
                    now - (deadline - TIMEOUT_S), timeout, held.until - now)
        # A partition whose high watermark moved (a live capture's transactions) may
        # still be a storage stall: a capture writing the partition has one open most of
        # the time.
        if self._storage_stall(c, todo, highs, {*holding, *fresh}):
            c = self.consumer()  # the same positions, a longer fetch wait
        return c, now + (HELD_RECHECK_S if fresh else STALL_S)

    def _timed_out(self, todo: Mapping[tuple[str, int], tuple[int, int | None]], held: _Held,
                   deadline: float) -> DblogError:
        """The error of a read that waited in vain: for an open transaction (``_stalled``)
        past the time the broker should have aborted it, or ``TIMEOUT_S`` for records."""
        where = self.cfg.bootstrap_servers
        if held.holding:
            waited = time.monotonic() - (deadline - TIMEOUT_S)
            parts = ", ".join(f"{t} partition {p}" for t, p in sorted(held.seen)[:3])
            return ChangeLogUnavailable(
                f"Kafka at {where}: an open transaction in {parts}, below the end of this read, "
                f"did not end in {waited:.0f} s, although its transaction.timeout.ms "
                f"({transaction_timeout_s(self.cfg):.0f} s) is past: the broker did not abort "
                "it (Tansu never does)",
                hint="start `dblog run` again: its producer (the same transactional.id) aborts "
                     "the killed capture's transaction at start")
        return ChangeLogUnavailable(f"Kafka at {where}: reading {sorted(todo)[:3]} timed out")

    def _storage_stall(self, c: Any, todo: dict[tuple[str, int], tuple[int, int | None]],
                       highs: Mapping[tuple[str, int], int], held: set[tuple[str, int]]) -> bool:
        """Tansu (0.6, S3 storage) after a restart reads the partition from S3 for each
        fetch and, when that takes longer than the fetch's ``max_wait``, answers with no
        records and no error, for good (docs/kafka.md has the reproduction with a bare
        client). If a partition has records past the consumer's position and nothing
        came for ``STALL_S``, read on with the next longer fetch wait (``FETCH_WAITS_MS``:
        S3 reads slow down with the machine's load). A broker that answers as soon as it
        has records never gets here. The wait is learned for the process and broker: a
        reader whose consumer was made before another one learned it reads on with that
        wait (no further step). The new consumer starts at each partition's position or
        ``todo``'s next offset, whichever is higher: a consumer that has returned no record
        (one made by an earlier step of the same read) has no position (-1001).
        ``highs``: the partitions' high watermarks; partitions in ``held`` have (or may
        have: ``_stalled``) an open transaction at their end: not a storage stall."""
        learned = self.fetch_wait_ms
        longer = [w for w in FETCH_WAITS_MS if w > self._consumer_wait]
        wait = learned if learned > self._consumer_wait else (longer[0] if longer else 0)
        if not wait:
            return False
        k = self.k
        positions = {(tp.topic, tp.partition): tp.offset
                     for tp in c.position([k.TopicPartition(t, p) for t, p in todo])}
        at = {tp: max(positions.get(tp, -1), nxt) for tp, (nxt, _) in todo.items()}
        stuck = [tp for tp in todo if tp not in held and highs[tp] > at[tp]]
        if not stuck:
            return False
        if wait > learned:
            log.warning("Kafka at %s sends no records of %s although it has some (a fetch wait "
                        "of %d ms is too short for its storage): reading with %d ms",
                        self.cfg.bootstrap_servers, sorted(stuck)[:3], self._consumer_wait, wait)
            self._own_wait = wait
            with _LEARNED_LOCK:
                key = str(self.cfg.bootstrap_servers)
                _LEARNED_WAITS[key] = max(min(wait, FETCH_WAITS_MS[1]), _LEARNED_WAITS.get(key, 0))
        c.unassign()
        c.close()
        self._consumer = None
        self._consumer_topics = set()
        c = self.consumer()
        self._know_topics(c, {t for t, _ in at})
        c.assign([k.TopicPartition(t, p, o) for (t, p), o in at.items()])
        return True

    def _deleted(self, m: Any, todo: Mapping[tuple[str, int], tuple[int, int | None]]) -> DblogError:
        return self._deleted_at(m.topic(), m.partition(), m.offset(), m.error().str(), todo)

    def _deleted_at(self, topic: str, part: int, offset: int, why: str,
                    todo: Mapping[tuple[str, int], tuple[int, int | None]]) -> DblogError:
        """A read below a partition's first kept offset: retention deleted records
        before they were read. Never skipped silently (the events would be missing)."""
        wanted = todo.get((topic, part), (offset, None))[0]
        return ChangeLogError(
            f"Kafka at {self.cfg.bootstrap_servers}: {topic} partition {part} no longer "
            f"holds offset {wanted} (retention deleted records before they were read: "
            f"{why})",
            hint="start at the first offset still complete (`dblog tail` without "
                 "--from-offset starts there; `dblog status` shows the topics' offsets), "
                 "or raise the topics' retention.ms / retention.bytes",
        )

    def _now_done(self, c: Any, todo: dict[tuple[str, int], tuple[int, int | None]],
                  now_ends: Mapping[tuple[str, int], int]) -> None:
        """``read_range(to_now=True)``, at a ``consume`` that found nothing fetched: a
        partition read to the end is done once the read (the records returned, or the
        consumer's position past markers) reached ``now_ends``, where it ended when the
        read began."""
        tps = [tp for tp in now_ends if tp in todo]
        if not tps:
            return
        k = self.k
        pos = {(tp.topic, tp.partition): tp.offset
               for tp in c.position([k.TopicPartition(t, p) for t, p in tps])}
        for tp in tps:
            if max(todo[tp][0], pos.get(tp, -1)) >= now_ends[tp]:
                del todo[tp]

    def _check_positions(self, c: Any, todo: dict[tuple[str, int], tuple[int, int | None]]) -> None:
        """A read_committed consumer skips aborted records and transaction markers: a
        partition is done once its position reached its end, seen or not."""
        k = self.k
        pos = c.position([k.TopicPartition(t, p) for t, p in todo])
        for tp in pos:
            key = (tp.topic, tp.partition)
            hi = todo[key][1]
            if hi is not None and tp.offset >= 0 and tp.offset >= hi:
                del todo[key]

    def read_commits(self, log_: CommitLog, start: int, to_now: bool = False) -> int:
        """Apply checkpoint-topic messages from Kafka offset ``start`` to the end (with
        ``to_now``, ``read_range``'s: a follower's, which comes back for the rest);
        returns the offset after the last one read."""
        topic = checkpoint_topic(self.prefix)
        if not self.partitions(topic):
            return start
        if start == 0:  # the first read: retention may have removed the beginning
            start = self.watermarks([(topic, 0)])[(topic, 0)][0]
        for m in self.read_range({(topic, 0): (start, None)}, to_now):
            start = m.offset() + 1
            if m.value() is None:
                continue
            log_.apply(CommitRecord.from_bytes(m.value(), m.offset()))
        return start

    def read_schemas(self) -> list[tuple[int, TableSchema]]:
        topic = schemas_topic(self.prefix)
        if not self.partitions(topic):
            return []
        (lo, _) = self.watermarks([(topic, 0)])[(topic, 0)]
        latest: dict[tuple[str, int], TableSchema] = {}
        for m in self.read_range({(topic, 0): (lo, None)}):
            if m.value() is None:
                continue
            d = orjson.loads(m.value())
            ts = TableSchema.from_json(d["schema"])
            latest[(ts.qualified, int(d["from"]))] = ts
        return sorted(((o, s) for (_, o), s in latest.items()), key=lambda x: (x[0], x[1].qualified))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
            self._consumer_topics = set()


def recover_commits(client: _Client) -> CommitLog:
    """The newest valid commit from the checkpoint topic's last ``RECOVERY_WINDOW``
    messages (the writer's recovery: it needs the last checkpoint and ``max_gen``).
    ``ends`` then holds every data partition's last valid end if the window began at
    the topic's start or holds a valid commit that listed them all (``known``); ``whole``
    says so."""
    log_ = CommitLog()
    topic = checkpoint_topic(client.prefix)
    if not client.partitions(topic):
        return log_
    lo, hi = client.watermarks([(topic, 0)])[(topic, 0)]
    known: dict[str, dict[str, int]] | None = None
    for m in client.read_range({(topic, 0): (max(lo, hi - RECOVERY_WINDOW), None)}):
        if m.value() is not None:
            rec = CommitRecord.from_bytes(m.value(), m.offset())
            if log_.apply(rec) and rec.known is not None:
                known = rec.known
    log_.whole = hi - RECOVERY_WINDOW <= lo  # (a broker's high watermark may lag: never ahead)
    if not log_.whole and known is not None:
        # Every end as of that commit; the valid commits after it are in ``ends``.
        for topic_name, parts in known.items():
            for p, end in parts.items():
                tp = (topic_name, int(p))
                log_.ends[tp] = max(end, log_.ends.get(tp, 0))
        log_.whole = True
    return log_


# -- the writer ------------------------------------------------------------------------------


class KafkaChangeLog(ChangeLogWriter):
    """The capture's writer: one transactional producer, one session (``gen``, id)."""

    def __init__(self, cfg: LogConfig) -> None:
        self.cfg = cfg
        self.client = client = _Client(cfg)
        k = client.k
        self.prefix = client.prefix
        self._tombstones = cfg.tombstones
        self._epoch: int | None = None  # set by claim(): commits are then verified
        self._verified_to = 0
        self._commits = 0
        conf = client_config(
            cfg,
            **{"transactional.id": cfg.transactional_id or f"dblog-{self.prefix}",
               "enable.idempotence": True, "acks": "all", "linger.ms": 2,
               "compression.type": "lz4", "partitioner": "murmur2_random",
               "queue.buffering.max.messages": 1_000_000,
               "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
               "on_delivery": self._on_delivery},
        )
        # The C path (``kafka_native``): records produced and their acknowledgements
        # counted without Python per record; the same records, the same checks.
        # A Kafka Connect format (``formats``) is produced from Python.
        self._formatter: Any = None
        if cfg.value_format != "json":
            from pydblog.changelog.formats import Formatter

            try:
                self._formatter = Formatter(cfg.value_format, self.prefix, cfg.schema_registry_url)
            except (ImportError, ValueError) as exc:
                raise ConfigError(f"[log] value_format: {exc}") from None
        self._native = kafka_native.writer_available() and self._formatter is None
        self._client_id = ""
        self._delivered: dict[tuple[str, int], list[int]] = {}  # [first, last, count]
        self._no_run: set[tuple[str, int]] = set()  # partitions without a run (notifications)
        self._include_truncates = getattr(cfg, "truncates", "skip") == "include"
        self._delivery_error: Any = None
        self._after: dict[tuple[str, int], int] = {}
        """Per data partition this session wrote, the end of its last commit there
        (``_copies``)."""
        self._valid_ends: dict[tuple[str, int], int] = {}
        """Per data partition, the end of the last valid commit that wrote it, as far as
        known (from recovery and this session's commits; ``_copies``)."""
        self._all_ends_read = False
        self._peek: _Client | None = None  # reads uncommitted records (``_own_records``)
        try:
            client.ensure_topics(
                [checkpoint_topic(self.prefix), schemas_topic(self.prefix),
                 notifications_topic(self.prefix), truncates_topic(self.prefix)], 1)
            self._producer = self._make_producer(conf)
            self._producer.init_transactions(TIMEOUT_S)
        except k.KafkaException as exc:
            raise _unavailable("starting the transactional producer", cfg, exc) from None
        commits = recover_commits(client)
        self._checkpoint = commits.last.checkpoint if commits.last is not None else None
        self._next = commits.next_offset
        self._valid_ends = dict(commits.ends)
        self._all_ends_read = commits.whole
        self.gen = commits.max_gen + 1
        self.writer_id = uuid.uuid4().hex[:16]
        self._tag = f"{self.gen}:{self.writer_id}".encode()
        self._schemas = client.read_schemas()
        self._table_schemas: dict[str, TableSchema] = {s.qualified: s for _, s in self._schemas}
        """Each table's current schema (what ``formats`` derive its Connect schemas from)."""
        self._begin()
        log.info("Kafka change log %s on %s: session %s, next offset %d", self.prefix,
                 cfg.bootstrap_servers, self._tag.decode(), self._next)

    def _make_producer(self, conf: dict[str, Any]) -> Any:
        """The transactional producer: with the C path's interceptor plugin if it can be
        made (else the Python path's, logged)."""
        k = self.client.k
        if self._native:
            native_conf, client_id = kafka_native.producer_config(conf)
            try:
                producer = k.Producer(native_conf)
            except k.KafkaException as exc:  # e.g. a librdkafka built without plugins
                log.warning("native Kafka writes: the producer with pydblog's interceptor "
                            "plugin cannot be made (%s): the writer produces from Python", exc)
                self._native = False
            else:
                self._client_id = client_id
                return producer
        return make_client(k.Producer, conf, self.cfg)

    def _begin(self) -> None:
        self._commit([], CommitRecord(self.gen, self.writer_id, self._next, self._next,
                                      self._checkpoint, {}, begin=True, epoch=self._epoch,
                                      known=self._known()))

    def _known(self) -> dict[str, dict[str, int]] | None:
        """Every data partition's last valid end (``CommitRecord.known``), if this
        session knows them all."""
        if not self._all_ends_read or len(self._valid_ends) > KNOWN_MAX_PARTITIONS:
            return None
        out: dict[str, dict[str, int]] = {}
        for (topic, part), end in self._valid_ends.items():
            out.setdefault(topic, {})[str(part)] = end
        return out

    def claim(self, epoch: int) -> None:
        """High availability: own the log with ``epoch`` (``ports.FencedChangeLog``).
        Refused (``Fenced``) if a newer epoch wrote to the checkpoint topic.

        First a fence message (``CommitRecord.fence``), then the recovery read, then the
        begin message: every commit of an older session either precedes the fence (the
        recovery reads it: this session continues after it) or follows it (readers
        ignore it, and its writer's ``_verify`` raises ``Fenced``). Recovering first, an
        older leader's commit landing between the read and the begin message (a
        ``transactional.id`` of its own: no broker fencing) stayed valid, and this
        session's begin then went back to the global offsets it had used: readers lost
        both sessions' events from there (tests/kafka/test_kafka_log.py::
        test_claim_races_an_older_leaders_commit). From now on
        messages carry the epoch, readers order sessions by ``(epoch, gen)``, and every
        commit is verified before it returns: if a message of a newer ``(epoch, gen)``
        precedes this commit's checkpoint message in the topic, readers ignore the
        commit and ``append`` raises ``Fenced`` (the source is then not acknowledged).
        The order of the checkpoint topic decides, so the check is atomic with the
        write even on a broker without transactional fencing."""
        topic = checkpoint_topic(self.prefix)
        self._epoch = epoch
        self._verified_to = self.client.watermarks([(topic, 0)])[(topic, 0)][1]
        self._commit([], CommitRecord(self.gen, self.writer_id, self._next, self._next, None, {},
                                      begin=True, epoch=epoch, fence=True))
        commits = recover_commits(self.client)
        if commits.max_epoch > epoch:
            raise Fenced(
                f"the Kafka change log {self.prefix} was claimed by epoch {commits.max_epoch}, "
                f"newer than this leader's {epoch}"
            )
        self._verified_to = commits.read_to
        for tp, end in commits.ends.items():
            self._valid_ends[tp] = max(end, self._valid_ends.get(tp, 0))
        self._checkpoint = commits.last.checkpoint if commits.last is not None else None
        self._next = commits.next_offset
        self._begin()

    def _verify(self, own_offset: int) -> None:
        """Fenced if a newer session's message precedes ours (see ``claim``)."""
        topic = checkpoint_topic(self.prefix)
        mine = (self._epoch or 0, self.gen)
        for m in self.client.read_range({(topic, 0): (self._verified_to, own_offset)}):
            if m.value() is None:
                continue
            rec = CommitRecord.from_bytes(m.value(), m.offset())
            if (rec.epoch or 0, rec.gen) > mine:
                raise Fenced(
                    f"the Kafka change log {self.prefix} now belongs to epoch {rec.epoch} "
                    f"(session {rec.writer_tag}); this leader's epoch {self._epoch} may not write"
                )
        self._verified_to = own_offset + 1

    @property
    def next_offset(self) -> int:
        return self._next

    def last_checkpoint(self) -> Checkpoint | None:
        return self._checkpoint

    def schemas(self, table: str | None = None) -> list[tuple[int, TableSchema]]:
        return [(o, s) for o, s in self._schemas if table is None or s.qualified == table]

    def enforce_retention(self, max_age_ms: int | None, max_bytes: int | None) -> int:
        return 0  # topics have their own retention (retention.ms / retention.bytes)

    def append(
        self,
        events: Sequence[Encoded],
        checkpoint: Checkpoint,
        schemas: Sequence[TableSchema] = (),
    ) -> int:
        start = self._next
        tables = {e.table for e in events}
        topics = {t: self._topic(t) for t in tables}
        self.client.ensure_topics(topics.values(), self.cfg.partitions)
        end = start + sum(e.size if type(e) is EncodedBlock else 1 for e in events)
        msgs = [(orjson.dumps({"from": start, "gen": self.gen, "w": self.writer_id,
                               "schema": s.to_json()}), s.qualified) for s in schemas]
        rec = CommitRecord(self.gen, self.writer_id, start, end, checkpoint, {}, epoch=self._epoch,
                           known=self._known() if self._commits % KNOWN_EVERY == 0 else None)
        for s in schemas:  # they apply from this commit's first event
            self._table_schemas[s.qualified] = s
        self._commit(events, rec, topics, msgs)
        self._next = end
        self._checkpoint = checkpoint
        if schemas:
            self._schemas = sorted([*self._schemas, *((start, s) for s in schemas)],
                                   key=lambda x: (x[0], x[1].qualified))
        return end

    def _fault(self, point: str) -> None:
        """A crash test's fault point (``pydblog.failpoints``) at the current commit."""
        failpoints.hit(point, self._commits)

    def _topic(self, qualified: str) -> str:
        if qualified in (".", ""):
            return notifications_topic(self.prefix)
        return data_topic(self.prefix, qualified)

    def _commit(
        self, events: Sequence[Encoded], rec: CommitRecord,
        topics: dict[str, str] | None = None, schema_msgs: Sequence[tuple[bytes, str]] = (),
    ) -> None:
        """One transaction: data, flush, end offsets, checkpoint message, commit. The
        delivery reports are checked first (``_copies``): a
        commit whose records the broker stored other than it acknowledged them is
        aborted (``ChangeLogUnavailable``: the capture retries in a new session)."""
        k = self.client.k
        p = self._producer
        data: dict[tuple[str, int], list[int]] = {}
        self._delivered.clear()
        self._no_run.clear()
        self._delivery_error = None
        try:
            if self._native:
                kafka_native.take_acks(p, self._client_id)  # none of this commit's yet
            p.begin_transaction()
            self._produce(events, rec.start, topics or {})
            for value, key in schema_msgs:
                self._send(schemas_topic(self.prefix), value, key.encode(), None, None)
            if p.flush(TIMEOUT_S) > 0:  # delivery reports: ``_delivered`` is complete
                raise ChangeLogUnavailable(
                    f"Kafka at {self.cfg.bootstrap_servers} did not acknowledge a commit in {TIMEOUT_S:.0f} s")
            self._take_acks()
            self._fault("kafka-after-data")
            if self._delivery_error is not None:
                raise k.KafkaException(self._delivery_error)
            internal = (checkpoint_topic(self.prefix), schemas_topic(self.prefix))
            data = {tp: d for tp, d in self._delivered.items() if tp[0] not in internal}
            problem = self._copies(data)
            if problem is None and self._delivered.get((schemas_topic(self.prefix), 0), [0])[0] < 0:
                problem = ("a schema message was acknowledged without its offset (a retried "
                           "produce taken for a duplicate): whether it is stored is unknown")
            if problem is not None:
                raise ChangeLogUnavailable(
                    f"Kafka at {self.cfg.bootstrap_servers}: a commit's records are not where "
                    f"the broker's acknowledgements put them: {problem}; the transaction is aborted",
                    hint="the capture retries from the last checkpoint in Kafka (a new session "
                         "writes the events again; readers skip the aborted session's records)",
                )
            rec.ends, rec.runs = commit_ends(data, self._no_run)
            self._delivered.clear()
            cp_topic = checkpoint_topic(self.prefix)
            self._send(cp_topic, rec.to_bytes(), self.prefix.encode(), None, None)
            # (commit_transaction would flush too, without telling what was delivered)
            if p.flush(TIMEOUT_S) > 0:
                raise ChangeLogUnavailable(
                    f"Kafka at {self.cfg.bootstrap_servers} did not acknowledge a checkpoint "
                    f"message in {TIMEOUT_S:.0f} s")
            self._take_acks()
            self._fault("kafka-before-commit")
            if self._delivery_error is not None:
                raise k.KafkaException(self._delivery_error)
            own = self._delivered.get((cp_topic, 0), [-1])[0]
            if own < 0:
                # Tansu, restarted with it in flight, answered the retry as a duplicate
                # and had not stored it (a kept run: the commit's records in Kafka, its
                # checkpoint message not, so readers skipped them: events lost).
                raise ChangeLogUnavailable(
                    f"Kafka at {self.cfg.bootstrap_servers} acknowledged a commit's checkpoint "
                    "message without its offset (it took a retried produce for a duplicate): "
                    "whether it is stored is unknown; the transaction is aborted",
                    hint="the capture retries from the last checkpoint in Kafka")
            p.commit_transaction(TIMEOUT_S)
            self._commits += 1
            for tp, (_, last, _) in data.items():
                self._after[tp] = self._valid_ends[tp] = last + 1
            if self._epoch is not None:
                self._verify(own)
        except (k.KafkaException, SystemError) as caught:
            # (SystemError: a fatal producer error surfacing through a delivery callback)
            abort_error = self._abort()
            cause: BaseException = caught
            if abort_error is not None and abort_error.fatal():
                cause = k.KafkaException(abort_error)  # e.g. fenced by a newer producer
            elif not isinstance(caught, k.KafkaException) and self._delivery_error is not None:
                cause = k.KafkaException(self._delivery_error)
            raise _unavailable("a commit", self.cfg, cause) from None
        except DblogError:
            self._abort()
            raise

    def _copies(self, data: Mapping[tuple[str, int], Sequence[int]]) -> str | None:
        """Why this commit's delivery reports (``data``: per data partition ``[lowest,
        highest, records]``, a lowest of -1: acknowledged without offsets) may not
        describe its records, or None: a record of this session (its writer header)
        that the reports do not account for, which readers checking headers would take
        as a second event at the same global offset. The broker put it there: a produce
        appended twice (its answer to the first copy lost, the producer's retry appended
        again; Tansu across a restart), or it answered the retry as a duplicate without
        offsets (Tansu).

        A transaction's records in a partition fill one stretch (one producer;
        tombstones are reported too), and where this session wrote before
        (``_after``: the end of its last commit there) they begin after its commit
        marker (one offset; none if the broker lost it). Only where the reports leave
        room for other records are those offsets read back: between the lowest and
        highest (another producer's records, or copies), and below the lowest, after the
        previous commit's marker or, for a partition without a run (readers check
        headers there) not written in this session, from the last valid commit's end.
        Records of other writers there are fine (readers skip them).

        Records below the last valid commit's end in their partition (``_valid_end``)
        are never read (``CommitLog.apply``): if the partition holds records above the
        acknowledged ones, the acknowledgements are wrong (retriable, as above); if it
        ends with them, it lost records (the topic re-created) and the commit raises a
        ``ChangeLogError`` that is not retriable (``_went_back``)."""
        for tp, (first, last, count) in sorted(data.items()):
            where = f"{tp[0]} partition {tp[1]}"
            if first < 0:
                return (f"{where}: the broker acknowledged records without their offsets "
                        "(it took a retried produce for a duplicate)")
            prev = self._valid_end(tp)
            if first < prev:
                # Offsets went back: acknowledgements that do not say where the records
                # are (the partition holds more), or a partition that lost records.
                high = self.client.watermarks([tp])[tp][1]
                if high > last + 1:
                    return (f"{where}: the records were acknowledged at offsets {first} to "
                            f"{last}, below {prev}, the end of the last valid commit there, "
                            f"but the partition holds records up to offset {high - 1}")
                raise self._went_back(tp, first, last, prev)
            dense = count == last + 1 - first
            if not dense:
                mine = self._own_records(tp, first, last + 1)
                if mine > count:
                    return (f"{where}: {mine} records of this session at offsets {first} to "
                            f"{last}, {count} acknowledged (a produce appended twice)")
            after = self._after.get(tp)
            lo: int | None = None
            if after is not None:  # (first >= after: _valid_end(tp) is after)
                lo = after if first > after + 1 else None
            elif not dense or tp in self._no_run:
                lo = self._valid_end(tp)
            if lo is not None and lo < first:
                # Records retention deleted are no copies a reader takes, and reading
                # below the partition's start fails (every restart stopped).
                lo = max(lo, self.client.watermarks([tp])[tp][0])
            if lo is not None and lo < first:
                mine = self._own_records(tp, lo, first)
                if mine:
                    return (f"{where}: {mine} records of this session at offsets {lo} to "
                            f"{first - 1}, below the commit's first offset {first} (a produce "
                            "appended twice)")
        return None

    def _went_back(self, tp: tuple[str, int], first: int, last: int, prev: int) -> ChangeLogError:
        """This commit's records in ``tp`` lie below ``prev``, the last valid commit's end
        there: readers take a partition's records only from there on, so they would never
        read them. Kafka offsets only grow: the partition lost records (audit13 F3)."""
        return ChangeLogError(
            f"{tp[0]} partition {tp[1]}: Kafka acknowledged this commit's records at offsets "
            f"{first} to {last}, below {prev}, the end of the last valid commit there: the "
            "topic was deleted and created again (or the partition lost records otherwise: "
            "an unclean leader election, a broker's storage lost). Readers take a "
            "partition's records only from that end on, so they would never read these "
            "events, and the events the partition held below it are gone: the transaction "
            "is aborted and capture stops",
            hint="this change log cannot be made complete again: start a new one (another "
                 "topic_prefix, and another [log] path or its state.json removed) with "
                 '[snapshot] mode = "initial"; `dblog tail` and `dblog sync` of this one end '
                 "before the lost records. (If the topic was not re-created and no records "
                 "were lost, the broker acknowledged wrong offsets: start dblog run again.)",
        )

    def _own_records(self, tp: tuple[str, int], lo: int, hi: int) -> int:
        """How many records with this session's writer header lie at ``lo <= offset <
        hi`` of ``tp``, the open transaction's included."""
        if self._peek is None:
            self._peek = _Client(self.cfg, uncommitted=True)
        tag = self._tag
        return sum(_header(m.headers(), HEADER_WRITER) == tag
                   for m in self._peek.read_range({tp: (lo, hi)}))

    def _valid_end(self, tp: tuple[str, int]) -> int:
        """The end of the last valid commit that wrote ``tp`` (0: none): where readers'
        span of this commit begins there."""
        if tp not in self._valid_ends and not self._all_ends_read:
            # not written within the recovery window: the whole checkpoint topic says
            whole = CommitLog(track=False)
            self.client.read_commits(whole, 0)
            self._valid_ends = {**whole.ends, **self._valid_ends}
            self._all_ends_read = True
        return self._valid_ends.get(tp, 0)

    def _take_acks(self) -> None:
        """The C path's delivery reports (``kafka_native.take_acks``: what ``_on_delivery``
        gathers per record, counted by librdkafka's interceptor) into ``_delivered``."""
        if not self._native:
            return
        entries, err = kafka_native.take_acks(self._producer, self._client_id)
        if err and self._delivery_error is None:
            self._delivery_error = self.client.k.KafkaError(err)
        for topic, part, first, last, count in entries:
            tp = (topic, part)
            seen = self._delivered.get(tp)
            if seen is None:
                self._delivered[tp] = [first, last, count]
            elif seen[0] < 0 or first < 0:
                self._delivered[tp] = [-1, -1, 0]
            else:
                self._delivered[tp] = [min(seen[0], first), max(seen[1], last), seen[2] + count]

    def _on_delivery(self, err: Any, msg: Any) -> None:
        """Delivery report (served by ``flush``): per partition the lowest and highest
        offset written and the number of records; the highest becomes the commit's
        ``ends`` (a broker's list-offsets answer is not used: Tansu's counts batches, not
        records), and if the records fill ``lowest..highest`` (offsets are unique in a
        partition, so then every offset there is one of them) the lowest goes into
        ``runs``."""
        if err is not None:
            if self._delivery_error is None:
                self._delivery_error = err
            return
        tp = (msg.topic(), msg.partition())
        off = msg.offset()
        if off is None or off < 0:  # acknowledged without an offset: ``_copies``
            self._delivered[tp] = [-1, -1, 0]
            return
        seen = self._delivered.get(tp)
        if seen is not None and seen[0] < 0:
            return
        if seen is None:
            self._delivered[tp] = [off, off, 1]
            return
        seen[2] += 1
        if off > seen[1]:
            seen[1] = off
        elif off < seen[0]:
            seen[0] = off

    def _abort(self) -> Any:
        """Abort the open transaction; the error if that failed (a KafkaError)."""
        try:
            self._producer.abort_transaction(5)
        except Exception as exc:  # the session ends anyway; readers ignore its records
            log.debug("abort_transaction failed: %s", exc)
            err = exc.args[0] if exc.args else None
            return err if isinstance(err, self.client.k.KafkaError) else None
        return None

    def _send(self, topic: str, value: Any, key: Any, headers: Any, partition: int | None,
              on_delivery: Any = None) -> None:
        p = self._producer
        while True:
            try:
                if partition is None:
                    p.produce(topic, value, key, headers=headers)
                elif on_delivery is not None:
                    p.produce(topic, value, key, partition=partition, headers=headers,
                              on_delivery=on_delivery)
                else:
                    p.produce(topic, value, key, partition=partition, headers=headers)
                return
            except BufferError:
                p.poll(0.05)

    def _produce(self, events: Sequence[Encoded], seq: int, topics: dict[str, str]) -> None:
        """Produce every event (global offsets from ``seq``)."""
        if self._formatter is not None:
            self._produce_formatted(events, seq, topics)
            return
        if self._native:
            self._produce_native(events if type(events) is list else list(events), seq, topics)
            return
        self._produce_py(events, seq, topics)

    def _produce_native(self, events: list[Encoded], seq: int, topics: dict[str, str]) -> None:
        """``_produce`` by ``kafka_native``: runs of stream events and template blocks in
        C; whatever it leaves (truncates, notifications, other envelopes) in Python, in
        order."""
        k = self.client.k
        p = self._producer
        i, n = 0, len(events)
        while i < n:
            item = events[i]
            if type(item) is EncodedBlock:
                seq = (self._produce_template(item, topics[item.table], seq) if item.head
                       else self._produce_py([item], seq, topics))
                i += 1
                continue
            i, seq, status, code, why = kafka_native.produce_events(
                p, self._client_id, events, i, seq, topics, self._tag, self._tombstones,
                EncodedEvent)
            if status == 1:  # Python's: a truncate, a notification, or an envelope it does not cut
                if type(events[i]) is not EncodedBlock:
                    seq = self._produce_py([events[i]], seq, topics)
                    i += 1
            elif status == 2:  # the producer's queue is full: serve delivery reports
                p.poll(0.05)
            elif status == 3:  # the event's record is in, its tombstone is not
                seq = self._produce_py([events[i]], seq, topics, tombstone_only=True)
                i += 1
            elif status == 4:
                raise k.KafkaException(k.KafkaError(code, why))

    def _produce_py(self, events: Sequence[Encoded], seq: int, topics: dict[str, str],
                    tombstone_only: bool = False) -> int:
        """``_produce`` in Python; the global offset after the events. ``tombstone_only``:
        only the tombstones of the deletes (their records are in)."""
        tag = self._tag
        produce = self._producer.produce
        for item in events:
            topic = topics[item.table]
            if type(item) is EncodedBlock:
                if item.head:
                    seq = self._produce_template(item, topic, seq)
                    continue
                bodies: list[str] = item.body.split("\n") if item.size else []
                op = item.op
            else:
                body = item.body
                bodies = [body if isinstance(body, str) else body.decode()]
                op = item.op
            for text in bodies:
                src_start = text.find('"source":') + 9
                src_end = text.find('},"key":', src_start) + 1
                source = text[src_start:src_end]
                value = f'{{"offset":{seq},{text[1:]}'
                headers = [(HEADER_WRITER, tag), (HEADER_SOURCE, source)]
                if op in ("n", "t"):
                    self._table_event(op, topic, text, value, headers)
                else:
                    key = _key_of(text, src_end + 7)
                    if not tombstone_only:
                        try:
                            produce(topic, value, key, headers=headers)
                        except BufferError:
                            self._send(topic, value, key, headers, None)
                    if op == "d" and self._tombstones:
                        self._send(topic, None, key, headers, None)
                seq += 1
        return seq

    def _produce_formatted(self, events: Sequence[Encoded], seq: int, topics: dict[str, str]) -> int:
        """``_produce`` in a Kafka Connect format (``[log] value_format``): key and value
        by ``formats.Formatter`` from the table's schema, the JSON envelope in the
        ``dblog.event`` header (what readers take). Notifications and skipped truncates
        go where ``_table_event`` puts them, as in the ``json`` format; an included
        truncate is a keyless record in partition 0 of the table's topic, in the format."""
        from pydblog.changelog.formats import RegistryError

        tag = self._tag
        for item in events:
            topic = topics[item.table]
            if type(item) is EncodedBlock:
                bodies = item.bodies()
            else:
                body = item.body
                bodies = [body if isinstance(body, str) else body.decode()]
            table = self._table_schemas.get(item.table)
            op = item.op
            for text in bodies:
                event = f'{{"offset":{seq},{text[1:]}'
                env = orjson.loads(text)
                headers: list[tuple[str, Any]] = [(HEADER_WRITER, tag),
                                                  (HEADER_SOURCE, orjson.dumps(env["source"]))]
                seq += 1
                if op == "n" or (op == "t" and not self._include_truncates):
                    self._table_event(op, topic, text, event, headers)
                    continue
                try:
                    value, key = self._formatter.encode(topic, table, env)
                except RegistryError as exc:
                    raise ChangeLogUnavailable(
                        f"{exc}; the transaction is aborted",
                        hint="the capture retries from the last checkpoint in Kafka") from None
                headers.append((HEADER_EVENT, event))
                if op == "t":
                    self._send(topic, value, None, headers, 0)
                    continue
                self._send(topic, value, key, headers, None)
                if op == "d" and self._tombstones:
                    self._send(topic, None, key, headers, None)
        return seq

    def _produce_template(self, block: EncodedBlock, topic: str, seq: int) -> int:
        """A template block's rows (see ``EncodedBlock``): key and source from the
        template's parts, no per-row search."""
        if self._native:
            k = self.client.k
            row = 0
            while True:
                row, seq, status, code, why = kafka_native.produce_template(
                    self._producer, self._client_id, topic, block.head, block.mid, block.body,
                    block.first_index, seq, self._tag, row)
                if status == 0:
                    return seq
                if status == 2:
                    self._producer.poll(0.05)
                elif status == 4:
                    raise k.KafkaException(k.KafkaError(code, why))
                else:
                    break  # not a template the C path cuts: nothing produced
        head, mid = block.head, block.mid
        src_start = head.find('"source":') + 9
        src_head = head[src_start:]
        src_tail = mid[: mid.find('},"key":') + 1]
        value_head = head[1:]
        tag = self._tag
        produce = self._producer.produce
        for i, tail in enumerate(block.body.split("\n"), block.first_index):
            key = tail.partition(TAIL_SEP)[0]
            value = f'{{"offset":{seq},{value_head}{i}{mid}{tail}'
            headers = [(HEADER_WRITER, tag), (HEADER_SOURCE, f"{src_head}{i}{src_tail}")]
            try:
                produce(topic, value, key, headers=headers)
            except BufferError:
                self._send(topic, value, key, headers, None)
            seq += 1
        return seq

    def _table_event(self, op: str, topic: str, text: str, value: str,
                     headers: list[tuple[str, Any]]) -> None:
        """A notification (``op`` ``n``) or a truncate (``t``) of the table whose topic is
        ``topic``, from its envelope ``text`` (``value``: with its ``offset``).

        A notification goes into the notification topic, shaped as Debezium's
        (``notification_value``), the envelope in the ``dblog.event`` header; the
        partition gets no run (``commit_ends``): readers check its records' headers,
        where they find the envelope. A truncate goes into partition 0 of the table's
        topic with ``truncates = "include"`` (Debezium sends one keyless message), else
        into the truncates topic. Either has its global offset: readers merge it with
        the data by offset, as every event."""
        if op == "n":
            topic = notifications_topic(self.prefix)
            key, body = notification_value(text)
            self._send(topic, body, key, [*headers, (HEADER_EVENT, value.encode())], 0)
            self._no_run.add((topic, 0))
        else:
            self._send(topic if self._include_truncates else truncates_topic(self.prefix),
                       value, None, headers, 0)

    def close(self) -> None:
        try:
            self._producer.flush(5)
        except Exception as exc:  # a fenced or failed producer: nothing left to deliver
            log.debug("flush at close failed: %s", exc)
        finally:
            self.client.close()
            if self._peek is not None:
                self._peek.close()


def _key_of(text: str, start: int) -> str | None:
    """The event key's JSON text in an envelope (``start``: just after ``,"key":``).
    The key ends at the envelope's ``,"before":``; if that text also occurs elsewhere
    (a key column or a json value named ``before``), the envelope is parsed."""
    end = text.find(',"before":', start)
    if end < 0 or text.count(',"before":') != 1:
        key = orjson.loads(text).get("key")
        return orjson.dumps(key).decode() if key is not None else None
    key_text = text[start:end]
    return None if key_text == "null" else key_text


# -- the reader ------------------------------------------------------------------------------


def parse_value(value: bytes) -> tuple[int, bytes]:
    """A data message's global offset and the envelope without it (as stored by the
    embedded log: ``events.with_offset`` puts it back)."""
    comma = value.index(b",")
    return int(value[10:comma]), b"{" + value[comma + 1 :]


class KafkaChangeLogReader(ChangeLogReader):
    """Reads a Kafka change log in global-offset order: every valid checkpoint is a
    consistent cut of all partitions, so records are merged by their offset up to the
    last valid checkpoint's end (``next_offset``).

    ``read(from_offset)`` seeks: it reads one window of commits around ``from_offset``
    (``CommitLog.window``), each partition from ``cut(lo)`` to ``cut(hi)``, never from the
    partition's start; memory holds one window (about ``limit`` events). A partition
    that only later commits wrote is read from its start once, as part of their window.
    A window that needs records retention already deleted raises ``ChangeLogError``
    (``first_offset`` is the first offset whose events are all still there).

    Memory stays bounded while a reader moves forward (``follow``, ``dblog tail -f``,
    the API's event stream): once more than ``KEEP_COMMITS`` commits lie before the
    current window, the commit log forgets them (``CommitLog.forget``). A read that
    goes back below what was forgotten re-reads the checkpoint topic from its start;
    ``first_offset`` and ``describe``, which need the whole history, read it into a
    throwaway commit log.

    ``read`` and ``next_offset`` read the checkpoint topic to its end as of the call
    (list-offsets requests, then a fetch to that end): what any writer committed before
    the call is seen. ``follow`` does that once, then waits for new commit messages on a
    consumer that stays assigned to the checkpoint topic (the "tail": librdkafka fetches
    in the background, one fetch wait at a time) and reads each new window of data once
    its commit came: no list-offsets request and no re-assignment per poll, so a follower
    costs the broker about what a plain consumer does. If the tail brings nothing for
    ``TAIL_EXACT_S`` the follower reads to the end the exact way again (a storage stall,
    a consumer that lost its place: the exact read handles both), so the tail is never
    the only way a commit is seen."""

    WINDOW_MIN = 1_000
    WINDOW_MAX = 100_000
    KEEP_COMMITS = 1_000
    TAIL_EXACT_S = 1.0

    def __init__(self, cfg: LogConfig) -> None:
        self.client = _Client(cfg)
        # The data windows' reads: below a valid commit's end, of records the commit
        # spans vouch for (aborted ones are skipped by them, not by the broker); read
        # uncommitted, so that the next transaction, open on the partition already,
        # does not hold them back (Tansu's last stable offset is 0 while one is open: a
        # read_committed fetch then gets nothing at all until it commits).
        self._data = _Client(cfg, uncommitted=True)
        self._bulk: _Client | None = None  # reads of the checkpoint topic from its start
        self.prefix = self.client.prefix
        self.cfg = cfg
        self._tail_c: Any = None  # the follower's checkpoint-topic consumer (``_tail``)
        self._tail_wait = 0  # the fetch wait it was made with
        self._tail_at = -1  # the offset it is positioned at (-1: to be assigned)
        self._reset()

    def _reset(self) -> None:
        self._commits = CommitLog()
        self._cp_next = 0
        self._window: tuple[int, int, list[LogRecord]] = (0, 0, [])

    def _refresh(self) -> None:
        self._cp_next = self._commit_reader().read_commits(self._commits, self._cp_next, to_now=True)

    def _commit_reader(self) -> _Client:
        """The client for reading the checkpoint topic from ``_cp_next``: from its start, a
        bulk client (``BULK_FETCH_WAIT_MS``: Tansu answers a 5 ms fetch of thousands of
        messages with nothing, and the stall that follows would teach the whole process
        a longer fetch wait, the follower's too); near the end, ``client``."""
        return self.client if self._cp_next else self._bulk_client()

    def _bulk_client(self) -> _Client:
        if self._bulk is None:
            self._bulk = _Client(self.cfg, bulk=True)
        return self._bulk

    def _read_window(self, lo: int, hi: int) -> list[LogRecord]:
        """The events ``lo <= offset < hi`` (commit boundaries), in offset order."""
        commits = self._commits
        start, stop = commits.cut(lo), commits.cut(hi)
        ranges = {tp: (start.get(tp, 0), end) for tp, end in stop.items() if end > start.get(tp, 0)}
        out: list[LogRecord] = []
        seen: dict[tuple[str, int], int] = {}  # each partition's offset after the last record
        for m in self._data.read_range(ranges):
            value = event_value(m)
            if value is None:
                continue
            off = m.offset()
            tp = (m.topic(), m.partition())
            if off < seen.get(tp, -1):  # never two copies of one record
                continue
            seen[tp] = off + 1
            span = commits.span(tp, off)
            if span is None:
                continue
            if span.first < 0:  # no run: the headers decide
                headers = m.headers()
                tag = _header(headers, HEADER_WRITER)
                if not span.valid(off, tag.decode() if tag else None):
                    continue
                if _header(headers, HEADER_FANOUT) is not None:
                    continue
                value = _header(headers, HEADER_EVENT) or value  # a notification's envelope
            elif not span.valid(off, None):
                continue
            seq, body = parse_value(value)
            if not lo <= seq < hi:
                continue
            env = orjson.loads(body)
            src = env["source"]
            table = f"{src['schema']}.{src['table']}"
            out.append(LogRecord(seq, table, env["op"], int(src.get("ts_ms") or 0), body))
        out.sort(key=lambda r: r.offset)
        return out

    def read(
        self, from_offset: int, limit: int, tables: Sequence[str] | None = None
    ) -> list[LogRecord]:
        self._refresh()
        return self._read(from_offset, limit, tables)

    def _read(self, from_offset: int, limit: int, tables: Sequence[str] | None) -> list[LogRecord]:
        """``read`` up to the commits known now (no read of the checkpoint topic, unless
        ``from_offset`` lies below what was forgotten)."""
        offset = max(from_offset, 0)
        if offset < self._commits.floor:  # forgotten: the whole checkpoint topic again
            self._reset()
            self._refresh()
        end = self._commits.next_offset
        wanted = set(tables) if tables else None
        size = min(max(limit, self.WINDOW_MIN), self.WINDOW_MAX)
        out: list[LogRecord] = []
        while offset < end and len(out) < limit:
            lo, hi, recs = self._window
            if not lo <= offset < hi:
                lo, hi = self._commits.window(offset, size)
                self._window = (lo, hi, self._read_window(lo, hi))
                recs = self._window[2]
                if bisect.bisect_left(self._commits.bounds, lo) > self.KEEP_COMMITS:
                    self._commits.forget(lo)
            i = bisect.bisect_left(recs, offset, key=lambda r: r.offset)
            for r in recs[i:]:
                if wanted is None or r.table in wanted:
                    out.append(r)
                    if len(out) >= limit:
                        break
            offset = hi
        return out

    def _whole(self) -> CommitLog:
        """The commit log with its whole history (read afresh if some was forgotten)."""
        self._refresh()
        if not self._commits.floor:
            return self._commits
        whole = CommitLog()
        self._bulk_client().read_commits(whole, 0, to_now=True)
        return whole

    def first_offset(self) -> int:
        commits = self._whole()
        if not commits.ends:
            return 0
        marks = self.client.watermarks(list(commits.ends))
        return commits.first_complete({tp: lo for tp, (lo, _) in marks.items()})

    def next_offset(self) -> int:
        self._refresh()
        return self._commits.next_offset

    def last_checkpoint(self) -> Checkpoint | None:
        self._refresh()
        return self._commits.last.checkpoint if self._commits.last is not None else None

    def schemas(self, table: str | None = None) -> list[tuple[int, TableSchema]]:
        return [(o, s) for o, s in self.client.read_schemas() if table is None or s.qualified == table]

    def follow(
        self, from_offset: int, poll_s: float = 0.2, tables: Sequence[str] | None = None
    ) -> Iterator[LogRecord]:
        """See the class docstring: one exact read to the end, then the tail; ``poll_s``
        is the longest a wait for the tail's next commit message lasts."""
        offset = from_offset
        wanted = set(tables) if tables else None
        heard = -float("inf")  # when the tail last brought a commit message (or an exact read ran)
        while True:
            if time.monotonic() - heard >= self.TAIL_EXACT_S:
                self._refresh()
                heard = time.monotonic()
            batch = self._read(offset, 100_000, None)
            for r in batch:
                if wanted is None or r.table in wanted:
                    yield r
            if batch:
                offset = batch[-1].offset + 1
            elif self._await_commits(poll_s):
                heard = time.monotonic()

    def _tail(self) -> Any:
        """The follower's consumer, positioned at ``_cp_next`` (None: no checkpoint topic
        yet). Re-made when the client learned a longer fetch wait (``_storage_stall``),
        re-assigned when an exact read moved ``_cp_next``."""
        topic = checkpoint_topic(self.prefix)
        wait = self.client.fetch_wait_ms
        if self._tail_c is not None and self._tail_wait < wait:
            self._close_tail()
        if self._tail_c is None:
            if not self.client.partitions(topic):
                return None
            conf = _for_consumer(client_config(
                self.cfg,
                **{"group.id": f"dblog-follower-{uuid.uuid4().hex[:8]}",
                   "enable.auto.commit": False, "isolation.level": "read_committed",
                   "auto.offset.reset": "error", "fetch.wait.max.ms": wait},
            ))
            self._tail_c = make_client(self.client.k.Consumer, conf, self.cfg)
            self._tail_wait = wait
            self._tail_at = -1
        if self._tail_at != self._cp_next:
            self._tail_c.assign([self.client.k.TopicPartition(topic, 0, self._cp_next)])
            self._tail_at = self._cp_next
        return self._tail_c

    def _await_commits(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the tail's next checkpoint messages and apply them
        (as ``_Client.read_commits`` does, in offset order); whether any came. An error
        of the tail's read leaves the tail to be re-assigned and the commits to the next
        exact read."""
        c = self._tail()
        if c is None:
            time.sleep(timeout)
            return False
        first = c.poll(timeout)
        if first is None:
            return False
        k = self.client.k
        came = False
        for m in [first, *c.consume(10_000, 0)]:
            if m.error() is not None:
                if m.error().code() == k.KafkaError._PARTITION_EOF:
                    continue
                log.debug("the follower's checkpoint-topic read: %s; reading to the end instead",
                          m.error().str())
                self._tail_at = -1
                time.sleep(min(timeout, 0.1))  # (not a busy loop until the exact read)
                return False
            off = m.offset()
            if off < self._cp_next:  # read already (by an exact read)
                continue
            self._cp_next = off + 1
            came = True
            if m.value() is not None:
                self._commits.apply(CommitRecord.from_bytes(m.value(), off))
        self._tail_at = self._cp_next
        return came

    def _close_tail(self) -> None:
        if self._tail_c is not None:
            self._tail_c.close()
            self._tail_c = None
            self._tail_at = -1

    def describe(self) -> dict[str, Any]:
        commits = self._whole()
        topics: dict[str, dict[str, Any]] = {}
        # every partition of each topic the log wrote (one no commit wrote yet too: a
        # table's topic gets no copy of anything in every partition)
        names = sorted({t for t, _ in commits.ends})
        marks = self.client.watermarks(sorted(
            {*commits.ends, *((t, p) for t in names for p in range(self.client.partitions(t)))}))
        for (t, _p), (lo, hi) in sorted(marks.items()):
            info = topics.setdefault(t, {"partitions": 0, "end_offsets": [], "messages": 0})
            info["partitions"] += 1
            info["end_offsets"].append(hi)
            info["messages"] += hi - lo
        last = commits.last
        out: dict[str, Any] = {
            "type": "kafka",
            "bootstrap_servers": self.cfg.bootstrap_servers,
            "checkpoint_topic": checkpoint_topic(self.prefix),
            "last_offset": commits.next_offset - 1 if commits.next_offset > 0 else None,
            "writer": last.writer_tag if last is not None else None,
            "topics": topics,
        }
        lag = sync_lag(self.client, commits)
        if lag is not None:
            out["sync_lag_messages"] = lag
        return out

    def close(self) -> None:
        self._close_tail()
        self._data.close()
        if self._bulk is not None:
            self._bulk.close()
        self.client.close()


class KafkaLogFigures:
    """The first and next offset of a Kafka change log, cheap to ask again and again
    (``/metrics``): one client kept open, and each call reads only the checkpoint
    messages written since the last (``CommitLog(track=False)``: memory does not grow
    with the log). The first offset is 0 while no data partition lost records to
    retention; after that it is worked out by a full reader (the whole checkpoint topic)
    at most every ``FIRST_EVERY_S`` seconds, the last answer served in between."""

    FIRST_EVERY_S = 60.0

    def __init__(self, cfg: LogConfig) -> None:
        self.cfg = cfg
        self.client = _Client(cfg)
        self.commits = CommitLog(track=False)
        self._cp_next = 0
        self._first: tuple[float, int] | None = None  # (when, first offset)

    def figures(self) -> tuple[int, int] | None:
        """``(first offset, next offset)``, or None while the log does not exist."""
        if not self.client.partitions(checkpoint_topic(self.client.prefix)):
            return None
        self._cp_next = self.client.read_commits(self.commits, self._cp_next, to_now=True)
        marks = self.client.watermarks(sorted(self.commits.ends))
        first = 0
        if any(lo > 0 for lo, _ in marks.values()):
            now = time.monotonic()
            if self._first is None or now - self._first[0] > self.FIRST_EVERY_S:
                reader = KafkaChangeLogReader(self.cfg)
                try:
                    self._first = (now, reader.first_offset())
                finally:
                    reader.close()
            first = self._first[1]
        return first, self.commits.next_offset

    def close(self) -> None:
        self.client.close()


SYNC_GROUP = "dblog-sync.{prefix}"
"""The consumer group ``dblog sync`` commits its applied offsets to (for monitoring:
the sink commits are what make the sync exactly once)."""


def sync_lag(client: _Client, commits: CommitLog) -> int | None:
    """Data messages (one per event) not yet applied by
    ``dblog sync``, from the offsets it commits to its consumer group, or None. A
    partition's offsets also count one transaction marker per commit that wrote it
    (each at that commit's end offset): those are not messages and are left out."""
    k = client.k
    group = SYNC_GROUP.format(prefix=client.prefix)
    try:
        futs = client.admin.list_consumer_group_offsets(
            [k.ConsumerGroupTopicPartitions(group)], request_timeout=10)
        res = futs[group].result()
    except k.KafkaException:
        return None
    parts = [tp for tp in res.topic_partitions if tp.offset >= 0]
    if not parts:
        return None
    lag = 0
    for tp in parts:
        key = (tp.topic, tp.partition)
        end = commits.ends.get(key)
        if end is not None:
            ends = commits.history.get(key, ([], []))[1]
            markers = len(ends) - bisect.bisect_right(ends, tp.offset)
            lag += max(0, end - tp.offset - markers)
    return lag
