"""``KafkaChangeLog._copies`` reads back below a commit's first offset for records of
its own session; where retention deleted the partition's start, that read begins at
the partition's low watermark, not at the last valid commit's end (there the consumer
would fail on the deleted offset, and every restart would replay the same stop)."""

from __future__ import annotations

from typing import Any

from pydblog.changelog.kafka.writer import KafkaChangeLog

TP = ("app.public.t", 0)


class _Marks:
    """The broker's watermarks (a stub of ``Client.watermarks``): retention deleted
    the partition up to ``low``."""

    def __init__(self, low: int) -> None:
        self.low = low

    def watermarks(self, tps: Any, committed: bool = False) -> dict[Any, tuple[int, int]]:
        return {tp: (self.low, 80) for tp in tps}


def _writer(valid_end: int, low: int) -> tuple[KafkaChangeLog, list[tuple[int, int]]]:
    reads: list[tuple[int, int]] = []
    w = object.__new__(KafkaChangeLog)
    w.client = _Marks(low)  # type: ignore[assignment]
    w._after = {}
    w._no_run = {TP}  # a partition without a run: the read below the first offset runs
    w._valid_ends = {TP: valid_end}
    w._all_ends_read = True

    def own(tp: tuple[str, int], lo: int, hi: int) -> int:
        assert lo >= low, f"read from offset {lo}: retention deleted it"
        reads.append((lo, hi))
        return 0

    w._own_records = own  # type: ignore[method-assign]
    return w, reads


def test_the_read_below_a_commit_starts_at_the_partition_start() -> None:
    w, reads = _writer(valid_end=20, low=50)
    assert w._copies({TP: [70, 79, 10]}) is None
    assert reads == [(50, 70)]


def test_nothing_read_when_retention_passed_the_commit_start() -> None:
    w, reads = _writer(valid_end=20, low=75)
    assert w._copies({TP: [75, 79, 5]}) is None
    assert reads == []
