"""Process facts for benchmarks (Linux /proc), and ending the processes that tests and
devtools start (``end_process``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def end_process(proc: subprocess.Popen[bytes], timeout: float = 30.0, *, kill: bool = False,
                group: bool = False) -> tuple[int, bytes, bytes]:
    """Stop ``proc`` if it still runs (SIGTERM, or SIGKILL with ``kill``; to its whole
    process group with ``group``, for one started with ``start_new_session``), SIGKILL it
    after ``timeout`` s, reap it, and read and close every pipe it has: nothing is left
    running, unreaped or open (an open pipe is an unraisable ``ResourceWarning`` in
    whatever test runs next). Returns its exit code, stdout and stderr (``b""`` for a
    stream that was not a pipe). Safe to call more than once."""

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)

    if proc.poll() is None:
        send(signal.SIGKILL if kill else signal.SIGTERM)
    elif group:  # the leader is gone; its group may not be (a JVM, a worker)
        send(signal.SIGKILL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        out, err = proc.communicate()
    except ValueError:  # its pipes were read and closed already (an earlier call)
        proc.wait()
        out, err = b"", b""
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    return proc.returncode, out or b"", err or b""


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set size (VmHWM) in KiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far, in seconds (0 once gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds used so far by the process's live threads, summed per thread name
    (``/proc/PID/task/TID/comm``: pydblog names its threads, see ``pydblog.threads``)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        try:
            head, _, rest = (task / "stat").read_text().rpartition(")")
            fields = rest.split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = head.partition("(")[2]
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def family_cpu(parent: int) -> dict[int, float]:
    """CPU seconds used so far by ``parent`` and each live process it started (e.g. a
    PostgreSQL postmaster and its backends, walsenders and background workers)."""
    out = {parent: cpu_seconds(parent)}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == parent:
            pid = int(stat.parent.name)
            out[pid] = cpu_seconds(pid)
    return out


def tree_cpu(pid: int) -> float:
    """CPU seconds used so far by ``pid`` and every live descendant, each with the
    children it has reaped (a Spark worker's executor and the Python workers it forked and
    ended count too); 0 once gone."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
            for kids in Path(f"/proc/{p}/task").glob("*/children"):
                todo.extend(int(k) for k in kids.read_text().split())
        except (OSError, IndexError, ValueError):
            continue
    return total


def cpu_since(now: dict[int, float], start: dict[int, float]) -> float:
    """CPU used between two ``family_cpu`` readings (processes that ended in between are
    not counted)."""
    return sum(c - start.get(pid, 0.0) for pid, c in now.items())
