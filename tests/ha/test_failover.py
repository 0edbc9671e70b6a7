"""End to end: two or three `dblog run` with one [ha] config under a write load.
kill -9 of the leader, then SIGSTOP of the next one (which must not write once it
wakes up): the change log materializes to the source, nothing is logged twice."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import orjson
import psycopg
import pytest

from tests.chaos import pg_writer, writing
from tests.ha.helpers import duplicates, ha_config, members
from tests.helpers import assert_oracle, dblog, wait_for


@pytest.mark.parametrize("backend", ["zookeeper", pytest.param("postgres", marks=pytest.mark.slow)])
def test_failover_kill9_and_sigstop(backend: str, pg_db: str, tmp_path: Path,
                                    request: pytest.FixtureRequest) -> None:
    hosts = request.getfixturevalue("zk_server").hosts if backend == "zookeeper" else None
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)")
    config = ha_config(tmp_path, pg_db, hosts, timeout_s=2.0, extra="batch_max_events = 200")
    m = members(config)
    m.start()
    m.start()
    try:
        first = m.leader()
        m.wait_checkpoint()
        m.wait_standbys(1)
        status = orjson.loads(dblog("status", "--config", str(config), "--json").stdout)
        assert status["ha"]["leader"].endswith(f":{first.pid}")
        assert len(status["ha"]["standbys"]) == 1
        with writing(pg_writer(pg_db, 7)):
            time.sleep(1.0)
            first.send_signal(signal.SIGKILL)
            first.wait()
            second = m.leader(timeout=30)
            m.start()  # a new standby
            m.wait_standbys(1)
            time.sleep(1.0)
            second.send_signal(signal.SIGSTOP)
            third = m.leader(timeout=30, not_pid=second.pid)
            time.sleep(1.0)
            if second.poll() is None:  # not killed as a frozen lock holder (ha.stonith)
                second.send_signal(signal.SIGCONT)  # wakes up as an ex-leader: must step down
                wait_for(lambda: "stepping down" in m.log_of(second) or second.poll() is not None,
                         30, "the old leader to step down")
            time.sleep(0.5)
            assert m.roles().get(third.pid) == "leader"
    except BaseException:  # failed: leave no member running
        m.stop_all()
        raise
    try:
        events = assert_oracle(config, pg_db, {"public.w": ["id"]})
    finally:
        codes = m.stop_all()
    assert duplicates(events) == 0
    assert not [p.pid for p in m.procs if "Traceback" in m.log_of(p)]
    code = {p.pid: c for p, c in zip(m.procs, codes, strict=True)}
    assert code[third.pid] == 0, m.log_of(third)[-2000:]
    # the frozen ex-leader stepped down and stopped cleanly, or it froze inside a commit
    # (holding the log's write lock) and the new leader killed it (ha.stonith)
    assert code[second.pid] == 0 or (
        code[second.pid] == -signal.SIGKILL and "killing it" in m.log_of(third)
    ), m.log_of(second)[-2000:]


def test_sigterm_hands_over_at_once(pg_db: str, tmp_path: Path) -> None:
    """SIGTERM of the leader: it flushes, exits 0 and releases leadership right away, so
    the standby leads long before the (deliberately long) session timeout could expire.
    The PostgreSQL advisory-lock backend, so the default run covers it end to end."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)")
    config = ha_config(tmp_path, pg_db, None, timeout_s=60.0)
    m = members(config)
    m.start()
    m.start()
    try:
        first = m.leader()
        m.wait_checkpoint()
        m.wait_standbys(1)
        with writing(pg_writer(pg_db, 9)):
            time.sleep(1.0)
            first.send_signal(signal.SIGTERM)
            assert first.wait(30) == 0, m.log_of(first)[-2000:]
            assert "released" in m.log_of(first)
            second = m.leader(timeout=30)  # far less than the 60 s session timeout
            assert second is not first
    except BaseException:  # failed: leave no member running
        m.stop_all()
        raise
    try:
        events = assert_oracle(config, pg_db, {"public.w": ["id"]})
    finally:
        codes = m.stop_all()
    assert duplicates(events) == 0
    assert codes == [0, 0]


def test_sigterm_while_zookeeper_is_down(pg_db: str, tmp_path: Path) -> None:
    """Leader and standby stop on SIGTERM although ZooKeeper is gone (kazoo's calls
    wait for the connection to come back: they used to keep both running)."""
    from pydblog.devtools.zookeeper import ZkServer

    zk = ZkServer().start()
    try:
        config = ha_config(tmp_path, pg_db, zk.hosts, timeout_s=2.0)
        m = members(config)
        m.start()
        m.start()
        try:
            m.leader()
            m.wait_standbys(1)
            zk.kill()
            time.sleep(1.0)
            for p in m.procs:
                p.send_signal(signal.SIGTERM)
            for p in m.procs:
                assert p.wait(20) == 0, m.log_of(p)[-2000:]
        finally:
            m.stop_all()
    finally:
        zk.stop()
