"""The Kafka source's native read (``kafka_native``, C): the same rows as the read through
confluent-kafka's ``Message`` objects, on a log with tombstones, a truncate's fan-out
copies, a crashed session's records and pieces cut anywhere; and a consumer it cannot
identify is refused, never read."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from pydblog.changelog import kafka_native, kafka_spark
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.config import LogConfig
from pydblog.events import Op
from tests.kafka.test_kafka_log import batches, cp, embedded_rows, row_event, source_rows

pytest.importorskip("pyspark")

if not kafka_native.available():
    pytest.skip("the native Kafka read (pydblog.changelog._kafkaread) is not built",
                allow_module_level=True)


def write_both(cfg: LogConfig, path: Path) -> None:
    """The same commits into the Kafka log and an embedded one; deletes get
    tombstones in Kafka (null values the reader skips)."""
    kf = KafkaChangeLog(cfg)
    sq = SqliteChangeLog(path)
    extra = [[row_event(Op.DELETE, "a", 60 + i, {"id": 1000 + i}, None) for i in range(5)]]
    for i, b in enumerate(batches() + extra):
        kf.append(b, cp(i))
        sq.append(b, cp(i))
    kf.close()
    sq.close()


def test_native_read_gives_the_rows_of_the_message_read(
        kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = LogConfig(type="kafka", path=str(tmp_path / "k"), bootstrap_servers=kafka_bootstrap,
                    topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3, tombstones=True)
    write_both(cfg, tmp_path / "sq")
    monkeypatch.setattr(kafka_spark, "MIN_RANGE_RECORDS", 7)  # pieces cut inside partitions
    runs: list[int] = []
    real = kafka_spark._read_runs

    def spy(client: object, piece: kafka_spark.KafkaPiece, values: object, check: object) -> None:
        runs.append(piece.end - piece.start)
        real(client, piece, values, check)  # type: ignore[arg-type]

    monkeypatch.setattr(kafka_spark, "_read_runs", spy)
    columns = ["offset", "op", "table", "key", "after", "unchanged", "ts_ms"]
    native = source_rows(cfg, columns)
    assert sum(runs) > 200, "most pieces read natively"
    assert native == embedded_rows(tmp_path / "sq", columns)
    monkeypatch.setattr(kafka_native, "_state", "unavailable")
    runs.clear()
    assert source_rows(cfg, columns) == native
    assert runs == []


def test_a_consumer_of_another_client_id_is_refused(kafka_bootstrap: str) -> None:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "g", "client.id": "mine"})
    try:
        with pytest.raises(RuntimeError, match=r"client\.id"):
            kafka_native.consume(c, "someone-else", 10, 0.0)
        assert len(kafka_native.consume(c, "mine", 10, 0.0)) == 0  # nothing assigned
    finally:
        c.close()


@pytest.mark.parametrize("thing", [12345, "a string", [1, 2], object()])
def test_anything_but_a_consumer_is_a_type_error(thing: object) -> None:
    """The C side reads a Consumer's handle layout: other objects must not reach it
    (they crashed the process with SIGSEGV before the check)."""
    if not kafka_native.available():
        pytest.skip("the _kafkaread extension is not built")
    with pytest.raises(TypeError, match=r"confluent_kafka\.Consumer"):
        kafka_native.consume(thing, "dblog-read-x", 1, 0.0)
