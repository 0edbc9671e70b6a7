"""Two processes saving the state file of one directory (an ex-leader finishing its
last save while the new leader saves, [ha]): neither trips over the other's temporary
file. Found by the chaos test: with one shared ``state.tmp``, the new leader's rename
failed with FileNotFoundError and the process died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition
from pydblog.state.file import FileStateStore

CHILD = """
import os, signal, sys
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition
from pydblog.state.file import FileStateStore

real_replace = os.replace
def frozen_replace(src, dst):
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen between writing and renaming
    real_replace(src, dst)
os.replace = frozen_replace
FileStateStore(sys.argv[1]).save(Checkpoint(PgPosition(Lsn(1), 0, Lsn(1))))
print("saved", flush=True)
"""


def test_a_frozen_save_does_not_break_another_process_save(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
            assert time.monotonic() < deadline and child.poll() is None, "child did not freeze"
            time.sleep(0.02)
        store = FileStateStore(tmp_path)
        store.save(Checkpoint(PgPosition(Lsn(2), 0, Lsn(2))))
        child.send_signal(signal.SIGCONT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err.decode()[-2000:]
    assert out.strip() == b"saved"
    store.save(Checkpoint(PgPosition(Lsn(3), 0, Lsn(3))))  # and saving goes on
    loaded = store.load()
    assert loaded is not None and loaded.position == PgPosition(Lsn(3), 0, Lsn(3))


def test_temporaries_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f"state.{dead.stdout.strip()}.tmp"
    stale.write_bytes(b"{")
    mine = tmp_path / f"state.{os.getpid()}.tmp"
    mine.write_bytes(b"{")
    FileStateStore(tmp_path)
    assert not stale.exists()
    assert mine.exists()  # a live process's file is left alone
