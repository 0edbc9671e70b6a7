"""A read-only snapshot across a failover: `dblog run` snapshots with GTID fences on the
primary under load, is killed mid-snapshot (its last checkpoint holds the snapshot's
progress and the GTID summary of the events no fence had settled), the replica catches
up and is promoted, and `dblog run` pointed at it finishes the snapshot there under load.
The change log equals the new primary's tables, and no binlog row change is logged
twice. The capture user cannot write (the server refuses it)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson
import pytest

from pydblog.devtools.mysql57 import TestServer
from pydblog.sources.mysql.setup import OwnTables, signal_table_ddl
from tests.chaos import writing
from tests.helpers import kill9, read_log, start_run, stop_run, wait_for
from tests.mysql.test_failover import _pair, new_database, rows_of
from tests.mysql.test_oracle import TABLES, catch_up, materialize, setup_tables, writer


def _read_only_user(server: TestServer, db: str) -> str:
    user = f"ro_{uuid.uuid4().hex[:8]}"
    server.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'ro'")
    server.execute(f"GRANT SELECT ON `{db}`.* TO '{user}'@'127.0.0.1'")
    server.execute(f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'@'127.0.0.1'")
    return user


# ~35 s a flavour: in the slow set (`pytest -m slow`).
@pytest.mark.slow
@pytest.mark.parametrize("flavour", ["mariadb", "mysql57"])
def test_read_only_snapshot_across_a_failover(flavour: str, tmp_path: Path) -> None:
    with _pair(flavour) as (primary, replica):
        db = new_database(primary, replica)
        setup_tables(primary, db)
        own = OwnTables((db, "dblog_signal"), (db, "dblog_watermark"),
                        ("public", "dblog_signal"), ("public", "dblog_watermark"))
        primary.execute(signal_table_ddl(own))
        values = ", ".join(f"({i}, 'old{i}', {i % 5}, {i}.5, '2020-01-01', '{{}}')"
                           for i in range(1000, 3000))
        primary.execute(f"INSERT INTO w VALUES {values}", db)
        user = _read_only_user(primary, db)  # replicated: the same user on the replica
        replica.wait_caught_up(primary)
        config = tmp_path / "dblog.toml"
        config.write_text(
            f'[source]\ntype = "mysql"\ndsn = "{primary.dsn(db, user=user, password="ro")}"\n'
            f'server_id = 779\ntables = ["{db}\\\\.w.*", "{db}\\\\.marker"]\n'
            f'heartbeat_interval_s = 0.5\n[log]\npath = "{tmp_path / "data"}"\n'
            '[snapshot]\nchunk_size = 40\nwatermark = "read-only"\n'
        )
        proc = start_run(config)
        with writing(lambda stop: writer(primary, db, stop, 31)):
            data = orjson.dumps({"data-collections": [rf"{db}\.w.*"]}).decode()
            with primary.admin(db) as cur:  # as an administrator: the capture user cannot
                cur.execute("INSERT INTO dblog_signal VALUES (%s, %s, %s)",
                            ("s1", "execute-snapshot", data))
            wait_for(lambda: sum(e["op"] == "r" for e in read_log(config)) >= 400, 60,
                     "snapshot rows from the primary")
            kill9(proc)
        replica.wait_caught_up(primary)
        primary.stop()
        replica.promote()
        config.write_text(config.read_text().replace(
            primary.dsn(db, user=user, password="ro"), replica.dsn(db, user=user, password="ro")))
        proc = start_run(config)
        with writing(lambda stop: writer(replica, db, stop, 32)):
            time.sleep(1.0)
        try:
            wait_for(lambda: any(e["op"] == "n" and e["notification"]["type"] == "COMPLETED"
                                 for e in read_log(config)), 120, "the snapshot's end")
            events = catch_up(config, replica, db)
            want = {table: rows_of(replica, db, table) for table in TABLES}
        finally:
            code, err = stop_run(proc)
        assert code == 0, err[-3000:]
    got = materialize(events)
    for table in TABLES:
        assert got.get(table, {}) == want[table], f"{table} differs"
    logged = [e for e in events if e["source"]["snapshot"] == "false"]
    ids = [(e["source"]["gtid"], e["source"]["index"]) for e in logged]
    assert len(ids) == len(set(ids)), "a row change was logged twice"
    files = {e["source"]["file"].split(".")[0] for e in events if e["op"] == "r"}
    assert files == {"primary-bin", "replica-log"}, files
