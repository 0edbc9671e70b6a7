"""Helpers for the failover tests: several `dblog run` members on one config."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from pydblog.ha.members import read_members
from tests.helpers import DBLOG, write_config


def ha_config(directory: Path, dsn: str, zk_hosts: str | None, timeout_s: float = 2.0,
              extra: str = "") -> Path:
    if zk_hosts is not None:
        ha = f'backend = "zookeeper"\nhosts = "{zk_hosts}"\npath = "/dblog-test/{directory.name}"'
    else:
        ha = f'backend = "postgres"\npath = "/dblog-test/{directory.name}"'
    return write_config(directory, dsn, extra=f"{extra}\n[ha]\n{ha}\nsession_timeout_s = {timeout_s}\n")


def start_member(config: Path) -> subprocess.Popen[bytes]:
    """A `dblog run` whose stderr goes to ``member-<pid>.log`` beside the config (a pipe
    nobody reads would fill up and block a long-running member)."""
    logs = config.parent / "logs"
    logs.mkdir(exist_ok=True)
    tmp = logs / f"member-{time.monotonic_ns()}.log"
    with open(tmp, "wb") as err:
        proc = subprocess.Popen([*DBLOG, "run", "--config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=err)
    tmp.rename(logs / f"member-{proc.pid}.log")
    return proc


def member_log(config: Path, proc: subprocess.Popen[bytes]) -> str:
    return (config.parent / "logs" / f"member-{proc.pid}.log").read_text()


def roles(config: Path) -> dict[int, str]:
    """pid -> role of the members whose file is fresh."""
    return {int(m["pid"]): str(m["role"]) for m in read_members(config.parent / "data")}


def wait_leader(config: Path, procs: list[subprocess.Popen[bytes]], timeout: float = 60,
                not_pid: int | None = None) -> subprocess.Popen[bytes]:
    """The member process that leads (per the member files), waiting for one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = roles(config)
        for p in procs:
            if p.poll() is None and r.get(p.pid) == "leader" and p.pid != not_pid:
                return p
        time.sleep(0.05)
    raise AssertionError(f"no leader within {timeout} s: {roles(config)}")


def stop_all(procs: list[subprocess.Popen[bytes]], timeout: float = 30) -> list[int]:
    """SIGTERM every member still running; their exit codes."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    out = []
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        out.append(p.returncode)
    return out


def duplicates(events: list[dict[str, Any]]) -> int:
    """Events logged twice: the same source position (stream) or the same snapshot row
    at the same position."""
    seen: set[tuple[Any, ...]] = set()
    dup = 0
    for e in events:
        if e["op"] == "n":
            continue
        src = e["source"]
        pos = (src.get("lsn"), src.get("index"), e["op"], str(e.get("key")))
        if pos in seen:
            dup += 1
        seen.add(pos)
    return dup
