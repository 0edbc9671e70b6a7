"""Member files: ``<log dir>/members/<member>.json``, one per ``dblog run`` with
``[ha]``, rewritten every second with its role. Each process writes only its own file
(standbys sharing the log directory never touch the leader's ``status.json`` or
``state.json``); ``dblog status`` lists the files updated recently."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from pydblog.config import Config
from pydblog.errors import DblogError
from pydblog.ha import create_election
from pydblog.ha.role import ROLE

MEMBERS_DIR = "members"
FRESH_S = 10.0
"""A member file older than this is shown as gone."""


def default_member_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _file_name(member: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", member) + ".json"


class MemberFile:
    """Rewrites this member's file every ``interval_s`` on its own thread."""

    def __init__(self, log_dir: Path, member: str, interval_s: float = 1.0) -> None:
        self.dir = log_dir / MEMBERS_DIR
        self.path = self.dir / _file_name(member)
        self.member = member
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dblog-ha-member", daemon=True)
        self._started = time.time()

    def start(self) -> MemberFile:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.write()
        self._thread.start()
        return self

    def write(self) -> None:
        info = ROLE.get()
        data: dict[str, Any] = {
            "member": self.member,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "role": info.role,
            "epoch": info.epoch,
            "leader": info.leader,
            "started_at": self._started,
            "updated_at": time.time(),
        }
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_bytes(orjson.dumps(data))
            os.replace(tmp, self.path)
        except OSError:
            pass  # status only; the next turn tries again

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.write()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.path.unlink()


def read_members(log_dir: Path) -> list[dict[str, Any]]:
    """The members whose file was updated within ``FRESH_S`` (leader first)."""
    out: list[dict[str, Any]] = []
    now = time.time()
    directory = log_dir / MEMBERS_DIR
    if not directory.is_dir():
        return out
    for p in sorted(directory.glob("*.json")):
        try:
            data = orjson.loads(p.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if now - float(data.get("updated_at", 0)) <= FRESH_S:
            out.append(data)
    out.sort(key=lambda m: (m.get("role") != "leader", str(m.get("member"))))
    return out


def election_leader(cfg: Config) -> str | None:
    """The leader's member name as the election backend knows it (None if unknown or
    the backend cannot be reached; ``dblog status``)."""
    try:
        election = create_election(cfg, "dblog-status")
    except DblogError:
        return None
    try:
        return election.leader()
    finally:
        election.close()
