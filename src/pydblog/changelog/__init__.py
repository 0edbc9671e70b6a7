"""Change log backends, chosen by ``[log] type``: the embedded SQLite log (default,
``changelog.sqlite``) or Kafka topics (``changelog.kafka``). Everything else (the
capture runner, ``dblog tail``/``status``, ``dblog sync``'s Spark source) reaches a log
only through these functions and the ``ports`` protocols ``ChangeLogWriter``/
``ChangeLogReader``/``ChangeLogStream``/``LogPartition``.

A new backend adds a branch to each function here (``open_stream`` included: its
``ChangeLogStream`` beside the backend, like ``sqlite_spark``/``kafka_spark``); nothing
in ``pydblog.spark`` names a backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydblog.errors import ChangeLogError

if TYPE_CHECKING:  # the package is imported by Spark's executors: keep it light
    from pydblog.config import LogConfig
    from pydblog.ports import ChangeLogReader, ChangeLogStream, ChangeLogWriter, Checkpoint

LOG_TYPES = ("embedded", "kafka")
"""``[log] type``'s values (``LogConfig.type``); the first is the default."""


def open_writer(cfg: LogConfig) -> ChangeLogWriter:
    """The capture's writer (high availability then calls its ``claim(epoch)``)."""
    if cfg.type == "kafka":
        from pydblog.changelog.kafka.writer import KafkaChangeLog

        Path(cfg.path).mkdir(parents=True, exist_ok=True)  # the local state and status files
        return KafkaChangeLog(cfg)
    from pydblog.changelog.sqlite import SqliteChangeLog

    return SqliteChangeLog(cfg.path)


def open_reader(cfg: LogConfig) -> ChangeLogReader:
    """A reader (raises ``ChangeLogError`` naming the fix when there is no log yet)."""
    if cfg.type == "kafka":
        from pydblog.changelog.kafka.reader import KafkaChangeLogReader

        return KafkaChangeLogReader(cfg)
    from pydblog.changelog.sqlite import SqliteChangeLogReader

    return SqliteChangeLogReader(cfg.path)


def log_name(cfg: LogConfig) -> str:
    """The change log ``cfg`` names, for messages."""
    if cfg.type == "kafka":
        return f"the Kafka change log {cfg.topic_prefix!r} at {cfg.bootstrap_servers}"
    from pydblog.changelog.sqlite import log_path

    return f"the change log {log_path(cfg.path)}"


def log_exists(cfg: LogConfig) -> bool:
    """Whether a log has been created (for Kafka: its checkpoint topic exists)."""
    if cfg.type == "kafka":
        from pydblog.changelog.kafka.client import checkpoint_topic_exists

        return checkpoint_topic_exists(cfg)
    from pydblog.changelog.sqlite import log_path

    return log_path(cfg.path).exists()


def describe(cfg: LogConfig) -> tuple[dict[str, Any] | None, Checkpoint | None]:
    """``dblog status``'s view of the log and its last checkpoint (``None, None`` when
    there is no log yet)."""
    if not log_exists(cfg):
        return None, None
    reader = open_reader(cfg)
    try:
        return reader.describe(), reader.last_checkpoint()
    finally:
        reader.close()


def open_stream(log_json: str, *, allow_gaps: bool = False) -> ChangeLogStream:
    """The change log as the source of ``dblog sync``'s Spark stream. ``log_json``: the
    ``[log]`` config as JSON (``LogConfig.model_dump_json()``; a partial table such as
    ``{"path": "./dblog-data"}`` means its defaults, ``type`` the embedded log), read
    without the config models (Spark's planning processes import little). ``allow_gaps``:
    the reader needs only each key's newest event (mirror sinks), so records a backend
    finds removed from its storage (compaction) are accepted where it can tell."""
    try:
        raw = json.loads(log_json)
    except ValueError as exc:
        raise ChangeLogError(f"the [log] option is not JSON: {exc}",
                             hint='.option("log", cfg.log.model_dump_json())') from None
    kind = raw.get("type", LOG_TYPES[0]) if isinstance(raw, dict) else None
    if kind not in LOG_TYPES:
        raise ChangeLogError(
            f"the [log] option names no change log type this version knows ({kind!r})",
            hint="type = " + " or ".join(f'"{t}"' for t in LOG_TYPES),
        )
    if kind == "kafka":
        from pydblog.changelog.kafka_spark import KafkaStream

        return KafkaStream(log_json, allow_gaps=allow_gaps)
    from pydblog.changelog.sqlite_spark import SqliteStream

    return SqliteStream.from_json(log_json)


def _log_type(log_json: str) -> str:
    raw = json.loads(log_json)
    kind = raw.get("type", LOG_TYPES[0]) if isinstance(raw, dict) else None
    if kind not in LOG_TYPES:
        raise ChangeLogError(f"the [log] option names no change log type this version knows "
                             f"({kind!r})")
    return str(kind)


def complete_ms(log_json: str) -> int | None:
    """How far the change log of ``log_json`` (the ``[log]`` config as JSON) is complete
    in source time: no event it logs later has a commit time at or below it (the
    newest logged commit time minus one, or the capture's last heartbeat when later);
    None while it has neither. ``consistent = true``'s rounds open at the least of the
    sources'."""
    if _log_type(log_json) == "kafka":
        from pydblog.changelog.kafka_spark import log_complete_ms as kafka_complete

        return kafka_complete(log_json)
    from pydblog.changelog.sqlite_spark import SqliteStream, log_complete_ms

    return log_complete_ms(SqliteStream.from_json(log_json).path)


def cut_end(log_json: str, start: dict[str, Any], end: dict[str, Any],
            low: int) -> dict[str, Any]:
    """``consistent = true``: the stream offset ``end`` (planned from ``start``) cut
    back to the end of the longest prefix of the batch whose commit times are at or
    below ``low``, whole transactions (``core.drainer.consistent_cut``); ``start``
    when that prefix is empty."""
    if _log_type(log_json) == "kafka":
        from pydblog.changelog.kafka_spark import consistent_end as kafka_cut

        return kafka_cut(log_json, start, end, low)
    from pydblog.changelog.sqlite_spark import SqliteStream
    from pydblog.changelog.sqlite_spark import consistent_end as cut

    path = SqliteStream.from_json(log_json).path
    return {"offset": cut(path, int(start["offset"]), int(end["offset"]), low)}
