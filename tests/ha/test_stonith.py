"""A leader frozen in the middle of a change-log commit holds SQLite's write lock: the
new leader's claim kills it if (and only if) it is a stopped process of this host and
the log's recorded owner (the previous leader, by pid and start time). A non-HA writer
refuses a log that a high-availability group claimed."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pydblog.changelog.sqlite import SqliteChangeLog, log_path
from pydblog.devtools.proc import end_process
from pydblog.errors import ChangeLogError
from pydblog.ha.fencing import claim
from pydblog.ha.lease import DeadlineLease
from pydblog.ha.stonith import write_lock_holder

HOLDER = """
import os, signal, sqlite3, sys
from pathlib import Path
if sys.argv[3] == "owner":  # a previous leader: it claimed the log before it froze
    from pydblog.changelog.sqlite import SqliteChangeLog
    SqliteChangeLog(Path(sys.argv[1]).parent).claim(2)
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE checkpoint SET updated_ms = 0")
print("locked", flush=True)
if sys.argv[2] == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
sys.stdin.readline()
"""


def hold(tmp_path: Path, mode: str, who: str = "owner") -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(log_path(tmp_path)), mode, who],
                            stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"locked"
    except BaseException:
        end_process(proc, kill=True)
        raise
    return proc


def claim_in_thread(log: SqliteChangeLog, epoch: int, stop: threading.Event
                    ) -> tuple[threading.Thread, list[BaseException | None]]:
    """``claim`` on a thread; its outcome (None or the exception) lands in the list."""
    result: list[BaseException | None] = []

    def run() -> None:
        try:
            claim(log, DeadlineLease(epoch, 30.0, "test", lambda: None), stop)
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, result


def new_log(tmp_path: Path) -> SqliteChangeLog:
    log = SqliteChangeLog(tmp_path)
    from pydblog.ports import Checkpoint

    log.append([], Checkpoint(None))
    return log


def test_stopped_lock_holder_is_killed(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    proc = hold(tmp_path, "stop")
    try:
        assert write_lock_holder(log.path) == proc.pid
        lease = DeadlineLease(7, 30.0, "test", lambda: None)
        claim(log, lease, threading.Event())
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
        assert log.fence_epoch() == 7
    finally:
        end_process(proc, kill=True)
        log.close()


def test_running_lock_holder_is_waited_for(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    proc = hold(tmp_path, "run")
    stop = threading.Event()
    t, result = claim_in_thread(log, 3, stop)
    try:
        time.sleep(2.0)  # past the grace period: a running holder is not killed
        assert proc.poll() is None and not result
        proc.communicate(b"\n", timeout=10)  # the holder ends (its transaction rolls back)
        t.join(10)
        assert result == [None]
        assert log.fence_epoch() == 3
    finally:
        stop.set()
        t.join(10)
        end_process(proc, kill=True)
        log.close()


def test_stopped_claim_gives_up(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    proc = hold(tmp_path, "run")
    stop = threading.Event()
    stop.set()
    try:
        with pytest.raises(ChangeLogError):
            claim(log, DeadlineLease(3, 30.0, "test", lambda: None), stop)
    finally:
        end_process(proc, kill=True)
        log.close()


def test_stopped_holder_that_is_not_the_owner_is_not_killed(tmp_path: Path) -> None:
    """Any other process holding the lock (an operator's sqlite3 shell suspended with
    Ctrl-Z, another program) is waited for, never killed."""
    log = new_log(tmp_path)
    log.claim(2)  # the recorded owner is this test process, not the holder
    proc = hold(tmp_path, "stop", who="stranger")
    stop = threading.Event()
    t, result = claim_in_thread(log, 3, stop)
    try:
        time.sleep(2.0)  # well past the grace period
        assert proc.poll() is None, "a stopped process that is not the log's owner was killed"
        assert not result
    finally:
        stop.set()
        t.join(10)
        end_process(proc, kill=True)
        log.close()


def test_non_ha_writer_refuses_a_claimed_log(tmp_path: Path) -> None:
    """A `dblog run` without [ha] on a log an HA group claimed would write unfenced
    beside the group's leader: every append checks that no group owns the log."""
    from pydblog.ports import Checkpoint

    ha = new_log(tmp_path)
    plain = SqliteChangeLog(tmp_path)
    try:
        plain.append([], Checkpoint(None))  # unclaimed: fine
        ha.claim(4)
        with pytest.raises(ChangeLogError, match=r"\[ha\]"):
            plain.append([], Checkpoint(None))
        assert ha.append([], Checkpoint(None)) >= 0
    finally:
        plain.close()
        ha.close()


def test_release_lets_a_non_ha_writer_take_over(tmp_path: Path) -> None:
    """`release_ha_claim` (``dblog run --release-ha``) removes the claim; a member
    still running is then fenced out of its next append."""
    from pydblog.changelog.sqlite import release_ha_claim
    from pydblog.errors import Fenced
    from pydblog.ports import Checkpoint

    ha = new_log(tmp_path)
    ha.claim(4)
    assert release_ha_claim(tmp_path) == 4
    plain = SqliteChangeLog(tmp_path)
    try:
        plain.append([], Checkpoint(None))
        with pytest.raises(Fenced):
            ha.append([], Checkpoint(None))
    finally:
        plain.close()
        ha.close()
