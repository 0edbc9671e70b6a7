"""``dblog sync --available-now``'s progress bar reads the change log's end in the
background: the job's loop (which notices the query's end and a stop) never waits for
it. A fresh Kafka reader read a 1.2M-event log's whole checkpoint topic for 14 s, and a
cold sync sat 20 s past its last batch before it exited."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from pydblog.config import load_config
from pydblog.ui import SyncProgress


class Applier:
    last_end: int | None = None


def test_the_loop_never_waits_for_the_logs_end(tmp_path: Path) -> None:
    f = tmp_path / "dblog.toml"
    f.write_text('[source]\ndsn = "postgresql://u@h/db"\n[log]\npath = "data"\n'
                 '[[sync.sinks]]\ntype = "delta"\npath = "lake"\n')
    release = threading.Event()
    calls: list[int] = []

    def end() -> int:
        calls.append(1)
        if len(calls) == 1:
            release.wait(60)  # a slow read: the bar must not wait for it
            return 100
        raise RuntimeError("the broker went away")  # a later read fails: the bar goes on

    applier = Applier()
    with SyncProgress(load_config(f), applier, enabled=True, end=end) as progress:
        assert progress._bar is not None and progress._task is not None
        task = progress._bar.tasks[0]
        applier.last_end = 40
        progress.update()  # the first read has not returned: no total yet
        assert calls == [1] and task.total is None and task.completed == 40
        release.set()
        deadline = time.monotonic() + 30
        while task.total is None and time.monotonic() < deadline:
            progress.update()
            time.sleep(0.01)
        assert task.total == 100
        applier.last_end = 100
        progress._last_check = 0.0
        progress.update()  # the end reached: read again (it fails, in the background)
        assert progress._reading is not None
        progress._reading.join(30)
        assert calls == [1, 1]
        progress.update(refresh=False)
        assert task.total == 100 and task.completed == 100
