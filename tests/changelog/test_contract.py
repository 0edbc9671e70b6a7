"""The change-log contract (``ports.ChangeLogWriter``/``ChangeLogReader``), one suite that
every backend passes: the embedded log and Kafka (``KAFKA_BOOTSTRAP_SERVERS``, else an
Apache Kafka node of the session). What a backend's own tests add is what only it has
(Kafka's topics and partitions, SQLite's blocks and retention)."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from pydblog.changelog import open_reader, open_writer
from pydblog.config import LogConfig
from pydblog.errors import Fenced
from pydblog.events import ChangeEvent, Encoded, Op, encode_event
from pydblog.ports import Checkpoint, ColumnSchema, LogRecord, TableSchema
from pydblog.positions import Lsn, PgPosition

TABLES = ("public.a", "public.b", "shop.c")
SCHEMA = TableSchema("public", "b", (ColumnSchema("id", "integer", "int32", False),
                                     ColumnSchema("v", "text", "string", True)), ("id",))


@pytest.fixture(params=["embedded", "kafka"])
def log_cfg(request: pytest.FixtureRequest, tmp_path: Path) -> LogConfig:
    if request.param == "embedded":
        return LogConfig(path=str(tmp_path / "data"))
    return LogConfig(type="kafka", path=str(tmp_path / "data"),
                     bootstrap_servers=request.getfixturevalue("kafka_bootstrap"),
                     topic_prefix=f"c{uuid.uuid4().hex[:10]}", partitions=3)


def event(i: int) -> Encoded:
    schema, table = TABLES[i % 3].split(".")
    ev = ChangeEvent(Op.CREATE, schema, table, PgPosition(Lsn(10 + i), 0, Lsn(10 + i)),
                     1_700_000_000_000 + i, {"id": i}, None, {"id": i, "v": f"row {i}\nline"})
    return encode_event(ev, "postgresql", "app", 1_700_000_000_500)


def cp(n: int) -> Checkpoint:
    return Checkpoint(PgPosition(Lsn(1000 + n), 0, Lsn(1000 + n)), {"tables": {"public.a": n}},
                      {"initial_started": True})


def everything(reader: Any) -> list[LogRecord]:
    out: list[LogRecord] = reader.read(0, 10**9)
    return out


def append_batches(writer: Any, sizes: list[int], start: int = 0) -> int:
    """Appends batches of ``sizes`` events (0: a checkpoint only), the second with
    ``SCHEMA``; returns the next offset, checked against every append's return."""
    n = start
    for i, size in enumerate(sizes):
        got = writer.append([event(n + j) for j in range(size)], cp(n + size),
                            [SCHEMA] if i == 1 else [])
        assert got == n + size
        n += size
    return n


def test_appends_read_back_dense_in_order_and_exact(log_cfg: LogConfig) -> None:
    writer = open_writer(log_cfg)
    try:
        assert writer.last_checkpoint() is None
        end = append_batches(writer, [7, 40, 0, 1, 25])
        assert writer.last_checkpoint() == cp(end)
    finally:
        writer.close()
    reader = open_reader(log_cfg)
    try:
        got = everything(reader)
        assert [r.offset for r in got] == list(range(end))
        for r in got:
            assert (r.table, r.op) == (TABLES[r.offset % 3], "c")
            body = orjson.loads(r.body)
            assert body["after"] == {"id": r.offset, "v": f"row {r.offset}\nline"}
        assert reader.next_offset() == end
        assert reader.last_checkpoint() == cp(end)
        assert reader.schemas() == [(7, SCHEMA)] and reader.schemas("public.b") == [(7, SCHEMA)]
        # a window, and a window of one table
        assert [r.offset for r in reader.read(10, 5)] == [10, 11, 12, 13, 14]
        assert [r.offset for r in reader.read(10, 4, ["public.b"])] == [10, 13, 16, 19]
        assert reader.read(end, 10) == []
    finally:
        reader.close()


def test_a_new_session_continues_where_the_log_ends(log_cfg: LogConfig) -> None:
    first = open_writer(log_cfg)
    end = append_batches(first, [5, 12])
    first.close()
    second = open_writer(log_cfg)  # (for Kafka: from Kafka alone, nothing local needed)
    try:
        assert second.last_checkpoint() == cp(end)
        assert second.schemas() == [(5, SCHEMA)]
        end = append_batches(second, [3, 4], start=end)
    finally:
        second.close()
    reader = open_reader(log_cfg)
    try:
        assert [r.offset for r in everything(reader)] == list(range(end))
        assert reader.last_checkpoint() == cp(end)
    finally:
        reader.close()


def test_a_claim_fences_the_older_epoch(log_cfg: LogConfig) -> None:
    """High availability: once epoch 2 claimed the log, epoch 1's appends are refused
    (``Fenced``) and readers never see them; a claim of an older epoch is refused."""
    old = open_writer(log_cfg)
    old.claim(1)
    end = append_batches(old, [6])
    new = open_writer(log_cfg)
    new.claim(2)
    try:
        assert new.last_checkpoint() == cp(end)
        with pytest.raises(Fenced):
            old.append([event(end + j) for j in range(4)], cp(end + 4))
        end = append_batches(new, [3], start=end)
        stale = open_writer(log_cfg)
        try:
            with pytest.raises(Fenced):
                stale.claim(1)
        finally:
            stale.close()
    finally:
        old.close()
        new.close()
    reader = open_reader(log_cfg)
    try:
        assert [(r.offset, orjson.loads(r.body)["after"]["id"]) for r in everything(reader)] == [
            (i, i) for i in range(end)]
        assert reader.last_checkpoint() == cp(end)
    finally:
        reader.close()


def test_a_follower_sees_every_commit_in_order(log_cfg: LogConfig) -> None:
    writer = open_writer(log_cfg)
    append_batches(writer, [2])  # (the log exists before the reader opens)
    reader = open_reader(log_cfg)
    seen: list[int] = []
    stop = threading.Event()

    def follow() -> None:
        for r in reader.follow(0, poll_s=0.05):
            seen.append(r.offset)
            if stop.is_set() or len(seen) >= 30:
                return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    try:
        end = append_batches(writer, [10, 0, 18], start=2)
        deadline = time.monotonic() + 30
        while len(seen) < end and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen == list(range(end))
    finally:
        stop.set()
        writer.close()
        t.join(timeout=10)
        reader.close()
