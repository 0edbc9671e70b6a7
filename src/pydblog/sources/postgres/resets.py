"""Table resets logged but not seen back in the stream yet (no IO).

A table's reset (``source._reset_tables``) is a transactional message logged where the
publication is kept (the source, or a standby's primary), committed with the
publication change, and yielded as a ``RelationReset`` when it comes back through the
stream. The refresh that logs it puts the new captured set into the checkpoint at
once (``source._captured_state``), so a reset whose message never comes back would be
lost for good: a standby promoted right after a refresh logged it on the old primary,
or before it received that WAL (an asynchronous failover), streams a history without
it. So every reset carries an id, is kept here until its message comes back, and is
part of the checkpoint (``pg_captured.resets``); ``open`` logs each one kept again,
with its id, in order, before any reset of its own refresh, on the server whose
stream is read now.

A reset that comes back twice (its message was in the stream after all, then its copy,
or copies of several opens) is yielded once: the ids of resets that came back after a
copy was logged are kept (``returned``, the last ``KEEP``) and their copies skipped. A
reset with no id (logged by an older version) or an id not kept here (logged by a
refresh whose checkpoint was never written: ``open`` derives that change again) is
always yielded: a second reset of a table is a truncate and snapshot more, never a
loss. Skipping is what must never be wrong: only a copy, logged after its original, of
a reset already yielded, is skipped.

Messages come back in the order they were logged (one WAL): a reset that comes back
means every reset kept before it came back too (or was logged where this stream will
never read it, and then the one coming back is its later copy): they are dropped with
it, never logged again after it (a table's GONE logged again after its RECREATED
would end its snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

KEEP = 64
"""Ids of resets come back whose copies may still come (the most recent ones)."""


@dataclass(frozen=True, slots=True)
class Reset:
    id: str
    table: str
    kind: str
    copied: bool = False
    """Logged again at an ``open``: a copy may come after the message."""


class Unreturned:
    """The resets logged and not seen back yet, oldest first, and the ids of the last
    ones seen back that had copies logged."""

    def __init__(self) -> None:
        self.pending: list[Reset] = []
        self.returned: list[str] = []

    @classmethod
    def load(cls, raw: dict[str, Any]) -> Unreturned:
        """From the checkpoint's ``pg_captured`` (no keys: none pending)."""
        out = cls()
        for entry in raw.get("resets") or ():
            rid, table, kind, copied = entry
            out.pending.append(Reset(str(rid), str(table), str(kind), bool(copied)))
        out.returned = [str(i) for i in raw.get("returned") or ()]
        return out

    def dump(self) -> dict[str, Any]:
        """The checkpoint's keys (none when nothing is pending or remembered)."""
        out: dict[str, Any] = {}
        if self.pending:
            out["resets"] = [[r.id, r.table, r.kind, r.copied] for r in self.pending]
        if self.returned:
            out["returned"] = list(self.returned)
        return out

    def logged(self, resets: list[Reset]) -> None:
        """``resets`` were committed (in this order), after every one kept."""
        self.pending.extend(resets)

    def to_log_again(self) -> list[Reset]:
        """The resets to log again (at ``open``), oldest first; from now on each may
        come back twice."""
        self.pending = [replace(r, copied=True) for r in self.pending]
        return list(self.pending)

    def came_back(self, rid: str) -> tuple[bool, bool]:
        """The message of reset ``rid`` came through the stream: (whether to yield it,
        whether the kept state changed)."""
        if rid in self.returned:
            return False, False  # a copy of a reset already yielded
        for i, r in enumerate(self.pending):
            if r.id == rid:
                # It, and every one kept before it (their messages came before, or
                # only its copy comes, after theirs).
                copied = [p.id for p in self.pending[:i + 1] if p.copied]
                del self.pending[:i + 1]
                if copied:
                    self.returned.extend(copied)
                    del self.returned[:-KEEP]
                return True, True
        return True, False
