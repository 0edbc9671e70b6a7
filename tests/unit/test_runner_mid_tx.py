"""The runner after a restart from a checkpoint inside a transaction (a batch that
reached ``batch_max_events``): nothing it places itself (a direct signal's notification,
read-only rows) may take a position before the replayed transaction's Commit, or it
would share a position with an event of that transaction, and a later restart would
skip that event. A fake source replays the transaction as PostgreSQL does (the slot
restarts before it) with idle moments first; the real SQLite change log is the oracle."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from pydblog.capture.inbox import INBOX, Offer
from pydblog.capture.runner import Runner
from pydblog.changelog import open_reader, open_writer
from pydblog.config import Config
from pydblog.events import ChangeEvent, Op
from pydblog.ports import Checkpoint, Commit, Idle
from pydblog.positions import Lsn, PgPosition
from pydblog.state.file import FileStateStore

C = Lsn(0x1000)
N = 5  # events in the transaction


def event(i: int) -> ChangeEvent:
    return ChangeEvent(Op.CREATE, "public", "t", PgPosition(C, i, Lsn(0x1100), 7), 1,
                       key={"id": i}, after={"id": i, "v": f"v{i}"})


class Crash(Exception):
    pass


class FakeSource:
    connector = "postgresql"
    db = "db"

    def __init__(self, script: Callable[[FakeSource], Iterator[Any]]) -> None:
        self.script = script
        self.opened_at: Checkpoint | None = None

    def open(self, checkpoint: Checkpoint | None) -> None:
        self.opened_at = checkpoint

    def stream(self) -> Iterator[Any]:
        yield from self.script(self)

    def ack(self, position: Any) -> None:
        pass

    def lag_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        pass


class FakeReader:
    def captured_tables(self) -> list[str]:
        return ["public.t"]


def config(tmp_path: Path) -> Config:
    return Config.model_validate({
        "source": {"dsn": "postgresql://u@127.0.0.1/db"},
        "log": {"path": str(tmp_path / "data"), "batch_max_events": 3},
        "api": {"listen": ""},
    })


def run(cfg: Config, script: Callable[[FakeSource], Iterator[Any]], stop: threading.Event) -> None:
    changelog = open_writer(cfg.log)
    runner = Runner(cfg, FakeSource(script), FakeReader(), changelog,  # type: ignore[arg-type]
                    FileStateStore(cfg.log_dir))
    try:
        runner.run(stop)
    except Crash:
        pass
    finally:
        runner.writer.close()
        changelog.close()


def logged(cfg: Config) -> list[tuple[str, tuple[int, int]]]:
    """(op, (lsn, index)) of every logged event, in log order."""
    reader = open_reader(cfg.log)
    try:
        out = []
        for rec in reader.read(0, 10_000):
            src = orjson.loads(rec.body)["source"]
            out.append((rec.op, (int(src["lsn"]), int(src["index"]))))
        return out
    finally:
        reader.close()


def wait_checkpoint(cfg: Config) -> Iterator[Any]:
    """Idle until the mid-transaction batch is durable, then crash."""
    for _ in range(500):
        log = open_writer(cfg.log)
        try:
            cp = log.last_checkpoint()
        finally:
            log.close()
        if cp is not None and cp.position == PgPosition(C, 2):
            raise Crash()
        yield Idle()
        threading.Event().wait(0.01)
    raise AssertionError("the mid-transaction batch never became durable")


def test_no_position_is_taken_before_the_replayed_transaction_commits(tmp_path: Path) -> None:
    cfg = config(tmp_path)

    def first(src: FakeSource) -> Iterator[Any]:
        yield from (event(i) for i in range(3))  # batch_max_events: flushed at (C, 2)
        yield from wait_checkpoint(cfg)

    run(cfg, first, threading.Event())
    offer: list[Offer] = []
    stop = threading.Event()

    def second(src: FakeSource) -> Iterator[Any]:
        assert src.opened_at is not None and src.opened_at.position == PgPosition(C, 2)
        offer.append(INBOX.offer("sig-1", "pause-snapshot", {}))
        for _ in range(5):  # the walsender re-decodes the transaction meanwhile
            yield Idle()
        yield from (event(i) for i in range(N))
        yield Commit(PgPosition(C, N, Lsn(0x1100), 7), 1)
        for _ in range(5):
            yield Idle()
            if offer[0].done.is_set():
                break
        stop.set()
        yield Idle()

    run(cfg, second, stop)
    assert offer[0].done.is_set() and offer[0].outcome == "applied"
    items = logged(cfg)
    positions = [p for _, p in items]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), items
    assert [op for op, _ in items] == ["c"] * N + ["n"], items
