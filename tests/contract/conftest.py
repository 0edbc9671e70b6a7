"""The contract suite runs every scenario against every source harness."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.contract.harness import Harness, PgHarness


@pytest.fixture(params=["postgres"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "postgres":
        dsn = request.getfixturevalue("pg_db")
        yield PgHarness(dsn)
    else:  # pragma: no cover - other sources register here
        raise AssertionError(request.param)
