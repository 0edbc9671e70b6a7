"""`dblog run` on another host resumes from Kafka alone: the first capture is killed
with -9 in the middle of an incremental snapshot under a write load, a column is added
while no capture runs, and a capture with a fresh, empty ``[log] path`` (same source,
same Kafka topics) takes over from the checkpoint in Kafka (source position, snapshot
progress, MySQL's schema history). It is killed in turn and the first host comes back,
its own ``state.json`` now older than Kafka's checkpoint (Kafka's, the newer, must win).
The oracle: the topics materialize to the source, no source position is logged twice,
and the snapshot was resumed each time, not restarted (at most the interrupted chunk is
read again). On PostgreSQL in the default run; on MariaDB and MySQL 5.7 (MySQL 5.7
names binlog columns from the schema history) with ``-m slow``."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import Harness, KafkaLogHarness, PgHarness
from tests.contract.test_snapshots import make_table, q, writer
from tests.helpers import sid
from tests.mysql.harness import MariaHarness

ROWS = 3000
CHUNK = 20


def source(request: pytest.FixtureRequest, name: str) -> Harness:
    if name == "postgres":
        return PgHarness(request.getfixturevalue("pg_db"))
    if name == "mariadb":
        return MariaHarness(request.getfixturevalue("mariadb"), request.getfixturevalue("my_db"))
    return MariaHarness(request.getfixturevalue("mysql57"), request.getfixturevalue("my57_db"))


@pytest.mark.parametrize("name", [
    "postgres",
    pytest.param("mariadb", marks=pytest.mark.slow),
    pytest.param("mysql57", marks=pytest.mark.slow),
])
def test_resume_on_another_host_mid_snapshot(request: pytest.FixtureRequest, name: str,
                                             tmp_path: Path, kafka_bootstrap: str) -> None:
    pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")
    h = KafkaLogHarness(source(request, name), kafka_bootstrap)
    make_table(h, "t1", ROWS)
    extra = f"[snapshot]\nchunk_size = {CHUNK}\nadaptive = false"
    host_a = Capture(h, tmp_path / "host-a", extra)
    host_b = Capture(h, tmp_path / "host-b", extra)
    stop = threading.Event()
    load = threading.Thread(target=writer, args=(h, "t1", stop, 31, ROWS + 500))
    try:
        host_a.start()
        load.start()
        h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
        host_a.wait_until(lambda ev: len(snapshot_rows(ev, "t1")) >= 600, what="600 snapshot rows")
        host_a.kill()
        done_a = len(snapshot_rows(host_a.events(), "t1"))

        # a column added while no capture runs: the next one reads the DDL from the
        # stream with the table's definition from the checkpoint (MySQL 5.7's schema
        # history)
        h.execute("ALTER TABLE t1 ADD COLUMN extra INT")
        h.execute("UPDATE t1 SET extra = id WHERE id < 200")
        # another host: nothing local at all, the same source and Kafka
        assert not host_b.log_dir.exists()
        host_b.start()
        host_b.wait_until(lambda ev: len(snapshot_rows(ev, "t1")) >= done_a + 600,
                          what="600 more snapshot rows on host b")
        host_b.kill()
        done_b = len(snapshot_rows(host_b.events(), "t1"))
        assert host_b.log_dir.exists()  # (its state.json: b ran from it, not from a's)

        # back on host a, whose state.json is now behind the checkpoint in Kafka
        host_a.start()
        host_a.wait_notification("COMPLETED", timeout=180)
        stop.set()
        load.join()
        events = host_a.assert_oracle({"t1": ["id"]})  # (also: no position twice)
    finally:
        stop.set()
        if load.is_alive():
            load.join()
        for cap in (host_a, host_b):
            cap.__exit__(None, None, None)
    assert [e["offset"] for e in events] == list(range(len(events))), "offsets are not dense"
    rows = snapshot_rows(events, "t1")
    for before, after in ((0, done_a), (done_a, done_b)):
        earlier = {e["key"]["id"] for e in rows[before:after]}
        again = [e for e in rows[after:] if e["key"]["id"] in earlier]
        # Resumed, not restarted: at most the interrupted chunk is read again (the
        # writes only remove rows from later chunks or add rows behind the cursor).
        assert len(again) <= CHUNK, f"{len(again)} rows read again after a take-over"


def test_a_new_topic_prefix_with_the_old_state_json(pg_db: str, tmp_path: Path,
                                                    kafka_bootstrap: str) -> None:
    """`[log] path` keeps state.json, the log is in Kafka: a capture pointed at a log
    with no checkpoint (here another topic_prefix; also deleted topics, a new cluster,
    a restarted in-memory broker) must not resume at state.json's position into it:
    that log would lack every earlier event, and `mode = "initial"` would take no
    snapshot (its flag is in state.json). The start is refused naming both; with
    state.json removed (the fix) the new log starts with a snapshot."""
    import uuid

    import psycopg

    from tests.helpers import dblog, read_log, start_run, stop_run, wait_for, write_config
    from tests.kafka.conftest import kafka_log_toml

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY)")
        conn.execute("INSERT INTO w SELECT generate_series(1, 5)")
    snap = '[snapshot]\nmode = "initial"\n'
    state = tmp_path / "data" / "state.json"
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(kafka_bootstrap, extra=snap))
    proc = start_run(config)
    try:
        wait_for(state.exists, 30, "state.json")
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
    prefix = f"b{uuid.uuid4().hex[:8]}"
    config = write_config(tmp_path, pg_db, extra=kafka_log_toml(kafka_bootstrap, prefix, snap))
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO w VALUES (6)")
    res = dblog("run", "--config", str(config), check=False, timeout=60)
    assert res.returncode == 6, res.stderr
    assert f"the Kafka change log '{prefix}' at {kafka_bootstrap} has no checkpoint" in res.stderr
    assert f"the state file {state} has one at LSN " in res.stderr and "Traceback" not in res.stderr
    assert f"remove {state}" in res.stderr
    assert read_log(config) == []
    state.unlink()
    proc = start_run(config)
    try:
        wait_for(lambda: {e["after"]["id"] for e in read_log(config) if e["source"]["table"] == "w"
                          and e["op"] in "rc"} == set(range(1, 7)), 60, "every row in the new log")
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
