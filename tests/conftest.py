"""Shared fixtures: a throwaway PostgreSQL cluster per test session, a fresh database
per test (random name, dropped with its replication slots at teardown)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import settings

from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.zookeeper import ZkServer
from pydblog.devtools.zookeeper import available as zookeeper_available
from tests.helpers import end_started

# Session servers shared by several suites are registered here, once: a fixture imported
# into two conftests is two fixtures, each starting its own server.
from tests.kafka_broker import kafka_bootstrap  # noqa: F401 - fixture
from tests.mysql.servers import mariadb, my57_db, my_db, mysql57  # noqa: F401 - fixtures

# Hypothesis's default 200 ms deadline per example is a timing assertion: on a loaded
# machine (or beside the other xdist worker) a plain parse example took 256 ms and
# failed tests/mysql/test_gtid.py. No deadline anywhere; a test's own settings may
# still set other limits.
settings.register_profile("pydblog", deadline=None)
settings.load_profile("pydblog")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``tansu`` start a Tansu broker (``pip install 'pydblog[kafka-test]'``)
    and check the change log's handling of what it, unlike Apache Kafka, does (records of
    aborted transactions delivered, storage stalls, a retried produce appended twice):
    they run only with ``PYDBLOG_TEST_TANSU=1``."""
    import os

    if os.environ.get("PYDBLOG_TEST_TANSU") == "1":
        return
    skip = pytest.mark.skip(reason="a Tansu broker's behaviour: set PYDBLOG_TEST_TANSU=1")
    for item in items:
        if item.get_closest_marker("tansu") is not None:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Every `dblog run` a test started (``helpers.start_run``) is ended and its stderr
    pipe closed when the test's body ends, passed or failed, before its fixtures are torn
    down (a database is dropped with its slots): one left running by a failed test held
    its slot and its open pipe was an unraisable ``ResourceWarning`` in whichever test
    ran next."""
    try:
        yield
    finally:
        end_started()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    cluster = PgCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


def drop_database(cluster: PgCluster, name: str) -> None:
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE database = %s AND active_pid IS NOT NULL",
            (name,),
        )
        for _ in range(50):
            rows = conn.execute(
                "SELECT slot_name, active FROM pg_replication_slots WHERE database = %s", (name,)
            ).fetchall()
            if not rows:
                break
            settled = True  # every slot dropped: look again at once (no 0.1 s a test)
            for slot, active in rows:
                settled = settled and not active
                if not active:
                    try:
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    except psycopg.Error:
                        settled = False
            if not settled:  # a walsender still exiting: give it a moment
                import time

                time.sleep(0.1)
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_db(pg_cluster: PgCluster) -> Iterator[str]:
    """The DSN of a fresh, empty database (superuser connection)."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    dsn = pg_cluster.create_database(name)
    try:
        yield dsn
    finally:
        drop_database(pg_cluster, name)


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZkServer]:
    """A ZooKeeper server (Debian's package) for the high-availability tests."""
    if not zookeeper_available():
        pytest.fail("ZooKeeper is not installed: apt-get install zookeeper (bash .ci/run does)")
    pytest.importorskip("kazoo", reason="the [ha] extra: pip install -e '.[ha]'")
    server = ZkServer().start()
    try:
        yield server
    finally:
        server.stop()
