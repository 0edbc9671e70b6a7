"""The Kafka change log's commit protocol (``changelog.kafka.protocol``) under any
interleaving of commits, crashes in the middle of a commit, restarts, zombie sessions
that keep committing after a newer one started, high-availability claims (a fence
message, an older leader's commit landing between the fence and the new leader's
begin message), commits that list no runs, foreign records between a commit's own, and
recovery windows that do not reach the topic's start.

The broker is modelled as one that shows everything (Tansu: aborted records and the
checkpoint messages of sessions killed after writing them stay readable), which is the
harder case: Apache Kafka hides a subset of what the rules skip anyway.

The oracle does not use the rules: sessions are started one after another, and a
commit is durable iff no later session had written its first owning message (a plain
session's begin, a claim's fence) when the commit's checkpoint message landed. Then:

- a reader's materialized view (every record the spans vouch for) holds each global
  offset below the last valid commit's end exactly once, written by the session whose
  commit the oracle holds durable for it: the committed prefix, nothing else;
- per data partition, the spans tile the offsets: laid end to end from 0, each ending
  above the one before, the last at the partition's end; a run lies inside its span;
- per data partition, valid records are in global-offset order, and every commit
  boundary ``b`` cuts each partition exactly (``cut``), and ``window`` reads give each
  event of their range once;
- a follower that applied the messages as they came and ``forget`` at random points
  answers as a fresh reader at and above what it forgot;
- a new session's recovery (``protocol.recover``) from the topic's last ``W`` messages
  continues at the committed prefix's end with the last durable checkpoint, and, when it
  says it knows every partition's end (``whole``), knows the right ones."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pydblog.changelog.kafka.protocol import CommitLog, CommitRecord, commit_ends, recover
from pydblog.ports import Checkpoint

TOPICS = ("p.public.a", "p.public.b")
PARTS = 2  # per topic
TPS = [(t, p) for t in TOPICS for p in range(PARTS)]

Record = tuple[int, str] | None  # (global offset, writer tag); None: a transaction marker


@dataclass
class Session:
    gen: int
    writer: str
    epoch: int | None
    next: int
    known: dict[tuple[str, int], int] | None  # every partition's valid end, if it knows them
    commits: int = 0

    @property
    def tag(self) -> str:
        return f"{self.gen}:{self.writer}"


@dataclass
class World:
    ha: bool
    window: int
    topic: list[CommitRecord] = field(default_factory=list)
    parts: dict[tuple[str, int], list[Record]] = field(
        default_factory=lambda: {tp: [] for tp in TPS})
    history: list[str] = field(default_factory=list)  # global offset -> durable writer tag
    durable_cp: Checkpoint | None = None
    newest: Session | None = None  # the last session whose owning message landed
    sessions: list[Session] = field(default_factory=list)
    max_gen: int = 0
    epoch: int = 0
    follower: CommitLog = field(default_factory=CommitLog)
    followed: int = 0  # checkpoint messages the follower applied
    anchor: int = 0  # the begin message of the session that wrote the last durable message

    def message(self, rec: CommitRecord) -> None:
        rec.kafka_offset = len(self.topic)
        self.topic.append(rec)
        self.max_gen = max(self.max_gen, rec.gen)

    def write(self, s: Session, n: int, seed: int, noise: bool) -> dict[tuple[str, int], list[int]]:
        """``n`` records of ``s`` from its next offset spread over the partitions (a
        foreign record among them with ``noise``), then the markers; the delivery
        reports."""
        delivered: dict[tuple[str, int], list[int]] = {}
        for i in range(n):
            tp = TPS[(seed >> (2 * i)) % len(TPS)]
            recs = self.parts[tp]
            recs.append((s.next + i, s.tag))
            off = len(recs) - 1
            d = delivered.setdefault(tp, [off, off, 0])
            d[0], d[1], d[2] = min(d[0], off), max(d[1], off), d[2] + 1
            if noise and i == n // 2:  # another producer's record lands between ours
                self.parts[TPS[(seed >> 24) % len(TPS)]].append((10**6 + i, "0:other"))
        for tp in delivered:
            self.parts[tp].append(None)
        return delivered

    def commit(self, s: Session, n: int, seed: int, noise: bool, legacy: bool) -> None:
        delivered = self.write(s, n, seed, noise)
        ends, runs = commit_ends(delivered, ())
        cp = Checkpoint(None, extra={"n": s.next + n, "by": s.tag})
        known = None
        if s.known is not None and s.commits % 3 == 0:
            known = {t: {str(p): e for (tt, p), e in s.known.items() if tt == t}
                     for t in {t for t, _ in s.known}}
        self.message(CommitRecord(s.gen, s.writer, s.next, s.next + n, cp, ends, epoch=s.epoch,
                                  runs={} if legacy else runs, known=known))
        s.commits += 1
        if s is self.newest:  # the oracle: durable iff no newer session owns the log
            assert s.next == len(self.history)
            self.history.extend([s.tag] * n)
            self.durable_cp = cp
        if s.known is not None:
            for tp, (_, last, _) in delivered.items():
                s.known[tp] = last + 1
        s.next += n

    def recovered(self) -> CommitLog:
        """``recover`` from the last ``window`` messages if they reach back to the begin
        message of the session that wrote the last durable message (recovery's
        precondition: ``writer.RECOVERY_WINDOW``), else from the topic's start."""
        lo = max(0, len(self.topic) - self.window)
        if lo > self.anchor:
            lo = 0
        return recover(self.topic[lo:], from_start=lo == 0)

    def start(self, zombie_between: tuple[int, int] | None) -> Session:
        """A new session: recovery, then its begin message (HA: first an unclaimed begin,
        then the claim's fence, recovery, the begin with the epoch; an older session's
        commit may land between the fence and the recovery)."""
        writer = f"w{len(self.sessions)}"
        if not self.ha:
            rec = self.recovered()
            s = Session(self.max_gen + 1, writer, None, rec.next_offset,
                        dict(rec.ends) if rec.whole else None)
            self.check_recovery(rec)
            self.anchor = len(self.topic)
            self.message(CommitRecord(s.gen, s.writer, s.next, s.next, _cp(rec), {}, begin=True,
                                      known=_known(s.known)))
        else:
            rec = self.recovered()
            s = Session(self.max_gen + 1, writer, None, rec.next_offset,
                        dict(rec.ends) if rec.whole else None)
            self.message(CommitRecord(s.gen, s.writer, s.next, s.next, _cp(rec), {}, begin=True))
            self.epoch += 1
            s.epoch = self.epoch
            self.message(CommitRecord(s.gen, s.writer, s.next, s.next, None, {}, begin=True,
                                      epoch=s.epoch, fence=True))
            older, self.newest = self.newest, s
            if zombie_between is not None and older is not None:
                self.commit(older, zombie_between[0], zombie_between[1], False, False)
            rec = self.recovered()
            assert rec.max_epoch == s.epoch
            self.check_recovery(rec)
            s.next = rec.next_offset
            if rec.whole:
                s.known = dict(rec.ends)
            self.anchor = len(self.topic)
            self.message(CommitRecord(s.gen, s.writer, s.next, s.next, _cp(rec), {}, begin=True,
                                      epoch=s.epoch, known=_known(s.known)))
        self.newest = s
        self.sessions.append(s)
        return s

    def check_recovery(self, rec: CommitLog) -> None:
        assert rec.next_offset == len(self.history)
        last = rec.last.checkpoint if rec.last is not None else None
        assert (last.extra if last else None) == (
            self.durable_cp.extra if self.durable_cp else None)
        if rec.whole:
            assert {tp: e for tp, e in rec.ends.items() if e} == {
                tp: e for tp, e in reader(self).ends.items() if e}

    def follow(self, forget_at: int | None) -> None:
        for rec in self.topic[self.followed:]:
            self.follower.apply(rec)
        self.followed = len(self.topic)
        if forget_at is not None and self.follower.next_offset:
            self.follower.forget(forget_at % (self.follower.next_offset + 1))


