"""Debezium envelope conformance: what a consumer written for Debezium's PostgreSQL JSON
change events (``value.converter.schemas.enable=false``) reads from the topics, field by
field, and the documented differences (docs/kafka.md) are exactly the ones there are."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg

from tests.helpers import start_run, stop_run, wait_for_marker, write_config
from tests.kafka.conftest import kafka_log_toml

# Debezium's PostgreSQL connector value payload: field -> JSON types allowed per op.
DEBEZIUM_VALUE = {"op", "ts_ms", "before", "after", "source"}
DEBEZIUM_SOURCE = {"connector": str, "db": str, "schema": str, "table": str, "ts_ms": int,
                   "snapshot": str, "txId": int, "lsn": int}
ABSENT = {"source": {"version", "name", "sequence", "xmin"}, "value": {"transaction", "ts_us", "ts_ns"}}
"""Debezium fields pydblog does not write (docs/kafka.md, 'Differences')."""
ADDED = {"value": {"offset", "key"}, "source": {"index"}}


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


def test_debezium_postgres_envelope(pg_db: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, email text, n int)")
    prefix = f"e{uuid.uuid4().hex[:8]}"
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(
        kafka_bootstrap, prefix, "partitions = 2\ntombstones = true\n"))
    proc = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO customers VALUES (1, 'a@x', 1), (2, 'b@x', 2)")
            conn.execute("UPDATE customers SET n = 5 WHERE id = 1")
            conn.execute("DELETE FROM customers WHERE id = 2")
            conn.execute("TRUNCATE customers")
        wait_for_marker(config, pg_db)
    finally:
        code, out = stop_run(proc)
    assert code == 0, out
    msgs = read_topic(kafka_bootstrap, f"{prefix}.public.customers")
    data = [m for m in msgs if m.value() is not None]
    ops = sorted(orjson.loads(m.value())["op"] for m in data)
    assert ops == ["c", "c", "d", "t", "t", "u"]  # the truncate once per partition
    for m in data:
        v = orjson.loads(m.value())
        assert set(v) >= DEBEZIUM_VALUE, v
        assert not ABSENT["value"] & set(v) and ADDED["value"] <= set(v)
        op, src = v["op"], v["source"]
        assert isinstance(v["ts_ms"], int)
        for name, typ in DEBEZIUM_SOURCE.items():
            assert isinstance(src[name], typ), (name, src)
        assert src["connector"] == "postgresql" and src["schema"] == "public"
        assert src["table"] == "customers" and src["snapshot"] == "false"
        assert not ABSENT["source"] & set(src) and ADDED["source"] <= set(src)
        assert dict(m.headers())["dblog.source"] == orjson.dumps(src)
        if op == "t":
            assert m.key() is None and v["before"] is None and v["after"] is None
            continue
        key = orjson.loads(m.key())
        row = v["after"] if op in ("c", "u") else v["before"]
        assert key == {"id": row["id"]} == v["key"]
        if op == "c":
            assert v["before"] is None and set(v["after"]) == {"id", "email", "n"}
        elif op == "u":
            assert v["after"]["n"] == 5  # before: null under REPLICA IDENTITY DEFAULT, as in Debezium
        else:
            assert v["after"] is None and v["before"]["id"] == 2  # the old key (replica identity)
    # The tombstone follows its delete in the same partition, with the same key.
    by_part: dict[int, list[Any]] = {}
    for m in msgs:
        by_part.setdefault(m.partition(), []).append(m)
    tombstones = [(p, i) for p, ms in by_part.items() for i, m in enumerate(ms) if m.value() is None]
    assert len(tombstones) == 1
    p, i = tombstones[0]
    delete = by_part[p][i - 1]
    assert orjson.loads(delete.value())["op"] == "d" and delete.key() == by_part[p][i].key() == b'{"id":2}'
