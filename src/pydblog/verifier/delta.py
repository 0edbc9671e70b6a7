"""A Delta mirror table, read with delta-rs (``deltalake``) into Arrow and compared row
by row in Python after normalization by logical type (Delta has no SQL engine here:
the source side of a Delta comparison is read row by row too).

Where the mirror stands: each data commit of the sync carries the application
transaction ``(pydblog-sync, end)``, one past the last change-log offset applied to
this table (docs/sync.md); a table is read at one version, so its rows and that offset
belong together.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from typing import Any

from pydblog.ports import TableSchema
from pydblog.verifier.ranges import Key, Range, Row, row_of

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

        self.rows, self.multiset, self._sorted, self.applied_end = {}, [], [], 0
        if not DeltaTable.is_deltatable(self.path):
            return
        dt = DeltaTable(self.path)
        self.applied_end = int(dt.transaction_version(APP_ID) or 0)
        have = set(dt.schema().to_arrow().names)
        cols = [c.name for c in self.schema.columns if c.name in have]
        data: list[dict[str, Any]] = dt.to_pyarrow_table(columns=cols).to_pylist()
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
