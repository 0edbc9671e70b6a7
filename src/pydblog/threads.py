"""Operating-system names for pydblog's threads, so that ``top -H``, ``ps -L`` and the
benchmarks' per-thread CPU figures tell them apart (Python 3.11 names only its own
``threading.Thread`` objects). Best effort: a no-op where ``prctl`` is missing."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
from typing import Any

_PR_SET_NAME = 15
_prctl: Any = None
with contextlib.suppress(OSError, AttributeError):  # not Linux
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl


def name_native_thread(name: str | None = None) -> None:
    """Give the calling thread its OS name (at most 15 bytes): ``name``, else its
    ``threading`` name."""
    if _prctl is None:
        return
    raw = (name or threading.current_thread().name).encode()[:15]
    with contextlib.suppress(Exception):  # naming is cosmetic
        _prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)
