"""Several `dblog run` members on one [ha] config, for the failover tests and
bench/failover.py: start, find the leader, inject faults, measure the gap.

A failover's gap is measured on the change log, as a consumer sees it: from the fault
to the first commit to the change log after it (``next_offset`` grows), under a write
load that commits continuously.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydblog.changelog.sqlite import SqliteChangeLogReader, log_path
from pydblog.ha.members import read_members

DBLOG = [sys.executable, "-m", "pydblog"]


class Members:
    """``probe``: what the source server says about itself (its replication threads,
    binlog files), added to every failure's diagnosis."""

    def __init__(self, config: Path, log_dir: Path,
                 probe: Callable[[], str] | None = None) -> None:
        self.config = config
        self.log_dir = log_dir
        self.probe = probe
        self.logs = config.parent / "logs"
        self.logs.mkdir(exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A member whose stderr goes to ``logs/member-<pid>.log`` (a pipe nobody reads
        would fill up and block a long-running member)."""
        tmp = self.logs / f"member-{time.monotonic_ns()}.log"
        with open(tmp, "wb") as err:
            proc = subprocess.Popen([*DBLOG, "run", "--config", str(self.config)],
                                    stdout=subprocess.DEVNULL, stderr=err, env=env)
        tmp.rename(self.logs / f"member-{proc.pid}.log")
        self.procs.append(proc)
        return proc

    def diagnosis(self, tail: int = 12000) -> str:
        """The roles and each member's state, thread stacks and last log lines, for a
        failed wait (a frozen member is resumed to print its stacks)."""
        parts = [f"\nroles: {self.roles()}"]
        running = [p for p in self.procs if p.poll() is None]
        for p in running:  # `dblog run` prints its threads' stacks on SIGUSR1
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGUSR1)
        if running:
            time.sleep(1.0)
        for p in self.procs:
            state = "running" if p.poll() is None else f"exited {p.returncode}"
            try:
                text = self.log_of(p)[-tail:]
            except OSError as exc:
                text = f"(no log: {exc})"
            parts.append(f"--- member {p.pid} ({state}):\n{text}")
        if self.probe is not None:
            try:
                parts.append(f"--- source server:\n{self.probe()}")
            except Exception as exc:  # a diagnosis must not hide the failure it explains
                parts.append(f"--- source server: (probe failed: {exc})")
        return "\n".join(parts)

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.logs / f"member-{proc.pid}.log").read_text(errors="replace")

    def roles(self) -> dict[int, str]:
        """pid -> role of the members whose file is fresh."""
        return {int(m["pid"]): str(m["role"]) for m in read_members(self.log_dir)}

    def leader(self, timeout: float = 60, not_pid: int | None = None) -> subprocess.Popen[bytes]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.roles()
            for p in self.procs:
                if p.poll() is None and r.get(p.pid) == "leader" and p.pid != not_pid:
                    return p
            time.sleep(0.02)
        raise AssertionError(f"no leader within {timeout} s: {self.roles()}{self.diagnosis()}")

    def wait_standbys(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if list(self.roles().values()).count("standby") >= n:
                return
            time.sleep(0.05)
        raise AssertionError(f"fewer than {n} standbys within {timeout} s: {self.roles()}")

    def next_offset(self) -> int:
        if not log_path(self.log_dir).exists():
            return 0
        reader = SqliteChangeLogReader(self.log_dir)
        try:
            return reader.next_offset()
        finally:
            reader.close()

    def wait_checkpoint(self, timeout: float = 60) -> None:
        """Wait until the change log holds a checkpoint (a leader captures: from then on
        every source write is captured, whoever leads)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log_path(self.log_dir).exists():
                reader = SqliteChangeLogReader(self.log_dir)
                try:
                    if reader.last_checkpoint() is not None:
                        return
                finally:
                    reader.close()
            time.sleep(0.05)
        raise AssertionError(f"no checkpoint in the change log within {timeout} s")

    def wait_progress(self, since: int, timeout: float = 120, poll_s: float = 0.01) -> float:
        """Wait until the change log holds more than ``since`` events; when (monotonic)."""
        deadline = time.monotonic() + timeout
        reader: SqliteChangeLogReader | None = None
        try:
            while time.monotonic() < deadline:
                if reader is None and log_path(self.log_dir).exists():
                    reader = SqliteChangeLogReader(self.log_dir)
                if reader is not None and reader.next_offset() > since:
                    return time.monotonic()
                time.sleep(poll_s)
        finally:
            if reader is not None:
                reader.close()
        raise AssertionError(
            f"the change log did not move past {since} within {timeout} s{self.diagnosis()}"
        )

    def stop_all(self, timeout: float = 30) -> list[int]:
        """SIGCONT + SIGTERM every member still running; their exit codes."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        out = []
        for p in self.procs:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            out.append(p.returncode)
        return out
