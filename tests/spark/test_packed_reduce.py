"""The packed reduce's Python passes without Spark (``plan.split_fn``,
``plan.reduce_packed_fn``, ``plan.unpack_reduced``): events split into payloads per key
partition, each partition's payloads reduced into payloads of at most
``REDUCED_CHUNK_ROWS`` rows, unpacked again, equal the reduce of the whole batch (the
driver's ``reduce.reduce_events``), every key of a table once, every payload's ``n``
and ``fresh`` true to its rows. The Spark plan around them (the shuffle, truncates cut
before the split) is ``test_spark_reduce.py``'s."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.spark import plan
from pydblog.spark.plan import REDUCED_PACKED_SCHEMA, reduce_packed_fn, split_fn, unpack_reduced
from pydblog.spark.reduce import reduce_events
from tests.spark.test_reduce import batch, random_events

COLS = ["offset", "op", "schema", "table", "key", "after", "unchanged"]


def _with_parts(parts: int) -> Any:
    def inner(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            t = pa.Table.from_batches([b]).select(COLS)
            keys = t["key"].to_pylist()
            t = t.append_column("part", pa.array(
                [zlib.crc32((k or "").encode()) % parts for k in keys], pa.int32()))
            yield from t.to_batches()

    return inner


def _net(rows: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[Any, ...]]:
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for r in rows:
        k = (f"{r['schema']}.{r['table']}", r["key"])
        assert k not in out, f"{k} twice"
        out[k] = (r["op"], r["offset"], orjson.loads(r["text"]), sorted(r["unchanged"] or []),
                  r["fresh"])
    return out


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_split_reduce_unpack_equals_the_whole_batch(data: st.DataObject) -> None:
    one = random_events(8, whole_table=False)
    t = batch(*data.draw(st.lists(one, min_size=1, max_size=50)))
    order = data.draw(st.permutations(range(t.num_rows)))  # a Kafka log interleaves
    t = t.take(pa.array(order, pa.int64()))
    parts = data.draw(st.integers(1, 4))
    chunk = data.draw(st.integers(1, 5))
    step = data.draw(st.integers(1, 9))  # events per packed payload of the read
    buckets = [100 + 7 * p for p in range(parts)]

    split = list(split_fn(_with_parts(parts), parts, buckets)(iter(t.to_batches(max_chunksize=step))))
    by: dict[int, list[pa.RecordBatch]] = {}
    for b in split:
        assert b.num_rows == 1
        by.setdefault(b.column("bucket")[0].as_py(), []).append(b)
    assert set(by) <= set(buckets)

    old = plan.REDUCED_CHUNK_ROWS
    plan.REDUCED_CHUNK_ROWS = chunk
    try:
        packed = [r for bucket in by.values() for r in reduce_packed_fn(parts)(iter(bucket))]
    finally:
        plan.REDUCED_CHUNK_ROWS = old
    rows: list[dict[str, Any]] = []
    for p in packed:
        assert p.schema == REDUCED_PACKED_SCHEMA
        got = [r for b in unpack_reduced(iter([p])) for r in b.to_pylist()]
        assert 0 < len(got) <= chunk and p.column("n")[0].as_py() == len(got)
        assert p.column("fresh")[0].as_py() == all(r["fresh"] for r in got)
        assert {(r["schema"], r["table"]) for r in got} == {
            (p.column("schema")[0].as_py(), p.column("table")[0].as_py())}
        assert all(r["part"] == zlib.crc32(r["key"].encode()) % parts for r in got)
        rows.extend(got)

    whole: list[dict[str, Any]] = []
    for tc in reduce_events(t).values():
        whole.extend(plan._reduced_table(tc, parts).to_pylist())
    assert _net(rows) == _net(whole)


def test_chunks_bound_a_payload_by_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide rows: a payload holds about ``REDUCED_CHUNK_BYTES``, whatever the row count."""
    monkeypatch.setattr(plan, "REDUCED_CHUNK_BYTES", 10_000)
    t = pa.table({"text": ["x" * 1000] * 95})
    sizes = [c.num_rows for c in plan._chunks(t)]
    assert sum(sizes) == 95 and max(sizes) <= 10 and len(sizes) >= 10
