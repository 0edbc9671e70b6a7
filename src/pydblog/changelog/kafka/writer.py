"""The capture's writer of a Kafka change log (``KafkaChangeLog``, ``ports.ChangeLogWriter``):
one transactional producer, one session; every ``append`` is one Kafka transaction whose
checkpoint message (``protocol.CommitRecord``) describes exactly the records it wrote
(docs/kafka.md, "Exactly once").

Invariants:
- ``append`` returns only once Kafka acknowledged the commit: the capture acknowledges
  the source (slot, binlog) only after that.
- The last valid checkpoint can be read from Kafka alone, by any host: a session
  resumes there (``recover_commits``), at the global offset where it ends.
- A commit whose delivery reports do not account for its records in the partitions
  (``KafkaChangeLog._copies``) is aborted, never committed.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from pydblog import failpoints
from pydblog.changelog import kafka_native
from pydblog.changelog.kafka import client as kafka_client
from pydblog.changelog.kafka.client import (
    TIMEOUT_S,
    TRANSACTION_TIMEOUT_MS,
    Client,
    client_config,
    unavailable,
)
from pydblog.changelog.kafka.producer import WireProducer
from pydblog.changelog.kafka.producer import codec as producer_codec
from pydblog.changelog.kafka.producer import supported as producer_unsupported
from pydblog.changelog.kafka.protocol import CommitLog, CommitRecord, commit_ends, recover
from pydblog.changelog.kafka.topics import (
    HEADER_EVENT,
    HEADER_SOURCE,
    HEADER_WRITER,
    checkpoint_topic,
    data_topic,
    header,
    notification_value,
    notifications_topic,
    schemas_topic,
    truncates_topic,
)
from pydblog.errors import ChangeLogError, ChangeLogUnavailable, ConfigError, DblogError, Fenced
from pydblog.events import Encoded, EncodedBlock, EncodedEvent, expand_template
from pydblog.ports import ChangeLogWriter, Checkpoint, TableSchema

if TYPE_CHECKING:
    from pydblog.config import LogConfig

log = logging.getLogger(__name__)

RECOVERY_WINDOW = 2000
"""Recovery reads this many of the checkpoint topic's last messages: the newest
session's begin message is among them unless it committed more than that since (then
its first message in the window is taken as the owner)."""
KNOWN_EVERY = RECOVERY_WINDOW // 4
"""A writer that knows every data partition's last valid end puts them all into its
begin message and into every ``KNOWN_EVERY``-th commit (``CommitRecord.known``), so a
later session's recovery window holds them: its first commit to a partition outside
the window need not read the whole checkpoint topic (``KafkaChangeLog._valid_end``)."""
KNOWN_MAX_PARTITIONS = 20_000
"""Above this many data partitions the ends are not written (~40 bytes each: the
checkpoint message's 1 MB limit)."""


def recover_commits(client: Client) -> CommitLog:
    """The newest valid commit from the checkpoint topic's last ``RECOVERY_WINDOW``
    messages (the writer's recovery: it needs the last checkpoint and ``max_gen``;
    ``protocol.recover``: ``ends`` then holds every data partition's last valid end if
    ``whole`` says so)."""
    topic = checkpoint_topic(client.prefix)
    if not client.partitions(topic):
        return CommitLog()
    lo, hi = client.watermarks([(topic, 0)])[(topic, 0)]
    records = (CommitRecord.from_bytes(m.value(), m.offset())
               for m in client.read_range({(topic, 0): (max(lo, hi - RECOVERY_WINDOW), None)})
               if m.value() is not None)
    # (a broker's high watermark may lag: never ahead)
    return recover(records, from_start=hi - RECOVERY_WINDOW <= lo)
class KafkaChangeLog(ChangeLogWriter):
    """The capture's writer: one transactional producer, one session (``gen``, id)."""

    def __init__(self, cfg: LogConfig) -> None:
        self.cfg = cfg
        self.client = client = Client(cfg)
        k = client.k
        self.prefix = client.prefix
        self._tombstones = cfg.tombstones
        self._source_header = cfg.source_header
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
        self._wire: WireProducer | None = None  # pydblog's own producer, if it serves
        self._no_wire = False  # the brokers do not serve the wire producer's requests
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
        self._peek: Client | None = None  # reads uncommitted records (``_own_records``)
        try:
            client.ensure_topics(
                [checkpoint_topic(self.prefix), schemas_topic(self.prefix),
                 notifications_topic(self.prefix), truncates_topic(self.prefix)], 1)
            self._producer = self._make_producer(conf)
            try:
                self._producer.init_transactions(TIMEOUT_S)
            except k.KafkaException as exc:
                if self._wire is None or not _unsupported_version(exc):
                    raise
                log.info("Kafka change log: librdkafka's producer writes (the brokers do not "
                         "serve a request version the wire producer speaks: %s)", exc)
                self._wire.close()
                self._wire = None
                self._no_wire = True
                self._producer = self._make_producer(conf)
                self._producer.init_transactions(TIMEOUT_S)
        except k.KafkaException as exc:
            if self._wire is not None:
                self._wire.close()
            raise unavailable("starting the transactional producer", cfg, exc) from None
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
        """The transactional producer: the wire producer (``producer``) if ``[log]
        producer`` asks for it and it speaks the ``[log.kafka]`` settings, else
        librdkafka's, with the C path's interceptor plugin if it can be made (else the
        Python path's, logged)."""
        k = self.client.k
        if self.cfg.producer == "wire" and kafka_native.writer_available() and not self._no_wire:
            why = producer_unsupported(self.cfg.kafka)
            if why is None:
                assert self.cfg.bootstrap_servers is not None
                self._wire = WireProducer(
                    self.cfg.bootstrap_servers, str(conf["transactional.id"]),
                    int(conf["transaction.timeout.ms"]), TIMEOUT_S,
                    compression=producer_codec(self.cfg.kafka),
                    client_id=str(conf["client.id"]) if "client.id" in conf else None)
                return self._wire
            log.info("Kafka change log: librdkafka's producer writes ([log.kafka] %s is not "
                     "spoken by pydblog's wire producer)", why)
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
        return kafka_client.make_client(k.Producer, conf, self.cfg)

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
                           known=self._known() if self._commits % KNOWN_EVERY == 0 else None,
                           times=commit_times(events, start))
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
            if self._wire is not None:
                self._wire.known(set((topics or {}).values()))
            elif self._native:
                kafka_native.take_acks(p, self._client_id)  # none of this commit's yet
            p.begin_transaction()
            if self._wire is not None:  # its partition joins the transaction with the data's
                self._wire.expect([(checkpoint_topic(self.prefix), 0)])
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
            raise unavailable("a commit", self.cfg, cause) from None
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
        read them. Kafka offsets only grow: the partition lost records."""
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
            self._peek = Client(self.cfg, uncommitted=True)
        tag = self._tag
        return sum(header(m.headers(), HEADER_WRITER) == tag
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
        if self._wire is not None:
            entries, err = self._wire.take_acks()
        elif self._native:
            entries, err = kafka_native.take_acks(self._producer, self._client_id)
        else:
            return
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
        order. With the wire producer, the batches cut meanwhile are sent between runs."""
        k = self.client.k
        p = self._producer
        wire = self._wire
        i, n = 0, len(events)
        while i < n:
            if wire is not None and wire.acc.ready:
                wire.send_ready()  # full batches go while the next records are encoded
            item = events[i]
            if type(item) is EncodedBlock:
                seq = (self._produce_template(item, topics[item.table], seq)
                       if item.head else self._produce_py([item], seq, topics))
                i += 1
                continue
            i, seq, status, code, why = kafka_native.produce_events(
                self._sink(), self._client_id, events, i, seq, topics, self._tag, self._tombstones,
                EncodedEvent, self._source_header)
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

    def _sink(self) -> Any:
        """What the C path produces into: the wire producer's accumulator, or the
        librdkafka producer."""
        return self._wire.acc if self._wire is not None else self._producer

    def _produce_py(self, events: Sequence[Encoded], seq: int, topics: dict[str, str],
                    tombstone_only: bool = False) -> int:
        """``_produce`` in Python; the global offset after the events. ``tombstone_only``:
        only the tombstones of the deletes (their records are in)."""
        for item in events:
            topic = topics[item.table]
            if type(item) is EncodedBlock:
                if item.head:
                    seq = self._produce_template(item, topic, seq)
                    continue
                bodies: list[str] = item.bodies()
            else:
                body = item.body
                bodies = [body if isinstance(body, str) else body.decode()]
            seq = self._produce_bodies(bodies, item.op, topic, seq, tombstone_only)
        return seq

    def _produce_bodies(self, bodies: Sequence[str], op: str, topic: str, seq: int,
                        tombstone_only: bool = False) -> int:
        """Envelopes of one table and op, one by one (global offsets from ``seq``); the
        global offset after them."""
        tag = self._tag
        produce = self._producer.produce
        for text in bodies:
            src_start = text.find('"source":') + 9
            src_end = text.find('},"key":', src_start) + 1
            value = f'{{"offset":{seq},{text[1:]}'
            headers: list[tuple[str, str | bytes]] = [(HEADER_WRITER, tag)]
            if self._source_header:
                headers.append((HEADER_SOURCE, text[src_start:src_end]))
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
                headers: list[tuple[str, Any]] = [(HEADER_WRITER, tag)]
                if self._source_header:
                    headers.append((HEADER_SOURCE, orjson.dumps(env["source"])))
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
        template's parts and the tail, no search of the whole envelope; a block of
        deletes with its tombstones. A row whose tail does not hold exactly one
        ``,"before":`` (its key ends there otherwise: ``_key_of``'s rule) and the rows
        after it go one by one."""
        start = 0
        if self._native:
            k = self.client.k
            half = False
            tombstones = block.op == "d" and self._tombstones
            while True:
                start, seq, status, code, why = kafka_native.produce_template(
                    self._sink(), self._client_id, topic, block.head, block.mid, block.body,
                    block.first_index, seq, self._tag, start, tombstones, half,
                    self._source_header)
                half = False
                if status == 0:
                    return seq
                if status == 2:
                    self._producer.poll(0.05)
                elif status == 3:
                    self._producer.poll(0.05)
                    half = True
                elif status == 4:
                    raise k.KafkaException(k.KafkaError(code, why))
                else:
                    break  # from row ``start`` on, not a template the C path cuts
        lines = block.body.split("\n")[start:]
        head, mid = block.head, block.mid
        src_start = head.find('"source":') + 9
        if block.op == "d" or src_start < 9 or '},"key":' not in mid:
            bodies = expand_template(head, block.first_index + start, mid, lines)
            return self._produce_bodies(bodies, block.op, topic, seq)
        src_head = head[src_start:]
        src_tail = mid[: mid.find('},"key":') + 1]
        value_head = head[1:]
        tag = self._tag
        produce = self._producer.produce
        for i, tail in enumerate(lines, block.first_index + start):
            value = f'{{"offset":{seq},{value_head}{i}{mid}{tail}'
            headers: list[tuple[str, str | bytes]] = [(HEADER_WRITER, tag)]
            if self._source_header:
                headers.append((HEADER_SOURCE, f"{src_head}{i}{src_tail}"))
            cut = tail.find(',"before":')
            key = (tail[:cut] if tail.find(',"before":', cut + 1) < 0 <= cut
                   else _key_of(f"{head}{i}{mid}{tail}", len(head) + len(str(i)) + len(mid)))
            if key == "null":
                key = None
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
            if self._wire is not None:
                self._wire.close()
            self.client.close()
            if self._peek is not None:
                self._peek.close()


def _unsupported_version(exc: BaseException) -> bool:
    """The wire producer's error for brokers that do not serve its request versions."""
    from pydblog.changelog.kafka.wire import UNSUPPORTED_VERSION

    err = exc.args[0] if exc.args else None
    return getattr(err, "code", lambda: None)() == UNSUPPORTED_VERSION


def commit_times(events: Sequence[Encoded], start: int) -> list[tuple[int, int]]:
    """``(first offset, ts_ms)`` where the events' commit time changes (the first event
    at ``start``): ``CommitRecord.times``."""
    out: list[tuple[int, int]] = []
    last = None
    pos = start
    for e in events:
        ts = e.ts_ms
        if ts != last:
            out.append((pos, ts))
            last = ts
        pos += e.size if type(e) is EncodedBlock else 1
    return out


def _key_of(text: str, start: int) -> str | None:
    """The event key's JSON text in an envelope (``start``: just after ``,"key":``): the
    JSON value there, which the envelope follows with ``,"before":`` (if that text also
    occurs elsewhere, a key column or a json value named ``before``, the value's end is
    found by decoding it); None for a null key."""
    end = text.find(',"before":', start)
    if end < 0 or text.count(',"before":') != 1:
        try:
            end = _JSON.raw_decode(text, start)[1]
        except ValueError:
            end = -1
        if not text.startswith(',"before":', end):
            key = orjson.loads(text).get("key")
            return orjson.dumps(key).decode() if key is not None else None
    key_text = text[start:end]
    return None if key_text == "null" else key_text


_JSON = json.JSONDecoder()


# -- the reader ------------------------------------------------------------------------------
