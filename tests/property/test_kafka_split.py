"""How a Kafka log's Spark stream (``changelog.kafka_spark``) cuts a batch into tasks (``split_ranges``): every
record of every partition's range lies in exactly one piece, each piece carries exactly
the spans that cover it, the tasks are nearly equal (within a quarter), and there are never more than two
per core nor (unless the batch is) any smaller than ``MIN_RANGE_RECORDS``."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.changelog import kafka_spark
from pydblog.changelog.kafka_spark import MIN_RANGE_RECORDS, split_ranges

# One partition: (records in the range, its first offset, span lengths over it)
partition = st.tuples(
    st.integers(0, 5 * MIN_RANGE_RECORDS), st.integers(0, 1000),
    st.lists(st.integers(1, 3 * MIN_RANGE_RECORDS), min_size=1, max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(partition, min_size=1, max_size=14), st.integers(1, 4))
def test_split_ranges_covers_each_record_once(parts_spec: list[tuple[int, int, list[int]]],
                                              cores: int) -> None:
    ranges = []
    for p, (n, lo, lengths) in enumerate(parts_spec):
        ends = list(itertools.accumulate(lengths, initial=lo))[1:]
        ends[-1] = max(ends[-1], lo + n)  # the spans reach the range's end
        spans = [(e, lo, f"w{k}") for k, e in enumerate(ends)]
        ranges.append((("t", p), lo, lo + n, spans))
    total = sum(hi - lo for _, lo, hi, _ in ranges)
    tasks = split_ranges("{}", ranges, cores)
    assert (1 if total else 0) <= len(tasks) <= max(1, 2 * cores)
    if total >= 2 * MIN_RANGE_RECORDS:
        assert len(tasks) > 1
    seen: dict[int, list[tuple[int, int]]] = {}
    sizes = []
    for task in tasks:
        sizes.append(sum(piece.end - piece.start for piece in task.pieces))
        for piece in task.pieces:
            (_, p), lo, hi, spans = ranges[piece.partition]
            assert lo <= piece.start < piece.end <= hi
            seen.setdefault(p, []).append((piece.start, piece.end))
            prev = [-1, *(s[0] for s in spans)]
            covering = tuple(s for k, s in enumerate(spans)
                             if prev[k] < piece.end and s[0] > piece.start)
            assert piece.spans == covering
    for (_, p), lo, hi, _ in ranges:
        cuts = sorted(seen.get(p, []))
        covered = sum(b - a for a, b in cuts)
        assert covered == hi - lo and (not cuts or (cuts[0][0] == lo and cuts[-1][1] == hi))
        assert all(a[1] == b[0] for a, b in itertools.pairwise(cuts))
    if len(tasks) > 1:
        size = -(-total // len(tasks))
        # each boundary moves by at most size / 8 (to a partition's edge)
        assert size >= MIN_RANGE_RECORDS
        assert size - 2 * (size // 8) - 1 <= min(sizes) <= max(sizes) <= size + 2 * (size // 8)


def test_twelve_small_partitions_make_four_equal_tasks() -> None:
    """The case that motivated equal tasks: 12 partitions of ~25k records on two cores
    were read as 75k + 75k + 75k + 50k + 25k (three rounds of tasks)."""
    sizes = [25_100, 24_900, 25_300, 24_800, 25_000, 25_200, 24_950, 25_050, 25_000,
             25_100, 24_900, 25_500]
    ranges = [(("t", p), 0, n, [(n, 0, "w")]) for p, n in enumerate(sizes)]
    tasks = split_ranges("{}", ranges, 2)
    assert [sum(p.end - p.start for p in t.pieces) for t in tasks] == [75_300, 75_000, 75_000, 75_500]
    assert all(len(t.pieces) == 3 for t in tasks)  # whole partitions, none cut
    assert kafka_spark.MIN_RANGE_RECORDS == MIN_RANGE_RECORDS
