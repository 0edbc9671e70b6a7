"""The change history: every event (all ops, with offset and source position) appended
to one Delta table, for audit and time travel.

Exactly once: each append carries the application transaction ``(APP_ID, end)`` in the
same Delta commit; events below the recorded version are already in the table and are
filtered out before appending, so a replayed batch appends nothing and a batch that
straddles the version (after a Spark checkpoint reset) appends only the new events.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError

from pydblog.errors import SinkError
from pydblog.spark.batch import Batch
from pydblog.spark.decode import ARROW_SCHEMA

APP_ID = "pydblog-history"


class HistorySink:
    def __init__(self, path: str) -> None:
        self.path = path
        self.name = f"history:{path}"

    def applied_end(self) -> int | None:
        """The end offset of what the table holds (its application transaction), None
        before the first batch."""
        try:
            if not DeltaTable.is_deltatable(self.path):
                return None
            done: int | None = DeltaTable(self.path).transaction_version(APP_ID)
            return done
        except (DeltaError, OSError) as exc:
            raise SinkError(f"{self.path}: {exc}") from exc

    def apply(self, batch: Batch) -> None:
        try:
            done = self.applied_end()
            if done is None and not DeltaTable.is_deltatable(self.path):
                Path(self.path).mkdir(parents=True, exist_ok=True)
            if done is not None and done >= batch.end:
                return
            events = batch.events_since(done if done is not None else batch.start)
            data = events.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA)
            write_deltalake(
                self.path,
                data,
                mode="append",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(APP_ID, batch.end)]
                ),
            )
        except (DeltaError, OSError, pa.ArrowException, ValueError) as exc:
            raise SinkError(f"{self.path}: {exc}") from exc

    def close(self) -> None:
        pass
