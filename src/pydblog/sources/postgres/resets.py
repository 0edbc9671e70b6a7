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

A copy is marked as one in its message. A copy is yielded only when its id is still
kept (its original never came through this stream); a copy of an id not kept is
skipped: its original, an earlier copy, or a reset logged after it came back first (so
the table's later state is in the log already; a GONE copy after its table's RECREATED
would truncate the mirror for good, as GONE queues no snapshot). No memory of ids that
came back is needed, however many copies are on their way. An original (not a copy)
with no id (logged by an older version) or an id not kept here (logged by a refresh
whose checkpoint was never written: ``open`` derives that change again) is always
yielded: its reset was not in the log yet.

Messages come back in the order they were logged (one WAL): a reset that comes back
means every reset kept before it came back too (or was logged where this stream will
never read it, and then the one coming back is its later copy): they are dropped with
it, never logged again after it (a table's GONE logged again after its RECREATED
would end its snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Reset:
    id: str
    table: str
    kind: str


class Unreturned:
    """The resets logged and not seen back yet, oldest first."""

    def __init__(self) -> None:
        self.pending: list[Reset] = []

    @classmethod
    def load(cls, raw: dict[str, Any]) -> Unreturned:
        """From the checkpoint's ``pg_captured`` (no keys: none pending)."""
        out = cls()
        for entry in raw.get("resets") or ():
            rid, table, kind, *_ = entry
            out.pending.append(Reset(str(rid), str(table), str(kind)))
        return out

    def dump(self) -> dict[str, Any]:
        """The checkpoint's keys (none when nothing is pending)."""
        if not self.pending:
            return {}
        return {"resets": [[r.id, r.table, r.kind] for r in self.pending]}

    def logged(self, resets: list[Reset]) -> None:
        """``resets`` were committed (in this order), after every one kept."""
        self.pending.extend(resets)

    def to_log_again(self) -> list[Reset]:
        """The resets to log again (at ``open``, each marked as a copy), oldest first."""
        return list(self.pending)

    def came_back(self, rid: str, copy: bool = False) -> tuple[bool, bool]:
        """The message of reset ``rid`` (``copy``: one logged again at an open) came
        through the stream: (whether to yield it, whether the kept state changed)."""
        for i, r in enumerate(self.pending):
            if r.id == rid:
                # It, and every one kept before it (their messages came before, or
                # only its copy comes, after theirs).
                del self.pending[:i + 1]
                return True, True
        return not copy, False
