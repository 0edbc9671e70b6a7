"""The commit protocol of the Kafka change log, free of IO: checkpoint-topic messages
(``CommitRecord``), the valid commits and which data records they vouch for
(``CommitLog``, ``Span``), a commit's ``ends`` and ``runs`` from its delivery reports
(``commit_ends``), and a writer's recovery from the topic's last messages (``recover``).

The rules (docs/kafka.md, "Exactly once"):

- **Owner.** A message is valid iff its ``(epoch, gen, writer)`` is the owner: the
  owner becomes the writer of a message with a higher ``(epoch, gen)``; any other
  writer's messages are ignored. A fence message changes the owner and is no commit.
- **Spans.** Per data partition the valid commits' ``ends`` cut the offsets into spans,
  one per valid commit that wrote the partition, laid end to end from 0 in topic order
  (an end at or below the partition's previous end makes no span). A record at offset
  ``o`` is valid iff, in the first span ending above ``o``, the commit listed a run and
  ``o`` is at or above its first offset, or it listed none and the record's writer
  header is the commit's.
- **Cuts.** ``cut(b)`` at a valid commit's end ``b`` splits every partition: valid records
  of global offset ``< b`` below it, the others at or above it.

These are property-tested (``tests/property/test_kafka_protocol.py``,
``test_kafka_runs.py``, ``test_kafka_cuts.py``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from pydblog.ports import Checkpoint


@dataclass(slots=True)
class CommitRecord:
    """One checkpoint-topic message: a writer session's commit (or its begin)."""

    gen: int
    writer: str
    start: int  # global offsets start <= offset < end
    end: int
    checkpoint: Checkpoint | None
    ends: dict[str, dict[str, int]]  # topic -> partition (text) -> end offset
    begin: bool = False
    epoch: int | None = None
    kafka_offset: int = -1
    runs: dict[str, dict[str, int]] = field(default_factory=dict)
    """topic -> partition (text) -> first offset, for the partitions whose records of
    this commit are exactly the offsets ``first <= o < end`` (every one of them a record
    of this commit; never the notification topic's, whose envelopes are in headers):
    readers take those without looking at headers.
    Partitions not listed are checked record by record (``dblog.writer`` header)."""
    known: dict[str, dict[str, int]] | None = None
    """Every data partition's last valid end before this commit, as its writer knew
    them all (``KNOWN_EVERY``; readers ignore it: only the writer's recovery uses it)."""
    fence: bool = False
    """A claim's fence (``KafkaChangeLog.claim``): it makes its session the owner (no
    older session's later message is valid) but is no commit: the last commit, the next
    offset and the checkpoint stay those of the valid commit before it."""
    times: list[tuple[int, int]] = field(default_factory=list)
    """The commit's source commit times: ``(first offset, ts_ms)`` where the events'
    ``ts_ms`` changes, in offset order (the event at global offset ``o`` has the time of
    the last entry at or below ``o``); empty for a commit without events or written by
    an older version. ``consistent = true``'s cut reads them."""
    ts: int | None = None
    """The writer's wall clock when it wrote the message (ms): with a checkpoint outside
    a transaction, a heartbeat (the log holds every source change up to it)."""

    @property
    def writer_tag(self) -> str:
        return f"{self.gen}:{self.writer}"

    def to_bytes(self) -> bytes:
        head = orjson.dumps({
            "v": 1, "gen": self.gen, "w": self.writer, "a": self.start, "b": self.end,
            "begin": self.begin, "epoch": self.epoch, "ends": self.ends,
            **({"runs": self.runs} if self.runs else {}),
            **({"known": self.known} if self.known is not None else {}),
            **({"fence": True} if self.fence else {}),
            **({"t": self.times} if self.times else {}),
            "ts": int(time.time() * 1000),
        })
        cp = self.checkpoint.to_bytes() if self.checkpoint is not None else b"null"
        return head[:-1] + b',"cp":' + cp + b"}"

    @classmethod
    def from_bytes(cls, raw: bytes, kafka_offset: int) -> CommitRecord:
        d = orjson.loads(raw)
        cp = d.get("cp")
        return cls(
            int(d["gen"]), str(d["w"]), int(d["a"]), int(d["b"]),
            Checkpoint.from_bytes(orjson.dumps(cp)) if cp is not None else None,
            {t: {p: int(o) for p, o in parts.items()} for t, parts in d.get("ends", {}).items()},
            bool(d.get("begin")), d.get("epoch"), kafka_offset,
            {t: {p: int(o) for p, o in parts.items()} for t, parts in d.get("runs", {}).items()},
            {t: {p: int(o) for p, o in parts.items()} for t, parts in d["known"].items()}
            if d.get("known") is not None else None,
            bool(d.get("fence")),
            [(int(a), int(t)) for a, t in d.get("t", ())],
            None if d.get("ts") is None else int(d["ts"]),
        )


