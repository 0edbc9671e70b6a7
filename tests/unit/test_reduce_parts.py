"""How many partitions a batch's reduce takes (``plan.reduce_parts``): at least the
cores, a multiple of them, each holding at most the per-partition bounds on average."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pydblog.spark.plan import REDUCE_PART_BYTES, REDUCE_PART_EVENTS, reduce_parts


def test_small_batches_take_one_partition_a_core() -> None:
    assert reduce_parts(2, 1, 100) == 2
    assert reduce_parts(8, 400_000, 10 << 20) == 8


def test_large_batches_take_more_partitions_in_whole_waves() -> None:
    assert reduce_parts(2, 2_000_000, 700 << 20) == 4  # 4 x 500k events, 175 MiB each
    assert reduce_parts(2, 100_000, 1 << 30) == 6  # wide rows: bytes decide
    assert reduce_parts(16, 2_000_000, 700 << 20) == 16


@given(st.integers(0, 64), st.integers(0, 10**9), st.integers(0, 1 << 40))
def test_bounds(cores: int, events: int, size: int) -> None:
    parts = reduce_parts(cores, events, size)
    c = max(1, cores)
    assert parts >= c and parts % c == 0
    assert events <= parts * REDUCE_PART_EVENTS and size <= parts * REDUCE_PART_BYTES
    # not more than one wave beyond what the bounds need
    need = max(1, -(-events // REDUCE_PART_EVENTS), -(-size // REDUCE_PART_BYTES))
    assert parts < need + c
