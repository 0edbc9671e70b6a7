"""The incremental lane read one chunk at a time, and its read-ahead. IO-free.

Without concurrent windows the incremental lane has one request awaiting its final
watermark (``Pending``: a table start, a chunk, or a key re-read). With read-ahead
(``CoreSettings.read_ahead``) a table's next chunk may go out behind it:

- Once chunk n's rows are in, and n is not the table's last, chunk n+1 is planned
  (``after_key`` = n's last key read) while n still waits for its H (``next_chunk``).
  The worker runs requests in order, so n+1's L lands after n's H and the two windows
  never overlap.
- At n's H, n+1 is kept if n was conclusive, i.e. the table's progress now equals
  n+1's ``after_key`` (``continues``), and dropped otherwise: its watermarks and
  answer are then unknown and ignored, and n is planned again.
- Nothing is read ahead while paused or while key re-reads wait (those go first).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pydblog.core.fence import FencedWindow, Fencing
from pydblog.core.keys import match_key
from pydblog.core.planner import Planner
from pydblog.core.progress import TableJob
from pydblog.core.requests import ChunkRequest, Request
from pydblog.core.run import StartAnswer
from pydblog.core.window import ChunkWindow


@dataclass(slots=True)
class Pending:
    """An incremental request whose final watermark has not been seen yet.

    ``window``: a chunk's (or key re-read's) window; ``low_seen``: its L came back (a
    read-only window is open from the request on); ``fenced``: the window judged by
    the read's fence (fenced windows); ``answer``: a table start's answer."""

    request: Request
    answer: StartAnswer | None = None
    window: ChunkWindow | None = None
    low_seen: bool = False
    fenced: FencedWindow | None = None

    def fence(self, fencing: Fencing) -> None:
        """Fenced windows: the window is judged by its read's fence; it sees every
        unsettled event of its table from now on (read-only: there is no L to wait for)."""
        if fencing.fenced and self.window is not None:
            self.fenced = fencing.window(self.window)
            self.low_seen = fencing.read_only  # else at its L

    @property
    def fence_in(self) -> bool:
        """The read's fence has come (fenced windows)."""
        return self.fenced is not None and self.fenced.fence is not None


def next_chunk(pending: Pending, job: TableJob | None, planner: Planner) -> ChunkRequest | None:
    """Chunk n+1 of ``job``'s table while chunk n (``pending``) waits for its H, or None
    (n's rows are not in yet, n is the table's last, or n is not a chunk of it)."""
    request, window = pending.request, pending.window
    if not isinstance(request, ChunkRequest) or window is None or not window.has_rows:
        return None
    if job is None or job.table != request.table or job.key_columns != request.key_columns:
        return None
    last = window.last_read_key
    if job.reached_end(window.read_count, request.limit, last):
        return None
    ahead = planner.plan(dataclasses.replace(job, last_key=last), blocking=False)
    assert isinstance(ahead, ChunkRequest)
    return ahead


def continues(ahead: Pending, job: TableJob | None) -> bool:
    """After a conclusive chunk: the read-ahead chunk continues exactly where the
    table's progress now is (else it must be dropped)."""
    request = ahead.request
    assert isinstance(request, ChunkRequest)
    return not (
        job is None or job.table != request.table or job.last_key is None
        or request.after_key is None
        or match_key(job.last_key) != match_key(request.after_key)
    )
