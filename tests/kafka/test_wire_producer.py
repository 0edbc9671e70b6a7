"""pydblog's wire producer (``changelog.kafka.producer``), read back by librdkafka's
consumer: every record as it was produced (keys, values, headers; null, empty, binary,
non-ASCII), keyed records in the partitions librdkafka's murmur2 partitioner picks,
batches cut small and pipelined with the offsets ``take_acks`` reports, aborted and
fenced transactions invisible to ``read_committed`` consumers; and the settings it does
not speak left to librdkafka's producer."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pydblog.changelog import kafka_native
from pydblog.changelog.kafka.producer import WireProducer, codec, supported
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.config import LogConfig

if not kafka_native.writer_available():
    pytest.skip("the wire producer needs pydblog.changelog._kafkawrite (not built)",
                allow_module_level=True)

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]


@pytest.fixture
def closing() -> Iterator[list[WireProducer]]:
    """The producers a test appends are closed after it, passed or failed (a failed
    test's open sockets would otherwise fail whichever test the garbage collector runs
    in next)."""
    made: list[WireProducer] = []
    yield made
    for p in made:
        p.close()


def new_topic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    name = f"wire{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result()
    return name


def read(bootstrap: str, topic: str, partitions: int, committed: bool = True,
         ) -> list[tuple[int, int, Any, Any, Any]]:
    """Every record of ``topic``: (partition, offset, key, value, headers)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wire-read",
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": "read_committed" if committed else "read_uncommitted"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    todo = set(range(partitions))
    out: list[tuple[int, int, Any, Any, Any]] = []
    deadline = time.monotonic() + 60
    while todo and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    todo.discard(m.partition())
                continue
            out.append((int(m.partition() or 0), int(m.offset() or 0), m.key(), m.value(),
                        m.headers()))
    c.close()
    assert not todo
    return sorted(out)


def records(n: int, seed: int) -> list[Record]:
    """Keys and values of every kind a change log writes and some it never does: null,
    empty, binary, non-ASCII, long (several batches' worth), up to 3 headers with null
    and empty values."""
    rng = random.Random(seed)
    out: list[Record] = []
    for i in range(n):
        kind = rng.randrange(6)
        key: bytes | None = (None if kind == 0 else b"" if kind == 1
                             else f'{{"id":{i},"k":"é{rng.random()}"}}'.encode())
        value: bytes | None = (None if kind == 2 else b"" if kind == 3
                               else bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
                               if kind == 4 else ("v€" * rng.randrange(1, 3000)).encode())
        headers: list[tuple[str, bytes | None]] | None = (
            None if i % 4 == 0 else
            [("dblog.writer", b"7:abc"), ("empty", b""), ("null", None)][: 1 + i % 3])
        out.append((key, value, headers))
    return out


def librdkafka_partitions(bootstrap: str, keys: list[bytes], partitions: int) -> dict[bytes, int]:
    """Where librdkafka's ``murmur2_random`` partitioner puts each key."""
    from confluent_kafka import Producer

    topic = new_topic(bootstrap, partitions)
    where: dict[bytes, int] = {}

    def report(err: Any, msg: Any) -> None:
        assert err is None
        where[msg.key()] = msg.partition()

    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for k in keys:
        p.produce(topic, b"x", k, on_delivery=report)
    assert p.flush(30) == 0
    return where


