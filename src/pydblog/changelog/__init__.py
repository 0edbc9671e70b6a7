"""Change log backends, chosen by ``[log] type``: the embedded SQLite log (default,
``changelog.sqlite``) or Kafka topics (``changelog.kafka``). Everything else (the
capture runner, ``dblog tail``/``status``) reaches a log only through these functions
and the ``ports`` protocols ``ChangeLogWriter``/``ChangeLogReader``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the package is imported by Spark's executors: keep it light
    from pydblog.config import LogConfig
    from pydblog.ports import ChangeLogReader, ChangeLogWriter, Checkpoint


def open_writer(cfg: LogConfig) -> ChangeLogWriter:
    """The capture's writer (high availability then calls its ``claim(epoch)``)."""
    if cfg.type == "kafka":
        from pydblog.changelog.kafka import KafkaChangeLog

        Path(cfg.path).mkdir(parents=True, exist_ok=True)  # the local state and status files
        return KafkaChangeLog(cfg)
    from pydblog.changelog.sqlite import SqliteChangeLog

    return SqliteChangeLog(cfg.path)


def open_reader(cfg: LogConfig) -> ChangeLogReader:
    """A reader (raises ``ChangeLogError`` naming the fix when there is no log yet)."""
    if cfg.type == "kafka":
        from pydblog.changelog.kafka import KafkaChangeLogReader

        return KafkaChangeLogReader(cfg)
    from pydblog.changelog.sqlite import SqliteChangeLogReader

    return SqliteChangeLogReader(cfg.path)


def log_exists(cfg: LogConfig) -> bool:
    """Whether a log has been created (for Kafka: its checkpoint topic exists)."""
    if cfg.type == "kafka":
        from pydblog.changelog.kafka import checkpoint_topic_exists

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
