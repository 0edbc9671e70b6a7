"""The reduce on the executors (``plan.SparkBatch.reduced``: events shuffled by
``(table, key)``, truncates cut before, ``reduce_events`` per partition) against the
driver's reduce of the whole batch (``reduce.reduce_events``, the oracle) on random
batches: the same net change per table and key, the same truncated tables."""

from __future__ import annotations

from typing import Any
from unittest import mock

import orjson
import pyarrow as pa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pydblog.spark import plan
from pydblog.spark.job import packed_frame
from pydblog.spark.plan import SparkBatch
from pydblog.spark.reduce import reduce_events
from tests.spark.test_reduce import batch, random_events

Net = dict[tuple[str, str], tuple[str, int, Any, list[str]]]

NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
"""Each example applies Spark batches (seconds each): a failure is reported as drawn,
not shrunk through dozens more of them (past the test's time limit)."""


def driver(t: pa.Table) -> tuple[Net, set[str]]:
    out: Net = {}
    for q, c in reduce_events(t).items():
        for i in range(len(c)):
            out[(q, c.keys[i])] = (c.ops[i], c.offsets[i], orjson.loads(c.texts[i]),
                                   sorted(c.unchanged[i]))
    return out, {q for q, c in reduce_events(t).items() if c.truncated}


def executors(spark: Any, t: pa.Table, parts: int) -> tuple[Net, set[str]]:
    b = SparkBatch.of(0, packed_frame(spark, t), t.column_names, [], dense=False, parts=parts)
    assert b is not None
    # (more reduce partitions than cores once the batch exceeds what one holds)
    assert b.parts % parts == 0 and (b.parts > parts) == (t.num_rows > parts * plan.REDUCE_PART_EVENTS)
    try:
        out: Net = {}
        for r in b.reduced().collect():
            out[(f"{r['schema']}.{r['table']}", r["key"])] = (
                r["op"], r["offset"], orjson.loads(r["text"]), sorted(r["unchanged"] or []))
        return out, set(b.cuts({}))
    finally:
        b.release()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=NO_SHRINK)
@given(st.data())
def test_the_executors_reduce_equals_the_drivers(spark: Any, data: st.DataObject) -> None:
    one = random_events(6)
    events = data.draw(st.lists(one, min_size=1, max_size=40))
    t = batch(*events)
    order = data.draw(st.permutations(range(t.num_rows)))  # a Kafka log interleaves
    t = t.take(pa.array(order, pa.int64()))
    parts = data.draw(st.integers(1, 3))
    # a batch larger than a reduce partition holds (here: a few events) is reduced in
    # more partitions than the cores
    per_part = data.draw(st.sampled_from([plan.REDUCE_PART_EVENTS, 3, 7]))
    with mock.patch.object(plan, "REDUCE_PART_EVENTS", per_part):
        assert executors(spark, t, parts) == driver(t)


def test_hash_buckets_send_each_part_to_its_own_partition(spark: Any) -> None:
    """The packed reduce's shuffle: the bucket of part ``p`` lands in Spark partition
    ``p`` (no two parts share a task, none is left empty)."""
    from pyspark.sql import functions as F

    from pydblog.spark.plan import hash_buckets

    for parts in (1, 2, 3, 8):
        buckets = hash_buckets(spark, parts)
        df = spark.createDataFrame([(b, p) for p, b in enumerate(buckets)], "bucket int, p int")
        got = {(r["p"], r["pid"]) for r in df.repartition(parts, "bucket")
               .select("p", F.spark_partition_id().alias("pid")).collect()}
        assert got == {(p, p) for p in range(parts)}
