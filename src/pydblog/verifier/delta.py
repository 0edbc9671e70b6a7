"""A Delta mirror table: checksummed through Spark, and read with delta-rs
(``deltalake``) into Arrow for the row-by-row comparison after normalization by logical
type.

``spark_checksums``: the row count and hash sum (``spark_row_hash``) of every range
at once, computed by Spark's executors over one version of the table (each row is put
in its range by its normalized key, in the source's key order); only one pair of
numbers per range reaches the driver.

Where the mirror stands: each data commit of the sync carries the application
transaction ``(pydblog-sync, end)``, one past the last change-log offset applied to
this table (docs/sync.md); a table is read at one version, so its rows and that offset
belong together.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from pydblog.ports import TableSchema
from pydblog.verifier.ranges import Key, Range, Row, key_columns, row_of, value

APP_ID = "pydblog-sync"


class DeltaMirror:
    def __init__(self, root: str, schema: TableSchema) -> None:
        self.schema = schema
        self.path = os.path.join(root, schema.schema, schema.table)
        self.name = f"delta:{self.path}"
        self.rows: dict[Key, Row] = {}
        self.multiset: list[Row] = []
        self._sorted: list[Key] = []
        self.applied_end = 0

    def load(self) -> None:
        """Read the table's current version (its rows and applied offset)."""
        from deltalake import DeltaTable

        from pydblog.deltaread import read_table

        self.rows, self.multiset, self._sorted, self.applied_end = {}, [], [], 0
        if not DeltaTable.is_deltatable(self.path):
            return
        dt = DeltaTable(self.path)
        self.applied_end = int(dt.transaction_version(APP_ID) or 0)
        have = set(dt.schema().to_arrow().names)
        cols = [c.name for c in self.schema.columns if c.name in have]
        data: list[dict[str, Any]] = read_table(dt, cols).to_pylist()
        for rec in data:
            key, row = row_of(self.schema, rec)
            self.rows[key] = row
            self.multiset.append(row)
        try:
            self._sorted = sorted(self.rows)
        except TypeError:  # keys that do not order (NULLs): every range is searched
            self._sorted = []

    def applied(self) -> int:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.path):
            return 0
        return int(DeltaTable(self.path).transaction_version(APP_ID) or 0)

    def range_rows(self, rng: Range, source_keys: set[Key]) -> dict[Key, Row]:
        """The mirror's rows of ``rng``: those whose key the source has in the range,
        and the others whose key falls in it by order."""
        out = {k: self.rows[k] for k in source_keys if k in self.rows}
        if self._sorted:
            start = 0 if rng.lo is None else _after(self._sorted, rng.lo)
            for k in self._sorted[start:]:
                if rng.hi is not None and k > rng.hi:
                    break
                out.setdefault(k, self.rows[k])
        else:
            for k, row in self.rows.items():
                if rng.holds(k):
                    out.setdefault(k, row)
        return out


def _after(keys: list[Key], lo: Key) -> int:
    i = bisect_left(keys, lo)
    while i < len(keys) and keys[i] <= lo:
        i += 1
    return i


def spark_row_hash(spark: Any, path: str, schema: TableSchema) -> str | None:
    """The row hash (``portable.spark_hash``) of the Delta table at ``path`` as a Spark
    SQL expression, or None when its column types have none (or it lacks a key column)."""
    from pydblog.verifier.portable import spark_hash

    fields = {f.name: f.dataType.simpleString()
              for f in spark.read.format("delta").load(path).schema.fields}
    if any(k not in fields for k in key_columns(schema)):
        return None
    return spark_hash(schema, fields)


def spark_checksums(spark: Any, path: str, schema: TableSchema, his: Sequence[Key | None],
                    h: str) -> dict[int, tuple[int, int]]:
    """``{range index: (rows, hash sum of the row hash h)}`` of the Delta table at
    ``path`` for the ranges ending at ``his`` (``(his[i-1], his[i]]``, the last one
    open), computed by Spark; an index missing from the answer has no row. A row whose
    key does not order with the bounds counts in the last range (which then differs
    from the source's)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from pydblog.spark.plan import spark_schema

    df = spark.read.format("delta").load(path)
    keys = key_columns(schema)
    logical = {c.name: c.logical for c in schema.columns}
    bounds = [b for b in his if b is not None]
    last = len(bounds)
    names = [f"_k{i}" for i in range(len(keys))]

    def assign(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            cols = [b.column(n).to_pylist() for n in names]
            out = []
            for vals in zip(*cols, strict=True):
                key = tuple(value(logical[k], v) for k, v in zip(keys, vals, strict=True))
                try:
                    out.append(bisect_left(bounds, key))
                except TypeError:
                    out.append(last)
            yield pa.RecordBatch.from_arrays([pa.array(out, pa.int32()), b.column("_h")],
                                             names=["_r", "_h"])

    out_schema = spark_schema(pa.schema([("_r", pa.int32()), ("_h", pa.int64())]))
    rows = (df.select(*[F.col(f"`{k}`").alias(n) for k, n in zip(keys, names, strict=True)],
                      F.expr(h).alias("_h"))
            .mapInArrow(assign, out_schema)
            .groupBy("_r").agg(F.count(F.lit(1)).alias("n"),
                               F.sum(F.col("_h").cast("decimal(38,0)")).alias("s"))
            .collect())
    return {int(r["_r"]): (int(r["n"]), int(r["s"] or 0)) for r in rows}
