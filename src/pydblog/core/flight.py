"""Concurrent chunk windows of one table (``CoreSettings.parallelism > 1``), IO-free.

Instead of one chunk at a time (``LIMIT n`` after the last key read, so chunk n+1 can
only be planned once chunk n is read), the table's remaining key space is cut into
**ranges** by boundary queries (``BoundsRequest``: the key of every ``step``-th row,
index only), and up to ``parallelism`` ranges are read at once, each as a
``ChunkRequest`` with ``after_key`` and ``max_key`` = its range and **its own window**
(its own L and H, or its own read-only fence). The windows overlap in the stream::

    stream:  [L1] e1 [L2] e2 (T1) e3 (T2) [H2] e4 [H1] e5 ...

Each window is exactly DBLog's (``core.window``): window i observes every event of the
table from its L on, and drops a key of *its* rows only (the ranges are disjoint, so an
event drops a key from the one window whose range holds it). Nothing about one window
depends on another's.

**Emission in key order.** A window's rows may be emitted only when every range before
it has been emitted: the persisted progress (``TableJob.last_key``, what a restart
resumes after) is then always the end of a contiguous prefix of emitted ranges, and a
``kill -9`` at any point re-reads exactly what was not emitted. A window whose H has
arrived while an earlier range is still open simply **stays open**: it keeps dropping
the keys of later events until it is emitted, at the H (or the passed fence) of the
range that unblocks it. Extending a window is always exact: an event after T is newer
than the row and, being in the log, stands for the key; the rows land at the emission
point, after every event that did not drop them.

**A range's read.** ``after < key <= upper LIMIT n``. If it returns ``n`` rows and its
last key is not ``upper`` (rows were inserted into the range since its bounds were
read), the range is emitted up to its last key read and its rest ``(last, upper]`` is
read next, before any later range is emitted. Otherwise the range is finished and
progress moves to ``upper``: the read saw every row of the range. The range whose upper
is the table's max key ends the table when it finishes.

**Failures and inconclusive windows** put the range back to be read again (new
watermarks); later ranges wait. Bounds only partition the key space: stale bounds cost
a continuation or a short chunk, never exactness.

**Integer keys** (``core.intsplit``): when the answer to the flight's first bounds query
says the chunk key is one integer column (``on_bounds(..., integer=True)``), the next
ranges are cut by arithmetic (``plan``) from the density that query and the ranges read
since have measured, instead of by more bounds queries. Such a range's ``LIMIT`` is
``intsplit.cap`` of the rows it was planned for; a read that fills it below the range's
upper shrinks the range to ``(after, last key read]`` at once (``set_rows``) and its
rest is cut into new ranges right after it, which may be read while it waits to be
emitted (instead of the continuation after its emission above).

**Slices** (``CoreSettings.slice_rows`` > 0). The head range's window hands its rows
out in consecutive slices of the rows read (``ChunkWindow.take``): the first at its H
(read-only: the passed fence), the next ones whenever ``SnapshotCore.on_boundary`` is
called (the runner calls it at the stream's transaction boundaries). A range whose
first slice is out is ``draining``: it stays the head, its window stays open (it keeps
dropping the keys of later events from the rows not yet out, the same extension as a
window waiting behind an earlier range above), and each slice moves the table's
progress and the range's ``after`` to the slice's last key read, so ``ranges[0].after``
is still the progress and a restart after any slice reads only the rest of the range
again. The last slice finishes the range as a whole chunk (its read count and last key
decide a continuation). The argument, invariant by invariant, is in
``docs/snapshots.md`` ("Concurrent windows", item 6).

This module keeps the ranges and their windows; ``core.concurrent`` decides when to
emit and moves the table's progress.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydblog.core.fence import FencedWindow, ReadFence
from pydblog.core.intsplit import Density
from pydblog.core.keys import RawKey, match_key, row_key
from pydblog.core.requests import BoundsRequest, ChunkRequest
from pydblog.core.window import ChunkWindow
from pydblog.events import ChangeEvent, ChunkRow


@dataclass(slots=True)
class Range:
    """One range ``(after, upper]`` of the table's key space, read as one chunk.

    ``last``: ``upper`` is the table's max key. ``request`` is the chunk request in
    flight (None: to be issued); ``window``/``fenced`` its window; ``low_seen``: L has
    come back (table watermarks); ``read``: its rows are in; ``high_seen``: H has come
    back (read-only: the fence is in ``fenced``; whether the stream passed it is asked
    at emission). ``planned``: the rows an arithmetic range was cut for (its read's
    ``LIMIT`` is ``intsplit.cap`` of it); 0 for a range between bounds."""

    after: RawKey | None
    upper: RawKey
    last: bool
    planned: int = 0
    request: ChunkRequest | None = None
    window: ChunkWindow | None = None
    fenced: FencedWindow | None = None
    low_seen: bool = False
    read: bool = False
    high_seen: bool = False
    draining: bool = False

    def reset(self, after: RawKey | None = None) -> None:
        """To be read again (from ``after`` if given: a continuation)."""
        if after is not None:
            self.after = after
        self.request = None
        self.window = None
        self.fenced = None
        self.low_seen = self.read = self.high_seen = self.draining = False

    def observes(self) -> ChunkWindow | FencedWindow | None:
        """The window that takes the table's stream events now, if any."""
        if self.fenced is not None:
            return self.fenced
        return self.window if self.low_seen else None


