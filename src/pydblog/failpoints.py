"""Named fault points for crash tests: ``DBLOG_CRASH_AT=<point>[:<n>]`` makes the
process exit at once (status 137, as after ``kill -9``: no flush, no cleanup) the
``n``-th time (counted from 0; without ``:n``, the first time) it reaches ``point``.

The points, each between two steps of the commit order (ports.py):

- ``after-log``: the change log committed a batch, the state store not yet;
- ``after-state``: the state store saved, the source not yet acknowledged;
- ``kafka-after-data``: Kafka acknowledged a commit's data, its checkpoint message not
  yet sent (``n`` counts the log's commits; the begin message is commit 0);
- ``kafka-before-commit``: the checkpoint message acknowledged, the transaction not yet
  committed.

Points are reached once per commit, not per event: the variable is read at each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

POINTS = frozenset({"after-log", "after-state", "kafka-after-data", "kafka-before-commit"})


@dataclass(frozen=True, slots=True)
class _Spec:
    point: str
    nth: int


def _spec() -> _Spec | None:
    raw = os.environ.get("DBLOG_CRASH_AT")
    if not raw:
        return None
    point, _, nth = raw.partition(":")
    if point not in POINTS:
        raise ValueError(f"DBLOG_CRASH_AT={raw!r}: unknown point (one of {sorted(POINTS)})")
    return _Spec(point, int(nth) if nth else 0)


_reached: dict[str, int] = {}


def hit(point: str, nth: int | None = None) -> None:
    """Exit the process if ``DBLOG_CRASH_AT`` names ``point`` and this is its ``n``-th
    time: counted here, or ``nth`` when the caller counts itself."""
    spec = _spec()
    if spec is None or spec.point != point:
        return
    if nth is None:
        nth = _reached.get(point, 0)
        _reached[point] = nth + 1
    if nth == spec.nth:
        os._exit(137)
