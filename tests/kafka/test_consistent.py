"""``consistent = true`` on a Kafka change log: the cut at a time ``T`` ends a batch at
the last whole transaction committed at or below it, inside a commit when it falls
there (``at``), and the next batch goes on from exactly there; the log's completeness
comes from the checkpoint topic's tail (the newest commit time minus one, or the
writer's clock at an idle commit: a heartbeat). Real Kafka; the merged sync of a Kafka
and an embedded source ends with the target a cut of both at the same time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.kafka_spark import (
    KafkaRange,
    KafkaStream,
    consistent_end,
    log_complete_ms,
    read_events,
)
from pydblog.config import LogConfig, parse_config
from pydblog.events import ChangeEvent, Op, encode_event
from pydblog.ports import Checkpoint, ColumnSchema, TableSchema
from pydblog.ports import SyncOffset as Offset
from pydblog.positions import Lsn, PgPosition
from tests.spark.conftest import spark  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(300)

ORDERS = TableSchema("public", "orders", (ColumnSchema("id", "integer", "int32", False),
                                          ColumnSchema("v", "text", "string", True)), ("id",))


def _events(rows: list[tuple[int, int, str]], db: str, first_lsn: int) -> list[Any]:
    """(commit time, id, v) upserts of public.orders as the change log stores them."""
    return [encode_event(ChangeEvent(Op.UPDATE, "public", "orders", PgPosition(Lsn(first_lsn + i)),
                                     ts, key={"id": id_}, after={"id": id_, "v": v}),
                         "postgresql", db, 0)
            for i, (ts, id_, v) in enumerate(rows)]


def _offsets(stream: KafkaStream, start: Offset, end: Offset) -> list[int]:
    got: list[int] = []
    for part in stream.partitions(start, end, 2):
        assert isinstance(part, KafkaRange)
        got.extend(orjson.loads(v)["offset"] for v in read_events(part).to_pylist())
    return sorted(got)


MID_TX = Checkpoint(PgPosition(Lsn(1)), extra={"mid_tx": True})


def test_the_cut_ends_inside_a_commit_and_the_next_batch_goes_on_from_there(
        kafka_log: LogConfig) -> None:
    log_json = kafka_log.model_dump_json()
    writer = KafkaChangeLog(kafka_log)
    stream = KafkaStream(log_json)
    try:
        assert log_complete_ms(log_json) is None
        # commit 1: offsets 0..5 (transactions at 100, 200, 300); commit 2: 6..7 (400, 500)
        writer.append(_events([(100, 1, "a"), (100, 2, "b"), (200, 3, "c"), (200, 4, "d"),
                               (200, 5, "e"), (300, 6, "f")], "k", 10), MID_TX, [ORDERS])
        writer.append(_events([(400, 7, "g"), (500, 8, "h")], "k", 20), MID_TX)
        # inside a transaction: complete up to just before the newest commit time
        assert log_complete_ms(log_json) == 499
        start = stream.initial_offset("earliest")
        end = stream.latest_offset(start, None)
        assert end["seq"] == 8
        assert consistent_end(log_json, start, end, 99) == start  # nothing at or below
        e1 = consistent_end(log_json, start, end, 250)
        assert e1.get("at") == 5 and e1["seq"] == 0  # inside commit 1
        assert _offsets(stream, start, e1) == [0, 1, 2, 3, 4]
        again = stream.latest_offset(e1, None)
        assert again == end
        e2 = consistent_end(log_json, e1, end, 450)
        assert e2.get("at") == 7 and e2["seq"] == 6  # after commit 1, inside commit 2
        assert _offsets(stream, e1, e2) == [5, 6]
        assert consistent_end(log_json, e2, stream.latest_offset(e2, None), 450) == e2
        e3 = consistent_end(log_json, e2, stream.latest_offset(e2, None), 500)
        assert e3 == end and _offsets(stream, e2, e3) == [7]
        # a cut at a commit's end is that commit's boundary (no ``at``)
        e4 = consistent_end(log_json, start, end, 300)
        assert "at" not in e4 and e4["seq"] == 6
        assert _offsets(stream, start, e4) == list(range(6))
        # an idle commit outside a transaction: the writer's clock is a heartbeat
        before = int(time.time() * 1000)
        writer.append([], Checkpoint(PgPosition(Lsn(30))))
        assert log_complete_ms(log_json) >= before  # type: ignore[operator]
    finally:
        stream.close()
        writer.close()


@pytest.mark.usefixtures("spark")
def test_a_kafka_and_an_embedded_source_end_at_the_same_time(
        kafka_log: LogConfig, pg_db: str, tmp_path: Path) -> None:
    from pydblog.spark.job import run_sync
    from tests.spark.test_drainer_progress import _write

    writer = KafkaChangeLog(kafka_log)
    try:  # k: transactions at 1000..1099 in commits of 7 events (cuts fall inside them)
        rows = [(1_000 + i, i, f"k{i}") for i in range(100)]
        for i in range(0, 100, 7):
            writer.append(_events(rows[i:i + 7], "k", i), MID_TX, [ORDERS] if i == 0 else [])
    finally:
        writer.close()
    # e: every other ms from 1000 to 1050, complete up to 1050 (its heartbeat)
    _write(tmp_path / "e", [(1_000 + 2 * i, Op.CREATE, i, f"e{i}") for i in range(26)],
           beat_ms=1_050)
    cfg = parse_config({
        "source": {"dsn": "postgresql://unused@127.0.0.1/x"},
        "log": {"path": str(tmp_path / "log")},
        "sync": {
            "checkpoint": str(tmp_path / "cp"), "trigger": "available-now",
            "master": "local[2]", "max_events_per_trigger": 30, "sink_retries": 0,
            "consistent": True,
            "sinks": [{"type": "postgres", "dsn": pg_db, "schema": "mirror"}],
            "sources": [{"name": "k", "log": kafka_log.model_dump()},
                        {"name": "e", "log": {"path": str(tmp_path / "e")}}],
            "routes": [{"tables": r"public\.orders", "target": "public.orders"}],
        },
    })
    assert run_sync(cfg, available_now=True) == 0
    with psycopg.connect(pg_db) as conn:
        got = set(conn.execute("SELECT _dblog_source, id, v FROM mirror.orders").fetchall())
    # T = min(k: 1098, e: 1050) = 1050: k's transactions up to 1050, all of e
    want = {("k", i, f"k{i}") for i in range(51)} | {("e", i, f"e{i}") for i in range(26)}
    assert got == want
    import json

    status = json.loads((tmp_path / "log" / "sync-watermarks.json").read_text())
    assert status["cut_ms"] == 1_050