def test_a_partitions_next_batches_wait_for_its_first_to_be_appended(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch,
        closing: list[WireProducer]) -> None:
    """A partition's batches after its first of a producer epoch are sent only once the
    broker has appended that first one. (A broker without the producer's state for a
    partition takes a batch of any sequence: pipelined behind a first batch it refused,
    for one, as a partition of a topic just made is not ready yet, a later batch would be
    appended before it, and the transaction fail.) Later batches are pipelined."""
    from pydblog.changelog.kafka import wire

    events: list[tuple[str, Any]] = []
    produce_request, produce_response = wire.produce_request, wire.produce_response

    def sent(txn: str, timeout_ms: int, batches: dict[str, list[tuple[int, bytes]]]) -> bytes:
        # a record batch's base sequence: int32 at byte 53 (Kafka's batch header)
        events.append(("send", [(t, part, int.from_bytes(b[53:57], "big"))
                                for t, parts in batches.items() for part, b in parts]))
        return produce_request(txn, timeout_ms, batches)

    def answered(body: Any) -> Any:
        events.append(("answer", None))
        return produce_response(body)

    monkeypatch.setattr(wire, "produce_request", sent)
    monkeypatch.setattr(wire, "produce_response", answered)
    parts = 3
    topic = new_topic(kafka_bootstrap, parts)
    p = WireProducer(kafka_bootstrap, f"wire-{topic}", 60_000, 30, batch_bytes=4096)
    closing.append(p)
    p.init_transactions()
    for _ in range(2):  # a second transaction of the same epoch: pipelined at once
        p.begin_transaction()
        for key, value, headers in records(1500, seed=7):
            p.produce(topic, value, key, headers=headers)
            p.send_ready()
        assert p.flush() == 0
        p.commit_transaction()
    # requests are answered in order (one broker, one connection): the n-th answer is the
    # n-th request's
    sends = [batch for kind, batch in events if kind == "send"]
    answered_before: list[int] = []  # per request: answers read before it was sent
    n = 0
    for kind, _ in events:
        if kind == "answer":
            n += 1
        else:
            answered_before.append(n)
    first_request = {}
    for i, batches in enumerate(sends):
        for t, part, seq in batches:
            if seq == 0:
                first_request[(t, part)] = i
    assert sorted(first_request) == [(topic, i) for i in range(parts)]
    pipelined = 0
    for i, batches in enumerate(sends):
        for t, part, seq in batches:
            if seq > 0:
                assert answered_before[i] > first_request[(t, part)], (
                    f"partition {part}: sequence {seq} sent before the first batch's answer")
        pipelined += answered_before[i] < i  # sent while an earlier request was unanswered
    assert pipelined > 0


@pytest.mark.parametrize(("compression", "early"), [("lz4", False), ("none", False),
                                                     ("lz4", True)])
def test_records_read_back_as_produced(kafka_bootstrap: str, compression: str,
                                       early: bool, closing: list[WireProducer]) -> None:
    """``early``: each full batch is sent as soon as it is cut (``send_ready``, as the
    writer does), the rest at ``flush``."""
    parts = 5
    topic = new_topic(kafka_bootstrap, parts)
    p = WireProducer(kafka_bootstrap, f"wire-{topic}", 60_000, 30, compression=compression,
                     batch_bytes=4096)  # several batches a partition, pipelined
    closing.append(p)
    p.init_transactions()
    p.begin_transaction()
    want = records(3000, seed=len(compression) + early)
    for key, value, headers in want:
        p.produce(topic, value, key, headers=headers)
        if early:
            p.send_ready()
    if early:
        assert p.acc.pending < len(want) / 2  # most went before the flush
    p.produce(topic, b"to 3", None, partition=3)
    assert p.flush() == 0
    acks, err = p.take_acks()
    p.commit_transaction()
    p.close()
    assert err == 0
    got = read(kafka_bootstrap, topic, parts)
    assert len(got) == len(want) + 1
    where = librdkafka_partitions(kafka_bootstrap, [k for k, *_ in want if k is not None], parts)
    by_part: dict[int, list[Record]] = {i: [] for i in range(parts)}
    for partition, _, key, value, headers in got:
        by_part[partition].append((key, value, headers))
    # each partition: its records in the order produced (keyless ones: anywhere)
    for i in range(parts):
        keyed = [r for r in by_part[i] if r[0] is not None]
        assert keyed == [r for r in want if r[0] is not None and where[r[0]] == i]
    keyless = sorted((r for rs in by_part.values() for r in rs if r[0] is None), key=repr)
    assert keyless == sorted([*(r for r in want if r[0] is None), (None, b"to 3", None)], key=repr)
    assert (None, b"to 3", None) in by_part[3]
    # the acknowledgements: per partition the lowest and highest offset and the count
    offsets: dict[int, list[int]] = {}
    for partition, offset, *_ in got:
        offsets.setdefault(partition, []).append(offset)
    assert sorted((part, first, last, n) for _, part, first, last, n in acks) == sorted(
        (part, min(o), max(o), len(o)) for part, o in offsets.items())


