"""The runner with ``InsertRun``s (Inserts the native decoder encoded, see
``events.InsertRun``): the change log holds the same envelopes as for the same inserts
as single events, and a restart from a checkpoint inside a run's transaction logs each
insert once (``InsertRun.past``). Fake sources; the real SQLite change log is the oracle."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from pydblog.config import Config
from pydblog.events import TAIL_SEP, ChangeEvent, InsertRun, Op
from pydblog.ports import Commit, Idle
from pydblog.positions import Lsn, PgPosition
from tests.unit.test_runner_mid_tx import C, Crash, FakeSource, run

TX = 7


def tail(i: int) -> str:
    return f'{{"id":{i}}}{TAIL_SEP}{{"id":{i},"v":"v{i}"}}}}'


def ins_run(first: int, size: int) -> InsertRun:
    return InsertRun("public", "t", C, first, TX, 1, size,
                     "\n".join(tail(i) for i in range(first, first + size)))


def config(tmp_path: Path, name: str) -> Config:
    return Config.model_validate({
        "source": {"dsn": "postgresql://u@127.0.0.1/db"},
        "log": {"path": str(tmp_path / name), "batch_max_events": 3},
        "api": {"listen": ""},
    })


def envelopes(cfg: Config) -> list[dict[str, Any]]:
    """Every logged envelope without its wall-clock ``ts_ms``."""
    from pydblog.changelog import open_reader

    reader = open_reader(cfg.log)
    try:
        out = []
        for rec in reader.read(0, 10_000):
            env = orjson.loads(rec.body)
            env.pop("ts_ms")
            out.append(env)
        return out
    finally:
        reader.close()


def once(items: list[Any]) -> Callable[[FakeSource], Iterator[Any]]:
    def script(src: FakeSource) -> Iterator[Any]:
        yield from items
        yield Commit(PgPosition(C, 6, Lsn(0x1100), TX), 1)
        yield Idle()
        stop.set()
        yield Idle()

    stop = threading.Event()
    script.stop = stop  # type: ignore[attr-defined]
    return script


def test_runs_log_the_events_they_stand_for(tmp_path: Path) -> None:
    runs = [ins_run(0, 2), ins_run(2, 3), ins_run(5, 1)]
    single = [e for r in runs for e in r.events()]
    assert [e.position for e in single] == [PgPosition(C, i, None, TX) for i in range(6)]
    assert single[3] == ChangeEvent(Op.CREATE, "public", "t", PgPosition(C, 3, None, TX), 1,
                                    {"id": 3}, None, {"id": 3, "v": "v3"})
    logs = {}
    for name, items in (("runs", runs), ("events", single)):
        cfg = config(tmp_path, name)
        script = once(items)
        run(cfg, script, script.stop)  # type: ignore[attr-defined]
        logs[name] = envelopes(cfg)
    assert len(logs["runs"]) == 6
    assert logs["runs"] == logs["events"]


def test_restart_inside_a_run_logs_each_insert_once(tmp_path: Path) -> None:
    cfg = config(tmp_path, "data")

    def first(src: FakeSource) -> Iterator[Any]:
        yield ins_run(0, 2)
        yield ins_run(2, 2)  # batch_max_events (3) reached: flushed at (C, 3)
        from pydblog.changelog import open_writer

        for _ in range(500):
            log = open_writer(cfg.log)
            try:
                cp = log.last_checkpoint()
            finally:
                log.close()
            if cp is not None and cp.position == PgPosition(C, 3):
                raise Crash()
            yield Idle()
            threading.Event().wait(0.01)
        raise AssertionError("the mid-transaction batch never became durable")

    run(cfg, first, threading.Event())
    second = once([ins_run(0, 6)])  # replayed from the transaction's start, cut otherwise
    run(cfg, second, second.stop)  # type: ignore[attr-defined]
    got = envelopes(cfg)
    assert [e["source"]["index"] for e in got] == list(range(6))
    assert [e["after"] for e in got] == [{"id": i, "v": f"v{i}"} for i in range(6)]
