"""The embedded state store: one JSON file, replaced atomically.

Invariant: after ``save`` returns, ``load`` in any later process returns that
checkpoint or a newer one, even after ``kill -9`` or power loss (write to a temporary
file, fsync, rename over, fsync the directory).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydblog.errors import ChangeLogError
from pydblog.ports import Checkpoint, StateStore

STATE_FILE = "state.json"


class FileStateStore(StateStore):
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.path = self.dir / STATE_FILE
        self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> None:
        """``state.<pid>.tmp`` files left by processes that died mid-save."""
        for tmp in self.dir.glob("state.*.tmp"):
            pid = tmp.name.split(".")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                tmp.unlink(missing_ok=True)

    def load(self) -> Checkpoint | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return Checkpoint.from_bytes(raw)
        except Exception as exc:
            raise ChangeLogError(
                f"the state file {self.path} is corrupt: {exc}",
                hint="delete it: the change log holds the same checkpoint and it is restored at start",
            ) from exc

    def save(self, checkpoint: Checkpoint) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        # One temporary file per process: with [ha], a frozen ex-leader finishing its last
        # save must not rename the new leader's half-written file (seen in the chaos test).
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        data = checkpoint.to_bytes()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
