"""``consistent = true``'s cut of a Kafka log reads the commit times of each commit
message (``CommitRecord.times``: where the time changes) instead of one per event:
``kafka_spark.cut_position`` must find what ``drainer.consistent_cut`` finds on the
events' times, from any start inside the commits."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.changelog.kafka.writer import commit_times
from pydblog.changelog.kafka_spark import PlannedCommit, cut_position
from pydblog.core.drainer import consistent_cut
from pydblog.events import EncodedBlock, EncodedEvent


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 4), st.booleans()),
                         min_size=1, max_size=5), max_size=6),
       st.integers(0, 40), st.integers(0, 60), st.integers(0, 60))
def test_the_cut_from_commit_times_is_the_cut_of_the_events(
        commits: list[list[tuple[int, int, bool]]], low: int, skip: int, short: int) -> None:
    """Commits of transactions (time, events, written as one block or not); times may
    even go back (a clock that went back: the cut stops at the first later commit)."""
    planned: list[PlannedCommit] = []
    times: list[int] = []
    pos = 0
    for txs in commits:
        events: list[EncodedEvent | EncodedBlock] = []
        for ts, n, block in txs:
            if block:
                events.append(EncodedBlock("s.t", "r", ts, n, "\n".join(["{}"] * n)))
            else:
                events.extend(EncodedEvent("s.t", "u", ts, "{}") for _ in range(n))
            times.extend([ts] * n)
        start = pos
        pos += sum(n for _, n, _ in txs)
        planned.append(PlannedCommit(start, pos, tuple(commit_times(events, start)), {}))
    first = min(skip, pos)
    stop = max(first, pos - short)
    want = first + consistent_cut(times[first:stop], low)
    assert cut_position(planned, first, stop, low) == want
