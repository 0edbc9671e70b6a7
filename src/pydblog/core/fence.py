"""Read-only windows: chunks fenced by the read's own transaction snapshot, no watermarks.

With ``watermark = "read-only"`` the worker writes nothing to the source. Instead of
L and H it hands the core, with the chunk's rows, a ``ReadFence``: what the SELECT's
snapshot saw, in the stream's terms. Two questions decide everything:

- ``visible(event)``: did the read see this event's transaction? True: the row already
  includes the event (it stays). False or None (cannot tell): the event is at least as
  new as the row, or may be, so the row's key is dropped and the event stands for it.
  Dropping is always safe: the event and every later one of that key are in the log.
- ``passed(reached)``: the stream, having delivered every transaction that committed
  before ``reached`` (a commit's end, a keepalive's WAL end), has delivered every
  transaction the read saw. The rows are emitted there.

Why this is exact (invariant 1 of docs/architecture.md). Per key, the transactions the read saw
come before the ones it did not in the stream's commit order (a row's writers are
serialised by its row lock, and the later one cannot become visible first). At the
close point every seen transaction has been delivered, so a row emitted there is never
placed after an older event of its key; every unseen transaction's event delivered
before the close dropped the key; unseen ones after the close are newer than the row
and come after it. An event delivered *before* the chunk was even requested can still
be unseen (PostgreSQL decodes a commit before it becomes visible, e.g. while it waits
for a synchronous standby), so the core keeps the events of the table being read that
no fence has yet proven visible (``Unsettled``) and shows them to each new window.

Events are kept only from the moment a table is *watched* (queued for a snapshot, or
with keys waiting for a re-read). Every transaction the stream delivered before that
(the ``Floor``) is assumed by the window to be in the rows, so a window is conclusive
only once its fence ``covers`` the floor: a read on a lagging hot standby may not have
replayed a commit the stream delivered seconds ago, and its row would then land after
that newer event. Until a fence covers it, windows are inconclusive (the chunk is read
again); once one does, the floor is dropped (visibility never goes back). Fences that
judge by transaction ids (a PostgreSQL primary, whose commits may wait for a
synchronous standby after the stream delivered them) need to know which transactions
were delivered before the floor: ``Delivered`` keeps those no fence has shown visible.

``settles(event)``: visible to this read *and to every later read of the same server*
(visibility never goes back), so the event can be forgotten. Each source documents its
fences in ``sources/<name>/fences.py``; docs/snapshots.md has the argument per source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from pydblog.core.window import ChunkWindow, WindowResult
from pydblog.events import ChangeEvent, ChunkRow
from pydblog.positions import Position, decode_position, encode_position

MAX_UNSETTLED = 200_000
"""Events kept while no fence proves them visible (e.g. a paused snapshot under write
load). Beyond it the oldest are forgotten and windows stay inconclusive until a fence
settles everything up to the last forgotten one."""

MAX_UNSETTLED_BYTES = 64 << 20
"""...and their estimated size (``weight``) at most: kept events are ``slim`` (no row
images beyond the identity), but an identity can be the whole row (``REPLICA IDENTITY
FULL`` without a key)."""

EVENT_OVERHEAD = 400
"""Estimated bytes of a kept event besides its values (the tuple, its position, three
small dicts): what ``weight`` adds to twice the length of its values' JSON."""


def slim(event: ChangeEvent) -> ChangeEvent:
    """What a window needs of a stream event (``window.ChunkWindow.observe``): its op,
    table, position, key, unchanged columns, and its images' identity values (the key's
    columns: a window's chunk key is the identity, or it windows by identity). The rest
    of a wide row is not kept. An image whose identity values equal the key is the
    key's own dict."""
    key = event.key
    if not key or (event.before is None and event.after is None):
        return event

    def cut(image: dict[str, Any] | None) -> dict[str, Any] | None:
        if image is None:
            return None
        part = {c: image[c] for c in key if c in image}
        return key if part == key else part

    return event._replace(before=cut(event.before), after=cut(event.after))


