"""Consumers no one here wrote: Kafka Connect standalone with Debezium's JDBC sink
connector reads a capture's table topics in a Kafka Connect format (``[log]
value_format``) into a second PostgreSQL database, which must then equal the source in
every column. A snapshot, then inserts, updates and deletes (REPLICA IDENTITY FULL).

Slow (``-m slow``): a Connect worker is a JVM of its own (~10 s to start, 512 MB heap)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pydblog.devtools import kafka_connect
from pydblog.devtools.pgcluster import PgCluster
from tests.conftest import drop_database
from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.kafka.conftest import kafka_log_toml
from tests.kafka.registry import schema_registry

pytestmark = pytest.mark.slow

COLUMNS = """
    id integer PRIMARY KEY,
    small smallint,
    qty bigint,
    name text,
    vc varchar(20),
    ok boolean,
    f double precision,
    r real,
    price numeric(10,2),
    born date,
    ts timestamp,
    ts3 timestamp(3),
    at timestamptz,
    t time,
    doc jsonb,
    u uuid,
    raw bytea,
    amount numeric,
    ia integer[],
    ta text[],
    iv interval,
    tz timetz
"""

ROW = ("({id}, {id} - 100, {id}::bigint * 1000000000, 'name {id}', 'vc{id}', {id} % 2 = 0, {id} / 3.0, "
       "{id} / 4.0, {id} * 1.25, DATE '2024-01-01' + {id}, TIMESTAMP '2024-01-02 03:04:05.123456' "
       "+ {id} * INTERVAL '1 hour', TIMESTAMP '2024-01-02 03:04:05.123' + {id} * INTERVAL '1 sec', "
       "TIMESTAMPTZ '2024-01-02 03:04:05.5+02' + {id} * INTERVAL '1 min', TIME '01:02:03.25' "
       "+ {id} * INTERVAL '1 sec', jsonb_build_object('id', {id}, 'xs', jsonb_build_array(1, 'two')), "
       "md5({id}::text)::uuid, decode(md5({id}::text), 'hex'), {id} / 7.0, ARRAY[{id}, NULL, 3], "
       "ARRAY['a,b', 'c\"d', NULL], {id} * INTERVAL '1 day 02:03:04.5', TIMETZ '01:02:03.25-08')")


def _rows(dsn: str) -> list[tuple[Any, ...]]:
    """Every row, every column as psycopg loads it (values, not their text: the sink
    writes an interval as hours, ``26:03:04.5``, and a ``timetz`` in UTC, Debezium's
    ``ZonedTime``; both equal the source's values)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        return conn.execute("SELECT * FROM items ORDER BY id").fetchall()


def _first_difference(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> str:
    for g, w in zip(got, want, strict=False):
        if g != w:
            return f"target {g!r}\nsource {w!r}"
    return f"{len(got)} rows in the target, {len(want)} in the source"


def _sink(name: str, topic: str, target: PgCluster, db: str) -> dict[str, Any]:
    return {
        "name": name,
        "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "tasks.max": 1,
        "topics": topic,
        "connection.url": f"jdbc:postgresql://127.0.0.1:{target.port}/{db}",
        "connection.username": "postgres",
        "connection.password": "postgres",
        "insert.mode": "upsert",
        "delete.enabled": True,
        "truncate.enabled": True,
        "primary.key.mode": "record_key",
        "schema.evolution": "none",
        "collection.name.format": "${source.table}",
        "use.time.zone": "UTC",
    }


def _scenario(pg_db: str, pg_cluster: PgCluster, tmp_path: Path, bootstrap: str,
              log_extra: str, converters: dict[str, Any]) -> None:
    h = PgHarness(pg_db)
    h.execute(f"CREATE TABLE items ({COLUMNS})", "ALTER TABLE items REPLICA IDENTITY FULL",
              "INSERT INTO items VALUES " + ", ".join(ROW.format(id=i) for i in range(1, 21)),
              "INSERT INTO items (id) VALUES (99)")  # every other column null
    target_db = f"t_{uuid.uuid4().hex[:10]}"
    target = pg_cluster.create_database(target_db)
    try:
        with psycopg.connect(target) as conn:
            conn.execute(f"CREATE TABLE items ({COLUMNS})")
        prefix = f"c{uuid.uuid4().hex[:8]}"
        topic = f"{prefix}.public.items"
        with Capture(h, tmp_path, kafka_log_toml(bootstrap, prefix, log_extra)
                     + '\n[snapshot]\nmode = "initial"\n') as cap:
            cap.caught_up()
            h.execute("INSERT INTO items VALUES " + ", ".join(ROW.format(id=i) for i in range(21, 31)))
            h.execute("UPDATE items SET name = 'renamed', price = price + 0.01, doc = NULL WHERE id % 3 = 0",
                      "UPDATE items SET id = id + 1000 WHERE id = 5")  # a key change: delete + insert
            h.execute("DELETE FROM items WHERE id % 7 = 0")
            cap.caught_up()
            with kafka_connect.ConnectStandalone(bootstrap, _sink(f"sink-{prefix}", topic, pg_cluster,
                                                                  target_db), converters) as connect:
                want = _rows(pg_db)
                assert len(want) == 27
                deadline = time.monotonic() + 180
                got: list[tuple[Any, ...]] = []
                while time.monotonic() < deadline:
                    failed = connect.failure()
                    assert failed is None, failed
                    got = _rows(target)
                    if got == want:
                        break
                    time.sleep(1)
                assert got == want, _first_difference(got, want)
    finally:
        drop_database(pg_cluster, target_db)


@pytest.fixture
def connect_ready() -> None:
    reason = kafka_connect.unavailable()
    if reason is not None:
        pytest.fail(reason)


@pytest.mark.usefixtures("connect_ready")
def test_json_schema_topics_into_postgres_by_debeziums_jdbc_sink(
        pg_db: str, pg_cluster: PgCluster, tmp_path: Path, kafka_bootstrap: str) -> None:
    _scenario(pg_db, pg_cluster, tmp_path, kafka_bootstrap, 'value_format = "json-schema"\n',
              kafka_connect.json_converters())


@pytest.mark.usefixtures("connect_ready")
def test_avro_topics_into_postgres_by_debeziums_jdbc_sink(
        pg_db: str, pg_cluster: PgCluster, tmp_path: Path, kafka_bootstrap: str) -> None:
    """Apicurio's ``AvroConverter`` in Confluent mode (4-byte ids) reads the schemas
    from the test's registry (``tests/kafka/registry.py``)."""
    with schema_registry() as (url, store):
        _scenario(pg_db, pg_cluster, tmp_path, kafka_bootstrap,
                  f'value_format = "avro"\nschema_registry_url = "{url}"\n',
                  kafka_connect.apicurio_converters(f"{url}/apis/registry/v2"))
        assert any(s.endswith(".public.items-value") for s in store.subjects)
