"""Process facts for benchmarks (Linux /proc)."""

from __future__ import annotations

from pathlib import Path


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set size (VmHWM) in KiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0
