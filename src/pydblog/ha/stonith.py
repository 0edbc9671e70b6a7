"""Same-host fencing of a frozen ex-leader that holds the embedded change log's write
lock ("shoot the other node in the head", limited to one host and one process).

A leader stopped (``SIGSTOP``, a debugger) in the middle of a commit keeps SQLite's
write lock: no other process can write the log until it dies or resumes. Its commit
passed the epoch check before it froze, so letting it finish would be consistent, but
nobody can say when that is. A new leader that waits for the lock longer than
``GRACE_S`` looks the holder up in ``/proc/locks``; it is killed (``SIGKILL``: SQLite
rolls its unfinished commit back, which is equally consistent) only if it is in the
stopped state AND it is the log's recorded owner: the process that made the last
claim, same host, same pid, same start time (so neither a recycled pid nor an
operator's suspended ``sqlite3`` shell is ever killed). Any other holder, and a
running one (a slow disk), is waited for. Across hosts (a shared disk) the holder is
not visible and the new leader waits.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

from pydblog.changelog.sqlite import process_start

log = logging.getLogger(__name__)

WAL_WRITE_LOCK_BYTE = 120
"""SQLite's WAL-index write lock: byte 120 of the ``-shm`` file (WALINDEX_LOCK_OFFSET
+ WAL_WRITE_LOCK in SQLite's wal.c), held by fcntl for a write transaction's length."""
GRACE_S = 0.3


def write_lock_holder(db_path: Path) -> int | None:
    """The pid holding the WAL write lock of ``db_path`` on this host, if any."""
    try:
        st = os.stat(f"{db_path}-shm")
        locks = Path("/proc/locks").read_text()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in locks.splitlines():
        parts = line.split()
        if len(parts) < 8 or parts[1] == "->" or parts[1] != "POSIX" or parts[3] != "WRITE":
            continue
        if parts[5] == dev and parts[6] == str(WAL_WRITE_LOCK_BYTE):
            return int(parts[4])
    return None


def is_stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


def is_owner(pid: int, owner: dict[str, Any] | None) -> bool:
    """Whether ``pid`` is the process recorded by the log's last claim."""
    return (
        owner is not None
        and owner.get("host") == socket.gethostname()
        and owner.get("pid") == pid
        and owner.get("start") is not None
        and owner.get("start") == process_start(pid)
    )


_refused: set[int] = set()


def kill_frozen_holder(db_path: Path, owner: dict[str, Any] | None) -> bool:
    """Kill the process holding ``db_path``'s write lock if it is stopped and is the
    log's recorded ``owner`` (the previous leader); whether it did."""
    pid = write_lock_holder(db_path)
    if pid is None or pid == os.getpid() or not is_stopped(pid):
        return False
    if not is_owner(pid, owner):
        if pid not in _refused:
            _refused.add(pid)
            log.warning("the change log's write lock is held by pid %d, which is stopped but "
                        "is not the log's previous leader: waiting (resume it with "
                        "`kill -CONT %d` or end it)", pid, pid)
        return False
    log.warning("the change log's write lock is held by pid %d, which is stopped (a frozen "
                "ex-leader): killing it so that this leader can take over", pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as exc:
        log.warning("could not kill pid %d: %s", pid, exc)
        return False
    return True
