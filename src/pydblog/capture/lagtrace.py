"""Where a stream event's lag goes (a debugging aid for benchmarks, off by default).

``PYDBLOG_LAG_TRACE=<file>`` makes ``dblog run`` write one line per logged stream
event (a row change, not a snapshot row) and one per long stall of the capture
thread, so a benchmark can split the stream's lag (server commit -> change log
commit) into its terms:

    e <commit_ms> <recv> <submit> <append_start> <append_end>
        an event: its source commit time (ms), then wall-clock seconds when the
        capture thread took it from the stream, handed its batch to the writer, and
        when the writer's append that holds it started and committed;
    a <start> <seconds> <events> <stream events> <cpu seconds> <run-queue seconds>
        one append of the writer (events: stream and snapshot rows; its thread's CPU,
        and its time waiting for a CPU: the rest is IO or the GIL);
    r <start> <seconds> <rows> <thread>
        one chunk read of a snapshot worker;
    s <start> <seconds> <what>
        the capture thread spent ``seconds`` (>= STALL_S) in one step (``what``:
        the stream item type; ``Watermark``: a watermark row, with the window it
        closes and the rows it emits; ``submit``: handing a batch to the writer,
        waiting while its queue is full; ``flush``: a batch full at
        ``batch_max_events``) without reading the stream.

Invariant: with the variable unset, nothing is recorded (one module-level flag).
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO

STALL_S = 0.005
"""Steps of the capture thread shorter than this are not recorded."""

PATH = os.environ.get("PYDBLOG_LAG_TRACE") or None
ON = PATH is not None

_lock = threading.Lock()
_out: IO[str] | None = None


def _write(text: str) -> None:
    global _out
    with _lock:
        if _out is None:
            assert PATH is not None
            _out = open(PATH, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
        _out.write(text)
        _out.flush()  # the process ends by a signal: nothing may stay in a buffer


def stall(start: float, what: str) -> None:
    """The capture thread did ``what`` from ``start`` (``time.time()``) until now."""
    took = time.time() - start
    if took >= STALL_S:
        _write(f"s {start:.6f} {took:.6f} {what}\n")


def run_wait() -> float:
    """Seconds the calling thread has waited for a CPU so far (Linux schedstat; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def appended(
    events: list[tuple[int, float, float]], start: float, end: float, size: int, cpu: float,
    run_wait: float,
) -> None:
    """Stream events (commit ms, received, submitted) committed by one append of
    ``size`` events in all, which took the writer thread ``cpu`` seconds of CPU and
    ``run_wait`` seconds waiting for a CPU."""
    _write(f"a {start:.6f} {end - start:.6f} {size} {len(events)} {cpu:.6f} {run_wait:.6f}\n"
           + "".join(f"e {c} {r:.6f} {s:.6f} {start:.6f} {end:.6f}\n" for c, r, s in events))


def chunk_read(start: float, rows: int) -> None:
    """A snapshot worker read ``rows`` chunk rows from ``start`` until now."""
    _write(f"r {start:.6f} {time.time() - start:.6f} {rows} {threading.current_thread().name}\n")


def flush() -> None:
    with _lock:
        if _out is not None:
            _out.flush()
