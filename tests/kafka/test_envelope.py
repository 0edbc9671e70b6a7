"""Debezium envelope conformance: what a consumer written for Debezium's PostgreSQL or
MySQL JSON change events (``value.converter.schemas.enable=false``) reads from the
topics, field by field, for creates, updates, deletes, incremental snapshot reads and
truncates, and from the notification topic; the documented differences (docs/kafka.md) are exactly the ones there are.

Debezium's ``source`` blocks, from its connector docs: PostgreSQL ``version, connector,
name, ts_ms, snapshot, db, sequence, schema, table, txId, lsn, xmin``; MySQL ``version,
connector, name, ts_ms, snapshot, db, sequence, table, server_id, gtid, file, pos, row,
thread, query``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.contract.capture import Capture
from tests.contract.harness import Harness, PgHarness
from tests.kafka.conftest import kafka_log_toml

DEBEZIUM_VALUE = {"op", "ts_ms", "before", "after", "source"}
ABSENT_VALUE = {"transaction", "ts_us", "ts_ns"}
ADDED_VALUE = {"offset", "key"}


@dataclass(frozen=True)
class Flavour:
    """One Debezium connector's ``source`` block as pydblog writes it."""

    connector: str
    source: dict[str, type | tuple[type, ...]]  # Debezium's fields pydblog writes: JSON types
    absent: frozenset[str]  # Debezium's fields pydblog does not write
    added: frozenset[str]  # pydblog's fields Debezium has not


POSTGRES = Flavour(
    "postgresql",
    {"connector": str, "db": str, "schema": str, "table": str, "ts_ms": int, "snapshot": str,
     "txId": int, "lsn": int},
    frozenset({"version", "name", "sequence", "xmin", "ts_us", "ts_ns"}),
    frozenset({"index"}),
)
MYSQL = Flavour(
    "mysql",
    {"connector": str, "db": str, "table": str, "ts_ms": int, "snapshot": str,
     "gtid": (str, type(None)), "file": str, "pos": int},
    frozenset({"version", "name", "sequence", "server_id", "row", "thread", "query",
               "ts_us", "ts_ns"}),
    frozenset({"index", "schema"}),
)


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "conformance",
                  "enable.partition.eof": True, "isolation.level": "read_committed"})
    md = c.list_topics(timeout=10)
    out: list[Any] = []
    for p in sorted(md.topics[topic].partitions):
        c.assign([TopicPartition(topic, p, 0)])
        eof = False
        while not eof:
            for m in c.consume(100, 1.0):
                if m.error() is None:
                    out.append(m)
                else:
                    eof = True
        c.unassign()
    c.close()
    return out


def _capture_scenario(h: Harness, tmp_path: Path, bootstrap: str, truncates: str,
                      value_format: str = "json", source_header: bool = False) -> tuple[str, str]:
    """Two rows snapshotted, then a create, an update, a delete and a truncate; the
    topic and the schema (database) of the table."""
    h.execute("CREATE TABLE customers (id INT PRIMARY KEY, email VARCHAR(40), n INT)",
              "INSERT INTO customers VALUES (10, 's@x', 10), (11, 't@x', 11)")
    prefix = f"e{uuid.uuid4().hex[:8]}"
    extra = (f'partitions = 2\ntombstones = true\ntruncates = "{truncates}"\n'
             f'value_format = "{value_format}"\n'
             f'source_header = {"true" if source_header else "false"}\n')
    with Capture(h, tmp_path, kafka_log_toml(bootstrap, prefix, extra)) as cap:
        mark = cap.end()
        h.signal("snap", "execute-snapshot", {"data-collections": [f"{h.schema}\\.customers"]})
        cap.wait_notification("COMPLETED", after=mark, signal_id="snap")
        h.execute("INSERT INTO customers VALUES (1, 'a@x', 1), (2, 'b@x', 2)")
        h.execute("UPDATE customers SET n = 5 WHERE id = 1")
        h.execute("DELETE FROM customers WHERE id = 2")
        h.execute("TRUNCATE customers")
        cap.caught_up()
    return f"{prefix}.{h.schema}.customers", h.schema


