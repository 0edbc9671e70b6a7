"""A storage stall (Tansu on S3: a fetch wait too short answers nothing, for good) met
twice within one bounded read: the read goes on where it was, never from its start again
(the second step's consumer had returned no record, its ``position()`` was
-1001 and the read restarted at its ``lo``: [lo, P) twice). The broker is a real Tansu; the
stall is faked by giving the consumers' ``consume`` a plan (records, then nothing)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pydblog.changelog import kafka_native
from pydblog.changelog.kafka import client as kafka_client
from pydblog.changelog.kafka import compat as kafka_compat
from pydblog.changelog.kafka.reader import KafkaChangeLogReader
from pydblog.changelog.kafka.topics import data_topic
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.config import LogConfig
from pydblog.errors import ChangeLogError
from pydblog.events import Op
from tests.kafka.test_kafka_log import cp, row_event

pytestmark = pytest.mark.tansu

PLAN = [5, 0, None]
"""Per consumer, in the order the read makes them: the first returns 5 records and then
nothing (a stall), the second (the next longer fetch wait) nothing at all, the third
reads normally."""


class Stalling:
    """A real consumer whose broker 'stalls' (answers nothing) after ``give`` records
    (None: never)."""

    def __init__(self, real: Any, give: int | None) -> None:
        self.real, self.give = real, give

    def consume(self, n: int, timeout: float) -> list[Any]:
        if self.give is None:
            return list(self.real.consume(n, timeout))
        if self.give <= 0:
            time.sleep(timeout)
            return []
        msgs = list(self.real.consume(min(n, self.give), 1.0))
        self.give -= sum(1 for m in msgs if m.error() is None)
        return msgs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def stalling_consumers(monkeypatch: pytest.MonkeyPatch, plan: list[int | None]) -> list[Stalling]:
    """``client.Client`` makes its consumers as ``Stalling`` ones, each giving the next of
    ``plan``'s record counts (None once ``plan`` is used up); the consumers made so far."""
    made: list[Stalling] = []
    real = kafka_client.Client.consumer

    def consumer(self: Any) -> Any:
        if self._consumer is None:
            made.append(Stalling(real(self), plan.pop(0) if plan else None))
            self._consumer = made[-1]
        return self._consumer

    monkeypatch.setattr(kafka_client.Client, "consumer", consumer)
    return made


def two_commits(tmp_path: Path, bootstrap: str) -> tuple[LogConfig, tuple[str, int]]:
    """One partition: records 0..9, a transaction marker (10), records 11..20."""
    cfg = LogConfig(type="kafka", path=str(tmp_path / "data"), bootstrap_servers=bootstrap,
                    topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=1)
    kf = KafkaChangeLog(cfg)
    for i in range(2):
        kf.append([row_event(Op.CREATE, "a", 1000 + 10 * i + j, {"id": 10 * i + j},
                             {"id": 10 * i + j}) for j in range(10)], cp(i))
    kf.close()
    return cfg, (data_topic(cfg.topic_prefix or "", "public.a"), 0)


@pytest.fixture
def short_stalls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_client, "STALL_S", 0.3)
    monkeypatch.setattr(kafka_compat, "FIRST_STALL_S", 0.3)
    monkeypatch.setattr(kafka_compat, "_LEARNED_WAITS", {})  # this test's steps only


