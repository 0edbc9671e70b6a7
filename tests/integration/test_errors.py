"""Bad input gets a clear message and exit code, never a traceback or a password."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from pydblog.devtools.pgcluster import PgCluster, free_port
from tests.helpers import dblog, read_log, start_run, stop_run, wait_for, write_config


def run_once(config: Path) -> tuple[int, str]:
    res = dblog("run", "--config", str(config), check=False, timeout=60)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, res.stderr


def test_unreachable_server(tmp_path: Path) -> None:
    dsn = f"postgresql://u:s3cret@127.0.0.1:{free_port()}/app"
    config = write_config(tmp_path, dsn, source_extra="connect_timeout_s = 1")
    code, err = run_once(config)
    assert code == 4
    assert "cannot connect to PostgreSQL" in err
    assert "s3cret" not in err and "Traceback" not in err


def test_wrong_password(pg_cluster: PgCluster, tmp_path: Path) -> None:
    config = write_config(tmp_path, pg_cluster.dsn(password="wrong-pw"))
    code, err = run_once(config)
    assert code == 3
    assert "refused the connection" in err and "password authentication failed" in err
    assert "wrong-pw" not in err


def test_missing_replication_privilege(pg_db: str, pg_cluster: PgCluster, tmp_path: Path) -> None:
    dbname = pg_db.rsplit("/", 1)[1]
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS plain")
        conn.execute("CREATE ROLE plain LOGIN PASSWORD 'pw'")
    config = write_config(tmp_path, pg_cluster.dsn(dbname, user="plain", password="pw"))
    code, err = run_once(config)
    assert code == 3
    assert "may not use replication" in err and "ALTER ROLE plain REPLICATION" in err


def test_wal_level_not_logical(tmp_path: Path) -> None:
    with PgCluster(settings={"wal_level": "replica"}) as cluster:
        config = write_config(tmp_path, cluster.dsn())
        code, err = run_once(config)
    assert code == 3
    assert "wal_level" in err and "logical" in err


def test_slot_in_use(pg_db: str, tmp_path: Path) -> None:
    """A second capture of a slot another one streams from waits ``slot_wait_s`` for it,
    then stops naming the holder."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path / "one", pg_db)
    other = write_config(tmp_path / "two", pg_db, source_extra="slot_wait_s = 1")
    proc = start_run(config)  # returns once the slot exists and is streamed from
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            wait_for(lambda: conn.execute(
                "SELECT count(*) FROM pg_replication_slots"
                " WHERE database = current_database() AND active").fetchone() == (1,),
                30, "the slot to be active")
        code2, err2 = run_once(other)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
    assert code2 == 5 and "in use by another process" in err2
    assert "waiting up to 1 s" in err2, err2


def test_a_slot_held_at_start_is_waited_for(pg_db: str, tmp_path: Path) -> None:
    """A capture started again right after a `kill -9` may find the slot still held by
    the killed run's walsender (PostgreSQL ends it once it notices its client is gone,
    later on a busy server): the new run waits for the slot instead of stopping."""
    import psycopg2
    import psycopg2.extras

    from tests.helpers import wait_for_marker

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg_db)
    code, err = stop_run(start_run(config))  # the slot and the publication exist
    assert code == 0, err
    holder = psycopg2.connect(pg_db, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        holder.cursor().start_replication(
            slot_name="dblog", decode=False,
            options={"proto_version": "1", "publication_names": "dblog"})
        with psycopg.connect(pg_db, autocommit=True) as conn:
            wait_for(lambda: conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = 'dblog'"
                " AND database = current_database()").fetchone() == (True,),
                30, "the slot to be held")
        proc = start_run(config, wait=False)
        try:
            time.sleep(3)  # the run finds the slot held
            assert proc.poll() is None, stop_run(proc)[1]
            holder.close()
            with psycopg.connect(pg_db, autocommit=True) as conn:
                conn.execute("INSERT INTO t VALUES (1)")
            events = wait_for_marker(config, pg_db)
        finally:
            code, err = stop_run(proc)
    finally:
        holder.close()
    assert code == 0, err
    assert "replication slot 'dblog' is in use by another process" in err and "waiting up to 30 s" in err, err
    assert [e["after"] for e in events if e["source"]["table"] == "t"] == [{"id": 1}]