def check_envelope(msgs: list[Any], flavour: Flavour, schema: str, truncates: str,
                   source_header: bool = False) -> None:
    data = [m for m in msgs if m.value() is not None]
    ops = sorted(orjson.loads(m.value())["op"] for m in data)
    # Debezium's ops only: no notification; a truncate only with truncates = "include"
    assert ops == ["c", "c", "d", "r", "r", *(["t"] if truncates == "include" else []), "u"], ops
    for m in data:
        v = orjson.loads(m.value())
        assert set(v) >= DEBEZIUM_VALUE, v
        assert not ABSENT_VALUE & set(v) and set(v) >= ADDED_VALUE, sorted(v)
        op, src = v["op"], v["source"]
        assert isinstance(v["ts_ms"], int)
        for name, typ in flavour.source.items():
            assert isinstance(src[name], typ), (name, src)
        assert set(src) == set(flavour.source) | flavour.added, sorted(src)
        assert not flavour.absent & set(src)
        assert src["connector"] == flavour.connector and src["table"] == "customers"
        assert src["schema"] == schema
        if source_header:
            assert dict(m.headers())["dblog.source"] == orjson.dumps(src)
        else:
            assert "dblog.source" not in dict(m.headers())
        if op == "t":  # one keyless message, as Debezium's
            assert m.key() is None and v["before"] is None and v["after"] is None
            assert m.partition() == 0 and src["snapshot"] == "false", src
            continue
        key = orjson.loads(m.key())
        row = v["after"] if op in ("c", "u", "r") else v["before"]
        assert key == {"id": row["id"]} == v["key"]
        assert src["snapshot"] == ("incremental" if op == "r" else "false"), src
        if op in ("c", "r"):
            assert v["before"] is None and set(v["after"]) == {"id", "email", "n"}
            assert (op == "r") == (row["id"] >= 10) and row["n"] == row["id"], v
        elif op == "u":
            assert v["after"] == {"id": 1, "email": "a@x", "n": 5}
        else:
            assert v["after"] is None and v["before"]["id"] == 2  # the old key (or row)
    # The tombstone follows its delete in the same partition, with the same key.
    by_part: dict[int, list[Any]] = {}
    for m in msgs:
        by_part.setdefault(m.partition(), []).append(m)
    tombstones = [(p, i) for p, ms in by_part.items() for i, m in enumerate(ms) if m.value() is None]
    assert len(tombstones) == 1
    p, i = tombstones[0]
    delete = by_part[p][i - 1]
    assert orjson.loads(delete.value())["op"] == "d" and delete.key() == by_part[p][i].key() == b'{"id":2}'


def check_notifications(bootstrap: str, prefix: str) -> None:
    """The snapshot's notifications, in the notification topic, as Debezium's Kafka
    notification channel sends them: key ``{"id"}``, value ``{"id", "aggregate_type",
    "type", "additional_data" (strings), "timestamp"}``; ``id`` the signal's."""
    notes = read_topic(bootstrap, f"{prefix}.__dblog.notifications")
    assert notes
    types = []
    for m in notes:
        v = orjson.loads(m.value())
        assert set(v) == {"id", "aggregate_type", "type", "additional_data", "timestamp"}, v
        assert orjson.loads(m.key()) == {"id": "snap"} and v["id"] == "snap"
        assert v["aggregate_type"] == "Incremental Snapshot" and isinstance(v["timestamp"], int)
        assert all(isinstance(x, str) for x in v["additional_data"].values()), v
        types.append(v["type"])
    assert types[0] == "STARTED" and types[-1] == "COMPLETED" and "TABLE_SCAN_COMPLETED" in types


