"""The Kafka clients a change log needs (``Client``: an admin client and a consumer for
bounded reads, with the topic metadata cached), the settings every client gets
(``client_config``, ``[log.kafka]``), and Kafka errors as pydblog's (``unavailable``,
``bad_setting``).

A read (``Client.read_range``, ``read_batches``, ``read_values``) returns every record
of each partition's range once, in offset order, or raises: it never skips a record
that retention deleted (``ChangeLogError``), and it waits for an open transaction below
its end (until the broker aborts it) rather than ending early. What a weaker broker
needs on top is in ``compat``."""

from __future__ import annotations

import bisect
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from pydblog.changelog import kafka_native
from pydblog.changelog.kafka import compat
from pydblog.changelog.kafka.protocol import CommitLog, CommitRecord
from pydblog.changelog.kafka.topics import INTERNAL, checkpoint_topic, schemas_topic
from pydblog.errors import ChangeLogError, ChangeLogUnavailable, ConfigError, DblogError, Fenced
from pydblog.ports import TableSchema

if TYPE_CHECKING:
    from pydblog.config import LogConfig

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0
"""A read that gets no record for this long fails (``ChangeLogUnavailable``), unless an
open transaction holds it (``_stalled``)."""
STALL_S = 5.0
"""A read that gets no record for this long looks why (``_stalled``): an open
transaction below its end, or a weaker broker's storage stall (``compat``)."""
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


def kafka_module() -> Any:
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError:
        raise ChangeLogError(
            "[log] type = \"kafka\" needs the Kafka client (confluent-kafka), which is not installed",
            hint="pip install 'pydblog[kafka]'",
        ) from None
    return confluent_kafka



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
    k = kafka_module()
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


def for_consumer(conf: dict[str, Any]) -> dict[str, Any]:
    """Drop producer-only settings (librdkafka warns about each otherwise)."""
    return {k: v for k, v in conf.items() if not k.startswith(_PRODUCER_ONLY)}


def topic_prefix(cfg: LogConfig) -> str:
    assert cfg.topic_prefix is not None
    return cfg.topic_prefix


def unavailable(what: str, cfg: LogConfig, exc: BaseException) -> DblogError:
    k = kafka_module()
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
    """One read's partitions that an open transaction holds (``Client._stalled``)."""

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
    client = Client(cfg)
    try:
        return client.partitions(checkpoint_topic(topic_prefix(cfg))) > 0
    finally:
        client.close()



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



class Client:
    """The Kafka clients a log needs: an admin client and a consumer for bounded reads
    (``read_range``), with the topic metadata cached."""

    def __init__(self, cfg: LogConfig, native: bool = False, uncommitted: bool = False,
                 bulk: bool = False) -> None:
        self.k = kafka_module()
        self.uncommitted = uncommitted  # read open transactions' records too (the writer's check)
        self.cfg = cfg
        self.prefix = topic_prefix(cfg)
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
        # bulk: reads of records the broker holds (``compat.BULK_FETCH_WAIT_MS``)
        self.waits = compat.FetchWaits(str(cfg.bootstrap_servers), bulk)

    @property
    def fetch_wait_ms(self) -> int:
        """The fetch wait a new consumer gets (``compat.FetchWaits``: the shortest, unless
        a read found it too short for the broker's storage)."""
        return self.waits.current

    @property
    def admin(self) -> Any:
        """The admin client, made on first use (a read of given offsets needs none)."""
        if self._admin is None:
            self._admin = make_client(
                self.k.admin.AdminClient, for_consumer(client_config(self.cfg)), self.cfg)
        return self._admin

    def consumer(self) -> Any:
        if self._consumer is None:
            self._consumer_wait = self.fetch_wait_ms
            conf = for_consumer(client_config(
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
            try:
                self._partitions.update(compat.topic_partitions(self.admin, TIMEOUT_S))
            except self.k.KafkaException as exc:
                raise unavailable("reading metadata", self.cfg, exc) from None
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
        not available", "unknown topic or partition" for a topic a moment old, a leader
        epoch the broker has not caught up with or has moved past, an offset the new
        leader cannot answer yet) is asked again until ``TIMEOUT_S``; any other error, or
        one still there then, is ``ChangeLogUnavailable``."""
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
                    k.KafkaError.UNKNOWN_TOPIC_OR_PART, k.KafkaError.UNKNOWN_LEADER_EPOCH,
                    k.KafkaError.FENCED_LEADER_EPOCH, k.KafkaError.OFFSET_NOT_AVAILABLE))
                # (the admin client calls them final; Kafka's protocol calls them retriable)
                if not again or time.monotonic() + pause > deadline:
                    raise unavailable("listing offsets", self.cfg, exc) from None
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
                        raise unavailable("reading", self.cfg, k.KafkaException(m.error()))
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
                        raise unavailable("reading", self.cfg, k.KafkaException(k.KafkaError(code, why)))
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
        """How long a read that got no record yet waits before it looks for a stall
        (``compat.FetchWaits.first_stall_s``)."""
        bounded = all(hi is not None for _, hi in todo.values())
        return self.waits.first_stall_s(bounded, self._consumer_wait, STALL_S)

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
        """A weaker broker's storage stall (``compat``: Tansu on S3 answers a fetch whose
        wait is shorter than its storage's read with nothing, for good): if a partition
        has records past the consumer's position (``highs``: the high watermarks) and is
        not in ``held`` (an open transaction at its end, ``_stalled``), read on with the
        next fetch wait (``compat.FetchWaits``) on a new consumer, from each partition's
        position or ``todo``'s next offset, whichever is higher (a consumer that has
        returned no record has no position: -1001). Whether it did. Apache Kafka answers
        a fetch as soon as it has records: its reads never get here."""
        wait = self.waits.next_wait(self._consumer_wait)
        if not wait:
            return False
        k = self.k
        positions = {(tp.topic, tp.partition): tp.offset
                     for tp in c.position([k.TopicPartition(t, p) for t, p in todo])}
        at = {tp: max(positions.get(tp, -1), nxt) for tp, (nxt, _) in todo.items()}
        stuck = [tp for tp in todo if tp not in held and highs[tp] > at[tp]]
        if not stuck:
            return False
        self.waits.step(wait, self._consumer_wait, stuck)
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