@dataclass(frozen=True, slots=True)
class Span:
    """One valid commit's part of a data partition: the offsets from the previous valid
    commit's end there up to ``end``. If the commit listed a run (``first >= 0``), the
    valid records are exactly ``first <= o < end`` (no header needed); otherwise a record
    in the span is valid iff its ``dblog.writer`` header is ``tag`` (a crashed session's
    aborted records, a fenced writer's and the transaction markers are not)."""

    end: int
    first: int
    tag: str

    def valid(self, offset: int, tag: str | None) -> bool:
        if self.first >= 0:
            return self.first <= offset < self.end
        return offset < self.end and tag is not None and tag == self.tag


def _span_end(span: Span) -> int:
    return span.end


@dataclass
class CommitLog:
    """The valid commits as read so far, in checkpoint-topic order (see the module
    docstring for the owner rule), and per data partition the ``spans`` (one per valid
    commit that wrote it) that decide which records are valid.

    For seeking, ``bounds`` holds every valid commit's end ``b`` (ascending) and
    ``history`` per data partition the pairs ``(b, end offset)`` of the valid commits
    that wrote it. ``cut(x)`` at a commit boundary ``x`` is exact: a valid record with
    global offset ``< x`` lies below ``cut(x)`` in its partition, one with offset
    ``>= x`` at or above it (it was written by a later commit)."""

    owner: tuple[int, int, str] | None = None  # (epoch, gen, writer)
    max_gen: int = 0
    max_epoch: int = 0
    read_to: int = 0  # the checkpoint topic's offset after the last message applied
    last: CommitRecord | None = None
    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    bounds: list[int] = field(default_factory=list)
    history: dict[tuple[str, int], tuple[list[int], list[int]]] = field(default_factory=dict)
    spans: dict[tuple[str, int], list[Span]] = field(default_factory=dict)
    track: bool = True
    """False: keep only the owner, the last commit and the partitions' ends (memory
    independent of the number of commits: ``KafkaLogFigures``); no seeking, no
    validity."""
    floor: int = 0
    """``forget`` dropped what only reads below this commit boundary need: ``cut``,
    ``window``, ``span`` and ``valid`` answer as before for offsets ``>= floor`` (and
    Kafka offsets at or above ``cut(floor)``); ``first_complete`` and ``history`` below
    it are gone (0: nothing forgotten)."""

    whole: bool = False
    """``recover_commits`` read the checkpoint topic from its start (the writer then
    knows every partition's last valid end)."""

    def apply(self, rec: CommitRecord) -> bool:
        """Take one message; True if it is valid."""
        self.max_gen = max(self.max_gen, rec.gen)
        self.max_epoch = max(self.max_epoch, rec.epoch or 0)
        self.read_to = max(self.read_to, rec.kafka_offset + 1)
        key = (rec.epoch or 0, rec.gen, rec.writer)
        if self.owner is None or key[:2] > self.owner[:2]:
            self.owner = key
        elif key != self.owner:
            return False
        if rec.fence:
            return True
        self.last = rec
        tag = rec.writer_tag
        if not self.track:
            for topic, parts in rec.ends.items():
                for p, end in parts.items():
                    tp = (topic, int(p))
                    self.ends[tp] = max(end, self.ends.get(tp, 0))
            return True
        if not self.bounds or rec.end > self.bounds[-1]:
            self.bounds.append(rec.end)
        for topic, parts in rec.ends.items():
            for p, end in parts.items():
                tp = (topic, int(p))
                prev = self.ends.get(tp, 0)
                if end <= prev:
                    continue
                self.ends[tp] = end
                bs, es = self.history.setdefault(tp, ([], []))
                if bs and bs[-1] == rec.end:
                    es[-1] = end
                else:
                    bs.append(rec.end)
                    es.append(end)
                first = rec.runs.get(topic, {}).get(p, -1)
                self.spans.setdefault(tp, []).append(
                    Span(end, first if prev <= first < end else -1, tag))
        return True

    @property
    def next_offset(self) -> int:
        return self.last.end if self.last is not None else 0

    def cut(self, offset: int) -> dict[tuple[str, int], int]:
        """Per data partition, the end offset after the last valid commit whose end is
        ``<= offset``: no valid record below it has a global offset ``>= offset``; at a
        commit boundary, every record with a smaller global offset lies below it (see
        the class docstring). Partitions no such commit wrote start at 0."""
        out: dict[tuple[str, int], int] = {}
        for tp, (bs, es) in self.history.items():
            i = bisect.bisect_right(bs, offset)
            if i:
                out[tp] = es[i - 1]
        return out

    def window(self, offset: int, size: int) -> tuple[int, int]:
        """Commit boundaries ``lo <= offset < hi`` around ``offset`` with ``hi`` the first
        boundary at or past ``offset + size`` (or the log's end): reading each partition
        from ``cut(lo)`` to ``cut(hi)`` gives exactly the events ``lo <= o < hi``
        (``offset < next_offset``)."""
        bounds = self.bounds
        i = bisect.bisect_right(bounds, offset)
        lo = bounds[i - 1] if i else 0
        j = bisect.bisect_left(bounds, offset + max(size, 1), lo=i)
        hi = bounds[j] if j < len(bounds) else self.next_offset
        return lo, hi

    def forget(self, before: int) -> None:
        """Drop the commits that reads at global offsets ``>= floor`` no longer need,
        ``floor`` being the last commit boundary ``<= before``: the boundaries below
        it, per partition the history entries before the last one at or below it (that
        one is ``cut(floor)`` there) and the spans ending at or below that cut. What is
        kept grows with the commits from ``floor`` on, not with the whole log (a
        follower that moves ``before`` along holds a bounded window)."""
        i = bisect.bisect_right(self.bounds, before)
        if i <= 1:
            return
        floor = self.bounds[i - 1]
        del self.bounds[:i - 1]
        for tp, (bs, es) in self.history.items():
            j = bisect.bisect_right(bs, floor)  # entries [0, j) end at or below floor
            if j > 1:
                del bs[:j - 1]
                del es[:j - 1]
            spans = self.spans.get(tp)
            if j and spans:
                del spans[:bisect.bisect_right(spans, es[0], key=_span_end)]
        self.floor = max(self.floor, floor)

    def first_complete(self, lows: Mapping[tuple[str, int], int]) -> int:
        """The first commit boundary from which on every valid record is at or above its
        partition's low watermark (``lows``: what retention kept): where a reader of a
        log whose beginning was deleted can start without a gap."""
        first = 0
        for tp, low in lows.items():
            hist = self.history.get(tp)
            if low <= 0 or hist is None:
                continue
            bs, es = hist
            i = bisect.bisect_left(es, low)  # the first commit that ends at or above low
            first = max(first, bs[i] if i < len(bs) else bs[-1])
        return first

    def span(self, tp: tuple[str, int], offset: int) -> Span | None:
        """The valid commit whose records in ``tp`` lie around ``offset`` (the first
        span ending above it), or None (past every valid commit)."""
        spans = self.spans.get(tp)
        if not spans:
            return None
        i = bisect.bisect_right(spans, offset, key=_span_end)
        return spans[i] if i < len(spans) else None

    def valid(self, tp: tuple[str, int], offset: int, tag: str | None) -> bool:
        """Whether the record at ``offset`` of ``tp`` with writer ``tag`` is committed
        (``Span.valid``; ``tag`` is only needed where the commit listed no run)."""
        span = self.span(tp, offset)
        return span is not None and span.valid(offset, tag)


