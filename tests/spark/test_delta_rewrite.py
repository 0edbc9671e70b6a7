"""When the Delta sink rewrites a whole table instead of a MERGE (``sinks.delta.rewrites``):
a batch of at least ``REWRITE_MIN_ROWS`` net rows into a table holding at most
``REWRITE_TARGET_RATIO`` times as many, never for a table with a change data feed. The
rewrite's rows are the MERGE's: ``test_sink_contract.py``'s ``delta-rewrite`` cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pydblog.spark.sinks import delta


def _snapshot(spark: Any, path: str) -> Any:
    jvm = spark._jvm
    return delta._delta_log(spark, path).update(False, jvm.scala.Option.empty(),
                                                 jvm.scala.Option.empty())


def test_rows_held_and_the_choice(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "t")
    spark.range(0, 30).selectExpr("id", "cast(id as string) as v").write.format("delta").save(path)
    spark.range(100, 110).selectExpr("id", "'x' as v").write.format("delta").mode("append").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 5")
    assert delta.held_rows(spark, path, _snapshot(spark, path)) == 35
    monkeypatch.setattr(delta, "CHECKSUM_FILES_MAX", 0)  # counted by Delta instead
    assert delta.held_rows(spark, path, _snapshot(spark, path)) == 35
    monkeypatch.undo()

    assert not delta.rewrites(spark, path, 35)  # below REWRITE_MIN_ROWS
    monkeypatch.setattr(delta, "REWRITE_MIN_ROWS", 10)
    assert delta.rewrites(spark, path, 35)
    assert not delta.rewrites(spark, path, 34)
    monkeypatch.setattr(delta, "REWRITE_TARGET_RATIO", 2.0)
    assert delta.rewrites(spark, path, 18) and not delta.rewrites(spark, path, 17)
    assert not delta.rewrites(spark, path, 9)  # below the (patched) minimum

    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    assert not delta.rewrites(spark, path, 1_000)
