"""A capture killed in the middle of a commit (``kill -9`` between its checkpoint message
and ``commit_transaction``) leaves an open transaction on the broker until it commits
or the broker aborts it after ``transaction.timeout.ms`` (the writer's: 60 s unless
``[log.kafka]`` sets it). The sync's planner reads the checkpoint topic up to an end
past it (``--available-now``'s target from the partition's high watermark, which counts
the open transaction's records; a read_committed read ends below them): it has to wait
for that end, say why by name, not take it for a broker whose storage needs a longer
fetch wait (``_storage_stall``: the 'too short' warning and a fetch wait learned for
the whole process), and not give up before the broker's abort (its read timeout was
30 s: shorter than the transaction's).

The transaction is held open by a real writer (``HeldCommit``) and made to commit only
once the planner waited past its read timeout (scaled down here, as is the transaction
timeout); Tansu never aborts a timed-out transaction, so the commit stands for the end
of the transaction either way. Tansu reports a last stable offset of 0 for a partition
holding an open transaction (a real Kafka: the transaction's first offset); both are
below the high watermark, which is what the reader looks at."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from pydblog.changelog.kafka import client as kafka_client
from pydblog.changelog.kafka import compat as kafka_compat
from pydblog.changelog.kafka.topics import checkpoint_topic
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.kafka_spark import KafkaStream, plan
from pydblog.config import LogConfig
from pydblog.ports import SyncOffset as Offset
from tests.kafka.opentxn import HeldCommit
from tests.kafka.test_planner import append, offsets

READ_TIMEOUT_S = 4.0
TRANSACTION_TIMEOUT_MS = 8000


def slow_consumers(monkeypatch: pytest.MonkeyPatch, slow: threading.Event) -> None:
    """The planner's consumers return nothing while ``slow`` is set (what they fetched
    meanwhile waits in their queue)."""
    real_consumer = kafka_client.Client.consumer

    class Slow:
        def __init__(self, real: Any) -> None:
            self.real = real

        def consume(self, n: int, timeout: float) -> list[Any]:
            if slow.is_set():
                time.sleep(timeout)
                return []
            return list(self.real.consume(n, timeout))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

    def consumer(self: Any) -> Any:
        if self._consumer is None:
            real = real_consumer(self)
            self._consumer = real if self.native else Slow(real)
        return self._consumer

    monkeypatch.setattr(kafka_client.Client, "consumer", consumer)


@pytest.mark.parametrize("where", ["available-now", "bounded"])
def test_the_planner_waits_for_an_open_transaction_by_name(
        kafka_log: LogConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        where: str) -> None:
    """``available-now``: the target (``_checkpoint_end``) read from the high watermark,
    past the open checkpoint message; ``bounded``: a plan up to an end past it."""
    monkeypatch.setattr(kafka_client, "TIMEOUT_S", READ_TIMEOUT_S)
    monkeypatch.setattr(kafka_client, "STALL_S", 1.0)
    monkeypatch.setattr(kafka_compat, "_LEARNED_WAITS", {})  # this test's reads only
    cfg = kafka_log.model_copy(update={"kafka": {"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}})
    writer = KafkaChangeLog(cfg)
    stream = KafkaStream(cfg.model_dump_json())
    checker = kafka_client.Client(cfg)
    lander: threading.Thread | None = None
    try:
        append(writer, 0, 20)
        held = HeldCommit(monkeypatch, writer, lambda: append(writer, 20, 10))
        topic = checkpoint_topic(cfg.topic_prefix or "")
        stop = checker.watermarks([(topic, 0)])[(topic, 0)][1]  # past the open message
        start = stream.initial_offset("earliest")
        began = time.monotonic()
        said: list[str] = []
        learned: dict[str, int] = {}
        slow = threading.Event()
        slow_consumers(monkeypatch, slow)

        def named() -> bool:
            return any("open transaction" in r.getMessage() for r in caplog.records)

        def land() -> None:
            # past the planner's read timeout, once it said what it waits for (at the
            # latest when its wait ought to be over: the test then fails on its checks)
            limit = began + READ_TIMEOUT_S + TRANSACTION_TIMEOUT_MS / 1000
            while time.monotonic() < limit and not (
                    named() and time.monotonic() > began + READ_TIMEOUT_S + 1):
                time.sleep(0.1)
            # what the planner said and learned while the transaction was open
            said.extend(r.getMessage() for r in list(caplog.records))
            learned.update(kafka_compat._LEARNED_WAITS)
            # the broker slow to show what the commit made readable: the read looks
            # again meanwhile and finds the transaction gone (it then timed out at once,
            # its own timeout long past: seen once in six runs under load; a storage
            # stall's longer fetch wait is fine then)
            slow.set()
            held.finish()
            time.sleep(kafka_client.STALL_S + 0.5)
            slow.clear()

        lander = threading.Thread(target=land)
        with caplog.at_level(logging.INFO, logger="pydblog.changelog.kafka"):
            lander.start()
            end: Offset
            if where == "available-now":
                stream.prepare_available_now()
                assert stream.target == stop
                end = stream.latest_offset(start, None)
            else:
                end, _ = plan(stream.log, start, stop, None, stream._planning())
        lander.join()
        lander = None
        assert (end["seq"], end["cp"]) == (30, stop)
        assert offsets(stream, start, end) == list(range(30))
    finally:
        if lander is not None:
            lander.join()
        checker.close()
        stream.close()
        writer.close()
    assert not [m for m in said if "too short" in m], said
    assert learned == {}  # no longer fetch wait for the process
    named_it = [m for m in said if "open transaction" in m]
    assert named_it, said
    first = named_it[0]
    assert f"{topic} partition 0" in first and "transaction.timeout.ms" in first, first
    assert f"{TRANSACTION_TIMEOUT_MS / 1000:.0f} s" in first, first
    assert "dblog run" in first, first  # what to do
