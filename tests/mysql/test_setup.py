"""Start-up checks: misconfigured servers, missing grants, bad logins give clear errors
(on MariaDB and MySQL 5.7: MariaDB 10.5+ calls REPLICATION CLIENT BINLOG MONITOR)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pydblog.devtools.mariadb import free_port
from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.errors import ConfigError, SourceError, SourceUnavailable
from tests.mysql.helpers import make

SECRET = "s3cr3t-Pw"


@pytest.fixture
def weak_user(server: TestServer, db: str) -> Iterator[str]:
    server.execute(f"CREATE USER 'weak'@'127.0.0.1' IDENTIFIED BY '{SECRET}'")
    try:
        yield "weak"
    finally:
        server.execute("DROP USER 'weak'@'127.0.0.1'")


def _open_as(server: TestServer, db: str, user: str, password: str) -> None:
    src, _ = make(server, db)
    src.dsn = type(src.dsn).parse(server.dsn(db, user=user, password=password))
    try:
        src.open(None)
    finally:
        src.close()


def test_missing_grants_are_each_named(server: TestServer, db: str, weak_user: str) -> None:
    server.execute(f"GRANT SELECT ON `{db}`.* TO 'weak'@'127.0.0.1'")
    with pytest.raises(SourceError) as err:
        _open_as(server, db, weak_user, SECRET)
    msg = str(err.value)
    assert "GRANT REPLICATION SLAVE ON *.* TO 'weak'@'127.0.0.1'" in msg
    assert "GRANT REPLICATION CLIENT ON *.* TO 'weak'@'127.0.0.1'" in msg
    assert "lacks SELECT" not in msg and SECRET not in msg
    server.execute(f"REVOKE SELECT ON `{db}`.* FROM 'weak'@'127.0.0.1'")
    server.execute("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'weak'@'127.0.0.1'")
    # No privilege at all on the database: the login itself is refused, by errno 1044.
    with pytest.raises(SourceError, match=rf"(?s)denied the connection.*GRANT SELECT.*{db}"):
        _open_as(server, db, weak_user, SECRET)
    server.execute(f"GRANT UPDATE ON `{db}`.* TO 'weak'@'127.0.0.1'")
    with pytest.raises(SourceError, match=rf"lacks SELECT on {db}") as err:
        _open_as(server, db, weak_user, SECRET)
    assert "REPLICATION" not in str(err.value)
    # Enough grants to capture, but the signal tables cannot be created.
    server.execute(f"GRANT SELECT ON `{db}`.* TO 'weak'@'127.0.0.1'")
    with pytest.raises(SourceError, match="GRANT CREATE, INSERT, UPDATE"):
        _open_as(server, db, weak_user, SECRET)
    server.execute(f"GRANT CREATE, INSERT, UPDATE ON `{db}`.* TO 'weak'@'127.0.0.1'")
    _open_as(server, db, weak_user, SECRET)


def test_wrong_password_and_unreachable(server: TestServer, db: str, weak_user: str) -> None:
    with pytest.raises(SourceError) as err:
        _open_as(server, db, weak_user, "wrong-" + SECRET)
    assert not isinstance(err.value, SourceUnavailable)
    assert "refused the login" in str(err.value) and SECRET not in str(err.value)
    src, _ = make(server, db)
    src.dsn = type(src.dsn).parse(f"mysql://root:{SECRET}@127.0.0.1:{free_port()}/{db}")
    with pytest.raises(SourceUnavailable) as err2:
        src.open(None)
    assert SECRET not in str(err2.value) and "cannot reach MySQL" in str(err2.value)
    with pytest.raises(SourceError, match="check the database name"):
        _open_as(server, "no_such_db", "root", "root")
    with pytest.raises(ConfigError, match="names no database"):
        make(server, "")


@pytest.mark.parametrize(
    ("variable", "bad"),
    [
        ("binlog_format", "STATEMENT"),
        ("binlog_row_image", "MINIMAL"),
        ("binlog_row_metadata", "MINIMAL"),
    ],
)
def test_binlog_settings_are_checked(server: TestServer, db: str, variable: str, bad: str) -> None:
    if variable == "binlog_row_metadata" and isinstance(server, MySQL57):
        pytest.skip("MySQL 5.7 has no binlog_row_metadata (names come from the schema)")
    (good,) = server.execute(f"SELECT @@GLOBAL.{variable}")[0]
    server.execute(f"SET GLOBAL {variable} = '{bad}'")
    try:
        with pytest.raises(SourceError, match=rf"{variable} is {bad}, must be") as err:
            _open_as(server, db, "root", "root")
        assert f"SET GLOBAL {variable}" in str(err.value)
    finally:
        server.execute(f"SET GLOBAL {variable} = '{good}'")


def test_cli_reports_without_traceback(server: TestServer, db: str, tmp_path: Path) -> None:
    dsn = server.dsn(db, password=SECRET)
    config = tmp_path / "dblog.toml"
    config.write_text(
        f'[source]\ntype = "mysql"\ndsn = "{dsn}"\n[log]\npath = "{tmp_path / "data"}"\n'
    )
    res = subprocess.run(
        [str(Path(sys.executable).parent / "dblog"), "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == SourceError.exit_code, res.stderr
    assert "Traceback" not in res.stderr and SECRET not in res.stderr + res.stdout
    assert "refused the login" in res.stderr
