"""The warning for semi-synchronous replication on MySQL without GTIDs (blocking reads
cannot be fenced there, ``MySqlSnapshotReader.fences_blocking_reads``), without a server:
the variable lookup answered as MySQL answers ``SHOW GLOBAL VARIABLES LIKE``."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest

from pydblog.config import parse_config
from pydblog.sources.mysql.chunks import MySqlSnapshotReader
from pydblog.sources.mysql.factory import create


class _Cursor:
    def __init__(self, variables: dict[str, str]) -> None:
        self.variables = variables
        self.rows: list[tuple[Any, ...]] = []

    def __enter__(self) -> _Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def execute(self, sql: str, args: object = None) -> None:
        if sql == "SELECT @@GLOBAL.gtid_mode":
            self.rows = [(self.variables["gtid_mode"],)]
            return
        like = re.fullmatch(r"SHOW GLOBAL VARIABLES LIKE '([^']*)'", sql)
        assert like is not None, sql
        pattern = like.group(1).replace("%", ".*").replace("_", ".")  # (names: [a-z_])
        self.rows = [(k, v) for k, v in sorted(self.variables.items())
                     if re.fullmatch(pattern, k, re.IGNORECASE)]

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


class _Conn:
    def __init__(self, variables: dict[str, str]) -> None:
        self.variables = variables

    def cursor(self) -> _Cursor:
        return _Cursor(self.variables)


def _reader(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str]) -> MySqlSnapshotReader:
    _, reader = create(parse_config({"source": {"type": "mysql",
                                                "dsn": "mysql://u:secret@127.0.0.1:3306/app"}}))
    assert isinstance(reader, MySqlSnapshotReader)
    reader._mariadb = False
    conn = _Conn(variables)
    monkeypatch.setattr(reader, "_connection", lambda: conn)
    return reader


@pytest.mark.parametrize(
    ("variables", "warned"),
    [
        # MySQL 5.7 / 8.0 with the old plugin (semisync_master)
        ({"rpl_semi_sync_master_enabled": "ON"}, True),
        # MySQL 8.0.26+ with semisync_source, and 8.4 (only that name)
        ({"rpl_semi_sync_source_enabled": "ON"}, True),
        ({"rpl_semi_sync_source_enabled": "OFF"}, False),
        # a replica's side of semi-sync is not a source's wait
        ({"rpl_semi_sync_replica_enabled": "ON", "rpl_semi_sync_slave_enabled": "ON"}, False),
        ({}, False),
    ],
)
def test_semisync_warning_without_gtids(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    variables: dict[str, str], warned: bool,
) -> None:
    """Every name of the semi-sync source variable is looked up, not only
    ``rpl_semi_sync_master_enabled``: MySQL 8.0.26+'s ``semisync_source`` plugin (and
    8.4's only name) warns too."""
    reader = _reader(monkeypatch, {"gtid_mode": "OFF", **variables})
    with caplog.at_level(logging.WARNING):
        assert reader.fences_blocking_reads() is False
    assert ("semi-synchronous replication is on" in caplog.text) is warned


def test_gtid_mode_on_fences_blocking_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Yes with GTIDs, and the reader's fenced reads are then blocking reads only: if
    gtid_mode is lowered later they fall back unfenced (``open_fenced``)."""
    reader = _reader(monkeypatch, {"gtid_mode": "ON"})
    assert not reader._order.blocking_only
    assert reader.fences_blocking_reads() is True
    assert reader._order.blocking_only and reader.fork()._order.blocking_only