def commit_ends(
    delivered: Mapping[tuple[str, int], Sequence[int]], no_run: Iterable[tuple[str, int]],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """A commit's ``ends`` and ``runs`` from its delivery reports: per data partition
    ``[lowest offset, highest offset, records]`` (``no_run``: partitions whose records
    readers must look at, the notification topic's: its values are not envelopes). The
    end is one past the highest offset; the partition has a run from the lowest if its
    records fill every offset in between (offsets are unique in a partition, so then
    nothing else lies there) and it is not in ``no_run``."""
    ends: dict[str, dict[str, int]] = {}
    runs: dict[str, dict[str, int]] = {}
    skip = set(no_run)
    for (topic, part), (first, last, count) in delivered.items():
        ends.setdefault(topic, {})[str(part)] = last + 1
        if count == last + 1 - first and (topic, part) not in skip:
            runs.setdefault(topic, {})[str(part)] = first
    return ends, runs



def recover(records: Iterable[CommitRecord], from_start: bool) -> CommitLog:
    """A writer's recovery from the checkpoint topic's last messages (``records``, in
    topic order; ``from_start``: they begin at the topic's first message kept): the
    commit log they make, whose ``whole`` says whether ``ends`` holds every data
    partition's last valid end: so if they begin at the start, or a valid commit among
    them listed every end as its writer knew them (``CommitRecord.known``). Then the
    ends are the last such list's and those of the valid commits after it: a message
    before it in the window may have been taken for valid only because the window does
    not show the older session that owned the log (a zombie's commit as the window's
    first message), and the list already holds every truly valid commit before it."""
    log_ = CommitLog()
    known: dict[str, dict[str, int]] | None = None
    after: dict[tuple[str, int], int] = {}  # the ends of the valid commits from the list's on
    for rec in records:
        if not log_.apply(rec) or rec.fence:
            continue
        if rec.known is not None:
            known = rec.known
            after = {}
        for topic_name, parts in rec.ends.items():
            for p, end in parts.items():
                tp = (topic_name, int(p))
                after[tp] = max(end, after.get(tp, 0))
    log_.whole = from_start
    if not log_.whole and known is not None:
        ends = {(topic_name, int(p)): end
                for topic_name, parts in known.items() for p, end in parts.items()}
        for tp, end in after.items():
            ends[tp] = max(end, ends.get(tp, 0))
        log_.ends = ends
        log_.whole = True
    return log_
