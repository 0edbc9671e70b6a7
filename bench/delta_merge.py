"""Benchmark: one Delta MERGE of a CDC batch into a large table, copy-on-write against
deletion vectors.

A table of ``--rows`` rows ``(id BIGINT, a STRING, b BIGINT, c DOUBLE)`` in
``--files`` files is written once per variant; then ``--merges`` MERGEs each upsert
``--batch`` keys drawn at random over the whole table (an update of every column), the
shape of a sync batch into a mirror whose changes are spread over its keys. Variants
alternate (``cow``, ``dv``, ``cow``, ``dv``, ... for ``--rounds`` rounds): ``cow`` is a
table as ``dblog sync`` creates it (Delta's defaults: a MERGE rewrites every file holding
a touched key), ``dv`` the same table with ``delta.enableDeletionVectors = true`` (a MERGE
marks the old rows deleted and writes only the new ones). Reported per variant: the
median MERGE time and the bytes the table's files take after the MERGEs (removed files
included: what a VACUUM would free). The first MERGE of each table is left out of the
median (its code paths are cold in the first round) unless it is the only one.

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/delta_merge.py
    [--rows 2000000] [--batch 20000] [--merges 4] [--rounds 2] [--master 'local[2]']
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import results


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.parquet")) + sum(
        f.stat().st_size for f in path.rglob("*.bin"))


def run_variant(spark: Any, path: Path, dv: bool, rows: int, files: int, batch: int,
                merges: int) -> tuple[list[float], int, int]:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    shutil.rmtree(path, ignore_errors=True)
    builder = (DeltaTable.createIfNotExists(spark).location(str(path))
               .addColumn("id", "BIGINT", nullable=False).addColumn("a", "STRING")
               .addColumn("b", "BIGINT").addColumn("c", "DOUBLE"))
    if dv:
        builder = builder.property("delta.enableDeletionVectors", "true")
    builder.execute()
    (spark.range(rows).select("id", F.sha1(F.col("id").cast("string")).alias("a"),
                              (F.col("id") * 7).alias("b"), F.rand(1).alias("c"))
     .repartition(files).write.format("delta").mode("append").save(str(path)))
    times = []
    for r in range(merges):
        keys = (spark.range(batch)
                .select((F.abs(F.xxhash64(F.col("id"), F.lit(r))) % rows).alias("id"))
                .distinct())
        src = keys.select("id", F.lit("x").alias("a"), F.lit(r).cast("bigint").alias("b"),
                          F.rand(r).alias("c"))
        t = time.monotonic()
        (DeltaTable.forPath(spark, str(path)).alias("t").merge(src.alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        times.append(time.monotonic() - t)
    count = spark.read.format("delta").load(str(path)).count()
    return times, dir_bytes(path), count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--merges", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    from pydblog.spark.session import spark_session

    spark = spark_session(args.master)
    work = Path(tempfile.mkdtemp(prefix="delta-merge-"))
    runs: dict[str, list[dict[str, Any]]] = {"cow": [], "dv": []}
    try:
        for rnd in range(args.rounds):
            for name in ("cow", "dv"):
                times, size, count = run_variant(spark, work / name, name == "dv", args.rows,
                                                 args.files, args.batch, args.merges)
                assert count == args.rows, (name, count)
                runs[name].append({"merge_s": times, "table_bytes": size})
                print(f"round {rnd} {name}: MERGEs {' '.join(f'{t:.2f}' for t in times)} s, "
                      f"files {size / 2**20:.0f} MiB (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    figures: dict[str, Any] = {"rows": args.rows, "files": args.files, "batch": args.batch,
                               "merges": args.merges, "master": args.master, "runs": runs}
    for name, rs in runs.items():
        figures[f"{name}_median_merge_s"] = statistics.median(
            t for r in rs for t in (r["merge_s"][1:] or r["merge_s"]))
        figures[f"{name}_table_bytes"] = statistics.median(r["table_bytes"] for r in rs)
    figures["dv_x_cow_merge_time"] = figures["dv_median_merge_s"] / figures["cow_median_merge_s"]
    print(f"median MERGE: copy-on-write {figures['cow_median_merge_s']:.2f} s, deletion vectors "
          f"{figures['dv_median_merge_s']:.2f} s = {figures['dv_x_cow_merge_time']:.2f} x; files "
          f"{figures['cow_table_bytes'] / 2**20:.0f} / {figures['dv_table_bytes'] / 2**20:.0f} MiB")
    print(f"results: {results.write('delta_merge', figures)}")


if __name__ == "__main__":
    main()
