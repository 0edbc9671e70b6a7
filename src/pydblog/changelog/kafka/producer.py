"""The capture's wire producer: a transactional Kafka producer that builds record batches
itself (``_kafkawrite.Accumulator``: records encoded in C, one LZ4 frame and one CRC-32C
per batch) and speaks Kafka's protocol (``wire``) for the few requests a transaction
needs: FindCoordinator, InitProducerId, AddPartitionsToTxn, Produce, EndTxn.

It serves ``KafkaChangeLog`` the subset of confluent-kafka's ``Producer`` the writer
uses (``init_transactions``, ``begin_transaction``, ``produce``, ``flush``,
``commit_transaction``, ``abort_transaction``) and the acknowledgements ``take_acks``
returns as ``kafka_native.take_acks`` does. A batch the accumulator has cut (full) may
be sent as soon as it is (``send_ready``: the broker stores it while the next records are
encoded); the rest wait until ``flush``, which sends them and returns once every record
of the transaction is acknowledged.

Invariants:
- Idempotent and transactional as Kafka's own producers: one producer id and epoch
  (InitProducerId), per partition sequence numbers from 0 with no gap, every partition
  added to the transaction before its first record is sent, acks from all in-sync
  replicas.
- A partition's batches are sent in order, on its leader's connection; the answers of
  every batch sent since the transaction's last ``flush`` are judged together at
  ``flush``, in the order the batches were cut.
- The transaction coordinator has a connection of its own, and metadata requests go to
  a connection with no answer pending: no response is read by the wrong caller.
- No produce request is ever sent twice. Any error fails the call (a
  ``confluent_kafka.KafkaException`` with the broker's code; fencing codes are fatal);
  the writer then aborts, and the next ``begin_transaction`` starts from a new epoch
  (InitProducerId again: the broker aborts whatever this producer left open).
- ``take_acks`` reports, per partition, the lowest and highest offset of the records
  acknowledged since its last call, and their number: a batch of n records
  acknowledged at base offset b holds offsets b to b + n - 1.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import struct
import time
import uuid
from collections import deque
from collections.abc import Iterable
from typing import Any

from pydblog.changelog.kafka import wire
from pydblog.changelog.kafka.wire import Broker, Connection, WireError

log = logging.getLogger(__name__)

BATCH_BYTES = 1_000_000
"""Records a batch holds at most (bytes before compression; Kafka's default
``message.max.bytes`` is 1 MB after it)."""
IN_FLIGHT = 5
"""Produce requests sent on a connection before the first answer is read."""
ATTR_LZ4 = 3
ATTR_TRANSACTIONAL = 0x10

_HEADER = struct.Struct(">qiibIhiqqqhii")
"""A v2 RecordBatch's header: base offset, length, partition leader epoch, magic, CRC,
attributes, last offset delta, first and max timestamp, producer id, epoch, base
sequence, record count (61 bytes)."""
_CRC_FROM = 21  # the CRC covers the attributes to the end
NOT_APPENDED = frozenset({wire.NOT_LEADER_OR_FOLLOWER, wire.LEADER_NOT_AVAILABLE,
                          wire.UNKNOWN_TOPIC_OR_PARTITION, wire.FENCED_LEADER_EPOCH,
                          wire.NOT_ENOUGH_REPLICAS})
"""Produce errors that say the batch was not appended: it is sent again (same sequence)
once the partition's leader is known again."""


def supported(settings: dict[str, Any]) -> str | None:
    """Why the wire producer does not serve a capture with these ``[log.kafka]``
    (librdkafka) ``settings``, naming the setting (None: it does). It speaks plaintext
    Kafka without authentication, writes lz4 (the default) or uncompressed batches, and
    takes ``transaction.timeout.ms``; any other producer setting (``linger.ms``,
    ``partitioner``, ``acks``, ...) is librdkafka's to honour, so librdkafka's producer
    serves then."""
    from pydblog.changelog.kafka.client import _PRODUCER_ONLY

    for key, value in settings.items():
        name = key.strip().lower()
        if name == "security.protocol":
            if str(value).lower() != "plaintext":
                return f'"{key}" = "{value}"'
        elif name in ("compression.type", "compression.codec"):
            if str(value).lower() not in ("lz4", "none"):
                return f'"{key}" = "{value}"'
        elif name == "transaction.timeout.ms":
            continue
        elif name.startswith(("ssl.", "sasl.", "plugin.", "client.dns.")) \
                or name.startswith(_PRODUCER_ONLY):
            return f'"{key}"'
    return None


