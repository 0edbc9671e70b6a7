"""MySQL source fixtures: one throwaway MariaDB per session (Debian's mariadb-server,
installed by .ci/install-mariadb.sh if missing), a fresh database per test."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pydblog.devtools.mariadb import MariaDB, find_binaries

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDB]:
    reason = _ensure_mariadb()
    if reason is not None:
        pytest.skip(reason)
    server = MariaDB(server_id=1).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def my_db(mariadb: MariaDB) -> Iterator[str]:
    """The name of a fresh, empty database."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    mariadb.execute(f"CREATE DATABASE `{name}`")
    try:
        yield name
    finally:
        mariadb.execute(f"DROP DATABASE IF EXISTS `{name}`")

