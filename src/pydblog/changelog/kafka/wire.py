"""Kafka's wire protocol, as far as the wire producer (``kafka.producer``) speaks it: a
blocking connection that frames requests (header v1) and pipelines them, and the
encoding of the requests it sends and the decoding of their responses, each at one
non-flexible version (``VERSIONS``; ``ApiVersions`` checks the broker serves it).

Invariants: responses are read in the order their requests were sent on a connection
(Kafka answers a connection's requests in order), and each is checked against its
request's correlation id; a connection that failed once is closed and never reused.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

API_PRODUCE = 0
API_METADATA = 3
API_FIND_COORDINATOR = 10
API_VERSIONS = 18
API_INIT_PRODUCER_ID = 22
API_ADD_PARTITIONS_TO_TXN = 24
API_END_TXN = 26

VERSIONS = {
    API_PRODUCE: 8,
    API_METADATA: 8,
    API_FIND_COORDINATOR: 2,
    API_INIT_PRODUCER_ID: 1,
    API_ADD_PARTITIONS_TO_TXN: 2,
    API_END_TXN: 1,
}
"""The version of each request the producer sends (the last before flexible encodings)."""

API_NAMES = {API_PRODUCE: "Produce", API_METADATA: "Metadata",
             API_FIND_COORDINATOR: "FindCoordinator", API_VERSIONS: "ApiVersions",
             API_INIT_PRODUCER_ID: "InitProducerId",
             API_ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn", API_END_TXN: "EndTxn"}

# error codes (org.apache.kafka.common.protocol.Errors)
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
NETWORK_EXCEPTION = 13
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
UNSUPPORTED_VERSION = 35
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
CONCURRENT_TRANSACTIONS = 51
TRANSACTION_COORDINATOR_FENCED = 52
UNKNOWN_PRODUCER_ID = 59
KAFKA_STORAGE_ERROR = 56
FENCED_LEADER_EPOCH = 74
PRODUCER_FENCED = 90
INVALID_RECORD = 87
TRANSACTION_ABORTABLE = 120

RETRIABLE = frozenset({
    LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NETWORK_EXCEPTION,
    COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
    NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, CONCURRENT_TRANSACTIONS,
    KAFKA_STORAGE_ERROR, FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION,
})
"""Errors a later attempt (after a metadata refresh or a back-off) may not meet."""

FENCING = frozenset({INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, TRANSACTION_COORDINATOR_FENCED})
"""Errors that say another producer with this transactional id took over."""


class WireError(Exception):
    """A Kafka error code a response carried (``code``), or a connection's failure
    (``code`` ``NETWORK_EXCEPTION``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE

    @property
    def fencing(self) -> bool:
        return self.code in FENCING


# -- encoding ---------------------------------------------------------------------------

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


def i16(v: int) -> bytes:
    return _I16.pack(v)


def i32(v: int) -> bytes:
    return _I32.pack(v)


def i64(v: int) -> bytes:
    return _I64.pack(v)


def string(s: str | None) -> bytes:
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def array(items: Sequence[bytes]) -> bytes:
    return i32(len(items)) + b"".join(items)


class Reader:
    """Reads a response body in order."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, st: struct.Struct) -> int:
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return int(v)

    def i8(self) -> int:
        return self._take(_I8)

    def i16(self) -> int:
        return self._take(_I16)

    def i32(self) -> int:
        return self._take(_I32)

    def i64(self) -> int:
        return self._take(_I64)

    def string(self) -> str | None:
        n = self.i16()
        if n < 0:
            return None
        s = self.buf[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def length(self) -> int:
        return self.i32()


# -- requests and responses -------------------------------------------------------------

def api_versions_response(r: Reader) -> tuple[int, dict[int, tuple[int, int]]]:
    """ApiVersions v0: the error code and per API key its (min, max) version."""
    err = r.i16()
    out: dict[int, tuple[int, int]] = {}
    for _ in range(r.length()):
        key, lo, hi = r.i16(), r.i16(), r.i16()
        out[key] = (lo, hi)
    return err, out


@dataclass(frozen=True)
class Broker:
    node_id: int
    host: str
    port: int


@dataclass
class Metadata:
    brokers: dict[int, Broker]
    partitions: dict[str, list[int]]
    """Per topic, each partition's leader (-1: none now)."""
    errors: dict[str, int]
    """Per topic that came back with one, its error code."""


def metadata_request(topics: Iterable[str]) -> bytes:
    """Metadata v8 for ``topics`` (none created)."""
    return array([string(t) for t in topics]) + b"\x00\x00\x00"


def metadata_response(r: Reader) -> Metadata:
    r.i32()  # throttle
    brokers: dict[int, Broker] = {}
    for _ in range(r.length()):
        node, host, port = r.i32(), r.string() or "", r.i32()
        r.string()  # rack
        brokers[node] = Broker(node, host, port)
    r.string()  # cluster id
    r.i32()  # controller
    partitions: dict[str, list[int]] = {}
    errors: dict[str, int] = {}
    for _ in range(r.length()):
        err = r.i16()
        name = r.string() or ""
        r.i8()  # internal
        leaders: dict[int, int] = {}
        for _ in range(r.length()):
            perr, index, leader = r.i16(), r.i32(), r.i32()
            r.i32()  # leader epoch
            for _ in range(3):  # replicas, isr, offline
                for _ in range(r.length()):
                    r.i32()
            leaders[index] = leader if perr in (NONE, NOT_LEADER_OR_FOLLOWER) or leader >= 0 else -1
        r.i32()  # authorized operations
        if err != NONE:
            errors[name] = err
        if leaders:
            partitions[name] = [leaders.get(i, -1) for i in range(max(leaders) + 1)]
    return Metadata(brokers, partitions, errors)


def find_coordinator_request(transactional_id: str) -> bytes:
    return string(transactional_id) + b"\x01"  # key type 1: a transaction


def find_coordinator_response(r: Reader) -> tuple[int, str | None, Broker]:
    r.i32()
    err = r.i16()
    message = r.string()
    node, host, port = r.i32(), r.string() or "", r.i32()
    return err, message, Broker(node, host, port)


def init_producer_id_request(transactional_id: str, timeout_ms: int) -> bytes:
    return string(transactional_id) + i32(timeout_ms)


def init_producer_id_response(r: Reader) -> tuple[int, int, int]:
    """(error, producer id, epoch)."""
    r.i32()
    return r.i16(), r.i64(), r.i16()


def add_partitions_request(transactional_id: str, pid: int, epoch: int,
                           parts: dict[str, list[int]]) -> bytes:
    return (string(transactional_id) + i64(pid) + i16(epoch)
            + array([string(t) + array([i32(p) for p in ps]) for t, ps in sorted(parts.items())]))


def add_partitions_response(r: Reader) -> dict[tuple[str, int], int]:
    r.i32()
    out: dict[tuple[str, int], int] = {}
    for _ in range(r.length()):
        name = r.string() or ""
        for _ in range(r.length()):
            p, err = r.i32(), r.i16()
            out[(name, p)] = err
    return out


def produce_request(transactional_id: str, timeout_ms: int,
                    batches: dict[str, list[tuple[int, bytes]]]) -> bytes:
    """Produce v8, acks all: per topic ``(partition, record batch)`` (one batch a
    partition)."""
    topics = [string(t) + array([i32(p) + i32(len(b)) + b for p, b in parts])
              for t, parts in batches.items()]
    return string(transactional_id) + i16(-1) + i32(timeout_ms) + array(topics)


@dataclass(frozen=True)
class PartitionAck:
    error: int
    base_offset: int
    message: str | None


def produce_response(r: Reader) -> dict[tuple[str, int], PartitionAck]:
    out: dict[tuple[str, int], PartitionAck] = {}
    for _ in range(r.length()):
        name = r.string() or ""
        for _ in range(r.length()):
            index, err, base = r.i32(), r.i16(), r.i64()
            r.i64()  # log append time
            r.i64()  # log start offset
            notes = []
            for _ in range(r.length()):
                r.i32()
                notes.append(r.string() or "")
            message = r.string()
            if notes and not message:
                message = "; ".join(notes)
            out[(name, index)] = PartitionAck(err, base, message)
    r.i32()  # throttle
    return out


def end_txn_request(transactional_id: str, pid: int, epoch: int, commit: bool) -> bytes:
    return string(transactional_id) + i64(pid) + i16(epoch) + (b"\x01" if commit else b"\x00")


def end_txn_response(r: Reader) -> int:
    r.i32()
    return r.i16()


# -- connections ------------------------------------------------------------------------

class Connection:
    """One blocking TCP connection to a broker; requests may be pipelined (``send``
    several, then ``receive`` each in order)."""

    def __init__(self, broker: Broker, client_id: str, timeout_s: float) -> None:
        self.broker = broker
        self._client_id = string(client_id)
        self._next_id = 0
        self._sent: list[tuple[int, int]] = []  # (correlation id, api key), oldest first
        try:
            self._sock = socket.create_connection((broker.host, broker.port), timeout=timeout_s)
        except OSError as exc:
            raise WireError(NETWORK_EXCEPTION,
                            f"cannot connect to broker {broker.node_id} at "
                            f"{broker.host}:{broker.port}: {exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.closed = False

    def send(self, api: int, version: int, body: bytes) -> None:
        cid = self._next_id
        self._next_id = (cid + 1) & 0x7FFFFFFF
        head = i16(api) + i16(version) + i32(cid) + self._client_id
        try:
            self._sock.sendall(i32(len(head) + len(body)) + head)
            self._sock.sendall(body)
        except OSError as exc:
            self._fail(f"sending a {API_NAMES.get(api, api)} request failed: {exc}")
        self._sent.append((cid, api))

    def receive(self) -> Reader:
        cid, api = self._sent.pop(0)
        size = _I32.unpack(self._read(4))[0]
        data = self._read(size)
        got = _I32.unpack_from(data, 0)[0]
        if got != cid:
            self._fail(f"a {API_NAMES.get(api, api)} response came for request {got}, "
                       f"not {cid}")
        r = Reader(data)
        r.pos = 4
        return r

    def request(self, api: int, version: int, body: bytes) -> Reader:
        self.send(api, version, body)
        return self.receive()

    @property
    def pending(self) -> int:
        """Requests sent whose responses are not read yet."""
        return len(self._sent)

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self._sock.recv(min(n - len(buf), 1 << 20))
            except OSError as exc:
                self._fail(f"reading a response failed: {exc}")
            if not chunk:
                self._fail("the broker closed the connection")
            buf += chunk
        return bytes(buf)

    def _fail(self, why: str) -> None:
        self.close()
        raise WireError(NETWORK_EXCEPTION,
                        f"broker {self.broker.node_id} at {self.broker.host}:{self.broker.port}: "
                        f"{why}")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self._sock.close()
