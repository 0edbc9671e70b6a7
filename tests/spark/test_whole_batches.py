"""The sync job's own check that a batch for a history sink holds every offset of its
range exactly once, and that a query's batches leave no offsets out between them
(``spark.job.check_whole``): a read that drops or repeats an event fails the batch before
any sink applies it. Real Delta tables; the batches given to ``BatchApplier.apply`` as
Arrow (packed into a DataFrame as the source packs them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pydblog.changelog.sqlite_spark import OffsetRange
from pydblog.config import LogConfig, SinkConfig
from pydblog.devtools.synth import SyntheticLoad, write_load
from pydblog.errors import ChangeLogError
from pydblog.spark.decode import read_range
from pydblog.spark.job import BatchApplier
from pydblog.spark.sinks import build_sink
from tests.spark.helpers import history_offsets


def setup(tmp_path: Path, history: bool = True) -> tuple[BatchApplier, int]:
    end = write_load(tmp_path / "log", SyntheticLoad(seed=5), 3_000)
    return applier(tmp_path, history), end


def applier(tmp_path: Path, history: bool = True) -> BatchApplier:
    """A process's applier over the log and sinks in ``tmp_path``."""
    specs: list[dict[str, Any]] = [{"type": "delta", "path": str(tmp_path / "lake")}]
    if history:
        specs.append({"type": "history", "path": str(tmp_path / "lake" / "_changes")})
    sinks = [build_sink(SinkConfig.model_validate(s)) for s in specs]
    return BatchApplier(LogConfig(path=str(tmp_path / "log")), sinks, retries=0, backoff_s=0)


def events(tmp_path: Path, a: int, b: int) -> pa.Table:
    return pa.Table.from_batches(list(read_range(OffsetRange(str(tmp_path / "log"), a, b))))


def without(t: pa.Table, offset: int) -> pa.Table:
    return t.filter(pc.not_equal(t["offset"], offset))


@pytest.mark.parametrize("hole", ["inside", pytest.param("repeated", marks=pytest.mark.slow)])
def test_a_batch_missing_an_offset_fails_before_any_sink(spark: Any, tmp_path: Path, hole: str) -> None:
    app, end = setup(tmp_path)
    app.apply(events(tmp_path, 0, 1_000), 0)
    t = without(events(tmp_path, 1_000, 2_000), 1_500)
    if hole == "repeated":  # as many events as offsets: one missing, another twice
        t = pa.concat_tables([t, t.filter(pc.equal(t["offset"], 1_700))])
        assert t.num_rows == 1_000
    with pytest.raises(ChangeLogError, match=r"offsets 1000\.\.1999 were read incompletely or twice"):
        app.apply(t, 1)
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(1_000))
    app.apply(events(tmp_path, 1_000, end), 1)  # the re-read batch applies
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))


@pytest.mark.slow
def test_a_batch_starting_past_the_last_ones_end_fails(spark: Any, tmp_path: Path) -> None:
    app, end = setup(tmp_path)
    app.apply(events(tmp_path, 0, 1_000), 0)
    with pytest.raises(ChangeLogError, match=r"offsets 1000\.\.1009 were never read"):
        app.apply(events(tmp_path, 1_010, end), 1)
    app.apply(events(tmp_path, 0, 1_000), 0)  # a replay (earlier start) is no gap
    app.apply(events(tmp_path, 1_000, end), 1)
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))


def test_mirrors_alone_accept_a_gap(spark: Any, tmp_path: Path) -> None:
    """Without a history sink the log may be compacted (``allowGaps``): mirrors apply
    each key's newest event, so a batch with an offset missing still applies."""
    app, _end = setup(tmp_path, history=False)
    app.apply(without(events(tmp_path, 0, 1_000), 500), 0)
    assert app.batches == 1


@pytest.mark.slow
def test_a_process_first_batch_past_what_the_history_holds_fails(spark: Any, tmp_path: Path) -> None:
    """The last batch of a process (an available-now run's, one before a kill) is checked
    by no later batch of that process: the next process's first batch is checked
    against the end the history sink recorded."""
    first, end = setup(tmp_path)
    first.apply(without(events(tmp_path, 0, 1_000), 999), 0)  # its last event lost
    first.close()
    again = applier(tmp_path)  # the next process
    with pytest.raises(ChangeLogError, match=r"the history sink holds offsets up to and ending "
                                             r"at 999: offsets 999\.\.999 were never read"):
        again.apply(events(tmp_path, 1_000, end), 1)
    again.apply(events(tmp_path, 0, 1_000), 0)  # a replay from the start mends it
    again.apply(events(tmp_path, 1_000, end), 1)
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))

