"""At a watermark the events pending so far go to the change log writer as their own
batch, checkpointed with the snapshot core's state from before the watermark, and the
rows the watermark releases follow in the next batch: the stream's events received
before a high watermark do not wait for the chunk's rows to be written
(``writer.GROUP_BULK_EVENTS`` keeps the writer from joining them again), and a crash
between the two appends reads that chunk again (its rows are in neither the log nor
the checkpointed progress)."""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pydblog.capture import writer as writer_module
from pydblog.capture.runner import Runner
from pydblog.changelog import open_writer
from pydblog.config import Config
from pydblog.events import ChangeEvent, Emitted, Op, SnapshotKind, SnapshotRows, encode_event
from pydblog.ports import Checkpoint, Commit, WatermarkSeen
from pydblog.positions import Lsn, PgPosition, Position
from pydblog.state.file import FileStateStore


class RecordingLog:
    """The real change log; records each append's events count and checkpoint."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.appends: list[tuple[int, Checkpoint]] = []
        self.gate = threading.Event()

    def append(self, events: Sequence[Any], checkpoint: Any, schemas: Sequence[Any] = ()) -> int:
        assert self.gate.wait(10)
        start = self.inner.next_offset
        end: int = self.inner.append(events, checkpoint, schemas)
        self.appends.append((end - start, checkpoint))
        return end

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Driver:
    """The snapshot core's side: a watermark releases 3 chunk rows and moves progress."""

    active = True
    draining = False  # no slices (``SnapshotCore.on_boundary``) to hand out

    def __init__(self) -> None:
        self.progress = "before H"

    def on_watermark(self, watermark_id: str, position: Position, ts_ms: int) -> list[Emitted]:
        self.progress = "after H"
        return [SnapshotRows("public", "t", SnapshotKind.INCREMENTAL, position, 1, 5,
                             [{"id": i} for i in range(3)], ("id",))]

    def state(self) -> dict[str, Any]:
        return {"progress": self.progress}

    def submit_next(self) -> None:
        pass


def test_events_before_a_watermark_are_a_batch_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(writer_module, "GROUP_BULK_EVENTS", 2)  # the 3 rows: a chunk
    cfg = Config.model_validate({
        "source": {"dsn": "postgresql://u@127.0.0.1/db"},
        "log": {"path": str(tmp_path / "data")},
        "api": {"listen": ""},
    })
    inner = open_writer(cfg.log)
    log = RecordingLog(inner)
    runner = Runner(cfg, None, None, log, FileStateStore(cfg.log_dir))  # type: ignore[arg-type]
    runner.driver = Driver()  # type: ignore[assignment]
    runner._known_schemas = {"public.t": None}  # type: ignore[dict-item]  # (no catalog to ask)
    try:
        for i in range(2):
            ev = ChangeEvent(Op.UPDATE, "public", "t", PgPosition(Lsn(0x100 + i), 0), 1,
                             key={"id": 10 + i}, after={"id": 10 + i})
            runner._pending.append(encode_event(ev, "postgresql", "db", 1))
            runner._position = ev.position
        runner._on_watermark_seen(WatermarkSeen("h-1", PgPosition(Lsn(0x200), 0)), threading.Event())
        runner.flush()
        log.gate.set()
        runner.writer.drain()
        assert [(n, cp.snapshot) for n, cp in log.appends] == [
            (2, {"progress": "before H"}),  # the stream's events, the core's state before H
            (3, {"progress": "after H"}),  # the rows H released, with the progress they make
        ]
        # Nothing pending at a watermark: no empty batch.
        runner._on_watermark_seen(WatermarkSeen("h-2", PgPosition(Lsn(0x300), 0)), threading.Event())
        runner.flush()
        runner.writer.drain()
        assert [n for n, _ in log.appends] == [2, 3, 3]
    finally:
        log.gate.set()
        runner.writer.close()
        inner.close()


class ReadOnlyDriver(Driver):
    """A read-only snapshot: the rows land at the first progress past their fence (0x200)."""

    fence_end = 0x200

    def closes_at(self, reached: Position) -> bool:
        assert isinstance(reached, PgPosition)
        return self.progress == "before H" and reached.ack_lsn.value >= self.fence_end

    def on_progress(self, position: Position, reached: Position) -> list[Emitted]:
        if not self.closes_at(reached):
            return []
        return self.on_watermark("", position, 0)

    waiting_for_progress = True