@pytest.mark.usefixtures("short_stalls")
def test_a_second_stall_step_reads_on_where_the_read_was(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, tp = two_commits(tmp_path, kafka_bootstrap)
    plan: list[int | None] = list(PLAN)
    made = stalling_consumers(monkeypatch, plan)
    client = kafka_client.Client(cfg)
    try:
        offsets = [m.offset() for m in client.read_range({tp: (0, 21)})]
        assert len(made) == 3, "the read stalled twice"
        # a read of two partitions (the per-message path), one of them empty (read to its
        # end: a bounded read of records the broker does not hold would wait for them)
        plan[:] = list(PLAN)
        kafka_compat._LEARNED_WAITS.clear()  # the same steps again
        client.close()
        client = kafka_client.Client(cfg)
        other = (data_topic(cfg.topic_prefix or "", "public.b"), 0)
        client.ensure_topics([other[0]], 1)
        both = [m.offset() for m in client.read_range({tp: (0, 21), other: (0, None)})]
        plan[:] = list(PLAN)
        kafka_compat._LEARNED_WAITS.clear()  # the same steps again
        client.close()
        client = kafka_client.Client(cfg)
        batches = [[m.offset() for m in b] for b in client.read_batches({tp: (3, 21), other: (0, None)})]
    finally:
        client.close()
    assert offsets == [*range(10), *range(11, 21)]
    assert both == offsets
    assert [o for b in batches for o in b] == [*range(3, 10), *range(11, 21)]


@pytest.mark.usefixtures("short_stalls")
def test_the_native_read_too(kafka_bootstrap: str, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    np = pytest.importorskip("numpy")
    if not kafka_native.available():
        pytest.skip("the native Kafka read (pydblog.changelog._kafkaread) is not built")
    cfg, tp = two_commits(tmp_path, kafka_bootstrap)
    plan = list(PLAN)
    gives: dict[int, Any] = {}
    held: list[Any] = []  # no id() reused
    real = kafka_native.consume

    def consume(c: Any, client_id: str, n: int, timeout: float) -> kafka_native.RawBatch:
        if id(c) not in gives:
            held.append(c)
            gives[id(c)] = plan.pop(0) if plan else None
        give = gives[id(c)]
        if give is None:
            return real(c, client_id, n, timeout)
        if give <= 0:
            time.sleep(timeout)
            return kafka_native.RawBatch(b"", np.zeros(0, np.int64), np.zeros(0, np.int64),
                                         np.zeros(0, np.int32), [])
        b = real(c, client_id, min(n, give), 1.0)
        gives[id(c)] = give - len(b)
        return b

    monkeypatch.setattr(kafka_native, "consume", consume)
    client = kafka_client.Client(cfg, native=True)
    try:
        offsets = [int(o) for b in client.read_values(tp, 0, 21) for o in b.offsets]
    finally:
        client.close()
    assert len(held) == 3, "the read stalled twice"
    assert offsets == [*range(10), *range(11, 21)]


def test_the_reader_keeps_one_copy_of_a_record(kafka_log: LogConfig,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a read ever return a record twice, ``dblog tail`` / a non-Spark sync still
    see each event once."""
    kf = KafkaChangeLog(kafka_log)
    for i in range(3):
        kf.append([row_event(Op.CREATE, "a", 1000 + 10 * i + j, {"id": 10 * i + j},
                             {"id": 10 * i + j}) for j in range(10)], cp(i))
    kf.close()
    reader = KafkaChangeLogReader(kafka_log)
    real = reader.client.read_range

    def twice(ranges: Any, to_now: bool = False) -> Iterator[Any]:
        msgs = list(real(ranges, to_now))
        yield from msgs
        yield from msgs

    monkeypatch.setattr(reader.client, "read_range", twice)
    try:
        assert [r.offset for r in reader.read(0, 100)] == list(range(30))
    finally:
        reader.close()


def test_the_spark_check_rejects_an_offset_twice() -> None:
    """``_RunCheck`` found missing offsets only: a record read twice passed into the sinks."""
    np = pytest.importorskip("numpy")
    from pydblog.changelog import kafka_spark

    piece = kafka_spark.KafkaPiece("t", 0, 0, 20, ((20, 0, "w"),))

    def see(*batches: list[int]) -> None:
        check = kafka_spark._RunCheck(piece, allow=True)
        for b in batches:
            check.see(np.array(b, np.int64), np.zeros(len(b), np.bool_), b[-1] + 1)
        check.finish()

    see(list(range(10)), list(range(10, 20)))  # whole: fine
    for bad in (([0, 1, 2], [1, 2, 3, 4]), ([0, 1, 1, 2],), ([0, 2, 1],), ([*range(10)], [*range(20)])):
        with pytest.raises(ChangeLogError, match="twice or out of order"):
            see(*bad)


@pytest.mark.usefixtures("short_stalls")
def test_a_wait_learned_elsewhere_is_taken_at_the_next_read(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived client whose consumer was made before another reader of
    the process learned a longer fetch wait re-makes it when its next read starts: it does
    not wait the stall out again (``_storage_stall`` is never needed)."""
    cfg, tp = two_commits(tmp_path, kafka_bootstrap)
    # the first consumer stalls after the first read
    made = stalling_consumers(monkeypatch, [20, None])
    stalls: list[int] = []
    real_stall = kafka_client.Client._storage_stall

    def storage_stall(self: Any, *args: Any) -> bool:
        stalls.append(1)
        return real_stall(self, *args)

    monkeypatch.setattr(kafka_client.Client, "_storage_stall", storage_stall)
    client = kafka_client.Client(cfg)
    try:
        assert len(list(client.read_range({tp: (0, 21)}))) == 20
        kafka_compat._LEARNED_WAITS[str(cfg.bootstrap_servers)] = 500  # another reader learned it
        assert [m.offset() for m in client.read_range({tp: (0, 21)})] == [*range(10), *range(11, 21)]
    finally:
        client.close()
    assert (len(made), stalls) == (2, [])


@pytest.mark.usefixtures("short_stalls")
def test_a_stall_below_a_live_writers_open_transaction_is_a_storage_stall(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture writing a partition has a transaction open there most of the time (the
    last stable offset below the high watermark, which moves): a read below it that the
    broker's storage stalls still steps its fetch wait. Only a transaction whose high
    watermark stays put holds a read (``Client._stalled``); taking every open one for
    that, the read waited until it timed out."""
    import confluent_kafka

    monkeypatch.setattr(kafka_client, "TIMEOUT_S", 6.0)
    cfg, tp = two_commits(tmp_path, kafka_bootstrap)
    stop, writing = threading.Event(), threading.Event()

    def live() -> None:  # one transaction, open, growing
        p = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True,
                                      "transactional.id": f"live-{uuid.uuid4().hex[:8]}"})
        p.init_transactions(10)
        p.begin_transaction()
        while not stop.is_set():
            p.produce(tp[0], b"x", partition=tp[1])
            p.flush(10)
            writing.set()
            time.sleep(0.05)
        p.abort_transaction(10)

    writer = threading.Thread(target=live)
    writer.start()
    try:
        assert writing.wait(20)
        made = stalling_consumers(monkeypatch, [5, None])
        client = kafka_client.Client(cfg)
        try:
            offsets = [m.offset() for m in client.read_range({tp: (0, 21)})]
        finally:
            client.close()
    finally:
        stop.set()
        writer.join()
    assert offsets == [*range(10), *range(11, 21)]
    assert len(made) == 2, "the stall was not stepped over"
