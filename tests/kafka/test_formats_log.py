"""A Kafka log in a Kafka Connect format (``[log] value_format``): every table record's
value and key are in the format (``json-schema``: ``{"schema", "payload"}`` with the
payload the envelope's; ``avro``: Confluent's framing against a schema registry
served over HTTP), and ``dblog tail``'s reader and the ``dblog sync`` source read the same
events as from the embedded log."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pydblog.changelog.formats import Registry, decode_avro
from pydblog.changelog.kafka.reader import KafkaChangeLogReader
from pydblog.changelog.kafka.topics import HEADER_EVENT
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.config import LogConfig
from pydblog.events import Op
from pydblog.ports import ColumnSchema, TableSchema
from tests.kafka.registry import SchemaStore, schema_registry
from tests.kafka.test_kafka_log import batches, cp, embedded_rows, row_event, source_rows
from tests.kafka.test_native_write import raw

SCHEMAS = [
    TableSchema("public", "a", (ColumnSchema("id", "integer", "int32", False),
                                ColumnSchema("v", "text", "string")), ("id",)),
    TableSchema("public", "b", (ColumnSchema("before", "integer", "int32", False),
                                ColumnSchema("k", "text", "string"),
                                ColumnSchema("j", "jsonb", "json")), ("before", "k")),
]


@pytest.fixture
def registry() -> Iterator[tuple[str, SchemaStore]]:
    with schema_registry() as served:
        yield served


def _write(cfg: LogConfig, path: Path | None = None) -> None:
    kf = KafkaChangeLog(cfg)
    sq = SqliteChangeLog(path) if path is not None else None
    extra = [[row_event(Op.DELETE, "a", 60 + i, {"id": 1000 + i}, None) for i in range(5)]]
    for i, b in enumerate(batches() + extra):
        kf.append(b, cp(i), SCHEMAS if i == 0 else ())
        if sq is not None:
            sq.append(b, cp(i), SCHEMAS if i == 0 else ())
    kf.close()
    if sq is not None:
        sq.close()


def _cfg(tmp_path: Path, bootstrap: str, name: str, **extra: Any) -> LogConfig:
    return LogConfig(type="kafka", path=str(tmp_path / name), bootstrap_servers=bootstrap,
                     topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3, tombstones=True,
                     truncates="include", **extra)


@pytest.mark.parametrize("fmt", ["json-schema", "avro"])
def test_connect_format_records_and_reads(kafka_bootstrap: str, tmp_path: Path,
                                          registry: tuple[str, SchemaStore], fmt: str) -> None:
    url, store = registry
    plain = _cfg(tmp_path, kafka_bootstrap, "plain")
    cfg = _cfg(tmp_path, kafka_bootstrap, "fmt", value_format=fmt,
               **({"schema_registry_url": url} if fmt == "avro" else {}))
    _write(plain)
    _write(cfg, tmp_path / "sq")

    # The readers: the same events as the json log's.
    a, b = KafkaChangeLogReader(plain), KafkaChangeLogReader(cfg)
    ra, rb = a.read(0, 10**9), b.read(0, 10**9)
    assert len(ra) > 350
    assert [orjson.loads(r.body) for r in rb] == [orjson.loads(r.body) for r in ra]
    a.close()
    b.close()

    # The records: each table record's value and key in the format, the event in the header.
    reg = Registry(url)
    records = raw(cfg)
    seen_ops = set()
    for topic, _part, _off, key, value, headers in records:
        if value is None or topic.startswith(".__dblog."):  # a tombstone; notifications
            continue
        event = orjson.loads(dict(headers)[HEADER_EVENT])
        if fmt == "json-schema":
            doc = orjson.loads(value)
            assert set(doc) == {"schema", "payload"}
            assert doc["schema"]["name"] == f"{cfg.topic_prefix}{topic}.Envelope"
            payload = doc["payload"]
            k = orjson.loads(key)["payload"] if key is not None else None
        else:
            payload = decode_avro(value, reg)
            k = decode_avro(key, reg) if key is not None else None
        assert payload["op"] == event["op"]
        seen_ops.add(event["op"])
        assert payload["source"]["lsn"] == event["source"]["lsn"]
        assert payload["source"]["index"] == event["source"]["index"]
        assert k == event["key"]
        row = event["after"] if event["op"] != "d" else event["before"]
        payload_row = payload["after"] if event["op"] != "d" else payload["before"]
        if row is None:
            assert payload_row is None
        else:
            assert {n: payload_row[n] for n in row if n != "j"} == {n: v for n, v in row.items() if n != "j"}
            if "j" in row:
                assert orjson.loads(payload_row["j"]) == row["j"]
    assert seen_ops == {"c", "u", "d", "r", "t"}  # notifications: their own topic
    if fmt == "avro":
        assert set(store.subjects) >= {
            f"{cfg.topic_prefix}.public.a-value", f"{cfg.topic_prefix}.public.a-key",
            f"{cfg.topic_prefix}.public.b-value", f"{cfg.topic_prefix}.public.b-key"}

    # The dblog sync source (the Python read path: the event in the header).
    pytest.importorskip("pyspark")
    columns = ["offset", "op", "table", "key", "after", "unchanged", "ts_ms"]
    assert source_rows(cfg, columns) == embedded_rows(tmp_path / "sq", columns)


def test_an_unreachable_registry_aborts_the_commit(kafka_bootstrap: str, tmp_path: Path) -> None:
    from pydblog.errors import ChangeLogUnavailable

    cfg = _cfg(tmp_path, kafka_bootstrap, "fmt", value_format="avro",
               schema_registry_url="http://user:secret@127.0.0.1:1")
    w = KafkaChangeLog(cfg)
    with pytest.raises(ChangeLogUnavailable) as info:
        w.append(batches()[0], cp(0), SCHEMAS)
    assert "cannot be reached" in str(info.value) and "secret" not in str(info.value)
    r = KafkaChangeLogReader(cfg)
    assert r.read(0, 10) == [] and r.next_offset() == 0  # nothing of the commit is valid
    r.close()
    w.close()
