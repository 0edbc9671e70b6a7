"""`dblog run` into Kafka: kill -9 under load (at random moments and at each step of a
Kafka commit), `dblog tail` and `dblog status` on Kafka.
The oracle: the topics, read back, materialize to the source table, and no source
position is logged twice."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.helpers import (
    assert_oracle,
    dblog,
    kill9,
    start_run,
    stop_run,
    write_config,
)
from tests.integration.test_crash import writer
from tests.kafka.conftest import kafka_log_toml


def _table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)")


def _check(config: Path, dsn: str) -> list[dict[str, Any]]:
    events = assert_oracle(config, dsn, {"public.w": ["id"]})
    positions = [(e["source"]["lsn"], e["source"]["index"]) for e in events]
    assert len(positions) == len(set(positions)), "a source position was logged twice"
    assert positions == sorted(positions), "offsets do not follow source positions"
    assert [e["offset"] for e in events] == list(range(len(events))), "offsets are not dense"
    return events


def test_kill9_during_load(pg_db: str, tmp_path: Path, kafka_bootstrap: str) -> None:
    _table(pg_db)
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(
        kafka_bootstrap, extra="partitions = 3\nbatch_max_events = 200"))
    stop = threading.Event()
    load = threading.Thread(target=writer, args=(pg_db, stop, 5))
    load.start()
    rng = random.Random(13)
    try:
        for _ in range(5):
            proc = start_run(config)
            time.sleep(rng.uniform(0.5, 2.0))
            kill9(proc)
    finally:
        stop.set()
        load.join()
    proc = start_run(config)
    try:
        _check(config, pg_db)
    finally:
        code, out = stop_run(proc)
    assert code == 0, out


@pytest.mark.parametrize("step", ["kafka-after-data", "kafka-before-commit"])
def test_crash_at_each_step_of_a_kafka_commit(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str, step: str
) -> None:
    _table(pg_db)
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(kafka_bootstrap, extra="partitions = 2"))
    for n in (1, 2, 1):
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for i in range(30):
                conn.execute("INSERT INTO w VALUES (%s, 'a', 0) ON CONFLICT (id) DO UPDATE SET n = w.n + 1", (i,))
        proc = start_run(config, env={"DBLOG_CRASH_AT": f"{step}:{n}"}, wait=False)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 137, err.decode()[-2000:]
    proc = start_run(config)
    try:
        _check(config, pg_db)
        status = orjson.loads(dblog("status", "--config", str(config), "--json").stdout)
        log = status["changelog"]
        assert log["type"] == "kafka" and log["last_offset"] >= 59  # rounds 2 and 3 (the slot is created after round 1)
        assert any(t.endswith(".public.w") for t in log["topics"])
    finally:
        code, out = stop_run(proc)
    assert code == 0, out
