"""New snapshot chunks wait while a stream event waits for the change log
(``runner.HOLD_STREAM_WAIT_S``): pending in the capture thread, or submitted and not yet
appended by the writer. Once the writer has appended it, chunks go again.

Why: on a loaded machine the writer and the capture thread wait for a CPU most of the
time (a lag trace shows it: ``capture/lagtrace.py``); each chunk read then only queues
more rows in front of the stream's next events."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydblog.capture import runner as runner_mod
from pydblog.capture.runner import Runner
from pydblog.changelog import open_writer
from pydblog.config import Config
from pydblog.events import ChangeEvent, Op, encode_event
from pydblog.positions import Lsn, PgPosition
from pydblog.state.file import FileStateStore


class GatedLog:
    """The real change log, whose appends wait until ``gate`` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()

    def append(self, events: Sequence[Any], checkpoint: Any, schemas: Sequence[Any] = ()) -> int:
        assert self.gate.wait(10)
        end: int = self.inner.append(events, checkpoint, schemas)
        return end

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_chunks_wait_while_a_stream_event_waits_for_the_change_log(tmp_path: Path) -> None:
    cfg = Config.model_validate({
        "source": {"dsn": "postgresql://u@127.0.0.1/db"},
        "log": {"path": str(tmp_path / "data")},
        "api": {"listen": ""},
    })
    inner = open_writer(cfg.log)
    log = GatedLog(inner)
    runner = Runner(cfg, None, None, log, FileStateStore(cfg.log_dir))  # type: ignore[arg-type]
    wait = runner_mod.HOLD_STREAM_WAIT_S
    try:
        assert not runner._hold()  # no stream event at all
        ev = ChangeEvent(Op.CREATE, "public", "t", PgPosition(Lsn(0x100), 0), 1,
                         key={"id": 1}, after={"id": 1})
        # as the capture loop takes a row change from the stream
        runner._stream_since = time.monotonic()
        runner._pending.append(encode_event(ev, "postgresql", "db", 1))
        runner._position = ev.position
        assert not runner._hold()  # received just now
        runner._stream_since -= wait  # ... and still pending after HOLD_STREAM_WAIT_S
        assert runner._hold()
        runner.flush()  # handed to the writer, which cannot append yet
        assert runner._stream_since is None
        assert runner._hold()
        log.gate.set()
        runner.writer.drain()
        assert not runner._hold()  # appended: chunks go again
        # Without a snapshot nobody asks _hold: flushes alone keep the record bounded.
        for _ in range(100):
            runner._stream_since = time.monotonic()
            runner._pending.append(encode_event(ev, "postgresql", "db", 1))
            runner.flush()
            runner.writer.drain()
        assert len(runner._stream_inflight) <= 1
    finally:
        log.gate.set()
        runner.writer.close()
        inner.close()
