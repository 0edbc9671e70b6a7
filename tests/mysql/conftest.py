"""MySQL source fixtures: ``server`` / ``db`` parametrised over both flavours
(``[mariadb]``, ``[mysql57]``), for the tests whose paths differ between them. The
servers themselves (``mariadb``, ``mysql57``, ``my_db``, ``my57_db``) are the session's
(``tests/mysql/servers.py``, registered in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.mysql.servers import Server, _fresh_database


@pytest.fixture(params=["mariadb", "mysql57"])
def server(request: pytest.FixtureRequest) -> Server:
    """The session's server of each flavour."""
    found: Server = request.getfixturevalue(request.param)
    return found


@pytest.fixture
def db(server: Server) -> Iterator[str]:
    """A fresh, empty database on ``server``."""
    yield from _fresh_database(server)
