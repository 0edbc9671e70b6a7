"""The Kafka stream's planner keeps one Kafka client for the stream's life
(``KafkaStream._planning``): later plans must see the commits appended after the
client was made, a batch's partitions must hold exactly its events, and ``close`` (or
an error) drops the client so that the next call connects afresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.kafka_spark import KafkaRange, KafkaStream, read_events
from pydblog.config import LogConfig
from pydblog.events import EncodedEvent
from pydblog.ports import Checkpoint
from pydblog.ports import SyncOffset as Offset
from pydblog.positions import Lsn, PgPosition

pytestmark = pytest.mark.timeout(300)


def append(log: KafkaChangeLog, first: int, n: int) -> None:
    events = [EncodedEvent("public.t", "c", 1, '{"op":"c","ts_ms":1,"source":{"connector":"postgresql",'
                           f'"db":"d","schema":"public","table":"t"}},"key":{{"id":{i}}},'
                           f'"before":null,"after":{{"id":{i}}}}}') for i in range(first, first + n)]
    log.append(events, Checkpoint(PgPosition(Lsn(first + n), 0)))


def offsets(stream: KafkaStream, start: Offset, end: Offset) -> list[int]:
    import orjson

    got: list[int] = []
    for part in stream.partitions(start, end, 2):
        assert isinstance(part, KafkaRange)
        got.extend(orjson.loads(v)["offset"] for v in read_events(part).to_pylist())
    return sorted(got)


def test_the_kept_client_sees_later_commits(kafka_log: LogConfig, tmp_path: Path) -> None:
    writer = KafkaChangeLog(kafka_log)
    stream = KafkaStream(kafka_log.model_dump_json())
    try:
        start = stream.initial_offset("earliest")
        append(writer, 0, 50)
        end1 = stream.latest_offset(start, None)
        client = stream._client
        assert end1["seq"] == 50 and client is not None
        assert offsets(stream, start, end1) == list(range(50))
        stream.commit(end1)
        assert stream.latest_offset(end1, None) == end1  # nothing new
        append(writer, 50, 30)
        append(writer, 80, 20)
        end2 = stream.latest_offset(end1, 30)  # stops after the commit reaching 30 events
        assert end2["seq"] == 80 and stream._client is client
        assert offsets(stream, end1, end2) == list(range(50, 80))
        stream.close()
        assert stream._client is None and stream._group is None
        end3 = stream.latest_offset(end2, None)  # connects afresh
        assert end3["seq"] == 100
        assert offsets(stream, end2, end3) == list(range(80, 100))
    finally:
        stream.close()
        writer.close()


def test_an_error_drops_the_client(kafka_log: LogConfig) -> None:
    stream = KafkaStream(kafka_log.model_dump_json())
    try:
        start = stream.initial_offset("earliest")
        stream.latest_offset(start, None)
        client = stream._client
        assert client is not None

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("broker gone")

        client.watermarks = broken
        client.partitions = lambda topic, refresh=False: 1
        with pytest.raises(RuntimeError, match="broker gone"):
            stream.latest_offset(start, None)
        assert stream._client is None
        assert stream.latest_offset(start, None) == start  # a fresh client
    finally:
        stream.close()


def test_the_task_readers_fetch_in_bulk(kafka_log: LogConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync task's consumers wait ``BULK_FETCH_WAIT_MS`` per fetch (Tansu answers a 5 ms
    fetch of a large partition with nothing, and spent seconds of CPU re-answering); the
    planner's stays at the low-latency wait; ``[log.kafka]`` wins over both."""
    from pydblog.changelog.kafka import client as kafka_client
    from pydblog.changelog.kafka import compat as kafka_compat

    made: list[dict[str, object]] = []
    real = kafka_client.make_client

    def make_client(factory: object, conf: dict[str, object], cfg: LogConfig) -> object:
        if "group.id" in conf:  # a consumer
            made.append(dict(conf))
        return real(factory, conf, cfg)  # type: ignore[arg-type]

    monkeypatch.setattr(kafka_client, "make_client", make_client)
    writer = KafkaChangeLog(kafka_log)
    append(writer, 0, 30)
    writer.close()
    for log, task_wait, plan_wait in ((kafka_log, kafka_compat.BULK_FETCH_WAIT_MS, kafka_compat.FETCH_WAITS_MS[0]),
                                      (kafka_log.model_copy(update={"kafka": {"fetch.wait.max.ms": 7}}), 7, 7)):
        monkeypatch.setattr(kafka_compat, "_LEARNED_WAITS", {})
        stream = KafkaStream(log.model_dump_json())
        try:
            start = stream.initial_offset("earliest")
            made.clear()
            end = stream.latest_offset(start, None)
            assert [c["fetch.wait.max.ms"] for c in made] == [plan_wait]
            made.clear()
            assert offsets(stream, start, end) == list(range(30))
            assert made and {c["fetch.wait.max.ms"] for c in made} == {task_wait}
        finally:
            stream.close()


def test_bounded_plans_fetch_in_bulk(kafka_log: LogConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan that ends at a known checkpoint-topic offset (``Trigger.AvailableNow``'s
    target, a replayed batch) reads through the planner's bulk client: at the 5 ms wait
    Tansu answered each fetch of the checkpoint topic with about one commit (the last
    plan of a 1.2M-event log, 3,600 small commits, took 7-23 s; 0.25 s in bulk). The
    plan is the same; an open plan keeps the low-latency wait. ``events_end`` (the
    progress bar's total) agrees with the reader."""
    from pydblog.changelog.kafka import client as kafka_client
    from pydblog.changelog.kafka import compat as kafka_compat
    from pydblog.changelog.kafka import reader as kafka_reader

    made: list[dict[str, object]] = []
    real = kafka_client.make_client

    def make_client(factory: object, conf: dict[str, object], cfg: LogConfig) -> object:
        if "group.id" in conf and "dblog-sync" not in str(conf["group.id"]):  # a reader
            made.append(dict(conf))
        return real(factory, conf, cfg)  # type: ignore[arg-type]

    monkeypatch.setattr(kafka_client, "make_client", make_client)
    monkeypatch.setattr(kafka_compat, "_LEARNED_WAITS", {})
    writer = KafkaChangeLog(kafka_log)
    for i in range(30):
        append(writer, 10 * i, 10)
    stream = KafkaStream(kafka_log.model_dump_json())
    try:
        start = stream.initial_offset("earliest")
        open_end = stream.latest_offset(start, 100)
        assert made and {c["fetch.wait.max.ms"] for c in made} == {kafka_compat.FETCH_WAITS_MS[0]}
        assert stream._bulk is None
        append(writer, 300, 10)
        stream.prepare_available_now()  # its target: the end now (310 events)
        made.clear()
        end = start
        for want in (100, 200, 300, 310):
            end = stream.latest_offset(end, 100)
            assert end["seq"] == want
        assert end["cp"] == stream.target
        assert made and {c["fetch.wait.max.ms"] for c in made} == {kafka_compat.BULK_FETCH_WAIT_MS}
        assert offsets(stream, start, end) == list(range(310))
        stream._planned = None  # a replay plans the logged batch again: in bulk, the same
        assert offsets(stream, open_end, end) == list(range(100, 310))
        assert {c["fetch.wait.max.ms"] for c in made} == {kafka_compat.BULK_FETCH_WAIT_MS}
        reader = kafka_reader.KafkaChangeLogReader(kafka_log)
        try:
            assert KafkaStream(kafka_log.model_dump_json()).events_end() == reader.next_offset() == 310
        finally:
            reader.close()
    finally:
        stream.close()
        writer.close()