class Flight:
    """The ranges of the current table, in key order, and their requests.

    Invariants: ``ranges[0].after`` equals the table's progress (``TableJob.last_key``;
    None: from the first row); consecutive ranges meet (``r[i].upper == r[i+1].after``);
    at most ``parallelism`` requests are being read (``reading``) and at most
    ``parallelism + 1`` ranges are issued and not yet emitted (bounded memory: each
    holds at most one chunk of rows); ids of dropped requests are forgotten, so their
    late answers and watermarks are ignored.
    """

    __slots__ = (
        "_by_id", "bounds", "density", "key_columns", "max_key", "name", "parallelism",
        "planned_all", "ranges", "reading", "schema", "table",
    )

    def __init__(
        self, table: str, schema: str, name: str, key_columns: tuple[str, ...],
        max_key: RawKey, parallelism: int,
    ) -> None:
        """``table``: the job's name for it; ``schema``/``name``: as events carry it."""
        self.table = table
        self.schema = schema
        self.name = name
        self.key_columns = key_columns
        self.max_key = max_key
        self.parallelism = parallelism
        self.ranges: deque[Range] = deque()
        self.bounds: BoundsRequest | None = None
        self.planned_all = False
        self.reading: set[str] = set()
        self._by_id: dict[str, Range] = {}
        # Set when the first bounds answer says the key is one integer column.
        self.density: Density | None = None

    # -- planning -----------------------------------------------------------------------

    @property
    def issued(self) -> int:
        return sum(1 for r in self.ranges if r.request is not None)

    @property
    def open(self) -> bool:
        """Some request is in flight or some issued range is not emitted yet."""
        return bool(self.reading) or self.issued > 0

    @property
    def exhausted(self) -> bool:
        """No chunk of the table is left to start: every range is planned and issued (a
        range put back to be read again, or a continuation, makes it wanted again).
        Only then may the next table's chunks start (``core.concurrent``)."""
        return (
            self.planned_all and self.bounds is None
            and all(r.request is not None for r in self.ranges)
        )

    def planned_end(self, progress: RawKey | None) -> RawKey | None:
        """Where the next bounds start: the last range's upper, else the progress."""
        return self.ranges[-1].upper if self.ranges else progress

    def next_range(self) -> Range | None:
        """The first range still to be issued, if the limits allow one more."""
        if len(self.reading) >= self.parallelism or self.issued >= self.parallelism + 1:
            return None
        return next((r for r in self.ranges if r.request is None), None)

    def wants_bounds(self) -> bool:
        """More ranges should be planned: fewer are waiting to be issued than could be."""
        if self.planned_all or self.bounds is not None:
            return False
        if len(self.reading) >= self.parallelism:
            return False
        waiting = sum(1 for r in self.ranges if r.request is None)
        return waiting < self.parallelism

    def issue(self, rng: Range, request: ChunkRequest, window: ChunkWindow,
              fenced: FencedWindow | None) -> None:
        rng.request, rng.window, rng.fenced = request, window, fenced
        self._by_id[request.id] = rng
        self.reading.add(request.id)

    def ask_bounds(self, request: BoundsRequest) -> None:
        self.bounds = request
        self.reading.add(request.id)

    def on_bounds(self, request_id: str, keys: Sequence[RawKey], integer: bool = False) -> bool:
        """The boundary keys after the planned end (ascending, each at most the max key).
        Fewer than asked for: the rest of the table fits in one more range. ``integer``:
        the chunk key is one integer column (the reader says so), so the next ranges
        may be cut by arithmetic (``plan``). Returns False for an answer nobody waits
        for."""
        if self.bounds is None or self.bounds.id != request_id:
            return False
        after = self.bounds.after_key
        asked = self.bounds.count
        if integer and _ints(self.max_key, after, *keys):
            self.density = self.density or Density()
            self.density.calibrate(
                None if after is None else after[0], [k[0] for k in keys], self.bounds.step
            )
        self.bounds = None
        self.reading.discard(request_id)
        top = match_key(self.max_key)
        for key in keys:
            last = match_key(key) == top
            self.ranges.append(Range(after, tuple(key), last))
            after = tuple(key)
            if last:
                self.planned_all = True
                return True
        if len(keys) < asked:
            self.ranges.append(Range(after, self.max_key, True))
            self.planned_all = True
        return True

    def plan(self, progress: RawKey | None, target: int) -> bool:
        """Integer keys: cut up to ``parallelism`` more ranges of about ``target`` rows
        after the planned end by arithmetic (``core.intsplit``); False if this flight
        cannot (not an integer key, no density measured yet, no integer start: a bounds
        query then)."""
        density = self.density
        start = self.planned_end(progress)
        if density is None or not density.calibrated or start is None or not _ints(start):
            return False
        top = self.max_key[0]
        uppers = density.plan(start[0], top, target, self.parallelism)
        if not uppers:
            return False
        after = start
        for upper in uppers:
            self.ranges.append(Range(after, (upper,), upper == top, planned=target))
            after = (upper,)
        self.planned_all = uppers[-1] == top
        return True

    def _measure(self, rng: Range, rows: Sequence[ChunkRow], target: int) -> None:
        """An integer flight's range was read: its density is taken into account, and a
        read that filled its ``LIMIT`` below its upper covers ``(after, last key read]``
        only; its rest is cut into new ranges right after it (``core.intsplit``)."""
        density, request = self.density, rng.request
        if density is None or request is None or not _ints(rng.upper):
            return
        first = row_key(rows[0], self.key_columns) if rows else None
        last = row_key(rows[-1], self.key_columns) if rows else None
        if not _ints(first, last) or (rows and (first is None or last is None)):
            return
        after = rng.after[0] if rng.after is not None and _ints(rng.after) else None
        upper = rng.upper[0]
        end = last[0] if last is not None else None
        begin = first[0] if first is not None else None
        if not density.after_read(after, upper, len(rows), begin, end, request.limit):
            return
        assert end is not None
        rest = density.rest(end, upper, max(1, target), self.parallelism)
        was_last = rng.last
        rng.upper, rng.last = (end,), False
        at = next(i for i, r in enumerate(self.ranges) if r is rng) + 1
        low = end
        for i, high in enumerate(rest):
            final = i == len(rest) - 1
            self.ranges.insert(at + i, Range((low,), (high,), was_last and final, planned=target))
            low = high

    # -- answers and the stream ---------------------------------------------------------

    def owns(self, request_id: str) -> bool:
        return request_id in self._by_id or (
            self.bounds is not None and self.bounds.id == request_id
        )

    def range_of(self, request_id: str) -> Range | None:
        return self._by_id.get(request_id)

    def set_rows(self, request_id: str, rows: Sequence[ChunkRow],
                 fence: ReadFence | None, target: int = 1) -> Range | None:
        """A range's rows (``target``: the rows a range is cut for now, for the rest of
        an integer range whose read filled its ``LIMIT``)."""
        rng = self._by_id.get(request_id)
        if rng is None or request_id not in self.reading:
            return None
        self.reading.discard(request_id)
        rng.read = True
        if rng.fenced is not None and fence is not None:
            rng.fenced.set_answer(rows, fence)
        elif rng.window is not None:
            rng.window.set_rows(rows)
        self._measure(rng, rows, target)
        return rng

    def failed(self, request_id: str) -> bool:
        """A request failed: its range is read again (bounds: asked again). False if
        the id is not this flight's."""
        if self.bounds is not None and self.bounds.id == request_id:
            self.bounds = None
            self.reading.discard(request_id)
            return True
        rng = self._by_id.pop(request_id, None)
        if rng is None:
            return False
        self.reading.discard(request_id)
        rng.reset()
        return True

    def on_watermark(self, watermark_id: str) -> bool:
        """L or H of one of the ranges; True if it was one."""
        for rng in self.ranges:
            request = rng.request
            if request is None:
                continue
            if watermark_id == request.low_watermark:
                rng.low_seen = True
                return True
            if watermark_id == request.high_watermark:
                rng.high_seen = True
                return True
        return False

    def observe(self, event: ChangeEvent) -> None:
        """A stream event of this table: every open window takes it (each drops only
        keys of its own rows)."""
        for rng in self.ranges:
            w = rng.observes()
            if w is not None:
                w.observe(event)

    def head_ready(self, passed: Callable[[FencedWindow], bool]) -> Range | None:
        """The first range, if its window may close now: its H has come back (table
        watermarks, fenced or not), or the stream has passed its fence (read-only)."""
        if not self.ranges:
            return None
        head = self.ranges[0]
        if head.request is None:
            return None
        if head.draining:  # its first slice is out: the rest may follow at any point
            return head
        if head.request.high_watermark is not None:
            return head if head.high_seen else None
        return head if head.fenced is not None and head.read and passed(head.fenced) else None

    @property
    def emitting(self) -> bool:
        """The head range may hand out rows now without waiting for anything (its H
        came back, or a slice of it is out): ``SnapshotCore.on_boundary`` has work."""
        head = self.ranges[0] if self.ranges else None
        if head is None or head.request is None:
            return False
        return head.draining or (head.request.high_watermark is not None and head.high_seen)

    def forget(self, rng: Range) -> None:
        if rng.request is not None:
            self._by_id.pop(rng.request.id, None)
            self.reading.discard(rng.request.id)

    def pop_head(self) -> Range:
        rng = self.ranges.popleft()
        self.forget(rng)
        return rng


def _ints(*keys: RawKey | None) -> bool:
    """Every key given is one plain integer (``None``s are skipped; bool is not one)."""
    return all(k is None or (len(k) == 1 and type(k[0]) is int) for k in keys)
