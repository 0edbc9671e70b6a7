"""The contract suite runs every scenario against every source harness.

PostgreSQL and MariaDB run every scenario. MySQL 5.7 runs those marked ``mysql57`` (the
ones that exercise paths where MySQL differs: GTID sets, column names from the schema,
surrogate keys, DDL); ``PYDBLOG_MYSQL57_ALL=1`` runs all of them against it too.
``postgres+kafka`` (the PostgreSQL source writing a Kafka change log) runs the scenarios
in ``KAFKA_SCENARIOS``; ``PYDBLOG_KAFKA_ALL=1`` runs all of them on Kafka too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.contract.harness import Harness, KafkaLogHarness, PgHarness
from tests.mysql.harness import MariaHarness

KAFKA_SCENARIOS = {
    "test_snapshot_only",
    "test_writes_during_snapshot",
    "test_kill9_mid_snapshot_resumes",
    "test_blocking_snapshot",
    "test_initial_mode_on_first_start",
    "test_soak_snapshots_under_load_with_kill9",
    "test_soak_long",
}
"""The scenarios that also run on a Kafka log: snapshots under writes, kill -9 mid-snapshot,
blocking and initial snapshots (the others exercise the source and the snapshot core,
which do not depend on the log)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness" not in metafunc.fixturenames:
        return
    sources = ["postgres", "mysql"]
    if metafunc.definition.get_closest_marker("mysql57") or os.environ.get(
        "PYDBLOG_MYSQL57_ALL"
    ) == "1":
        sources.append("mysql57")
    if metafunc.function.__name__ in KAFKA_SCENARIOS or os.environ.get("PYDBLOG_KAFKA_ALL") == "1":
        sources.append("postgres+kafka")
    metafunc.parametrize("harness", sources, indirect=True)


@pytest.fixture
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "postgres":
        yield PgHarness(request.getfixturevalue("pg_db"))
    elif request.param == "postgres+kafka":
        pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")
        yield KafkaLogHarness(PgHarness(request.getfixturevalue("pg_db")),
                              request.getfixturevalue("kafka_bootstrap"))
    elif request.param == "mysql":
        yield MariaHarness(request.getfixturevalue("mariadb"), request.getfixturevalue("my_db"))
    else:
        yield MariaHarness(request.getfixturevalue("mysql57"), request.getfixturevalue("my57_db"))
