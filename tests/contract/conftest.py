"""The contract suite runs every scenario against every source harness.

PostgreSQL and MariaDB run every scenario. MySQL 5.7 runs those marked ``mysql57`` (the
ones that exercise paths where MySQL differs: GTID sets, column names from the schema,
surrogate keys, DDL); ``PYDBLOG_MYSQL57_ALL=1`` runs all of them against it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.contract.harness import Harness, PgHarness
from tests.mysql.conftest import mariadb, my57_db, my_db, mysql57  # noqa: F401 - fixtures
from tests.mysql.harness import MariaHarness


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness" not in metafunc.fixturenames:
        return
    sources = ["postgres", "mysql"]
    if metafunc.definition.get_closest_marker("mysql57") or os.environ.get(
        "PYDBLOG_MYSQL57_ALL"
    ) == "1":
        sources.append("mysql57")
    metafunc.parametrize("harness", sources, indirect=True)


@pytest.fixture
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "postgres":
        yield PgHarness(request.getfixturevalue("pg_db"))
    elif request.param == "mysql":
        yield MariaHarness(request.getfixturevalue("mariadb"), request.getfixturevalue("my_db"))
    else:
        yield MariaHarness(request.getfixturevalue("mysql57"), request.getfixturevalue("my57_db"))
