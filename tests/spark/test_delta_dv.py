"""The Delta sink with ``deletion_vectors = true``: tables are created with Delta's
deletion vectors (or switched to them), so a MERGE marks the rows it replaces deleted
instead of rewriting their files. The mirror is compared with the log materialized,
every column and the row count, as delta-rs reads it (through its query engine:
``pydblog.deltaread``), as Spark's Delta reads it and as ``dblog verify`` loads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pydblog.changelog.sqlite_spark import OffsetRange
from pydblog.config import LogConfig, SinkConfig
from pydblog.deltaread import has_deletion_vectors, read_table
from pydblog.spark.decode import read_range
from pydblog.spark.job import BatchApplier
from pydblog.spark.sinks import build_sink, delta
from pydblog.verifier.delta import DeltaMirror
from tests.spark.helpers import latest_schemas, oracle
from tests.spark.test_delta_fresh import assert_exact, build


def _deletion_vectors_written(path: Path) -> int:
    """The log's added files that carry a deletion vector."""
    found = 0
    for f in sorted((path / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            add = json.loads(line).get("add")
            if add and add.get("deletionVector"):
                found += 1
    return found


def test_mirror_with_deletion_vectors(spark: Any, tmp_path: Path) -> None:
    log_dir, lake = tmp_path / "log", tmp_path / "lake"
    ends = build(log_dir)
    sink = build_sink(SinkConfig(type="delta", path=str(lake), deletion_vectors=True))
    applier = BatchApplier(LogConfig(path=str(log_dir)), [sink], retries=0, backoff_s=0)

    def events(a: int, b: int) -> pa.Table:
        return pa.Table.from_batches(list(read_range(OffsetRange(str(log_dir), a, b))))

    try:
        start = 0
        for i, end in enumerate(ends):
            applier.apply(events(start, end), i, dense=True)
            start = end
    finally:
        applier.close()
    expected = oracle(log_dir)
    schemas = latest_schemas(log_dir)
    marked = 0
    for q, table in expected.items():
        schema, _, name = q.partition(".")
        path = lake / schema / name
        assert has_deletion_vectors(DeltaTable(str(path))), q
        assert delta.uses_deletion_vectors(spark, str(path)), q
        marked += _deletion_vectors_written(path)
        assert spark.read.format("delta").load(str(path)).count() == len(table), q
        mirror = DeltaMirror(str(lake), schemas[q])
        mirror.load()
        assert len(mirror.multiset) == len(table) and mirror.applied_end > 0, q
    assert marked, "no MERGE wrote a deletion vector"
    assert_exact(log_dir, lake)  # every column, through pydblog.deltaread


def test_an_existing_table_is_switched(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    spark.range(0, 10).selectExpr("cast(id as int) as id", "cast(id as string) as v") \
        .coalesce(1).write.format("delta").save(path)
    schema = pa.schema([pa.field("id", pa.int32(), nullable=False), pa.field("v", pa.string())])
    delta.ensure_table(spark, path, schema)
    assert not delta.uses_deletion_vectors(spark, path)
    delta.ensure_table(spark, path, schema, deletion_vectors=True)
    assert delta.uses_deletion_vectors(spark, path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 3")
    assert _deletion_vectors_written(Path(path)) == 1
    got = read_table(DeltaTable(path), ["id", "v"]).to_pylist()
    assert sorted(r["id"] for r in got) == list(range(3, 10))


def test_only_delta_sinks_take_the_setting() -> None:
    assert SinkConfig(type="delta", path="/x").deletion_vectors is False
    with pytest.raises(ValueError, match="deletion_vectors is a setting of \"delta\" sinks"):
        SinkConfig(type="history", path="/x", deletion_vectors=True)
