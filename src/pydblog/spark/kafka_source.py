"""Deprecated: the 0.x module of the ``dblog-kafka`` data source, kept for old callers.

The sync reads every ``[log] type`` through ``source.DblogDataSource`` (format
``dblog``, ``.option("log", cfg.log.model_dump_json())``), and what it knows of Kafka
lives with the backend (``changelog.kafka_spark``, reached through
``changelog.open_stream``). This module keeps the old names working without naming a
backend: ``NAME``/``KafkaDataSource`` (the ``dblog-kafka`` format: the ``dblog`` source),
``KafkaStreamReader`` (whose ``partitions`` are the backend's bare ``KafkaRange``s), and
every other name (``KafkaRange``, ``split_ranges``, ``MIN_RANGE_RECORDS``, ...) read
*and set* on the Kafka backend's stream module. Nothing in pydblog imports it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from typing import Any

from pydblog.spark.source import DblogDataSource, DblogStreamReader, _part

NAME = "dblog-kafka"
_LOG_TYPE = '{"type": "kafka"}'  # a [log] table of the type whose module this aliases


class KafkaDataSource(DblogDataSource):
    @classmethod
    def name(cls) -> str:
        return NAME


class KafkaStreamReader(DblogStreamReader):
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
        return [_part(p) for p in super().partitions(start, end)]


def _backend() -> types.ModuleType:
    from pydblog.changelog import open_stream

    return sys.modules[type(open_stream(_LOG_TYPE)).__module__]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_backend(), name)


class _Alias(types.ModuleType):
    """Setting a name the backend module has sets it there (``monkeypatch``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.__dict__ and not name.startswith("__") and hasattr(_backend(), name):
            setattr(_backend(), name, value)
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Alias
