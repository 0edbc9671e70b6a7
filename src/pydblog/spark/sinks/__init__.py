"""Sinks apply one reduced micro-batch to a target, idempotently.

The exactly-once contract every sink keeps (see docs/sync.md):
- ``apply(batch)`` may be called again for the same ``batch`` (a retry after an error,
  or Spark replaying a batch after a crash before its commit): the second call must
  leave the target as one call would. Each sink records, atomically with its writes,
  which part of the change log it has applied, and skips what is already there.
- ``apply`` either returns with the whole batch applied or raises; it never skips
  rows silently. Errors are ``SinkError`` naming the sink and table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from pydblog.config import SinkConfig
from pydblog.errors import DblogError, SinkError
from pydblog.spark.plan import SparkBatch

log = logging.getLogger("pydblog.sync")


class Sink(Protocol):
    name: str

    def apply(self, batch: SparkBatch) -> None: ...

    def close(self) -> None: ...


def build_sink(cfg: SinkConfig) -> Sink:
    if cfg.type == "delta":
        from pydblog.spark.sinks.delta import DeltaSink

        assert cfg.path is not None
        return DeltaSink(cfg.path, cfg.workers(), cfg.deletion_vectors)
    if cfg.type == "history":
        from pydblog.spark.sinks.history import HistorySink

        assert cfg.path is not None
        return HistorySink(cfg.path)
    if cfg.type == "mysql":
        from pydblog.extras import needs_extra

        with needs_extra("mysql", "a mysql sink"):
            import pymysql  # noqa: F401
        from pydblog.spark.sinks.mysql import MySqlSink

        assert cfg.dsn is not None
        return MySqlSink(cfg.dsn, cfg.schema_, cfg.workers())
    from pydblog.spark.sinks.postgres import PostgresSink

    assert cfg.dsn is not None
    return PostgresSink(cfg.dsn, cfg.schema_, cfg.workers())


def apply_with_retry(
    sink: Sink,
    batch: SparkBatch,
    *,
    retries: int,
    backoff_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """``sink.apply(batch)``, retried up to ``retries`` times with exponential backoff
    (safe: ``apply`` is idempotent). The last error is raised as ``SinkError``."""
    attempt = 0
    while True:
        try:
            sink.apply(batch)
            return
        except Exception as exc:
            err = exc if isinstance(exc, DblogError) else None
            msg = err.message if err is not None else f"{type(exc).__name__}: {exc}"
            if attempt >= retries:
                raise SinkError(
                    f"sink {sink.name} failed on batch {batch.batch_id} "
                    f"(offsets {batch.start}..{batch.end - 1}) after {attempt + 1} attempts: "
                    f"{msg}",
                    hint=err.hint
                    if err is not None and err.hint
                    else "fix the target and restart `dblog sync`: it resumes at this batch",
                ) from exc
            delay = min(backoff_s * 2**attempt, 30.0)
            log.warning(
                "sink %s, batch %d: %s; retrying in %.1fs", sink.name, batch.batch_id, msg, delay
            )
            sleep(delay)
            attempt += 1
