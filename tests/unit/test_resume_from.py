"""Which checkpoint capture resumes from (``runner.resume_from``): the change log's,
unless the local state file is newer, which means the log is not the one that capture
wrote or lost commits: refused, never a silent gap."""

from __future__ import annotations

from pathlib import Path

import pytest

from pydblog.capture.runner import resume_from
from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.config import Config
from pydblog.errors import ChangeLogError
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition
from pydblog.state.file import FileStateStore


def config(tmp_path: Path, kafka: bool = False) -> Config:
    log: dict[str, object] = {"path": str(tmp_path / "data")}
    if kafka:
        log.update(type="kafka", bootstrap_servers="127.0.0.1:9", topic_prefix="app")
    return Config.model_validate({"source": {"dsn": "postgresql://u@127.0.0.1/db"}, "log": log,
                                  "api": {"listen": ""}})


def cp(lsn: int, index: int = 0) -> Checkpoint:
    return Checkpoint(PgPosition(Lsn(lsn), index), {"n": lsn}, {"initial_started": True})


def test_the_log_wins_ties_and_when_it_is_ahead(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert resume_from(None, None, cfg) is None
    log = cp(20)
    assert resume_from(log, None, cfg) is log  # another host: no local state
    assert resume_from(log, cp(20), cfg) is log  # a tie: the log's was committed with the events
    assert resume_from(log, cp(10), cfg) is log  # a crash between the log's commit and the save
    assert resume_from(log, cp(20, 0), cfg) is log
    assert resume_from(log, Checkpoint(None), cfg) is log


def test_a_state_file_ahead_of_an_empty_log_is_refused(tmp_path: Path) -> None:
    """The SQLite file deleted (a new empty one is made), state.json kept."""
    cfg = config(tmp_path)
    state = FileStateStore(cfg.log_dir)
    state.save(cp(0x16B3F28, 3))
    changelog = SqliteChangeLog(cfg.log.path)
    try:
        with pytest.raises(ChangeLogError) as err:
            resume_from(changelog.last_checkpoint(), state.load(), cfg)
    finally:
        changelog.close()
    text, hint = err.value.message, err.value.hint or ""
    assert f"the change log {cfg.log_dir / 'changelog.sqlite'} has no checkpoint" in text
    assert f"the state file {cfg.log_dir / 'state.json'} has one at LSN 0/16B3F28 (index 3)" in text
    assert "SQLite file deleted" in text and "does not start" in text
    assert f"remove {cfg.log_dir / 'state.json'}" in hint and 'mode = "initial"' in hint
    assert err.value.exit_code == 6 and not err.value.retriable


def test_a_state_file_ahead_of_an_older_log_is_refused(tmp_path: Path) -> None:
    """The SQLite file replaced by an older copy: the commits after it are missing."""
    cfg = config(tmp_path)
    changelog = SqliteChangeLog(cfg.log.path)
    try:
        changelog.append([], cp(0x100))
        with pytest.raises(ChangeLogError) as err:
            resume_from(changelog.last_checkpoint(), cp(0x200), cfg)
    finally:
        changelog.close()
    text, hint = err.value.message, err.value.hint or ""
    assert "has an older checkpoint, at LSN 0/100 (index 0), but the state file" in text
    assert "has one at LSN 0/200 (index 0)" in text
    assert "another [log] path" in hint and "Removing only" in hint


def test_the_kafka_log_is_named(tmp_path: Path) -> None:
    cfg = config(tmp_path, kafka=True)
    with pytest.raises(ChangeLogError) as err:
        resume_from(None, cp(5), cfg)
    assert err.value.message.startswith("the Kafka change log 'app' at 127.0.0.1:9 has no checkpoint")
    assert "topic_prefix or bootstrap_servers changed" in err.value.message


def test_an_older_log_of_a_mysql_source_may_drop_the_state_file(tmp_path: Path) -> None:
    """Acknowledging a MySQL/MariaDB source discards nothing (the binlog
    has its own expiry, and the source refuses clearly when what it needs is gone), so
    for a log restored from an older copy the hint offers removing state.json, not only
    a new log and a full snapshot. A Kafka log's message names a checkpoint topic whose
    retention deleted checkpoints as a cause."""
    from pydblog.sources.mysql.position import BinlogPosition

    cfg = config(tmp_path, kafka=True)
    older = Checkpoint(BinlogPosition("binlog.000003", 400), None, {})
    newer = Checkpoint(BinlogPosition("binlog.000004", 120), None, {})
    with pytest.raises(ChangeLogError) as err:
        resume_from(older, newer, cfg)
    text, hint = err.value.message, err.value.hint or ""
    assert f"remove {cfg.log_dir / 'state.json'}" in hint and "binlog still holds" in hint
    assert "refuses" in hint  # (when the binlog no longer holds them)
    assert "checkpoint topic" in text and "retention" in text
    with pytest.raises(ChangeLogError) as err:  # PostgreSQL: the slot gave them already
        resume_from(cp(0x100), cp(0x200), cfg)
    assert "slot" in (err.value.hint or "") and "Removing only" in (err.value.hint or "")