def _cp(rec: CommitLog) -> Checkpoint | None:
    """The checkpoint a session begins with: the recovered one."""
    return rec.last.checkpoint if rec.last is not None else None


def _known(ends: dict[tuple[str, int], int] | None) -> dict[str, dict[str, int]] | None:
    if ends is None:
        return None
    out: dict[str, dict[str, int]] = {}
    for (t, p), e in ends.items():
        out.setdefault(t, {})[str(p)] = e
    return out


def reader(w: World) -> CommitLog:
    log = CommitLog()
    for rec in w.topic:
        log.apply(rec)
    return log


def valid_records(log: CommitLog, w: World, tp: tuple[str, int], lo: int = 0,
                  hi: int | None = None) -> list[tuple[int, int, str]]:
    """``(kafka offset, global offset, tag)`` of the records ``lo <= kafka offset < hi``
    (``hi``: the partition's valid end) the commit log takes, reading headers only
    where a span has no run, as the readers do."""
    recs = w.parts[tp]
    end = log.ends.get(tp, 0) if hi is None else hi
    out = []
    for off in range(lo, min(end, len(recs))):
        rec = recs[off]
        if rec is None:
            continue
        span = log.span(tp, off)
        if span is None:
            continue
        if span.first >= 0:
            if span.valid(off, None):
                assert rec[1] == span.tag, "a run vouched for another writer's record"
                out.append((off, *rec))
        elif span.valid(off, rec[1]):
            out.append((off, *rec))
    return out