def test_debezium_postgres_envelope(pg_db: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    topic, schema = _capture_scenario(PgHarness(pg_db), tmp_path, kafka_bootstrap, "include",
                                      source_header=True)
    msgs = read_topic(kafka_bootstrap, topic)
    check_envelope(msgs, POSTGRES, schema, "include", source_header=True)
    check_notifications(kafka_bootstrap, topic.split(".")[0])
    before = [orjson.loads(m.value())["before"] for m in msgs if m.value() is not None]
    assert {"id": 2} in before  # a delete's before: the key only (REPLICA IDENTITY DEFAULT)
    updates = [orjson.loads(m.value()) for m in msgs if m.value() and b'"op":"u"' in m.value()]
    assert updates[0]["before"] is None  # as in Debezium without REPLICA IDENTITY FULL


def test_debezium_mariadb_envelope(tmp_path: Path, kafka_bootstrap: str,
                                   request: pytest.FixtureRequest) -> None:
    from tests.mysql.harness import MariaHarness

    server = request.getfixturevalue("mariadb")
    db = request.getfixturevalue("my_db")
    h = MariaHarness(server, db)
    topic, schema = _capture_scenario(h, tmp_path, kafka_bootstrap, "skip")
    msgs = read_topic(kafka_bootstrap, topic)
    check_envelope(msgs, MYSQL, schema, "skip")
    check_notifications(kafka_bootstrap, topic.split(".")[0])
    for m in msgs:
        if m.value() is None:
            continue
        v = orjson.loads(m.value())
        src = v["source"]
        assert src["db"] == db and src["file"] and src["pos"] > 0, src
        assert src["gtid"] is None or src["gtid"].count("-") == 2, src  # MariaDB's domain-server-seq
        if v["op"] == "u":
            assert v["before"] == {"id": 1, "email": "a@x", "n": 1}  # binlog_row_image=FULL
        if v["op"] == "d":
            assert v["before"] == {"id": 2, "email": "b@x", "n": 2}


DEBEZIUM_CONNECT_VALUE = ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
DEBEZIUM_PG_SOURCE = ["version", "connector", "name", "ts_ms", "snapshot", "db", "sequence",
                      "ts_us", "ts_ns", "schema", "table", "txId", "lsn", "xmin"]


def test_debezium_postgres_envelope_with_schemas(pg_db: str, tmp_path: Path,
                                                 kafka_bootstrap: str) -> None:
    """``value_format = "json-schema"`` (``JsonConverter`` with schemas): the payload has
    exactly Debezium's envelope and ``source`` fields (and ``source.index``), each described
    by the schema in that order (what ``JsonConverter`` requires); ``version``, ``name``
    and the finer timestamps are set; ``transaction`` is null (Debezium's default)."""
    topic, schema = _capture_scenario(PgHarness(pg_db), tmp_path, kafka_bootstrap, "include",
                                      "json-schema")
    prefix = topic.split(".")[0]
    msgs = [m for m in read_topic(kafka_bootstrap, topic) if m.value() is not None]
    assert sorted(orjson.loads(m.value())["payload"]["op"] for m in msgs) == [
        "c", "c", "d", "r", "r", "t", "u"]
    for m in msgs:
        doc = orjson.loads(m.value())
        value, payload = doc["schema"], doc["payload"]
        assert list(payload) == DEBEZIUM_CONNECT_VALUE == [f["field"] for f in value["fields"]]
        src = payload["source"]
        src_schema = next(f for f in value["fields"] if f["field"] == "source")
        assert list(src) == [*DEBEZIUM_PG_SOURCE, "index"] == [
            f["field"] for f in src_schema["fields"]]
        assert src["version"] == "pydblog" and src["name"] == prefix and src["schema"] == schema
        assert isinstance(src["txId"], int) and isinstance(src["lsn"], int)
        assert src["ts_us"] == src["ts_ms"] * 1000 and src["ts_ns"] == src["ts_ms"] * 10**6
        assert payload["ts_us"] == payload["ts_ms"] * 1000
        assert payload["ts_ns"] == payload["ts_ms"] * 10**6
        assert payload["transaction"] is None and src["sequence"] is None and src["xmin"] is None
        # the JSON envelope rides in the header, as in the json format
        event = orjson.loads(dict(m.headers())["dblog.event"])
        assert event["op"] == payload["op"] and event["source"]["lsn"] == src["lsn"]
