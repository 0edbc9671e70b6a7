"""Reading a Delta table's current rows with delta-rs, whatever Spark's Delta wrote.

delta-rs's Arrow dataset reader refuses tables with deletion vectors (the Delta sink's
``deletion_vectors = true``); its DataFusion engine reads them and leaves out the rows
they delete. ``read_table`` takes the dataset reader where it can (no query planning)
and the engine where the table needs it: the same rows either way.
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


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def read_table(table: Any, columns: Sequence[str] | None = None) -> pa.Table:
    """``columns`` (default: all) of the ``deltalake.DeltaTable``'s loaded version."""
    if not has_deletion_vectors(table):
        return table.to_pyarrow_table(columns=list(columns) if columns is not None else None)
    from deltalake import QueryBuilder

    names = list(columns) if columns is not None else list(table.schema().to_arrow().names)
    if not names:
        raise ValueError("read_table needs at least one column")
    query = f"SELECT {', '.join(map(_ident, names))} FROM t"
    return pa.table(QueryBuilder().register("t", table).execute(query).read_all())
