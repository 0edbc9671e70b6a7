"""Reading a Delta table's current rows with delta-rs, whatever Spark's Delta wrote.

delta-rs's Arrow dataset reader refuses tables with deletion vectors (the Delta sink's
``deletion_vectors = true``); its ``scan`` (the DataFusion engine) reads them and leaves
out the rows they delete. ``read_table`` takes the dataset reader where it can (as
before) and ``scan`` where the table needs it, with the same column types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

DELETION_VECTORS_FEATURE = "deletionVectors"


def has_deletion_vectors(table: Any) -> bool:
    """Whether the ``deltalake.DeltaTable``'s protocol has the deletion-vectors reader
    feature."""
    features = table.protocol().reader_features or []
    return DELETION_VECTORS_FEATURE in features


def read_table(table: Any, columns: Sequence[str] | None = None) -> pa.Table:
    """``columns`` (default: all) of the ``deltalake.DeltaTable``'s loaded version, typed
    as its schema says (the engine's string and binary views cast back)."""
    if not has_deletion_vectors(table):
        return table.to_pyarrow_table(columns=list(columns) if columns is not None else None)
    got = pa.table(table.scan(columns=list(columns) if columns is not None else None))
    if not got.num_columns:
        return got  # no column: only the row count
    want = pa.schema(table.schema().to_arrow())
    return got.cast(pa.schema([
        pa.field(f.name, want.field(f.name).type, nullable=f.nullable) for f in got.schema]))
