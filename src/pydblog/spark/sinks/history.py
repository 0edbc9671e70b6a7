"""The change history: every event (all ops, with offset and source position) appended
to one Delta table, for audit and time travel, by Spark's Delta on the executors.

Exactly once: each append carries the application transaction ``(APP_ID, end)`` in the
same Delta commit (Delta's idempotent writes, writer options ``txnAppId``/``txnVersion``);
events below the recorded version are already in the table and are filtered out before
appending, so a replayed batch appends nothing and a batch that straddles the version
(after a Spark checkpoint reset) appends only the new events.
"""

from __future__ import annotations

from typing import Any

from pydblog.errors import SinkError
from pydblog.spark.decode import ARROW_SCHEMA
from pydblog.spark.plan import SparkBatch
from pydblog.spark.sinks.delta import DEFAULT_SOURCE, _first_line, app_id, txn_version

APP_ID = "pydblog-history"


class HistorySink:
    def __init__(self, path: str) -> None:
        self.path = path
        self.name = f"history:{path}"

    def path_of(self, source: str) -> str:
        """A source's history table: ``path`` for the single-source sync's source,
        ``<path>.<source>`` for any other (offsets are per source)."""
        return self.path if source == DEFAULT_SOURCE else f"{self.path.rstrip('/')}.{source}"

    def applied_end(self, spark: Any, source: str = DEFAULT_SOURCE) -> int | None:
        """The end offset of what a source's table holds (its application transaction),
        None before the first batch."""
        try:
            return txn_version(spark, self.path_of(source), app_id(APP_ID, source))
        except Exception as exc:
            raise SinkError(f"{self.path}: {_first_line(exc)}") from exc

    def apply(self, batch: SparkBatch) -> None:
        spark = batch.packed.sparkSession
        done = self.applied_end(spark, batch.source)
        if done is not None and done >= batch.end:
            return
        try:
            events = batch.events(list(ARROW_SCHEMA.names), since=done)
            (events.write.format("delta").mode("append")
             .option("txnAppId", app_id(APP_ID, batch.source))
             .option("txnVersion", str(batch.end))
             .save(self.path_of(batch.source)))
        except Exception as exc:
            raise SinkError(f"{self.path}: {_first_line(exc)}") from exc

    def close(self) -> None:
        pass