def test_events_before_a_read_only_window_closes_are_a_batch_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read-only snapshots close a window at a commit (or a keepalive) past its fence:
    the stream's events pending then go to the writer first, with the core's state from
    before, as at a watermark; commits that close nothing flush nothing."""
    monkeypatch.setattr(writer_module, "GROUP_BULK_EVENTS", 2)
    cfg = Config.model_validate({
        "source": {"dsn": "postgresql://u@127.0.0.1/db"},
        "log": {"path": str(tmp_path / "data"), "batch_max_ms": 600_000},  # no flush by age
        "snapshot": {"watermark": "read-only"},
        "api": {"listen": ""},
    })
    inner = open_writer(cfg.log)
    log = RecordingLog(inner)
    runner = Runner(cfg, None, None, log, FileStateStore(cfg.log_dir))  # type: ignore[arg-type]
    runner.driver = ReadOnlyDriver()  # type: ignore[assignment]
    runner._read_only = True
    runner._driver_active = True
    runner._known_schemas = {"public.t": None}  # type: ignore[dict-item]  # (no catalog to ask)
    stop = threading.Event()
    try:
        for i, lsn in enumerate((0x100, 0x180, 0x200)):
            ev = ChangeEvent(Op.UPDATE, "public", "t", PgPosition(Lsn(lsn), 0), 1,
                             key={"id": 10 + i}, after={"id": 10 + i})
            if not runner._pending:
                runner._pending_since = time.monotonic()
            runner._pending.append(encode_event(ev, "postgresql", "db", 1))
            runner._position = ev.position
            runner._in_tx = True
            runner._on_commit(Commit(PgPosition(Lsn(lsn), 1, Lsn(lsn + 8)), 1), stop)
        runner.flush()
        log.gate.set()
        runner.writer.drain()
        assert [(n, cp.snapshot) for n, cp in log.appends] == [
            (3, {"progress": "before H"}),  # the stream's events, before the window closed
            (3, {"progress": "after H"}),  # the rows, with the progress they make
        ]
    finally:
        log.gate.set()
        runner.writer.close()
        inner.close()


class SlicingDriver(Driver):
    """A window being handed out in slices: each ``on_boundary`` releases 2 rows and
    moves progress to them; 3 slices are left."""

    def __init__(self) -> None:
        super().__init__()
        self.left = 3
        self.draining = True
        self.boundaries: list[Position] = []

    def on_boundary(self, position: Position) -> list[Emitted]:
        self.boundaries.append(position)
        self.left -= 1
        self.draining = self.left > 0
        self.progress = f"slice {3 - self.left}"
        first = 2 * (3 - self.left)
        return [SnapshotRows("public", "t", SnapshotKind.INCREMENTAL, position, 1, 5,
                             [{"id": first + i} for i in range(2)], ("id",))]


def test_slices_go_out_at_commits_while_the_writer_backlog_is_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At a commit a window's next slices go to the writer, each in a batch with the
    stream's events received before it and the progress it makes (what a restart
    resumes after); no slice inside a transaction, and none while the writer has
    ``SLICE_BACKLOG`` events queued."""
    from pydblog.capture import runner as runner_module

    monkeypatch.setattr(runner_module, "SLICE_BACKLOG", 2)  # one 2-row slice queued at most
    cfg = Config.model_validate({
        "source": {"dsn": "postgresql://u@127.0.0.1/db"},
        "log": {"path": str(tmp_path / "data"), "batch_max_ms": 600_000},  # no flush by age
        "api": {"listen": ""},
    })
    inner = open_writer(cfg.log)
    log = RecordingLog(inner)
    acks: list[Position] = []
    source = types.SimpleNamespace(ack=acks.append)
    runner = Runner(cfg, source, None, log, FileStateStore(cfg.log_dir))  # type: ignore[arg-type]
    driver = runner.driver = SlicingDriver()  # type: ignore[assignment]
    runner._driver_active = True
    runner._read_only = False
    runner._known_schemas = {"public.t": None}  # type: ignore[dict-item]  # (no catalog to ask)
    stop = threading.Event()
    try:
        ev = ChangeEvent(Op.UPDATE, "public", "t", PgPosition(Lsn(0x100), 0), 1,
                         key={"id": 10}, after={"id": 10})
        runner._in_tx = True
        runner._pending.append(encode_event(ev, "postgresql", "db", 1))
        runner._position = ev.position
        runner._slices()  # inside a transaction: nothing
        assert driver.boundaries == []
        runner._on_commit(Commit(PgPosition(Lsn(0x100), 1, Lsn(0x101)), 1), stop)
        # The writer is gated: the first slice is queued (2 events + the stream's 1),
        # over the backlog's limit, so the second waits for the next boundary.
        assert len(driver.boundaries) == 1
        for n, lsn in enumerate((0x110, 0x120), start=2):
            log.gate.set()
            runner.writer.drain()
            log.gate.clear()
            runner._on_commit(Commit(PgPosition(Lsn(lsn), 0, Lsn(lsn + 1)), 1), stop)
            assert len(driver.boundaries) == n
        log.gate.set()
        runner.writer.drain()
        assert [(n, cp.snapshot) for n, cp in log.appends] == [
            (3, {"progress": "slice 1"}),  # the stream's event, then the slice it waited for
            (2, {"progress": "slice 2"}),
            (2, {"progress": "slice 3"}),
        ]
        assert runner.writer.wake_below == 0  # nothing left to hand out
        assert acks  # the source is acknowledged as batches become durable
    finally:
        log.gate.set()
        runner.writer.close()
        inner.close()
