"""``consistent = true``'s lockstep rounds: the shared state file and the planners' use of
it (the rules are ``core.drainer.plan_round``'s).

The state (``core.drainer.Rounds``: round, its time ``T``, the sources done with it,
the last complete cut) is one JSON file in the sync's status directory (``[log] path``
of the sync's config, beside ``sync-watermarks.json``), read and replaced under an
exclusive ``fcntl`` lock by each source's planner (the ``dblog`` source's
``latestOffset``, each in a Python process of its own) and read by the driver for
reporting.

Invariants:
- The state is replaced atomically (write, fsync, rename) while the lock is held, so a
  planner killed at any point leaves the old state or the new one, and two planners
  never interleave their read-modify-write.
- A planner writes the state before it returns its batch's end: Spark logs that end
  afterwards, so a crash between the two leaves a state the next plan, from the same
  start, plans the same end from (``plan_round`` is a function of state and start).
- Light to import (Spark's planning processes): json, fcntl and ``core.drainer``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydblog.core.drainer import Rounds, plan_round

ROUNDS_FILE = "sync-rounds.json"
"""In the sync's status directory: the rounds' state (``core.drainer.Rounds.to_json``)."""
LOCK_FILE = "sync-rounds.lock"


def bound_spec(status_dir: str | Path, source: str, logs: dict[str, str],
               cap: int | None = None) -> str:
    """The ``bound`` option of ``source``'s query: the state file, every source's
    ``[log]`` (as JSON) and the rounds' cap (``--available-now``)."""
    return json.dumps({"self": source, "state": str(Path(status_dir) / ROUNDS_FILE),
                       "logs": logs, "cap": cap})


def read_state(path: str | Path) -> Rounds:
    """The rounds' state at ``path`` (a fresh one when there is none)."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return Rounds()
    return Rounds.from_json(raw)


def _write(path: Path, state: Rounds) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state.to_json(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[Path]:
    """Hold the rounds' lock (a file beside the state) for a read-modify-write."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p.with_name(LOCK_FILE), "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield p
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def least_complete(logs: dict[str, str]) -> int | None:
    """The least completeness time of the logs (None while one has none)."""
    from pydblog.changelog import complete_ms

    times = [complete_ms(log) for log in logs.values()]
    return None if any(t is None for t in times) else min(t for t in times if t is not None)


def plan_batch(bound_json: str, start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """The end of the batch from ``start`` of the source named in ``bound_json``
    (``bound_spec``), ``end`` being how far it could reach (the trigger's limit and the
    available-now target applied): cut at its round's time (``plan_round``), the state
    updated under the lock. Returns ``start`` when the source waits for the others."""
    from pydblog.changelog import cut_end

    spec = json.loads(bound_json)
    source, logs = str(spec["self"]), dict(spec["logs"])
    cap = spec.get("cap")
    own = logs[source]
    cuts: dict[int, dict[str, Any]] = {}

    def cut(t: int) -> dict[str, Any]:
        if t not in cuts:
            cuts[t] = cut_end(own, start, end, t) if end != start else start
        return cuts[t]

    with locked(spec["state"]) as path:
        state = read_state(path)
        new, planned = plan_round(state, source, list(logs), start, cut, least_complete(logs),
                                  None if cap is None else int(cap))
        if new != state:
            _write(path, new)
    out: dict[str, Any] = planned
    return out
