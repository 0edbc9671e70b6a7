"""The election port against real backends: ZooKeeper and a PostgreSQL advisory lock.

Each backend: one leader at a time, epochs strictly increase in leadership order, a
release hands over at once, a lost session ends the leader's lease and elects another.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest

from pydblog.devtools.zookeeper import ZkServer
from pydblog.errors import LeadershipLost
from pydblog.ha.lease import DeadlineLease
from pydblog.ha.pglock import PgLockElection, lock_key
from pydblog.ports import Election, Lease

TIMEOUT_S = 2.0


def campaign_in_thread(election: Election) -> tuple[threading.Thread, list[Lease | None], threading.Event]:
    out: list[Lease | None] = []
    stop = threading.Event()
    t = threading.Thread(target=lambda: out.append(election.campaign(stop)), daemon=True)
    t.start()
    return t, out, stop


def wait_lease(out: list[Lease | None], timeout: float = 20) -> Lease:
    deadline = time.monotonic() + timeout
    while not out:
        assert time.monotonic() < deadline, "no leadership in time"
        time.sleep(0.02)
    lease = out[0]
    assert lease is not None
    return lease


def handover(make: Callable[[str], Election]) -> None:
    a, b = make("a"), make("b")
    try:
        stop = threading.Event()
        la = a.campaign(stop)
        assert la is not None
        la.check()
        t, out, stop_b = campaign_in_thread(b)
        time.sleep(1.0)
        assert not out, "a second leader while the first holds leadership"
        assert b.leader() == "a"
        la.release()
        lb = wait_lease(out)
        assert lb.epoch > la.epoch
        with pytest.raises(LeadershipLost):
            la.check()
        lb.check()
        # a stopped campaign returns None
        c = make("c")
        _, out_c, stop_c = campaign_in_thread(c)
        time.sleep(0.3)
        stop_c.set()
        deadline = time.monotonic() + 10
        while not out_c and time.monotonic() < deadline:
            time.sleep(0.02)
        assert out_c == [None]
        c.close()
        lb.release()
        stop_b.set()
        t.join(5)
    finally:
        a.close()
        b.close()


def test_zookeeper_handover(zk_server: ZkServer) -> None:
    from pydblog.ha.zookeeper import ZkElection

    path = f"/t/{uuid.uuid4().hex}"
    handover(lambda name: ZkElection(zk_server.hosts, path, TIMEOUT_S, name))


def test_postgres_lock_handover(pg_db: str) -> None:
    path = f"/t/{uuid.uuid4().hex}"
    handover(lambda name: PgLockElection(pg_db, path, "public.dblog_ha", TIMEOUT_S, name))


def test_zookeeper_session_loss(zk_server: ZkServer) -> None:
    """The leader's session expires (another client with its session id closes it):
    its lease ends and the standby leads with a newer epoch."""
    from kazoo.client import KazooClient

    from pydblog.ha.zookeeper import ZkElection

    path = f"/t/{uuid.uuid4().hex}"
    a = ZkElection(zk_server.hosts, path, TIMEOUT_S, "a")
    b = ZkElection(zk_server.hosts, path, TIMEOUT_S, "b")
    try:
        la = a.campaign(threading.Event())
        assert la is not None
        _, out, stop_b = campaign_in_thread(b)
        sid, pwd = a._client.client_id
        killer = KazooClient(hosts=zk_server.hosts, client_id=(sid, pwd), timeout=TIMEOUT_S)
        killer.start()
        killer.stop()
        killer.close()
        lb = wait_lease(out)
        assert lb.epoch > la.epoch
        deadline = time.monotonic() + TIMEOUT_S * 2
        while not isinstance(la, DeadlineLease) or not la.lost:
            assert time.monotonic() < deadline, "the old leader still believes it leads"
            time.sleep(0.05)
        stop_b.set()
    finally:
        a.close()
        b.close()


def test_postgres_lock_session_loss(pg_db: str) -> None:
    """The leader's lock connection is terminated: its lease ends at the next ping and
    the standby takes the lock with a newer epoch."""
    path = f"/t/{uuid.uuid4().hex}"
    a = PgLockElection(pg_db, path, "public.dblog_ha", TIMEOUT_S, "a")
    b = PgLockElection(pg_db, path, "public.dblog_ha", TIMEOUT_S, "b")
    try:
        la = a.campaign(threading.Event())
        assert la is not None
        _, out, stop_b = campaign_in_thread(b)
        key = lock_key(path)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = %s",
                (key,),
            )
        lb = wait_lease(out)
        assert lb.epoch > la.epoch
        deadline = time.monotonic() + TIMEOUT_S * 2
        while not isinstance(la, DeadlineLease) or not la.lost:
            assert time.monotonic() < deadline, "the old leader still believes it leads"
            time.sleep(0.05)
        stop_b.set()
    finally:
        a.close()
        b.close()


def test_postgres_lock_idle_leader_loses_the_lock(pg_db: str) -> None:
    """A leader that stops talking (frozen) loses the lock after idle_session_timeout,
    without anyone terminating it."""
    path = f"/t/{uuid.uuid4().hex}"
    a = PgLockElection(pg_db, path, "public.dblog_ha", TIMEOUT_S, "a")
    b = PgLockElection(pg_db, path, "public.dblog_ha", TIMEOUT_S, "b")
    try:
        la = a.campaign(threading.Event())
        assert la is not None
        a._io.acquire()  # the renewer can no longer ping: as if the process froze
        started = time.monotonic()
        _, out, stop_b = campaign_in_thread(b)
        lb = wait_lease(out)
        assert lb.epoch > la.epoch
        assert time.monotonic() - started >= TIMEOUT_S * 0.7
        with pytest.raises(LeadershipLost):
            la.check()
        a._io.release()
        stop_b.set()
    finally:
        a.close()
        b.close()