# One step: (kind, events, seed, noise, legacy, forget point)
step = st.tuples(st.sampled_from(["commit", "commit", "commit", "zombie", "crash", "restart",
                                  "restart-keep-zombie"]),
                 st.integers(0, 5), st.integers(0, 2**30), st.booleans(), st.booleans(),
                 st.none() | st.integers(0, 100))


@settings(max_examples=120, deadline=None)
@example(True, 2, [("commit", 0, 0, False, False, None)] * 3
         + [("restart-keep-zombie", 1, 0, False, False, None)])  # a zombie's commit opens the window
@given(st.booleans(), st.integers(2, 12) | st.just(10**6), st.lists(step, min_size=1, max_size=30))
def test_the_reader_materializes_the_committed_prefix(
        ha: bool, window: int, script: list[tuple[str, int, int, bool, bool, int | None]]) -> None:
    w = World(ha=ha, window=window)
    cur = w.start(None)
    zombies: list[Session] = []
    for kind, n, seed, noise, legacy, forget_at in script:
        if kind == "commit":
            w.commit(cur, n, seed, noise, legacy)
        elif kind == "zombie" and zombies:
            w.commit(zombies[seed % len(zombies)], n, seed, noise, legacy)
        elif kind == "crash":  # records and markers, no checkpoint message; a new session
            w.write(cur, n, seed, noise)
            cur = w.start(None)
        elif kind.startswith("restart"):
            if kind.endswith("zombie"):
                zombies.append(cur)
            cur = w.start((n, seed) if zombies or kind.endswith("zombie") else None)
        w.follow(forget_at)

    log = reader(w)
    total = len(w.history)
    assert log.next_offset == total
    got: dict[int, str] = {}
    for tp in TPS:
        recs = valid_records(log, w, tp)
        seqs = [seq for _, seq, _ in recs]
        assert seqs == sorted(seqs), f"{tp}: valid records out of global-offset order"
        for _, seq, tag in recs:
            assert seq not in got, f"global offset {seq} twice"
            got[seq] = tag
    assert sorted(got) == list(range(total)), "not the committed prefix"
    assert [got[i] for i in range(total)] == w.history, "a record of a commit that is not durable"

    # spans tile each partition's offsets, and runs lie inside their span
    for tp, spans in log.spans.items():
        prev = 0
        for span in spans:
            assert span.end > prev
            assert span.first < 0 or prev <= span.first < span.end
            prev = span.end
        assert prev == log.ends[tp]

    # every commit boundary is an exact cut; windows hold their events once
    for b in log.bounds:
        cut = log.cut(b)
        for tp in TPS:
            for off, seq, _ in valid_records(log, w, tp):
                assert (seq < b) == (off < cut.get(tp, 0)), f"cut({b}) in {tp} at {off}"
    for offset in range(0, total, 3):
        lo, hi = log.window(offset, 4)
        assert lo <= offset < hi
        start, stop = log.cut(lo), log.cut(hi)
        seqs = sorted(seq for tp in TPS
                      for _, seq, _ in valid_records(log, w, tp, start.get(tp, 0), stop.get(tp, 0)))
        assert seqs == list(range(lo, hi))

    # a follower that forgot answers as the reader from what it kept
    f = w.follower
    for rec in w.topic[w.followed:]:
        f.apply(rec)
    assert f.next_offset == total
    assert f.bounds == [b for b in log.bounds if b >= f.floor]
    floor_cut = log.cut(f.floor)
    for tp in TPS:
        assert valid_records(f, w, tp, floor_cut.get(tp, 0)) == valid_records(
            log, w, tp, floor_cut.get(tp, 0))

    # a new session starts where the committed prefix ends
    w.check_recovery(w.recovered())
