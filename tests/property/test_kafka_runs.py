"""Which records of a Kafka change log are valid, with and without the header check:
a writer's commits spread over partitions, with another writer's records interleaved
(a fenced zombie), crashed sessions whose aborted records stay in the partitions (Tansu
shows them), transaction markers taking offsets, truncates fanned out to every
partition, and old writers that list no runs. A reader that reads headers only where a
commit listed no run (``Span.first < 0``) gets every committed event exactly once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.changelog.kafka.protocol import CommitLog, CommitRecord, commit_ends

TOPIC = "p.public.t"
PARTS = 3

# One commit: (events, partition choice seed, a zombie's records interleaved?, crash
# (data, no checkpoint message)?, a truncate fanned out?, an old writer (no runs)?)
steps = st.lists(
    st.tuples(st.integers(0, 6), st.integers(0, 2**16), st.booleans(), st.booleans(),
              st.booleans(), st.booleans()),
    min_size=1, max_size=25,
)

Record = tuple[int, str, bool] | None  # (global offset, writer tag, fan-out copy); None: a marker


def build(script: list[tuple[int, int, bool, bool, bool, bool]]) -> tuple[CommitLog, dict[int, list[Record]], int]:
    log = CommitLog()
    parts: dict[int, list[Record]] = {p: [] for p in range(PARTS)}
    gen, cp_offset, nxt = 1, 0, 0

    def message(rec: CommitRecord) -> None:
        nonlocal cp_offset
        rec.kafka_offset = cp_offset
        cp_offset += 1
        log.apply(rec)

    message(CommitRecord(gen, f"w{gen}", 0, 0, None, {}, begin=True))
    for n, seed, zombie, crash, truncate, legacy in script:
        tag = f"{gen}:w{gen}"
        delivered: dict[tuple[str, int], list[int]] = {}
        fanned: set[tuple[str, int]] = set()

        def put(p: int, rec: Record, own: bool,
                delivered: dict[tuple[str, int], list[int]] = delivered) -> None:
            parts[p].append(rec)
            if own:
                off = len(parts[p]) - 1
                d = delivered.setdefault((TOPIC, p), [off, off, 0])
                d[0], d[1], d[2] = min(d[0], off), max(d[1], off), d[2] + 1

        seq = nxt
        for i in range(n):
            p = (seed >> (2 * i)) % PARTS
            put(p, (seq, tag, False), True)
            seq += 1
            if zombie and i == n // 2:  # a fenced writer's record lands between ours
                put((seed >> 20) % PARTS, (10**6 + seq, "0:zombie", False), False)
        if truncate:
            for p in range(PARTS):
                put(p, (seq, tag, p > 0), True)
                if p > 0:
                    fanned.add((TOPIC, p))
            seq += 1
        for tp in delivered:  # the transaction's marker (commit or abort)
            parts[tp[1]].append(None)
        if crash:  # aborted: the records stay; the next session begins
            gen += 1
            message(CommitRecord(gen, f"w{gen}", nxt, nxt, None, {}, begin=True))
            continue
        ends, runs = commit_ends(delivered, fanned)
        message(CommitRecord(gen, f"w{gen}", nxt, seq, None, ends, runs={} if legacy else runs))
        nxt = seq
    return log, parts, nxt


@settings(max_examples=300, deadline=None)
@given(steps)
def test_every_committed_event_once_reading_headers_only_without_a_run(
        script: list[tuple[int, int, bool, bool, bool, bool]]) -> None:
    log, parts, total = build(script)
    got: list[int] = []
    for p, recs in parts.items():
        end = log.ends.get((TOPIC, p), 0)
        for off, rec in enumerate(recs[:end]):
            if rec is None:  # a marker: consumers never see it
                continue
            seq, tag, fanout = rec
            span = log.span((TOPIC, p), off)
            if span is None:
                continue
            if span.first >= 0:  # a run: decided by the offset alone
                if span.valid(off, None):
                    assert not fanout and tag == span.tag
                    got.append(seq)
            elif span.valid(off, tag) and not fanout:
                got.append(seq)
    assert sorted(got) == list(range(total))


@settings(max_examples=100, deadline=None)
@given(steps)
def test_runs_are_listed_only_for_clean_partitions(
        script: list[tuple[int, int, bool, bool, bool, bool]]) -> None:
    """A commit with neither a zombie's record, nor a fan-out copy, nor an old writer
    lists a run for every partition it wrote (the fast path is taken when it can be)."""
    log, _, _ = build(script)
    clean = [s for s in script if not (s[2] or s[4] or s[5])]
    if clean == script:
        assert all(span.first >= 0 for spans in log.spans.values() for span in spans)
