"""The Delta sink's read of a table's application transaction version
(``sinks.delta.txn_version``): it decides which events a batch still applies, so it
must equal what Delta's own snapshot records, after every kind of commit the sink
makes, and read from the version checksum (no Spark job) when the checksum holds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydblog.spark.sinks.delta import _delta_log, app_transaction, txn_version


def _snapshot_txn(spark: Any, path: str, app: str) -> int | None:
    """Delta's own answer: the snapshot's state (a state reconstruction)."""
    jvm = spark._jvm
    snap = _delta_log(spark, path).update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
    found = snap.transactions().get(app)
    return int(found.get()) if found.isDefined() else None


def _jobs(spark: Any) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


def test_txn_version_follows_every_commit_without_a_spark_job(spark: Any, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    assert txn_version(spark, path, "app") is None  # no table
    spark.range(0, 1000).selectExpr("id", "cast(id as string) as s").write.format("delta").save(path)
    assert txn_version(spark, path, "app") is None  # a table, no transaction yet
    for version in (5, 12):
        src = spark.range(version * 10, version * 10 + 500).selectExpr("id", "cast(id * 2 as string) as s")
        with app_transaction(spark, "app", version):
            (DeltaTable.forPath(spark, path).alias("t").merge(src.alias("s"), "t.id = s.id")
             .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        before = _jobs(spark)
        got = txn_version(spark, path, "app")
        assert _jobs(spark) == before, "read from the checksum, not by a state reconstruction"
        assert got == version == _snapshot_txn(spark, path, "app")
        assert txn_version(spark, path, "other") is None
    # a commit of no transaction (a column added) keeps the recorded version
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (extra string)")
    assert txn_version(spark, path, "app") == 12 == _snapshot_txn(spark, path, "app")
    # a writer's transaction (an append or overwrite of the sink) is read the same way
    (spark.range(0, 10).selectExpr("id", "'x' as s", "'y' as extra").write.format("delta")
     .mode("append").option("txnAppId", "app").option("txnVersion", "20").save(path))
    assert txn_version(spark, path, "app") == 20 == _snapshot_txn(spark, path, "app")


def test_txn_version_without_checksums_reads_the_snapshot(spark: Any, tmp_path: Path) -> None:
    """A table written by a writer that keeps no checksum files (delta-rs, older
    Deltas): the version comes from the snapshot's state."""
    path = tmp_path / "t"
    for version in (3, 4):
        (spark.range(0, 10).selectExpr("id").write.format("delta").mode("append")
         .option("txnAppId", "app").option("txnVersion", str(version)).save(str(path)))
    for crc in (path / "_delta_log").glob("*.crc"):
        crc.unlink()
    # a fresh log instance: the cached snapshot was loaded with its checksum
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    assert txn_version(spark, str(path), "app") == 4 == _snapshot_txn(spark, str(path), "app")