def test_table_without_key_is_warned_not_captured(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE nokey (x int)")
        conn.execute("CREATE TABLE fullkey (x int)")
        conn.execute("ALTER TABLE fullkey REPLICA IDENTITY FULL")
    config = write_config(tmp_path, pg_db)
    proc = start_run(config)  # (returns once streaming: the tables' warnings are logged)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO nokey VALUES (1)")
        conn.execute("UPDATE nokey SET x = 2")  # must still work on the source
        conn.execute("INSERT INTO fullkey VALUES (1)")
        conn.execute("UPDATE fullkey SET x = 2")
    from tests.helpers import wait_for_marker

    events = wait_for_marker(config, pg_db)
    _code, err = stop_run(proc)
    assert "public.nokey has no primary key" in err and "REPLICA IDENTITY FULL" in err
    tables = {e["source"]["table"] for e in events}
    assert "nokey" not in tables and "fullkey" in tables
    # Without a primary key the whole row is the key: an UPDATE is a delete + create.
    full = [(e["op"], e["before"], e["after"]) for e in events if e["source"]["table"] == "fullkey"]
    assert full == [("c", None, {"x": 1}), ("d", {"x": 1}, None), ("c", None, {"x": 2})]


def test_malformed_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[source]\ndsn = "postgresql://u:topsecret@h/db"\nslots = "x"\n[log]\nbatch_max_events = "many"\n')
    res = dblog("run", "--config", str(bad), check=False)
    assert res.returncode == 2
    assert "source.slots: unknown key" in res.stderr
    assert "log.batch_max_events" in res.stderr
    assert "topsecret" not in res.stderr and "Traceback" not in res.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[source\n")
    res = dblog("tail", "--config", str(broken), check=False)
    assert res.returncode == 2 and "not valid TOML" in res.stderr
    res = dblog("status", "--config", str(tmp_path / "missing.toml"), check=False)
    assert res.returncode == 2 and "not found" in res.stderr


def test_run_without_ha_on_a_claimed_log(tmp_path: Path) -> None:
    """A `dblog run` without [ha] on a log a high-availability group claimed is refused
    (it would write beside the group's leader, unfenced); `--release-ha` lets it in."""
    from pydblog.changelog.sqlite import SqliteChangeLog

    dsn = f"postgresql://u:s3cret@127.0.0.1:{free_port()}/app"
    config = write_config(tmp_path, dsn, source_extra="connect_timeout_s = 1")
    member = SqliteChangeLog(tmp_path / "data")
    member.claim(9)
    member.close()
    code, err = run_once(config)
    assert code == 6, err
    assert "high-availability group" in err and "--release-ha" in err
    res = dblog("run", "--config", str(config), "--release-ha", check=False, timeout=60)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 4, res.stderr  # past the claim: now the source is unreachable
    assert "released the high-availability claim (epoch 9)" in res.stderr
    assert "s3cret" not in res.stderr


def test_a_lost_slot_is_not_recreated(pg_db: str, tmp_path: Path) -> None:
    """The slot dropped (or lost with a rebuilt server) while `dblog run` was down: a
    new slot would start at the current WAL position and the changes committed
    meanwhile would be missing from the log without a word. The restart refuses,
    naming the gap and the fix, and creates no slot."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg_db)
    proc = start_run(config)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        wait_for(lambda: any(e["op"] == "c" for e in read_log(config)), 30, "the insert logged")
        code, err = stop_run(proc)
        assert code == 0, err
        conn.execute("SELECT pg_drop_replication_slot('dblog')")
        conn.execute("INSERT INTO t VALUES (2)")  # would be lost
        code, err = run_once(config)
        assert code == 3, err
        assert "replication slot 'dblog' does not exist" in err and "missing from the log" in err
        assert "fresh change log" in err and 'mode = "initial"' in err
        slots = conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()
        assert slots == (0,)


def test_an_invalidated_slot_is_fatal(pg_db: str, pg_cluster: PgCluster, tmp_path: Path) -> None:
    """The slot invalidated while `dblog run` was down (its WAL removed: past
    max_slot_wal_keep_size): it can give no more changes; the restart refuses with a
    fatal error (exit 3, not the retried "unavailable") naming the fix."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg_db)
    proc = start_run(config)
    code, err = stop_run(proc)
    assert code == 0, err
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            wait_for(lambda: conn.execute("SHOW max_slot_wal_keep_size").fetchone() == ("1MB",),
                     30, "reload")
            for i in range(3):
                conn.execute("INSERT INTO t VALUES (%s)", (i,))
                conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            assert conn.execute("SELECT wal_status FROM pg_replication_slots "
                                "WHERE slot_name = 'dblog'").fetchone() == ("lost",)
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
    code, err = run_once(config)
    assert code == 3, err
    assert "replication slot 'dblog' is invalidated" in err and "fresh change log" in err


def test_a_change_log_deleted_while_its_state_file_remains(pg_db: str, tmp_path: Path) -> None:
    """The change log deleted (or replaced) while `[log] path` keeps state.json: resuming
    at state.json's position would write into an empty log that lacks every event before
    it, and `mode = "initial"` would take no snapshot (its flag is in the checkpoint).
    The start is refused, naming both and the fix."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 5)")
    config = write_config(tmp_path, pg_db, extra='[snapshot]\nmode = "initial"\n')
    data = tmp_path / "data"
    proc = start_run(config)
    wait_for(lambda: sum(e["op"] == "r" for e in read_log(config)) == 5, 30, "the snapshot logged")
    wait_for(lambda: (data / "state.json").exists(), 30, "state.json")
    code, err = stop_run(proc)
    assert code == 0, err
    for name in ("changelog.sqlite", "changelog.sqlite-wal", "changelog.sqlite-shm"):
        (data / name).unlink(missing_ok=True)
    code, err = run_once(config)
    assert code == 6, err
    assert f"the change log {data / 'changelog.sqlite'} has no checkpoint" in err
    assert f"the state file {data / 'state.json'} has one at LSN " in err
    assert f"remove {data / 'state.json'}" in err
    assert read_log(config) == []  # nothing was written into the new log
    # (the fix, state.json removed, is followed in the Kafka twin of this test:
    # tests/kafka/test_resume_elsewhere.py::test_a_new_topic_prefix_with_the_old_state_json)