def codec(settings: dict[str, Any]) -> str:
    """The batches' compression under ``settings`` ("lz4" unless "none" is asked)."""
    for key in ("compression.type", "compression.codec"):
        if str(settings.get(key, "")).lower() == "none":
            return "none"
    return "lz4"


def _kafka() -> Any:
    import confluent_kafka

    return confluent_kafka


def _error(code: int, why: str) -> Exception:
    """confluent-kafka's exception for a Kafka error code (what the writer handles)."""
    k = _kafka()
    exc: Exception = k.KafkaException(k.KafkaError(code, why, fatal=code in wire.FENCING,
                                                   retriable=code in wire.RETRIABLE))
    return exc


class WireProducer:
    """A transactional producer for one ``transactional.id`` (see the module)."""

    def __init__(self, bootstrap: str, transactional_id: str, transaction_timeout_ms: int,
                 timeout_s: float, compression: str = "lz4", batch_bytes: int = BATCH_BYTES,
                 client_id: str | None = None) -> None:
        import crc32c
        import lz4.frame

        _kafkawrite = importlib.import_module("pydblog.changelog._kafkawrite")
        self._crc = crc32c.crc32c
        self._lz4 = lz4.frame.compress if compression == "lz4" else None
        self.acc: Any = _kafkawrite.Accumulator(batch_bytes)
        self.txn_id = transactional_id
        self._txn_timeout_ms = transaction_timeout_ms
        self._timeout_s = timeout_s
        self._client_id = client_id or f"dblog-wire-{uuid.uuid4().hex[:12]}"
        self._bootstrap = [_address(b) for b in bootstrap.split(",") if b.strip()]
        self._conns: dict[int, Connection] = {}
        self._brokers: dict[int, Broker] = {}
        self._leaders: dict[str, list[int]] = {}
        self._coordinator: Connection | None = None
        self._pid = -1
        self._epoch = -1
        self._seq: dict[tuple[str, int], int] = {}
        self._in_txn: set[tuple[str, int]] = set()
        self._open = False
        self._stale = False  # an error left the transaction: a new epoch first
        self._acks: dict[tuple[str, int], list[int]] = {}
        self._expected: set[tuple[str, int]] = set()
        # the batches sent (or held) since the last flush, and their answers
        self._todo: list[tuple[tuple[str, int], int, bytes]] = []
        self._answers: dict[int, wire.PartitionAck] = {}
        self._flight: dict[int, deque[list[int]]] = {}  # per leader: each request's batches
        self._held: set[tuple[str, int]] = set()  # partitions with a batch not sent
        # partitions with a batch appended in this producer epoch (see ``_dispatch``)
        self._proven: set[tuple[str, int]] = set()

    # -- connections and metadata ---------------------------------------------------------

    def _any(self) -> Connection:
        for c in self._conns.values():
            if not c.closed and not c.pending:
                return c
        last: WireError | None = None
        for host, port in self._bootstrap:
            try:
                c = Connection(Broker(-1, host, port), self._client_id, self._timeout_s)
                self._check_versions(c)
            except WireError as exc:
                if exc.code != wire.NETWORK_EXCEPTION:
                    c.close()
                    raise
                last = exc  # (the connection is closed): the next server
                continue
            return c
        raise last or WireError(wire.NETWORK_EXCEPTION, "no bootstrap server")

    def _check_versions(self, c: Connection) -> None:
        err, versions = wire.api_versions_response(c.request(wire.API_VERSIONS, 0, b""))
        if err != wire.NONE:
            raise WireError(err, f"ApiVersions failed with error {err}")
        for api, v in wire.VERSIONS.items():
            lo, hi = versions.get(api, (1, 0))
            if not lo <= v <= hi:
                raise WireError(wire.UNSUPPORTED_VERSION,
                                f"the broker does not serve {wire.API_NAMES[api]} v{v}")

    def _conn(self, node: int) -> Connection:
        c = self._conns.get(node)
        if c is None or c.closed:
            broker = self._brokers.get(node)
            if broker is None:
                self._refresh([])
                broker = self._brokers.get(node)
                if broker is None:
                    raise WireError(wire.LEADER_NOT_AVAILABLE, f"broker {node} is not known")
            c = self._conns[node] = Connection(broker, self._client_id, self._timeout_s)
        return c

    def _refresh(self, topics: Iterable[str]) -> None:
        """The brokers and the leaders of ``topics``' partitions, from any broker that
        answers (a broker whose connection fails is skipped: it may be the one gone)."""
        body = wire.metadata_request(list(topics))
        for _ in range(len(self._conns) + 1):
            c = self._any()
            try:
                md = wire.metadata_response(
                    c.request(wire.API_METADATA, wire.VERSIONS[wire.API_METADATA], body))
            except WireError:
                if c.broker.node_id >= 0:
                    continue  # closed now: another known broker, or the bootstrap servers
                raise
            self._brokers.update(md.brokers)
            if c.broker.node_id < 0:
                c.close()
            self._leaders.update(md.partitions)
            return
        raise WireError(wire.NETWORK_EXCEPTION, "no broker answered a metadata request")

    def known(self, topics: Iterable[str]) -> None:
        """Register ``topics`` (existing ones) with the accumulator, partition counts
        from the brokers' metadata."""
        missing = [t for t in topics if self.acc.partitions(t) is None]
        if not missing:
            return
        try:
            self._refresh(missing)
        except WireError as exc:
            raise _error(exc.code, str(exc)) from None
        for t in missing:
            leaders = self._leaders.get(t)
            if not leaders:
                raise _error(wire.UNKNOWN_TOPIC_OR_PARTITION,
                             f"topic {t} is not known to the brokers")
            self.acc.topic(t, len(leaders))

    # -- the transaction coordinator --------------------------------------------------------

    def _coord(self) -> Connection:
        if self._coordinator is not None and not self._coordinator.closed:
            return self._coordinator
        deadline = time.monotonic() + self._timeout_s
        for attempt in itertools.count():
            c = self._any()
            err, message, broker = wire.find_coordinator_response(c.request(
                wire.API_FIND_COORDINATOR, wire.VERSIONS[wire.API_FIND_COORDINATOR],
                wire.find_coordinator_request(self.txn_id)))
            if c.broker.node_id < 0:
                c.close()
            if err == wire.NONE:
                self._brokers[broker.node_id] = broker
                self._coordinator = Connection(broker, self._client_id, self._timeout_s)
                return self._coordinator
            self._backoff(err, deadline, f"FindCoordinator: {message or err}", attempt)
        raise AssertionError("itertools.count() ended")

    def _backoff(self, err: int, deadline: float, what: str, attempt: int = 0) -> None:
        """Raise ``err`` unless it is retriable and time is left; else wait before the
        next attempt: 1 ms, doubling up to 20 ms (the coordinator answers
        CONCURRENT_TRANSACTIONS while it writes the last transaction's markers, ~1 ms)."""
        if err not in wire.RETRIABLE or time.monotonic() > deadline:
            raise _error(err, what)
        if err in (wire.NOT_COORDINATOR, wire.COORDINATOR_NOT_AVAILABLE):
            if self._coordinator is not None:
                self._coordinator.close()
            self._coordinator = None
        time.sleep(min(0.02, 0.001 * (1 << min(attempt, 5))))

    def _coordinated(self, api: int, body: bytes) -> wire.Reader:
        """A request to the transaction coordinator; a lost connection is retried once
        (these requests are idempotent for the coordinator)."""
        try:
            return self._coord().request(api, wire.VERSIONS[api], body)
        except WireError:
            self._coordinator = None
            return self._coord().request(api, wire.VERSIONS[api], body)

    # -- the confluent-kafka Producer subset ------------------------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """A new producer epoch (InitProducerId): the broker aborts this id's open
        transaction and fences any other producer of it; sequences start from 0."""
        deadline = time.monotonic() + (timeout or self._timeout_s)
        try:
            for attempt in itertools.count():
                err, pid, epoch = wire.init_producer_id_response(self._coordinated(
                    wire.API_INIT_PRODUCER_ID,
                    wire.init_producer_id_request(self.txn_id, self._txn_timeout_ms)))
                if err == wire.NONE:
                    break
                self._backoff(err, deadline, f"InitProducerId failed with error {err}", attempt)
        except WireError as exc:
            raise _error(exc.code, str(exc)) from None
        self._pid, self._epoch = pid, epoch
        self._seq.clear()
        self._proven.clear()
        self._in_txn.clear()
        self._stale = False

    def expect(self, tps: Iterable[tuple[str, int]]) -> None:
        """Partitions this transaction will write: added to it with the first records'
        partitions (one AddPartitionsToTxn round trip for both)."""
        self._expected.update(tps)

    def begin_transaction(self) -> None:
        if self._stale:
            self.init_transactions()
        self._forget_round()
        self.acc.clear()
        self._acks.clear()
        self._in_txn.clear()
        self._expected.clear()
        self._open = True

    def produce(self, topic: str, value: Any = None, key: Any = None,
                partition: int | None = None, headers: Any = None, **_: Any) -> None:
        if self.acc.partitions(topic) is None:
            self.known([topic])
        self.acc.add(topic, -1 if partition is None else partition, key, value, headers)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float | None = None) -> int:
        """Send every record added; returns 0 once all are acknowledged (raises
        otherwise)."""
        try:
            self._flush()
        except WireError as exc:
            self._stale = True
            raise _error(exc.code, str(exc)) from None
        except BaseException:
            self._stale = True
            raise
        return 0

    def send_ready(self) -> None:
        """Send the batches the accumulator has cut (full) so far; their answers are read
        when more requests than ``IN_FLIGHT`` would be waiting on a connection, the rest
        by ``flush``."""
        if not self._open or not self.acc.ready:
            return
        try:
            self._dispatch(self._take(sealed_only=True))
        except WireError as exc:
            self._stale = True
            raise _error(exc.code, str(exc)) from None
        except BaseException:
            self._stale = True
            raise

    def _take(self, sealed_only: bool) -> list[tuple[tuple[str, int], int, bytes]]:
        """The accumulator's batches (all, or the cut ones), built: header, compression,
        sequence numbers; their partitions added to the transaction first."""
        batches = self.acc.take(sealed_only=sealed_only)
        if not batches:
            return []
        new = ({(t, p) for t, p, *_ in batches} | self._expected) - self._in_txn
        self._expected.clear()
        todo: list[tuple[tuple[str, int], int, bytes]] = []
        try:
            if new:
                self._add_partitions(new)
            for topic, part, count, base_ts, max_ts, records in batches:
                tp = (topic, part)
                seq = self._seq.get(tp, 0)
                self._seq[tp] = (seq + count) & 0x7FFFFFFF
                todo.append((tp, count, self._batch(records, count, base_ts, max_ts, seq)))
        finally:
            del batches  # views of the accumulator's buffers: now returned to it
            self.acc.release()
        return todo

    def _flush(self) -> None:
        if not self._open:
            if self.acc.pending:
                raise WireError(wire.INVALID_TXN_STATE, "records outside a transaction")
            return
        self._dispatch(self._take(sealed_only=False))
        todo = self._collect()
        deadline = time.monotonic() + self._timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise WireError(wire.REQUEST_TIMED_OUT, "partitions without a leader to take "
                                f"their records: {sorted({tp for tp, *_ in todo})}")
            time.sleep(0.05)
            self._refresh({tp[0] for tp, *_ in todo})
            self._dispatch(todo)
            todo = self._collect()

    def _dispatch(self, todo: list[tuple[tuple[str, int], int, bytes]]) -> None:
        """Sends ``todo`` (each partition's batches in order) to the partitions'
        leaders, at most ``IN_FLIGHT`` requests waiting on a connection (the oldest
        answer is read first otherwise). A partition without a known leader, and from
        then on in this round every later batch of it, is held (not sent).

        A partition's first batch of the producer epoch goes alone, and its answer is
        read before any later batch of it is sent: a broker that holds no state of the
        producer for a partition appends a batch of any sequence, so a later batch
        pipelined behind a refused first one (a partition of a topic just made, not
        ready yet) would be appended before it. Once one of its batches is appended
        (``_proven``), a partition's batches are pipelined."""
        if not todo:
            return
        firsts: list[tuple[tuple[str, int], int, bytes]] = []
        rest: list[tuple[tuple[str, int], int, bytes]] = []
        first_of: set[tuple[str, int]] = set()
        for item in todo:
            tp = item[0]
            if tp in self._proven or tp in self._held or tp in first_of:
                rest.append(item)
            else:
                first_of.add(tp)
                firsts.append(item)
        if firsts:
            base = len(self._todo)
            self._send(firsts)
            self._receive_all()
            for k in range(base, base + len(firsts)):
                ack = self._answers.get(k)
                tp = self._todo[k][0]
                if ack is not None and ack.error == wire.NONE:
                    self._proven.add(tp)
                else:  # refused or not sent: its later batches wait for the next round
                    self._held.add(tp)
        self._send(rest)

    def _send(self, todo: list[tuple[tuple[str, int], int, bytes]]) -> None:
        """``_dispatch``'s sending: no wait for the answers but a connection's
        ``IN_FLIGHT`` limit."""
        if not todo:
            return
        base = len(self._todo)
        self._todo.extend(todo)
        # per leader, a queue of requests: the i-th holds each partition's i-th batch
        plan: dict[int, list[dict[str, list[tuple[int, bytes]]]]] = {}
        items: dict[int, list[list[int]]] = {}  # the todo indexes each request holds
        depth: dict[tuple[str, int], int] = {}
        for n in range(base, len(self._todo)):
            tp, _, data = self._todo[n]
            leader = -1 if tp in self._held else self._leader(*tp)
            if leader < 0:
                self._held.add(tp)
                continue
            i = depth.get(tp, 0)
            depth[tp] = i + 1
            queue = plan.setdefault(leader, [])
            where = items.setdefault(leader, [])
            while len(queue) <= i:
                queue.append({})
                where.append([])
            queue[i].setdefault(tp[0], []).append((tp[1], data))
            where[i].append(n)
        timeout_ms = int(self._timeout_s * 1000)
        v = wire.VERSIONS[wire.API_PRODUCE]
        waiting = {leader: deque(zip(reqs, items[leader], strict=True))
                   for leader, reqs in plan.items()}
        while waiting:
            for leader in list(waiting):
                c = self._conn(leader)
                flight = self._flight.setdefault(leader, deque())
                reqs = waiting[leader]
                while reqs and len(flight) < IN_FLIGHT:
                    req, idx = reqs.popleft()
                    c.send(wire.API_PRODUCE, v, wire.produce_request(self.txn_id, timeout_ms, req))
                    flight.append(idx)
                if not reqs:
                    del waiting[leader]
            for leader in waiting:  # its connection is full: its oldest answer first
                self._receive(leader)

    def _receive(self, leader: int) -> None:
        """The answer to the oldest request waiting on ``leader``'s connection."""
        idx = self._flight[leader].popleft()
        answer = wire.produce_response(self._conns[leader].receive())
        for k in idx:
            self._answers[k] = answer.get(self._todo[k][0]) or wire.PartitionAck(
                wire.NETWORK_EXCEPTION, -1, "no answer for the partition")

    def _receive_all(self) -> None:
        """The answers to every request still waiting, on every connection."""
        for leader, flight in self._flight.items():
            while flight:
                self._receive(leader)

    def _collect(self) -> list[tuple[tuple[str, int], int, bytes]]:
        """Reads every answer still due and judges the round's batches in order: the
        batches to send again (held ones, and from a partition's first refused one on:
        refused by a broker that is not its leader, so not appended); the round is
        over after."""
        self._receive_all()
        todo = self._todo
        again: list[tuple[tuple[str, int], int, bytes]] = []
        refused: set[tuple[str, int]] = set()
        try:
            for k, (tp, count, data) in enumerate(todo):
                ack = self._answers.get(k)
                if ack is None:  # held: never sent
                    again.append((tp, count, data))
                    continue
                if tp in refused:
                    # after a refused batch of its partition: refused too (out of order)
                    if ack.error not in (wire.NONE, wire.OUT_OF_ORDER_SEQUENCE_NUMBER) \
                            and ack.error not in NOT_APPENDED:
                        raise WireError(ack.error, f"{tp[0]} partition {tp[1]}: produce failed "
                                                   f"with error {ack.error}: {ack.message or ''}")
                    if ack.error == wire.NONE:
                        raise WireError(wire.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                        f"{tp[0]} partition {tp[1]}: a batch was taken after one "
                                        "before it was refused")
                    again.append((tp, count, data))
                    continue
                if ack.error in NOT_APPENDED:
                    self._leaders.pop(tp[0], None)
                    refused.add(tp)
                    again.append((tp, count, data))
                    continue
                if ack.error != wire.NONE:
                    raise WireError(ack.error, f"{tp[0]} partition {tp[1]}: produce failed with "
                                               f"error {ack.error}: {ack.message or ''}")
                first, last = ack.base_offset, ack.base_offset + count - 1
                seen = self._acks.get(tp)
                if ack.base_offset < 0:
                    self._acks[tp] = [-1, -1, 0]
                elif seen is None:
                    self._acks[tp] = [first, last, count]
                elif seen[0] >= 0:
                    self._acks[tp] = [min(seen[0], first), max(seen[1], last), seen[2] + count]
        finally:
            self._forget_round()
        return again

    def _forget_round(self) -> None:
        """Ends the round of sent batches; a connection left with answers unread (an
        error stopped the round) is closed, so no later caller reads them."""
        for leader, flight in self._flight.items():
            c = self._conns.get(leader)
            if flight and c is not None:
                c.close()
        self._flight.clear()
        self._todo = []
        self._answers.clear()
        self._held.clear()

    def _leader(self, topic: str, part: int) -> int:
        """The partition's leader (-1: none known now, after a metadata refresh)."""
        leaders = self._leaders.get(topic)
        if leaders is None or part >= len(leaders) or leaders[part] < 0:
            self._refresh([topic])
            leaders = self._leaders.get(topic)
        if leaders is None or part >= len(leaders):
            return -1
        return leaders[part]

    def _add_partitions(self, tps: set[tuple[str, int]]) -> None:
        parts: dict[str, list[int]] = {}
        for t, p in sorted(tps):
            parts.setdefault(t, []).append(p)
        deadline = time.monotonic() + self._timeout_s
        body = wire.add_partitions_request(self.txn_id, self._pid, self._epoch, parts)
        for attempt in itertools.count():
            result = wire.add_partitions_response(
                self._coordinated(wire.API_ADD_PARTITIONS_TO_TXN, body))
            errors = {e for e in result.values() if e != wire.NONE}
            if not errors:
                self._in_txn |= tps
                return
            # one failed partition fails them all (OPERATION_NOT_ATTEMPTED for the rest)
            err = min(errors - {55} or errors)
            self._backoff(err, deadline, f"AddPartitionsToTxn failed with error {err}", attempt)

    def _batch(self, records: Any, count: int, base_ts: int, max_ts: int, seq: int) -> bytes:
        """One v2 RecordBatch of ``count`` records (``records``: their bytes, or a view
        of them), transactional, sequence ``seq`` on."""
        attrs = ATTR_TRANSACTIONAL
        body: bytes
        if self._lz4 is not None:
            body = self._lz4(records, block_linked=False, store_size=False,
                             compression_level=0)
            attrs |= ATTR_LZ4
        else:
            body = bytes(records)  # (a view of the accumulator's buffer)
        head = bytearray(_HEADER.pack(0, 49 + len(body), -1, 2, 0, attrs, count - 1,
                                      base_ts, max_ts, self._pid, self._epoch, seq, count))
        crc = self._crc(body, self._crc(bytes(head[_CRC_FROM:])))
        struct.pack_into(">I", head, 17, crc)
        return bytes(head) + body

    def take_acks(self) -> tuple[list[tuple[str, int, int, int, int]], int]:
        """``kafka_native.take_acks``'s answer: per partition (topic, partition, lowest,
        highest, records) acknowledged since the last call; errors raise in ``flush``."""
        out = [(t, p, a[0], a[1], a[2]) for (t, p), a in self._acks.items()]
        self._acks.clear()
        return out, 0

    def commit_transaction(self, timeout: float | None = None) -> None:
        self.flush(timeout)
        self._end(True)

    def abort_transaction(self, timeout: float | None = None) -> None:
        self.acc.clear()
        if not self._open:
            return
        if any(self._flight.values()):
            self._stale = True  # requests in flight: a new epoch fences them
        if self._stale or not self._in_txn:
            # nothing sent (a new epoch aborts it anyway) or the epoch is to be renewed
            self._open = False
            self._stale = True
            return
        self._end(False)

    def _end(self, commit: bool) -> None:
        deadline = time.monotonic() + self._timeout_s
        try:
            if self._in_txn:
                body = wire.end_txn_request(self.txn_id, self._pid, self._epoch, commit)
                for attempt in itertools.count():
                    err = wire.end_txn_response(self._coordinated(wire.API_END_TXN, body))
                    if err == wire.NONE:
                        break
                    self._backoff(err, deadline, f"EndTxn failed with error {err}", attempt)
        except WireError as exc:
            self._stale = True
            self._open = False
            raise _error(exc.code, str(exc)) from None
        except BaseException:
            self._stale = True
            self._open = False
            raise
        self._open = False
        self._in_txn.clear()

    def close(self) -> None:
        for c in self._conns.values():
            c.close()
        self._conns.clear()
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None


def _address(text: str) -> tuple[str, int]:
    text = text.strip()
    for scheme in ("PLAINTEXT://", "plaintext://"):
        text = text.removeprefix(scheme)
    host, _, port = text.rpartition(":")
    return (host.strip("[]") or "localhost", int(port or 9092))