def test_aborted_then_committed(kafka_bootstrap: str, closing: list[WireProducer]) -> None:
    """An aborted transaction's records are not read committed (whether they were sent
    or not); the producer goes on with the next one."""
    topic = new_topic(kafka_bootstrap, 2)
    p = WireProducer(kafka_bootstrap, f"wire-{topic}", 60_000, 30)
    closing.append(p)
    p.init_transactions()
    p.begin_transaction()
    p.produce(topic, b"aborted", b"k1")
    assert p.flush() == 0
    p.abort_transaction()
    p.begin_transaction()
    p.produce(topic, b"kept", b"k1")
    p.commit_transaction()
    # a record for a partition the topic does not have is refused at once
    p.begin_transaction()
    with pytest.raises(ValueError, match="partitions, not partition 9"):
        p.produce(topic, b"nowhere", None, partition=9)
    p.produce(topic, b"aborted too", b"k1")
    p.abort_transaction()
    p.begin_transaction()
    p.produce(topic, b"kept too", b"k2")
    p.commit_transaction()
    p.close()
    assert sorted(v for *_, v, _ in read(kafka_bootstrap, topic, 2)) == [b"kept", b"kept too"]
    assert len(read(kafka_bootstrap, topic, 2, committed=False)) == 3  # (+ the aborted one)


def test_a_fenced_producer_cannot_commit(kafka_bootstrap: str) -> None:
    """A second producer of the same transactional id fences the first: its open
    transaction is aborted, its commit fails with a fatal fencing error (what the writer
    turns into ``Fenced``)."""
    from confluent_kafka import KafkaException

    topic = new_topic(kafka_bootstrap, 1)
    old = WireProducer(kafka_bootstrap, f"wire-{topic}", 60_000, 30)
    old.init_transactions()
    old.begin_transaction()
    old.produce(topic, b"zombie", b"k")
    assert old.flush() == 0
    new = WireProducer(kafka_bootstrap, f"wire-{topic}", 60_000, 30)
    new.init_transactions()
    with pytest.raises(KafkaException) as caught:
        old.produce(topic, b"zombie 2", b"k")
        old.commit_transaction()
    err = caught.value.args[0]
    assert err.code() in (47, 90) and err.fatal(), err  # INVALID_PRODUCER_EPOCH, PRODUCER_FENCED
    new.begin_transaction()
    new.produce(topic, b"new", b"k")
    new.commit_transaction()
    old.close()
    new.close()
    assert [v for *_, v, _ in read(kafka_bootstrap, topic, 1)] == [b"new"]


def test_settings_it_does_not_speak_go_to_librdkafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    assert supported({}) is None
    assert supported({"compression.type": "none", "transaction.timeout.ms": 30_000,
                      "security.protocol": "PLAINTEXT", "socket.keepalive.enable": True}) is None
    assert codec({"compression.type": "none"}) == "none" and codec({}) == "lz4"
    cases: list[tuple[dict[str, Any], str]] = [({"security.protocol": "SASL_SSL"}, "security.protocol"),
                            ({"sasl.mechanism": "PLAIN"}, "sasl.mechanism"),
                            ({"ssl.ca.location": "/x"}, "ssl.ca.location"),
                            ({"compression.type": "zstd"}, "compression.type"),
                            ({"linger.ms": 50}, "linger.ms"),
                            ({"partitioner": "consistent"}, "partitioner"),
                            ({"acks": "all"}, "acks")]
    for settings, named in cases:
        why = supported(settings)
        assert why is not None and named in why, (settings, why)

    def writer(**kw: Any) -> KafkaChangeLog:
        cfg = LogConfig(type="kafka", path=str(tmp_path / uuid.uuid4().hex),
                        bootstrap_servers=kafka_bootstrap,
                        topic_prefix=f"w{uuid.uuid4().hex[:10]}", **kw)
        w = KafkaChangeLog(cfg)
        w.close()
        return w

    assert writer()._wire is not None
    assert writer(kafka={"linger.ms": 5})._wire is None
    assert writer(producer="librdkafka")._wire is None


def test_brokers_without_its_request_versions_get_librdkafkas_producer(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that does not serve a request version the wire producer sends (here: a
    Produce version no broker serves) gets librdkafka's producer, and the log works."""
    from pydblog.changelog.kafka import wire
    from pydblog.changelog.kafka.reader import KafkaChangeLogReader
    from tests.kafka.test_kafka_log import batches, cp

    monkeypatch.setitem(wire.VERSIONS, wire.API_PRODUCE, 999)
    cfg = LogConfig(type="kafka", path=str(tmp_path / "log"), bootstrap_servers=kafka_bootstrap,
                    topic_prefix=f"w{uuid.uuid4().hex[:10]}")
    w = KafkaChangeLog(cfg)
    assert w._wire is None
    events = batches()[0]
    w.append(events, cp(0))
    w.close()
    r = KafkaChangeLogReader(cfg)
    assert len(r.read(0, 10**9)) == len(events)
    r.close()
