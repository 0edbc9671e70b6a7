"""Seeking in a Kafka change log (``CommitLog.cut`` / ``window`` / ``first_complete``)
under random histories: commits spread over partitions, partitions added later, crashed
sessions whose records stay in the partitions (Tansu shows aborted records), and
retention that removed a prefix of some partitions. A window read between two cuts
holds every event of its global offsets exactly once, and nothing below a partition's
low watermark is ever needed from the first complete offset on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.changelog.kafka.protocol import CommitLog, CommitRecord

TOPIC = "p.public.t"

# One step: (events in the commit, crash instead of commit?, add a partition first?,
# the partition choice seed)
steps = st.lists(
    st.tuples(st.integers(0, 7), st.booleans(), st.booleans(), st.integers(0, 2**16)),
    min_size=1, max_size=30,
)


def build(script: list[tuple[int, bool, bool, int]]) -> tuple[CommitLog, dict[tuple[str, int], list[tuple[int, str]]], int]:
    """Replay ``script`` as a writer would: returns the commit log as a reader applies
    it, each partition's records ``(global offset, writer tag)`` by Kafka offset, and
    the number of committed events."""
    log = CommitLog()
    parts: dict[tuple[str, int], list[tuple[int, str]]] = {(TOPIC, 0): []}
    gen, cp_offset, nxt = 1, 0, 0

    def message(rec: CommitRecord) -> None:
        nonlocal cp_offset
        rec.kafka_offset = cp_offset
        cp_offset += 1
        log.apply(rec)

    message(CommitRecord(gen, f"w{gen}", 0, 0, None, {}, begin=True))
    for n, crash, grow, seed in script:
        if grow and len(parts) < 4:
            parts[(TOPIC, len(parts))] = []
        tag = f"{gen}:w{gen}"
        written: dict[str, int] = {}
        for i in range(n):
            tp = (TOPIC, (seed >> i) % len(parts))
            parts[tp].append((nxt + i, tag))
            written[str(tp[1])] = len(parts[tp])
        if crash:  # data in the partitions, no checkpoint message: a new session
            gen += 1
            message(CommitRecord(gen, f"w{gen}", nxt, nxt, None, {}, begin=True))
            continue
        message(CommitRecord(gen, f"w{gen}", nxt, nxt + n, None, {TOPIC: written}))
        nxt += n
    return log, parts, nxt


def read(log: CommitLog, parts: dict[tuple[str, int], list[tuple[int, str]]],
         lo: int, hi: int) -> list[int]:
    """What a reader gets from the window ``[lo, hi)``: the valid records between the
    two cuts, clipped to the window's offsets."""
    start, stop = log.cut(lo), log.cut(hi)
    out = []
    for tp, recs in parts.items():
        for pos in range(start.get(tp, 0), stop.get(tp, 0)):
            seq, tag = recs[pos]
            if log.valid(tp, pos, tag) and lo <= seq < hi:
                out.append(seq)
    return sorted(out)


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(0, 60), st.integers(1, 20))
def test_windows_hold_each_event_once(script: list[tuple[int, bool, bool, int]], at: int,
                                      size: int) -> None:
    log, parts, total = build(script)
    assert log.next_offset == total
    at = min(at, total)
    seen: list[int] = []
    f = at
    while f < total:
        lo, hi = log.window(f, size)
        assert lo <= f < hi <= total
        got = read(log, parts, lo, hi)
        assert got == list(range(lo, hi))  # complete, once each, nothing of another window
        seen.extend(s for s in got if s >= f)
        f = hi
    assert seen == list(range(at, total))


@settings(max_examples=200, deadline=None)
@given(steps, st.lists(st.integers(0, 12), min_size=4, max_size=4))
def test_first_complete_offset_needs_nothing_retention_removed(
        script: list[tuple[int, bool, bool, int]], cut_by: list[int]) -> None:
    log, parts, total = build(script)
    lows = {tp: min(cut_by[tp[1]], len(recs)) for tp, recs in parts.items()}
    first = log.first_complete(lows)
    assert 0 <= first <= total
    start = log.cut(first)
    for tp, low in lows.items():
        assert start.get(tp, 0) >= low or not any(
            log.valid(tp, pos, tag) for pos, (_, tag) in enumerate(parts[tp]) if pos >= start.get(tp, 0))
    # Every event from ``first`` on is still readable.
    kept = {tp: recs[low:] for tp, recs in parts.items() for low in [lows[tp]]}
    readable = sorted(seq for tp, recs in kept.items() for i, (seq, tag) in enumerate(recs)
                      if log.valid(tp, i + lows[tp], tag) and seq >= first)
    assert readable == list(range(first, total))
    # ... and it is the first boundary where no partition starts below its low watermark.
    earlier = [b for b in log.bounds if b < first]
    if earlier:
        before = log.cut(earlier[-1])
        assert any(before.get(tp, 0) < low for tp, low in lows.items())


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(0, 60), st.integers(0, 60), st.integers(1, 20))
def test_forgetting_keeps_every_read_from_the_floor(
        script: list[tuple[int, bool, bool, int]], before: int, at: int, size: int) -> None:
    """``forget(before)`` (a follower's bounded memory) changes no read at or above its
    floor, and drops every commit boundary below it."""
    whole, parts, total = build(script)
    log, _, _ = build(script)
    log.forget(before)
    assert log.floor <= max(0, before)
    assert all(b >= log.floor for b in log.bounds)
    assert log.next_offset == whole.next_offset == total
    assert sum(map(len, log.spans.values())) <= sum(map(len, whole.spans.values()))
    f = max(log.floor, min(at, total))
    seen: list[int] = []
    start = f
    while f < total:
        assert log.window(f, size) == whole.window(f, size)
        lo, hi = log.window(f, size)
        assert log.cut(lo) == whole.cut(lo) and log.cut(hi) == whole.cut(hi)
        got = read(log, parts, lo, hi)
        assert got == read(whole, parts, lo, hi) == list(range(lo, hi))
        seen.extend(s for s in got if s >= f)
        f = hi
    assert seen == list(range(start, total))
