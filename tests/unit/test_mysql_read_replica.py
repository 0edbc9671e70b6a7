"""``[snapshot] read_dsn`` for MySQL/MariaDB without a server: the config's checks and the
replica's own GTIDs left out of its fences (``sources.mysql.fenced``)."""

from __future__ import annotations

import pytest

from pydblog.config import parse_config
from pydblog.errors import ConfigError, SourceError
from pydblog.sources.mysql.chunks import MySqlSnapshotReader
from pydblog.sources.mysql.factory import create
from pydblog.sources.mysql.fenced import replicated_state, without_source
from pydblog.sources.mysql.gtid import MariaGtidPos, MySqlGtidSet

SRC = "mysql://u:secret@127.0.0.1:3306/app"
A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
B = "4e11fa47-71ca-11e1-9e33-c80aa9429562"


def _cfg(read_dsn: str) -> dict[str, object]:
    return {"source": {"type": "mysql", "dsn": SRC},
            "snapshot": {"watermark": "read-only", "read_dsn": read_dsn}}


def test_read_dsn_builds_a_replica_reader() -> None:
    _, reader = create(parse_config(_cfg("mysql://u:secret@10.0.0.2:3307/app")))
    assert isinstance(reader, MySqlSnapshotReader)
    assert (reader.dsn.host, reader.dsn.port) == ("10.0.0.2", 3307)
    assert reader.source is not None and reader.source.host == "127.0.0.1"
    _, plain = create(parse_config({"source": {"type": "mysql", "dsn": SRC}}))
    assert isinstance(plain, MySqlSnapshotReader) and plain.source is None


@pytest.mark.parametrize(
    ("read_dsn", "message"),
    [
        ("mysql://u:secret@10.0.0.2:3307/other", "names database 'other'"),
        ("postgresql://u:secret@10.0.0.2/app", "snapshot.read_dsn: .* is not a MySQL DSN"),
    ],
)
def test_read_dsn_errors(read_dsn: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        create(parse_config(_cfg(read_dsn)))
    assert "secret" not in str(info.value)


def test_mysql_fence_without_the_replicas_own_gtids() -> None:
    state = MySqlGtidSet.parse(f"{A}:1-100,{B}:1-3")
    assert without_source(state, B.upper()) == MySqlGtidSet.parse(f"{A}:1-100")
    assert without_source(state, "5e11fa47-71ca-11e1-9e33-c80aa9429562") == state


def test_mariadb_fence_without_the_replicas_own_gtids() -> None:
    # The replica (server 12) wrote in a domain of its own: left out.
    assert replicated_state("0-11-500,2-12-3", 12, "r") == MariaGtidPos.parse("0-11-500")
    # Several source servers in one domain (a past failover): the last of the domain.
    assert replicated_state("0-10-90,0-11-500\n,1-11-7", 12, "r") == MariaGtidPos.parse(
        "0-11-500,1-11-7")
    assert replicated_state("", 12, "r") == MariaGtidPos()
    # Its own writes in a domain it also replicates: the domain's state cannot be told.
    with pytest.raises(SourceError, match="GTID domain 0, which it also replicates"):
        replicated_state("0-11-500,0-12-501", 12, "r")
