"""The Kafka signal channel with read-only snapshots: signals go straight to the capture
(no signal row is written to the source), each is applied once across a kill -9 (its
offset is committed only after the capture's checkpoint holds it; a redelivered one
is recognised by its id), and the change log stays exact."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import psycopg

from tests.helpers import (
    assert_oracle,
    kill9,
    read_log,
    start_run,
    stop_run,
    wait_for,
    write_config,
)
from tests.kafka.conftest import kafka_log_toml
from tests.kafka.test_capture import _signal_entry


def _signal_rows(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT to_regclass('dblog_signal')").fetchone()
        if found is None or found[0] is None:
            return 0
        row = conn.execute("SELECT count(*) FROM dblog_signal").fetchone()
        assert row is not None
        return int(row[0])


def _notices(config: Path, kind: str) -> list[str]:
    return [e["notification"]["signal_id"] for e in read_log(config)
            if e["op"] == "n" and e["notification"]["type"] == kind]


def test_kafka_signals_with_read_only_snapshots(pg_db: str, tmp_path: Path,
                                                kafka_bootstrap: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)")
        conn.execute("INSERT INTO w SELECT g, 'v' || g, g FROM generate_series(1, 2000) g")
    prefix = f"r{uuid.uuid4().hex[:8]}"
    signals = f"{prefix}-signals"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.create_topics([NewTopic(signals, 1, 1)]).values():
        f.result()
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(
        kafka_bootstrap, prefix,
        f'[snapshot]\nsignal_topic = "{signals}"\nchunk_size = 50\nwatermark = "read-only"\n'))
    before = _signal_rows(pg_db)
    proc = start_run(config)
    try:
        # Signals sent once the capture's checkpoint names the topic are handled.
        wait_for(lambda: _signal_entry(config) is not None, 60, "the signal topic in the checkpoint")
        p = Producer({"bootstrap.servers": kafka_bootstrap})
        p.produce(signals, orjson.dumps({"type": "execute-snapshot",
                                         "data": {"data-collections": ["public\\.w"]}}),
                  prefix.encode())
        p.flush(10)
        wait_for(lambda: bool(_notices(config, "STARTED")), 60, "STARTED")
        kill9(proc)  # maybe before the listener committed the offset: redelivered
        proc = start_run(config)
        wait_for(lambda: bool(_notices(config, "COMPLETED")), 120, "COMPLETED")
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("UPDATE w SET n = -n WHERE id % 7 = 0")
        events = assert_oracle(config, pg_db, {"public.w": ["id"]})
        started = _notices(config, "STARTED")
        assert len(started) == 1 and started[0].startswith("kafka-0-"), started
        assert sum(1 for e in events if e["op"] == "r") >= 2000
        entry = _signal_entry(config)  # the handed-over signal's offset is in the checkpoint
        assert entry is not None and entry["next"] == {"0": 1}, entry
    finally:
        code, out = stop_run(proc)
    assert code == 0, out[-3000:]
    assert _signal_rows(pg_db) == before, "a signal row was written to the source"
