"""An idle, caught-up capture rewrites its checkpoint every heartbeat interval (same
position), so the change log's checkpoint time moves while the source is idle: how
`dblog sync` knows an idle source is complete up to now (its watermark). Never inside a
transaction. A fake source; the real SQLite change log is the oracle."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydblog.changelog.sqlite import log_path
from pydblog.config import Config
from pydblog.ports import Checkpoint, Commit, Idle
from pydblog.positions import Lsn, PgPosition
from tests.unit.test_runner_mid_tx import FakeSource, event, run

C = Lsn(0x1000)


def _checkpoint_ms(cfg: Config) -> int | None:
    with sqlite3.connect(log_path(cfg.log_dir)) as conn:
        row = conn.execute("SELECT updated_ms FROM checkpoint WHERE id = 1").fetchone()
    return None if row is None else int(row[0])


def config(tmp_path: Path) -> Config:
    return Config.model_validate({
        "source": {"dsn": "postgresql://u@127.0.0.1/db", "heartbeat_interval_s": 0.2},
        "log": {"path": str(tmp_path / "data")},
        "api": {"listen": ""},
    })


def test_idle_capture_moves_its_checkpoint_time(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    stop = threading.Event()
    seen: list[int | None] = []

    def script(src: FakeSource) -> Iterator[Any]:
        yield from (event(i) for i in range(3))
        yield Commit(PgPosition(C, 3, Lsn(0x1100), 7), 1)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            yield Idle()
            time.sleep(0.05)
            seen.append(_checkpoint_ms(cfg))
        # inside a transaction: its events are flushed (a mid-transaction checkpoint,
        # which the sync never takes for a heartbeat), and then no rewrite
        yield event(3)
        for _ in range(3):
            yield Idle()
            time.sleep(0.05)
        mid = _checkpoint_ms(cfg)
        with sqlite3.connect(log_path(cfg.log_dir)) as conn:
            state = conn.execute("SELECT state FROM checkpoint WHERE id = 1").fetchone()[0]
        assert Checkpoint.from_bytes(state).extra.get("mid_tx")
        for _ in range(12):
            yield Idle()
            time.sleep(0.05)
        seen.append(-1)
        assert _checkpoint_ms(cfg) == mid
        stop.set()
        yield Idle()

    run(cfg, script, stop)
    idle = sorted({t for t in seen if t is not None and t != -1})
    assert len(idle) >= 5, idle  # rewritten about every 0.2 s while idle
    assert -1 in seen
