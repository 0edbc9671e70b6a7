"""The batch writer's group commit, on a real change log: batches that queue up while a
commit runs are appended together, in order, described by the newest checkpoint; a
batch with schemas starts its own append; tasks run in submission order."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from pydblog.capture import writer as writer_module
from pydblog.capture.writer import Batch, BatchWriter
from pydblog.changelog.sqlite import SqliteChangeLog, SqliteChangeLogReader
from pydblog.errors import ChangeLogUnavailable
from pydblog.events import Encoded, EncodedEvent
from pydblog.ports import Checkpoint, ColumnSchema, TableSchema
from pydblog.positions import Lsn, PgPosition
from pydblog.state.file import FileStateStore


class GatedLog(SqliteChangeLog):
    """A real change log whose first append waits for ``gate``; records every append."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.appends: list[tuple[int, int, Checkpoint, int]] = []

    def append(self, events: Sequence[Encoded], checkpoint: Checkpoint,
               schemas: Sequence[TableSchema] = ()) -> int:
        self.entered.set()
        self.gate.wait(10)
        start = self.next_offset
        end = super().append(events, checkpoint, schemas)
        self.appends.append((start, end, checkpoint, len(schemas)))
        return end


def _batch(i: int, n: int, *, schemas: Sequence[TableSchema] = (), ack: bool = True) -> Batch:
    pos = PgPosition(Lsn(100 + i), 0)
    events = [EncodedEvent("s.t", "c", i, f'{{"b":{i},"e":{j}}}') for j in range(n)]
    return Batch(events, Checkpoint(pos, None, {"b": i}), list(schemas), pos if ack else None, n)


def test_queued_batches_commit_together(tmp_path: Path) -> None:
    log = GatedLog(tmp_path / "log")
    writer = BatchWriter(log, FileStateStore(tmp_path / "state"), depth=16)
    order: list[str] = []
    drained: list[int] = []
    writer.on_drained = lambda: drained.append(log.next_offset)
    schema = TableSchema("s", "t", (ColumnSchema("id", "int8", "int64", False),), ("id",))
    writer.submit(_batch(0, 2))
    assert log.entered.wait(10)  # the writer holds batch 0 in its first append
    writer.submit(_batch(1, 3))
    writer.submit(_batch(2, 1, ack=False))  # mid-transaction: no ack of its own
    writer.submit(_batch(3, 4, schemas=[schema]))  # starts its own append
    writer.submit(_batch(4, 2))
    writer.run_task(lambda: order.append(f"task after {log.next_offset}"))
    writer.submit(_batch(5, 1))
    log.gate.set()
    writer.drain()
    writer.close()
    assert [(a, b, cp.extra["b"], s) for a, b, cp, s in log.appends] == [
        (0, 2, 0, 0),  # the batch being written when the others arrived
        (2, 6, 2, 0),  # batches 1 and 2 together, described by batch 2's checkpoint
        (6, 12, 4, 1),  # the schema batch with the one queued behind it
        (12, 13, 5, 0),  # after the task, which ran in its place in the queue
    ]
    assert order == ["task after 12"]
    assert drained[-1] == 13 and 2 not in drained  # woken when the queue ran dry, only then
    assert writer.take_ack() == PgPosition(Lsn(105), 0)
    reader = SqliteChangeLogReader(tmp_path / "log")
    bodies = [r.body.decode() for r in reader.read_range(0, 13)]
    assert bodies == [f'{{"b":{i},"e":{j}}}' for i, n in enumerate([2, 3, 1, 4, 2, 1]) for j in range(n)]
    assert [o for o, _ in reader.schemas("s.t")] == [6]
    reader.close()
    log.close()


def test_a_bulk_batch_starts_its_own_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of more than ``GROUP_BULK_EVENTS`` events (a snapshot chunk) is not
    committed in one transaction with the small batches queued before it (the stream's
    events do not wait for its write); those queued behind it join it. The log's order
    is the submission order."""
    monkeypatch.setattr(writer_module, "GROUP_BULK_EVENTS", 3)
    log = GatedLog(tmp_path / "log")
    writer = BatchWriter(log, FileStateStore(tmp_path / "state"), depth=16)
    writer.submit(_batch(0, 1))
    assert log.entered.wait(10)
    writer.submit(_batch(1, 2))
    writer.submit(_batch(2, 1))
    writer.submit(_batch(3, 5))  # bulk: its own group
    writer.submit(_batch(4, 1))  # joins the bulk batch's group
    writer.submit(_batch(5, 4))  # bulk again
    writer.submit(_batch(6, 3))  # at the limit: not bulk
    log.gate.set()
    writer.drain()
    writer.close()
    assert [(a, b, cp.extra["b"]) for a, b, cp, _ in log.appends] == [
        (0, 1, 0), (1, 4, 2), (4, 10, 4), (10, 17, 6),
    ]
    reader = SqliteChangeLogReader(tmp_path / "log")
    bodies = [r.body.decode() for r in reader.read_range(0, 17)]
    assert bodies == [f'{{"b":{i},"e":{j}}}' for i, n in enumerate([1, 2, 1, 5, 1, 4, 3]) for j in range(n)]
    reader.close()
    log.close()


class FailingLog(GatedLog):
    """A real change log whose first append waits for ``gate``, then fails (a broker
    gone in the middle of a commit)."""

    def append(self, events: Sequence[Encoded], checkpoint: Checkpoint,
               schemas: Sequence[TableSchema] = ()) -> int:
        self.entered.set()
        self.gate.wait(10)
        raise ChangeLogUnavailable("the broker went away")


@pytest.mark.timeout(60)
def test_an_append_that_fails_while_the_queue_is_full_is_raised(tmp_path: Path) -> None:
    """The capture submits batches faster than a slow commit takes them and blocks on the
    full queue; the commit then fails and the writer thread ends. The blocked submit
    raises that error (before, it waited for a queue nobody took from: the capture stood
    still for good, without a word: seen in test_broker_restart_under_load, the writer
    thread gone from the stack dump)."""
    log = FailingLog(tmp_path / "log")
    writer = BatchWriter(log, FileStateStore(tmp_path / "state"), depth=2)
    submitted: list[int] = []
    failed: list[BaseException] = []

    def capture() -> None:
        try:
            for i in range(10):
                writer.submit(_batch(i, 1))
                submitted.append(i)
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=capture, daemon=True)
    t.start()
    assert log.entered.wait(10)
    while t.is_alive() and len(submitted) < 3:  # the commit's batch and two queued
        t.join(0.05)
    log.gate.set()
    t.join(20)
    try:
        assert not t.is_alive(), "the submit still waits for the full queue"
        assert failed and isinstance(failed[0], ChangeLogUnavailable), failed
    finally:
        writer.close()
        log.close()
