"""The contract suite runs every scenario against every source harness."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.contract.harness import Harness, PgHarness
from tests.mysql.conftest import mariadb, my_db  # noqa: F401 - fixtures
from tests.mysql.harness import MariaHarness


@pytest.fixture(params=["postgres", "mysql"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "postgres":
        yield PgHarness(request.getfixturevalue("pg_db"))
    else:
        yield MariaHarness(request.getfixturevalue("mariadb"), request.getfixturevalue("my_db"))
