"""A follower (``dblog tail -f``, the API's event stream: ``KafkaChangeLogReader.follow``)
of an idle capture keeps up with a checkpoint topic that grows at every fetch wait.

An idle capture commits a checkpoint at every heartbeat. Each read of a follower read
the checkpoint topic "to its end": to an end-of-partition event. Tansu answers a fetch
at a partition's end only after its whole fetch wait, with the records that came
meanwhile and no end of partition: once commits came faster than the follower's fetch
wait (a wait stepped up to 500-5,000 ms by storage stalls on S3, against a heartbeat of
0.5 s in test_broker_restart_under_load, or of 10 s by default), the read never ended,
and the follower printed nothing more (docs/kafka.md). Here a memory-backed Tansu, a
fetch wait of 1 s as such a stall leaves the follower's client, and commits every
0.05 s."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from pydblog.changelog.kafka import compat as kafka_compat
from pydblog.changelog.kafka.reader import KafkaChangeLogReader, KafkaLogFigures
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.config import LogConfig
from tests.kafka.test_planner import append

CAP_S = 30.0
"""The writer stops after this (a follower that chases the end never returns before)."""


class Heartbeats:
    """A capture's heartbeats: an empty commit every 0.05 s, from a thread, until
    ``stop`` (or ``CAP_S``); ``event()`` has the next commit carry one event."""

    def __init__(self, writer: KafkaChangeLog, first: int) -> None:
        self.writer = writer
        self.next = first
        self.writing = threading.Event()
        self.writing.set()
        self.stopping = threading.Event()
        self.want = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            until = time.monotonic() + CAP_S
            while not self.stopping.is_set() and time.monotonic() < until:
                if self.want.is_set():
                    self.want.clear()
                    append(self.writer, self.next, 1)
                    self.next += 1
                else:
                    append(self.writer, self.next, 0)
                time.sleep(0.05)
            if self.want.is_set():  # asked for at the last moment: written all the same
                append(self.writer, self.next, 1)
        except BaseException as exc:  # handed to stop()
            self.error = exc
        finally:
            self.writing.clear()

    def event(self) -> None:
        self.want.set()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(CAP_S)
        if self.error is not None:
            raise self.error


def test_a_follower_keeps_up_with_a_checkpoint_topic_growing_each_fetch_wait(kafka_log: LogConfig) -> None:
    writer = KafkaChangeLog(kafka_log)
    reader = KafkaChangeLogReader(kafka_log)
    figures = KafkaLogFigures(kafka_log)
    beats: Heartbeats | None = None
    try:
        append(writer, 0, 5)
        beats = Heartbeats(writer, 5)
        for client in (reader.client, figures.client):
            client.waits.own = 1000  # what storage stalls leave a follower's client with
        follow = reader.follow(0, 0.05)
        assert [next(follow).offset for _ in range(5)] == list(range(5))
        assert beats.writing.is_set(), "the follower got the events only once the log stopped growing"
        beats.event()
        assert next(follow).offset == 5
        assert beats.writing.is_set(), "the follower got the event only once the log stopped growing"
        assert reader._tail_wait == 1000  # (the follower waited with the long wait)
        assert figures.figures() is not None  # /metrics' figures: the same read
        assert beats.writing.is_set(), "the figures came only once the log stopped growing"
    finally:
        if beats is not None:
            beats.stop()
        figures.close()
        reader.close()
        writer.close()


@pytest.fixture(autouse=True)
def _no_learned_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_compat, "_LEARNED_WAITS", {})


@pytest.mark.slow
@pytest.mark.tansu
def test_a_follower_on_s3_storage_gets_the_last_commit_of_an_idle_capture(tmp_path: Path) -> None:
    """Tansu's high watermark on S3 storage lags the partition's end by up to ~16 offsets
    for good (it moves in steps as commits come): a follower's read that stopped at the
    high watermark it saw when it began (instead of at what it is fetched) would not see
    an idle capture's last commits until that many more came (with the default 10 s
    heartbeat, minutes)."""
    from pydblog.devtools.tansu import TansuBroker

    with TansuBroker(s3=True) as broker:
        cfg = LogConfig(type="kafka", path=str(tmp_path / "data"), bootstrap_servers=broker.bootstrap,
                        topic_prefix="idle", partitions=1)
        writer = KafkaChangeLog(cfg)
        reader = KafkaChangeLogReader(cfg)
        try:
            for i in range(30):
                append(writer, i, 1)
            # the capture is idle now: no commit comes after the last one
            got: list[int] = []
            until = time.monotonic() + 120
            while len(got) < 30 and time.monotonic() < until:
                got.extend(r.offset for r in reader.read(len(got), 100))
            assert got == list(range(30))
        finally:
            reader.close()
            writer.close()
        broker.stop_broker(kill=True)


def test_a_follower_waits_on_the_checkpoint_topic_without_listing_offsets_per_poll(
        kafka_log: LogConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """``follow`` reads to the end the exact way (list-offsets, then a fetch to that end)
    once, then takes new commits from the consumer that stays on the checkpoint topic: a
    follower of a capture committing every 20 ms got each commit's event in order, and
    listed offsets a few times, not once per poll (before: at least once per commit,
    each a broker request, from every follower)."""
    writer = KafkaChangeLog(kafka_log)
    reader = KafkaChangeLogReader(kafka_log)
    listed: list[int] = []
    watermarks = reader.client.watermarks

    def counted(tps: Sequence[tuple[str, int]], committed: bool = False) -> dict[tuple[str, int], tuple[int, int]]:
        listed.append(1)
        return watermarks(tps, committed)

    monkeypatch.setattr(reader.client, "watermarks", counted)
    n = 60
    error: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(1, n):
                append(writer, i, 1)
                time.sleep(0.02)
        except BaseException as exc:  # handed to the test
            error.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    try:
        append(writer, 0, 1)
        follow = reader.follow(0, 0.5)
        assert next(follow).offset == 0
        thread.start()
        got = [next(follow).offset for _ in range(1, n)]
        thread.join(CAP_S)
        assert not error, error
        assert got == list(range(1, n))
        assert len(listed) < n // 4, f"{len(listed)} list-offsets reads for {n} commits"
    finally:
        reader.close()
        writer.close()


def test_dblog_tail_follows_a_kafka_log(kafka_log: LogConfig, tmp_path: Path) -> None:
    """`dblog tail` (it follows by default) prints what was logged before it started,
    then each new commit's events as they come, in offset order, each line the envelope
    with its offset."""
    import queue
    import subprocess

    import orjson

    from pydblog.devtools.proc import end_process
    from tests.helpers import DBLOG, write_config
    from tests.kafka.conftest import kafka_log_toml

    assert kafka_log.bootstrap_servers is not None
    config = write_config(tmp_path / "cfg", "postgresql://unused@127.0.0.1:1/x", extra=kafka_log_toml(
        kafka_log.bootstrap_servers, kafka_log.topic_prefix, "partitions = 3"))
    writer = KafkaChangeLog(kafka_log)
    lines: queue.Queue[bytes] = queue.Queue()
    tail = None
    try:
        append(writer, 0, 5)
        errors = (tmp_path / "tail.err").open("wb")
        tail = subprocess.Popen([*DBLOG, "tail", "--config", str(config)], stdout=subprocess.PIPE,
                                stderr=errors)
        errors.close()
        out = tail.stdout
        assert out is not None

        def pump() -> None:
            for line in out:
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()

        def take(n: int) -> list[int]:
            got: list[int] = []
            for _ in range(n):
                try:
                    line = lines.get(timeout=CAP_S)
                except queue.Empty:
                    raise AssertionError(f"dblog tail printed {got} and then nothing for {CAP_S} s: "
                                         f"{(tmp_path / 'tail.err').read_text()[-2000:]}") from None
                env = orjson.loads(line)
                assert env["source"]["table"] == "t" and env["after"] == {"id": env["offset"]}
                got.append(env["offset"])
            return got

        assert take(5) == list(range(5))
        for i in range(5, 12):
            append(writer, i, 1)
            assert take(1) == [i]
        append(writer, 12, 30)
        assert take(30) == list(range(12, 42))
    finally:
        if tail is not None:
            end_process(tail)
        writer.close()
