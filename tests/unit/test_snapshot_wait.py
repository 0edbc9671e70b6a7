"""``dblog snapshot --wait``: the line it ends with, read from the change log."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.config import parse_config
from pydblog.events import EncodedEvent
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition
from pydblog.ui import wait_for_snapshot

SRC = {"type": "postgres", "dsn": "postgresql://u@h/db"}


def _notice(kind: str, signal_id: str, data: dict[str, Any]) -> EncodedEvent:
    body = {"op": "n", "notification": {"type": kind, "signal_id": signal_id,
                                        "additional_data": data}}
    return EncodedEvent("", "n", 0, orjson.dumps(body).decode())


def _wait(tmp_path: Path, notices: list[EncodedEvent]) -> tuple[int, str]:
    cfg = parse_config({"source": SRC, "log": {"path": str(tmp_path / "log")}})
    log = SqliteChangeLog(cfg.log_dir)
    log.append(notices, Checkpoint(PgPosition(Lsn(1), 0, Lsn(1)), None))
    log.close()
    out = io.StringIO()
    code = wait_for_snapshot(cfg, "s1", 0, poll_s=0.01, console=Console(file=out, width=200))
    return code, out.getvalue()


def test_completed_names_the_tables_a_stop_removed(tmp_path: Path) -> None:
    code, text = _wait(tmp_path, [
        _notice("STARTED", "s1", {}),
        _notice("COMPLETED", "s1", {"tables": 1, "aborted_data_collections": ["public.u"]}),
    ])
    assert code == 0
    assert "snapshot s1: completed; stopped before their end: public.u" in text


def test_completed_plain(tmp_path: Path) -> None:
    code, text = _wait(tmp_path, [_notice("STARTED", "s1", {}),
                                  _notice("COMPLETED", "s1", {"tables": 1})])
    assert code == 0 and "snapshot s1: completed\n" in text


def test_aborted_exits_1_with_its_reason(tmp_path: Path) -> None:
    code, text = _wait(tmp_path, [_notice("STARTED", "s1", {}),
                                  _notice("ABORTED", "s1", {"reason": "stopped by s2"})])
    assert code == 1 and "snapshot s1: aborted: stopped by s2" in text
