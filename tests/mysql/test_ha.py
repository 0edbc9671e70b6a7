"""High availability with a MariaDB (default run) or MySQL 5.7 (`-m slow`) source:
members share one server_id; a frozen (SIGSTOP) leader's binlog connection is dropped by
the server when the new leader registers with the same id, and the woken ex-leader
steps down without writing."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pydblog.devtools.hamembers import Members
from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.devtools.zookeeper import ZkServer
from tests.chaos import writing
from tests.helpers import wait_for
from tests.mysql.test_oracle import assert_oracle, setup_tables, write_config, writer


def test_mysql_failover_sigstop(mariadb: MariaDB, my_db: str, tmp_path: Path,
                                zk_server: ZkServer) -> None:
    failover_sigstop(mariadb, my_db, tmp_path, zk_server)


@pytest.mark.slow
def test_mysql57_failover_sigstop(mysql57: MySQL57, my57_db: str, tmp_path: Path,
                                  zk_server: ZkServer) -> None:
    failover_sigstop(mysql57, my57_db, tmp_path, zk_server)


def failover_sigstop(mariadb: TestServer, my_db: str, tmp_path: Path,
                     zk_server: ZkServer) -> None:
    setup_tables(mariadb, my_db)
    config = write_config(
        tmp_path, mariadb, my_db,
        f'batch_max_events = 150\n[ha]\nbackend = "zookeeper"\nhosts = "{zk_server.hosts}"\n'
        f'path = "/dblog-test/{my_db}"\nsession_timeout_s = 2.0',
    )
    m = Members(config, config.parent / "data", probe=lambda: server_state(mariadb))
    m.start()
    m.start()
    try:
        first = m.leader()
        m.wait_checkpoint()
        m.wait_standbys(1)
        # Paced: what the writer commits while the members fail over must stay what the
        # capture drains within the oracle's wait on a loaded machine.
        with writing(lambda stop: writer(mariadb, my_db, stop, 3, 0.005)):
            time.sleep(1.5)
            first.send_signal(signal.SIGSTOP)
            second = m.leader(timeout=30, not_pid=first.pid)
            before = m.next_offset()
            # The new leader captures (exactness is what this test checks; bench/failover.py
            # measures the gap).
            m.wait_progress(before, timeout=60)
            if first.poll() is None:
                first.send_signal(signal.SIGCONT)
                wait_for(lambda: "stepping down" in m.log_of(first), 30,
                         "the old leader to step down")
            time.sleep(1.0)
            assert m.roles().get(second.pid) == "leader"
    except BaseException:  # failed: leave no member running
        m.stop_all()
        raise
    try:
        try:
            assert_oracle(config, mariadb, my_db)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{m.diagnosis()}") from None
    finally:
        codes = m.stop_all()
    assert codes[m.procs.index(second)] == 0, m.log_of(second)[-3000:]


def server_state(server: TestServer) -> str:
    """The server's binlog dump threads and binlog files, for a failure's diagnosis."""
    lines = ["processlist (id, user, command, time, state, info):"]
    for r in server.execute("SELECT id, user, command, time, state, LEFT(info, 120) "
                            "FROM information_schema.processlist ORDER BY id"):
        lines.append(f"  {r}")
    lines.append("binary logs:")
    lines.extend(f"  {r}" for r in server.execute("SHOW BINARY LOGS"))
    return "\n".join(lines)
