"""The snapshot driver's pacing: chunk requests wait while the change log writer's
queue is full (the stream comes first), but never longer than MAX_HOLD_S."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from pydblog.capture import driver as driver_mod
from pydblog.capture.driver import SnapshotDriver
from pydblog.config import Config
from pydblog.ports import TableInfo


class _Reader:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.called = threading.Event()

    def captured_tables(self) -> list[str]:
        return ["public.t"]

    def table_info(self, qualified: str, surrogate_key: str | None = None) -> TableInfo | None:
        self.calls.append(f"table_info {qualified}")
        self.called.set()
        return None

    def write_watermark(self, watermark_id: str) -> None:
        self.calls.append(f"watermark {watermark_id}")


def _driver(tmp_path: Path) -> tuple[SnapshotDriver, _Reader]:
    cfg = Config.model_validate(
        {"source": {"dsn": "postgresql://u@127.0.0.1/db"}, "log": {"path": str(tmp_path)}}
    )
    reader = _Reader()
    d = SnapshotDriver(cfg, reader, None)  # type: ignore[arg-type]
    d.start_initial(["public.t"])
    return d, reader


def test_requests_wait_while_held(tmp_path: Path) -> None:
    d, reader = _driver(tmp_path)
    d.hold = lambda: True
    d.submit_next()
    assert not reader.called.wait(0.2)
    d.hold = lambda: False
    d.submit_next()
    assert reader.called.wait(5)


def test_a_hold_never_lasts_longer_than_max_hold(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(driver_mod, "MAX_HOLD_S", 0.05)
    d, reader = _driver(tmp_path)
    d.hold = lambda: True
    d.submit_next()
    assert not reader.called.is_set()
    threading.Event().wait(0.06)
    d.submit_next()
    assert reader.called.wait(5)
    assert reader.calls[0] == "table_info public.t"


def test_close_ends_the_worker_threads(tmp_path: Path) -> None:
    d, reader = _driver(tmp_path)
    d.submit_next()
    assert reader.called.wait(5)
    worker = d._worker
    assert worker is not None and worker.is_alive()
    d.close()
    assert not worker.is_alive()


def test_after_a_read_that_could_not_decide_the_next_request_waits(tmp_path: Path) -> None:
    """An inconclusive read (an uncovered fenced start or chunk) is
    not followed by the next request at once (``core.retry``)."""
    d, reader = _driver(tmp_path)
    d.core._read_again = 1  # as if the last read could not decide
    d.submit_next()
    assert not reader.called.wait(0.02)  # within the first wait (0.05 s)
    threading.Event().wait(0.06)
    d.submit_next()
    assert reader.called.wait(5)


def test_a_blocking_snapshot_backs_off_after_a_read_that_could_not_decide(tmp_path: Path) -> None:
    """Fenced blocking reads are read again while they cannot decide (a
    delivered commit still waits for a synchronous standby): ``run_blocking`` waits
    between them as ``submit_next`` does, instead of a tight loop of reads."""
    import json
    import time

    from pydblog.core import parse_signal
    from pydblog.positions import Lsn, PgPosition

    d, reader = _driver(tmp_path)
    at: list[float] = []
    reader.table_info = lambda *a, **k: at.append(time.monotonic())  # type: ignore[method-assign]
    signal = parse_signal("b1", "execute-snapshot", json.dumps(
        {"data-collections": ["public\\.u"], "type": "blocking"}))
    position = PgPosition(Lsn(7))
    d.core.on_signal(signal, ["public.t", "public.u"], position, 0)
    assert d.core.blocking
    d.core._read_again = 1  # as if the last read could not decide
    d.run_blocking(position, threading.Event(), lambda events: None, lambda: None)
    assert not d.core.blocking and at  # (no such table: rejected, the lane is empty)
    assert d._backoff.streak == 1 and at[0] >= d._backoff._until
