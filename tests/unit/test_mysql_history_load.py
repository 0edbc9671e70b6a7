"""``sources.mysql.history``: the schema history a checkpoint carries, read back (of
the tracked tables only), and a DDL it cannot follow, without a server."""

from __future__ import annotations

import pytest

from pydblog.errors import SourceError
from pydblog.sources.mysql.history import SchemaHistory
from pydblog.sources.mysql.tablemap import SchemaColumn, SchemaTable


def _history() -> SchemaHistory:
    history = SchemaHistory(server_version=50729)
    table = SchemaTable((SchemaColumn("id", "int", "int(11)", None),), ("id",), "utf8mb4")
    history.put(("db", "kept"), table)
    history.put(("db", "other"), table)
    history.forget(("db", "gone"), "ALTER TABLE gone ...")
    return history


def test_load_keeps_the_tracked_tables_only() -> None:
    raw = _history().to_json()
    loaded = SchemaHistory.load(raw, 50729, lambda db, t: t in ("kept", "gone"))
    assert set(loaded.tables) == {("db", "kept")}
    assert loaded.lost == {("db", "gone"): "ALTER TABLE gone ..."}
    assert loaded.server_version == 50729


def test_load_without_a_history_is_empty() -> None:
    loaded = SchemaHistory.load(None, 50644, lambda db, t: True)
    assert loaded.tables == {} and loaded.lost == {} and loaded.server_version == 50644


@pytest.mark.parametrize("raw", [{"v": 99}, {"v": 1, "tables": [["db"]]}])
def test_unreadable_history_names_the_fix(raw: object) -> None:
    with pytest.raises(SourceError, match="schema history cannot be read") as info:
        SchemaHistory.load(raw, 50729, lambda db, t: True)
    assert info.value.hint is not None and "fresh [log] path" in info.value.hint


def test_a_ddl_not_followed_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    history = _history()
    applied = history.follow(
        "ALTER TABLE kept ADD COLUMN g GEOMETRY_OF_THE_FUTURE", "db",
        lambda db, t: True, "binlog.000003:777",
    )
    assert ("db", "kept") in applied.touched
    assert ("db", "kept") not in history.tables and ("db", "kept") in history.lost
    assert "could not follow a DDL on db.kept at binlog.000003:777" in caplog.text
