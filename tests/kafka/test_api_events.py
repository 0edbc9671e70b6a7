"""`GET /events` of `dblog run` with Kafka as the change log: read through the
ChangeLogReader port, materialized, equal to the source."""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.helpers import materialize, source_rows, start_run, stop_run, wait_for, write_config
from tests.integration.test_api import Api
from tests.kafka.conftest import kafka_log_toml


def test_events_from_kafka(pg_db: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE k (id int PRIMARY KEY, v text)")
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(kafka_bootstrap) +
                          '\n[api]\nlisten = "127.0.0.1:0"\n')
    proc = start_run(config)
    try:
        api = Api(config)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO k SELECT g, 'v' || g FROM generate_series(1, 200) g")
            conn.execute("UPDATE k SET v = 'x' WHERE id <= 50")
            conn.execute("DELETE FROM k WHERE id > 180")

        def mirrored() -> bool:
            events = api.events("from=0&limit=10000&table=public.k")
            return materialize(events).get("public.k") == source_rows(pg_db, "public.k", ["id"])

        wait_for(mirrored, 60, "/events to mirror the source")
        code, _, body = api.request("GET", "/metrics")
        assert code == 200 and b"dblog_changelog_next_offset" in body
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
