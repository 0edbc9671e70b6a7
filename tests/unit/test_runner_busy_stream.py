"""A snapshot signal read from a stream that never goes idle (a steady write load whose
transactions arrive closer together than the source's idle interval, as the MySQL
source sees it: it yields ``Idle`` only after ``idle_s`` without an event) starts the
snapshot at once, as a watermark does: the first request must not wait for a lull.

Found by the contract test ``test_parallel_chunks_with_writes[mysql57]``, whose snapshot
waited 8-70 s for a gap in its writer's transactions before its first chunk."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from pydblog.capture.runner import Runner
from pydblog.changelog import open_writer
from pydblog.config import Config
from pydblog.events import ChangeEvent, Op
from pydblog.ports import Commit
from pydblog.positions import Lsn, PgPosition
from pydblog.state.file import FileStateStore


class BusySource:
    """A signal row, then one transaction after another and never ``Idle``."""

    connector = "postgresql"
    db = "db"

    def __init__(self, reader: Reader, stop: threading.Event) -> None:
        self.reader = reader
        self.stop = stop
        self.transactions = 0

    def open(self, checkpoint: Any) -> None:
        pass

    def stream(self) -> Iterator[Any]:
        lsn = 0x1000
        data = orjson.dumps({"data-collections": ["public\\.t"]}).decode()
        yield ChangeEvent(Op.CREATE, "public", "dblog_signal", PgPosition(Lsn(lsn), 0), 1,
                          key={"id": "sig-1"},
                          after={"id": "sig-1", "type": "execute-snapshot", "data": data})
        yield Commit(PgPosition(Lsn(lsn), 1), 1)
        while not self.stop.is_set() and self.transactions < 3000:
            lsn += 0x100
            self.transactions += 1
            yield ChangeEvent(Op.CREATE, "public", "other", PgPosition(Lsn(lsn), 0), 1,
                              key={"id": lsn}, after={"id": lsn})
            yield Commit(PgPosition(Lsn(lsn), 1), 1)
            self.stop.wait(0.01)  # 10 ms apart: busier than any idle interval

    def ack(self, position: Any) -> None:
        pass

    def lag_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        pass


class Reader:
    """Records that the snapshot asked for its table (and stops the stream then)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.asked: list[str] = []

    def captured_tables(self) -> list[str]:
        return ["public.t", "public.other"]

    def table_info(self, table: str, *args: Any) -> None:
        self.asked.append(table)
        self.stop.set()
        return None  # (the snapshot then fails: not this test's concern)


def test_a_signal_starts_the_snapshot_without_waiting_for_an_idle_stream(tmp_path: Path) -> None:
    cfg = Config.model_validate({
        "source": {"dsn": "postgresql://u@127.0.0.1/db"},
        "log": {"path": str(tmp_path / "data")},
        "api": {"listen": ""},
    })
    stop = threading.Event()
    reader = Reader(stop)
    source = BusySource(reader, stop)
    changelog = open_writer(cfg.log)
    runner = Runner(cfg, source, reader, changelog,  # type: ignore[arg-type]
                    FileStateStore(cfg.log_dir))
    try:
        runner.run(stop)
    finally:
        runner.writer.close()
        changelog.close()
    assert reader.asked == ["public.t"], (
        f"the snapshot did not start within {source.transactions} busy transactions"
    )