def weight(event: ChangeEvent) -> int:
    """Estimated bytes ``event`` holds (``MAX_UNSETTLED_BYTES``)."""
    values = orjson.dumps((event.key, event.before, event.after), default=str)
    return EVENT_OVERHEAD + 2 * len(values)


LOST_XIDS = 10_000
"""Distinct transaction ids ``Lost`` keeps (and a checkpoint persists) at most; past it
only their range is known."""


class Lost:
    """What is known of unsettled events the core no longer holds (forgotten past
    ``MAX_UNSETTLED``, or held before a restart): the position of the newest one in
    stream order, the largest and smallest numeric transaction ids among them (``max_tx``
    None if one had none) and, up to ``LOST_XIDS`` of them, the ids themselves (``xids``;
    None past it, or unknown). A fence that ``settles_lost`` proves every one of them
    visible for good. Fences that judge by transaction ids judge them by their own ids
    (or their range), never by transactions that were not delivered: an open transaction
    that never committed must not keep them unsettled."""

    __slots__ = ("last_position", "max_tx", "min_tx", "xids")

    def __init__(self, last_position: Position | None = None, max_tx: int | None = 0,
                 xids: set[int] | None = None, min_tx: int | None = None) -> None:
        """``Lost(xids=set())``: nothing lost yet (``add`` then keeps everything)."""
        self.last_position = last_position
        self.max_tx = max_tx
        self.min_tx = min_tx
        self.xids = xids

    def add(self, events: Sequence[ChangeEvent]) -> None:
        for event in events:
            tx = getattr(event.position, "tx_id", None)
            if self.max_tx is None:
                continue
            if not isinstance(tx, int):
                self.max_tx = self.min_tx = self.xids = None
                continue
            self.max_tx = max(self.max_tx, tx)
            self.min_tx = tx if self.min_tx is None else min(self.min_tx, tx)
            if self.xids is not None:
                self.xids.add(tx)
                if len(self.xids) > LOST_XIDS:
                    self.xids = None
        if events:
            self.last_position = events[-1].position

    def merge(self, other: Lost) -> None:
        if other.last_position is not None:
            self.last_position = other.last_position
        if self.max_tx is None:
            return
        if other.max_tx is None:
            self.max_tx = self.min_tx = self.xids = None
            return
        self.max_tx = max(self.max_tx, other.max_tx)
        mins = [m for m in (self.min_tx, other.min_tx) if m is not None]
        self.min_tx = min(mins) if mins else None
        if self.xids is not None and other.xids is not None:
            self.xids |= other.xids
            if len(self.xids) > LOST_XIDS:
                self.xids = None
        else:
            self.xids = None

    def to_json(self) -> dict[str, Any]:
        last = self.last_position
        return {"last": None if last is None else encode_position(last), "max_tx": self.max_tx,
                "min_tx": self.min_tx, "xids": None if self.xids is None else sorted(self.xids)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lost:
        last = data.get("last")
        xids = data.get("xids")  # absent in states written before it was kept: unknown
        return cls(None if last is None else decode_position(last), data.get("max_tx"),
                   None if xids is None else {int(x) for x in xids}, data.get("min_tx"))


MAX_DELIVERED = 100_000
"""Transaction ids ``Delivered`` keeps at most; past it they are forgotten."""


class Delivered:
    """The numeric transaction ids (``tx_id``) the stream delivered that no fence has
    yet shown visible for good, for fences that judge the floor by transaction ids
    (``ReadFence.in_doubt``): a PostgreSQL primary delivers a commit before it becomes
    visible (while it waits for a synchronous standby). ``forgotten``: some delivered
    ids may be missing (at a start: those delivered before it; past ``limit``); the
    next fence that tells its doubtful transactions resolves that, conservatively, by
    taking every committing one (``ReadFence.in_commit``: every forgotten one still
    invisible is among them; one still executing, or prepared and left, was not
    delivered, and must not hold every snapshot for as long as it lives)."""

    __slots__ = ("_last", "epoch", "forgotten", "limit", "xids")

    def __init__(self, limit: int = MAX_DELIVERED) -> None:
        self.xids: set[int] = set()
        self.forgotten = True
        self.limit = limit
        self._last: int | None = None
        self.epoch = 0
        """Clears and new floors so far. A fence resolves ``forgotten`` (and judges a
        floor) only if its read was requested in the current epoch (``issued``) or the
        floor's: one requested before the clear may have taken its running transactions
        before some forgotten ones had an xid."""

    def add(self, position: Position) -> None:
        tx = getattr(position, "tx_id", None)
        if not isinstance(tx, int) or tx == self._last:
            return
        self._last = tx
        if len(self.xids) >= self.limit:
            self.xids.clear()
            self.forgotten = True
            self.epoch += 1
        self.xids.add(tx)

    def prune(self, fence: ReadFence, issued: int | None = None) -> None:
        """Forget what ``fence`` shows visible (visibility never goes back). ``issued``:
        the epoch its read was requested in (None: now)."""
        doubt = fence.in_commit()
        if doubt is None:
            return
        if self.forgotten and (issued is None or issued >= self.epoch):
            self.xids |= doubt
            self.forgotten = False
        self.xids = {x for x in self.xids if not fence.sees_tx(x)}


class Floor:
    """Where the core began to keep a table's events: every transaction the stream had
    delivered up to ``position`` (that position's own included) was never held by a
    window, so only a fence that ``covers`` it may decide one. ``position`` is None
    until the core learns any position (a table watched before the stream delivered
    anything: the first position it learns is past everything the stream skipped).
    ``xids``/``forgotten``: what ``Delivered`` knew then of the delivered transactions
    not yet shown visible (for fences that judge by transaction ids). Only a position
    still unknown is ever set in place; a window keeps the floor it was opened with,
    and ``narrowed`` makes a new one for later windows."""

    __slots__ = ("epoch", "forgotten", "position", "xids")

    def __init__(self, position: Position | None, xids: frozenset[int] = frozenset(),
                 forgotten: bool = True, epoch: int = 0) -> None:
        self.position = position
        self.xids = xids
        self.forgotten = forgotten
        self.epoch = epoch  # ``Delivered.epoch`` when it was taken

    @classmethod
    def at(cls, position: Position | None, delivered: Delivered) -> Floor:
        return cls(position, frozenset(delivered.xids), delivered.forgotten, delivered.epoch)

    def fresh(self, issued: int | None) -> bool:
        """A read requested in ``Delivered`` epoch ``issued`` (None: now) was requested
        after this floor was taken, so its fence may judge it: one requested before may
        have taken its running transactions before some delivered ones had an xid."""
        return issued is None or issued >= self.epoch

    def covered_by(self, fence: ReadFence) -> bool:
        return self.position is not None and fence.covers(self)

    def narrowed(self, fence: ReadFence, issued: int | None = None) -> Floor:
        """This floor for reads after ``fence``'s: without the transactions it shows
        visible for good (if forgotten: with every committing one it doubts instead
        (``ReadFence.in_commit``), only if its
        read was requested in the floor's ``Delivered`` epoch or later, ``issued``;
        None: now)."""
        doubt = fence.in_commit()
        if doubt is None:
            return self
        resolve = self.forgotten and self.fresh(issued)
        xids = doubt | self.xids if resolve else self.xids
        return Floor(self.position, frozenset(x for x in xids if not fence.sees_tx(x)),
                     self.forgotten and not resolve, self.epoch)


class ReadFence(Protocol):
    """What one chunk read saw (see the module docstring). Immutable, IO-free."""

    def visible(self, event: ChangeEvent) -> bool | None: ...

    def covers(self, floor: Floor) -> bool:
        """Every transaction the stream delivered up to ``floor.position`` (its own
        included) is visible to this read and to every later one."""
        ...

    def in_doubt(self) -> frozenset[int] | None:
        """Transaction ids (as the stream numbers them) that were running just before
        the read and that it does not see: every delivered transaction it does not see
        is among them. None: this fence judges the floor by its position only."""
        ...

    def in_commit(self) -> frozenset[int] | None:
        """Of ``in_doubt``, the transactions that may have been delivered before the
        read was requested (their commit record was written: e.g. waiting for a
        synchronous standby); one still executing, or prepared and left, was not. What
        a forgotten ``Delivered`` (and floor) resolves to, and what ``covers`` judges a
        forgotten floor by. None iff ``in_doubt`` is None."""
        ...

    def sees_tx(self, tx: int) -> bool:
        """The read sees transaction ``tx`` (only asked when ``in_doubt`` is not None)."""
        ...

    def settles(self, event: ChangeEvent) -> bool: ...

    def settles_lost(self, lost: Lost) -> bool:
        """Every forgotten event is visible to this read and every later one."""
        ...

    def passed(self, reached: Position) -> bool: ...


class Unsettled:
    """Stream events of the tables being read that no fence has proven visible yet,
    in stream order, ``slim``. Bounded by ``limit`` events and ``limit_bytes`` of their
    ``weight``: past either, the oldest are forgotten into ``lost`` (down to half of
    each bound), and windows stay inconclusive until a fence ``settles_lost``. ``floor``:
    where the newest watched table began to be kept (windows stay inconclusive until a
    fence ``covers`` it).

    Invariant: ``_held`` is ``Lost(xids=set())`` with ``add(events)``, kept up to date
    as events come (``summary`` runs at every checkpoint: it must not walk them)."""

    __slots__ = ("_held", "_weights", "delivered", "events", "floor", "limit", "limit_bytes",
                 "lost", "weight")

    def __init__(self, limit: int = MAX_UNSETTLED, limit_bytes: int = MAX_UNSETTLED_BYTES) -> None:
        self.events: list[ChangeEvent] = []
        self._weights: list[int] = []  # each event's ``weight``, in step with ``events``
        self.weight = 0
        self._held = Lost(xids=set())
        self.limit = limit
        self.limit_bytes = limit_bytes
        self.lost: Lost | None = None
        self.floor: Floor | None = None
        self.delivered = Delivered()

    def watch_from(self, position: Position | None) -> None:
        """A table is watched from now on; ``position``: the newest the stream has
        delivered (None: nothing yet). Replaces an older floor (a later position: a
        fence that covers it covers the older one)."""
        self.delivered.epoch += 1  # reads requested before it cannot judge it
        self.floor = Floor.at(position, self.delivered)

    def learn(self, position: Position) -> None:
        """A position the stream delivered: it places a floor still unknown."""
        self.delivered.add(position)
        floor = self.floor
        if floor is not None and floor.position is None:
            floor.position = position  # (in place: windows already open share it)

    def add(self, event: ChangeEvent) -> None:
        """Keep ``event`` (``slim``)."""
        event = slim(event)
        w = weight(event)
        self.events.append(event)
        self._weights.append(w)
        self.weight += w
        self._held.add((event,))
        if len(self.events) > self.limit or self.weight > self.limit_bytes:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        """The oldest events into ``lost``, until at most half of each bound is kept."""
        total, cut = self.weight, 0
        count = len(self.events) - self.limit // 2
        while cut < len(self.events) and (cut < count or total > self.limit_bytes // 2):
            total -= self._weights[cut]
            cut += 1
        if self.lost is None:
            self.lost = Lost(xids=set())
        self.lost.add(self.events[:cut])
        del self.events[:cut]
        del self._weights[:cut]
        self.weight = total
        self._recount()

    def _recount(self) -> None:
        self._held = Lost(xids=set())
        self._held.add(self.events)

    def prune(self, fence: ReadFence, issued: int | None = None) -> None:
        """Forget what ``fence`` proves visible for good. ``issued``: the
        ``Delivered.epoch`` its read was requested in (None: now)."""
        kept = [(e, w) for e, w in zip(self.events, self._weights, strict=True)
                if not fence.settles(e)]
        if len(kept) != len(self.events):
            self.events = [e for e, _ in kept]
            self._weights = [w for _, w in kept]
            self.weight = sum(self._weights)
            self._recount()
        if self.lost is not None and fence.settles_lost(self.lost):
            self.lost = None
        self.delivered.prune(fence, issued)
        floor = self.floor
        if floor is not None:
            fresh = floor.fresh(issued)
            self.floor = None if fresh and floor.covered_by(fence) else floor.narrowed(fence, issued)

    def clear(self) -> None:
        self.events.clear()
        self._weights.clear()
        self.weight = 0
        self._recount()
        self.lost = None
        self.floor = None

    def summary(self) -> Lost | None:
        """Everything unsettled as a ``Lost`` (what ``SnapshotCore.state()`` persists: the
        events themselves are not, and after a restart windows stay inconclusive until
        a fence settles them), or None when nothing is unsettled."""
        if not self.events and self.lost is None:
            return None
        lost = Lost(xids=set())
        if self.lost is not None:
            lost.merge(self.lost)
        lost.merge(self._held)
        return lost


class FencedWindow:
    """The window of one read-only chunk: a ``ChunkWindow`` whose drops are the events
    the read did not see. Events that arrive before the fence are held and judged when
    it comes; after it, each is judged on arrival."""

    __slots__ = ("_floor", "_held", "_lost", "fence", "window")

    def __init__(self, window: ChunkWindow, unsettled: Unsettled) -> None:
        self.window = window
        self.fence: ReadFence | None = None
        self._held: list[ChangeEvent] = [
            e for e in unsettled.events if e.table == window.table and e.schema == window.schema
        ]
        self._lost = unsettled.lost
        self._floor = unsettled.floor

    @property
    def schema(self) -> str:
        return self.window.schema

    @property
    def table(self) -> str:
        return self.window.table

    @property
    def has_rows(self) -> bool:
        return self.window.has_rows

    def observe(self, event: ChangeEvent) -> None:
        """A stream event of this window's table, in stream order."""
        if self.fence is None:
            self._held.append(event)
        elif self.fence.visible(event) is not True:
            self.window.observe(event)

    def set_answer(self, rows: Sequence[ChunkRow], fence: ReadFence) -> None:
        self.window.set_rows(rows)
        self.fence = fence
        held, self._held = self._held, []
        for event in held:
            if fence.visible(event) is not True:
                self.window.observe(event)

    @property
    def conclusive_so_far(self) -> bool:
        """False while events older than the window were forgotten, or never kept (its
        floor), and the fence does not prove them visible (the window cannot decide)."""
        fence = self.fence
        if self._lost is not None and (fence is None or not fence.settles_lost(self._lost)):
            return False
        return self._floor is None or (fence is not None and self._floor.covered_by(fence))

    def passed(self, reached: Position) -> bool:
        return self.fence is not None and self.fence.passed(reached)

    def close(self) -> WindowResult:
        result = self.window.close()
        if not self.conclusive_so_far:
            return WindowResult([], result.read, None, False)
        return result

    def take(self, max_rows: int, max_bytes: int = 0) -> WindowResult:
        """The next slice (``ChunkWindow.take``): events after the fence are all unseen
        by the read, so each drops its key until the slice holding it is taken."""
        if not self.conclusive_so_far:
            return WindowResult([], 0, None, False)
        return self.window.take(max_rows, max_bytes)


MAX_ISSUED = 1024
"""Fenced requests whose issue epoch ``Fencing`` remembers at most (``issue``)."""


class Fencing:
    """The fenced modes of one snapshot core, and what they keep between reads.

    ``fenced``: incremental windows are judged by their reads' fences (read-only, or
    watermarks *and* fences, ``CoreSettings.fenced``); ``fenced_blocking``: blocking
    reads are (implied by ``fenced``; alone: MySQL/MariaDB). ``read_only``: no
    watermarks at all (windows open at the request, close at a passed fence).

    Invariants:

    - Events are kept (``unsettled``) only while fenced reads may be judged: for the
      tables ``watched`` (``watch``: every table of both lanes and with keys waiting
      for a re-read; with blocking reads fenced alone, the blocking lane's only); none
      watched clears everything kept. A table newly watched opens a floor at the
      newest position delivered (events before it were not kept).
    - Each fenced read's fence is judged with the ``Delivered`` epoch its request was
      issued in (``issue``/``prune``): at most ``MAX_ISSUED`` are remembered; an
      unknown one is judged as too old (conservative).
    - ``state()`` persists what a restart must still distrust (``Unsettled.summary``);
      the events themselves are not persisted.
    """

    __slots__ = ("_issued", "fenced", "fenced_blocking", "read_only", "unsettled", "watched")

    def __init__(self, read_only: bool, fenced: bool, fenced_blocking: bool) -> None:
        self.read_only = read_only
        self.fenced = read_only or fenced
        self.fenced_blocking = self.fenced or fenced_blocking
        self.unsettled = Unsettled()
        self.watched: set[str] = set()
        self._issued: dict[str, int] = {}  # fenced request id -> Delivered epoch at issue

    def learn(self, position: Position) -> None:
        """A position the stream delivered (places a floor still unknown)."""
        if self.fenced_blocking:
            self.unsettled.learn(position)

    def watch(self, tables: set[str], blocking: set[str], horizon: Position | None) -> None:
        """The tables to keep events of now: ``tables`` with fenced windows, else the
        blocking lane's ``blocking`` (only blocking reads are fenced); ``horizon``: the
        newest position delivered (a floor for tables newly watched)."""
        if not self.fenced_blocking:
            return
        before = self.watched
        self.watched = tables if self.fenced else blocking
        if not self.watched:
            self.unsettled.clear()
        elif not self.watched <= before:
            # Events delivered until now were not kept: windows need a fence that
            # covers them (a lagging standby may not have replayed them yet).
            self.unsettled.watch_from(horizon)

    def keep(self, event: ChangeEvent) -> ChangeEvent | None:
        """A stream event: kept if its table is watched; returns it (``slim``) when
        fenced windows must see it, else None."""
        self.unsettled.learn(event.position)
        if not self.watched or f"{event.schema}.{event.table}" not in self.watched:
            return None
        event = slim(event)  # windows need only its identity; a wide row is not held
        self.unsettled.add(event)
        return event if self.fenced else None  # (else only blocking reads are fenced)

    def issue(self, request_id: str) -> None:
        """A fenced request goes out: remember which ``Delivered`` epoch its fence comes
        from. Bounded: an answer that never comes (a failed read) leaves its entry; one
        dropped here is judged as too old (conservative)."""
        issued = self._issued
        issued[request_id] = self.unsettled.delivered.epoch
        if len(issued) > MAX_ISSUED:
            del issued[next(iter(issued))]

    def issued_epoch(self, request_id: str) -> int:
        return self._issued.pop(request_id, -1)  # unknown: too old to resolve anything

    def prune(self, fence: ReadFence, request_id: str) -> None:
        """Forget what the fence of ``request_id``'s read proves visible for good."""
        self.unsettled.prune(fence, self.issued_epoch(request_id))

    def window(self, window: ChunkWindow) -> FencedWindow | None:
        """``window`` judged by its read's fence (None: windows are not fenced)."""
        return FencedWindow(window, self.unsettled) if self.fenced else None

    def start_covered(self, fence: ReadFence, request_id: str) -> bool:
        """A fenced start's fence sees everything the stream delivered before the
        table was watched (events after that are in the log: a key it misses is not lost)."""
        issued = self.issued_epoch(request_id)
        self.unsettled.prune(fence, issued)
        floor = self.unsettled.floor
        return floor is None or (floor.fresh(issued) and floor.covered_by(fence))

    def floor_hint(self) -> Position | None:
        """The floor's position while one is open (``ChunkRequest.floor``)."""
        floor = self.unsettled.floor if self.fenced_blocking else None
        return floor.position if floor is not None else None

    def state(self) -> dict[str, Any]:
        """What a restart must still distrust (see ``Unsettled.summary``)."""
        lost = self.unsettled.summary() if self.fenced_blocking else None
        return {} if lost is None else {"unsettled": lost.to_json()}

    def restore(self, state: dict[str, Any]) -> None:
        unsettled = state.get("unsettled")
        if unsettled is not None and self.fenced_blocking:
            self.unsettled.lost = Lost.from_json(unsettled)


def describe(fence: Any) -> str:
    """A fence for logs (its repr, shortened)."""
    text = repr(fence)
    return text if len(text) <= 200 else text[:197] + "..."
