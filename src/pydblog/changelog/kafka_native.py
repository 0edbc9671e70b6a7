"""Kafka values without a Python object per message (``_kafkaread``, C).

confluent-kafka makes a ``Message`` per consumed message (three Python objects and a
copy of the payload: ~2 us of the reading thread each, most of a ``dblog sync`` read of
a Kafka log). ``consume`` pops the same messages from the same confluent-kafka
``Consumer``'s queue in C and hands over one batch: the payloads joined into one
``bytes`` plus numpy arrays of lengths, offsets and partitions, and the messages that
carry an error.

Invariants:
- Only for consumers made by ``consumer_config``: no ``logger`` (a confluent-kafka log
  callback served from the consumer queue needs the state confluent-kafka's own
  ``consume`` sets up; without it librdkafka logs to stderr from its own threads) and a
  unique ``client.id``, which the C side checks against the handle before using it.
- The messages, their order and their errors are exactly those ``Consumer.consume``
  would have returned for the same call.
- If the extension is not built, stale, or cannot find confluent-kafka's librdkafka,
  ``available()`` is False (logged once) and readers use ``Consumer.consume``. Never an
  error. ``PYDBLOG_NATIVE_KAFKA=0`` turns it off (benchmarks compare both).
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

ABI_VERSION = 1
"""The ``_kafkaread`` interface this module speaks (its ``VERSION``)."""

DISABLE_ENV = "PYDBLOG_NATIVE_KAFKA"

_state = "unknown"
_module: Any = None


@dataclass(frozen=True, slots=True)
class RawBatch:
    """One ``consume`` call's messages: ``data`` holds the non-null payloads in order;
    ``lengths[i]`` is message i's payload length (-1: null, no bytes in ``data``);
    ``errors``: ``(index, code, topic, partition, offset, text)`` of each message with an
    error, ``index`` being the number of data messages before it."""

    data: bytes
    lengths: Any  # numpy arrays (numpy comes with the spark extra, as do the callers)
    offsets: Any
    partitions: Any
    errors: list[tuple[int, int, str, int, int, str]]

    def __len__(self) -> int:
        return len(self.offsets)


def _librdkafka_path() -> str | None:
    """The librdkafka confluent-kafka loaded (its wheel's copy, or the system's)."""
    import confluent_kafka

    _ = confluent_kafka.libversion()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = "/" + line.rstrip("\n").partition("/")[2]
                if os.path.basename(path).startswith("librdkafka") and ".so" in path:
                    return os.path.realpath(path)
    except OSError:
        return None
    return None


def available() -> bool:
    """True if ``consume`` can serve (decided once per process)."""
    global _module, _state
    if _state != "unknown":
        return _state == "ready"
    _state = "unavailable"
    if os.environ.get(DISABLE_ENV, "1") == "0":
        log.info("native Kafka reads off (%s=0)", DISABLE_ENV)
        return False
    try:
        from pydblog.changelog import _kafkaread  # type: ignore[attr-defined]
    except ImportError as exc:
        log.warning("native Kafka reads not built (%s): reads make a Python object per "
                    "message (reinstall pydblog with a C compiler to build it)", exc)
        return False
    import confluent_kafka

    if getattr(_kafkaread, "VERSION", None) != ABI_VERSION:
        log.warning("native Kafka reads are stale (reinstall pydblog to rebuild them)")
        return False
    raw: Any = confluent_kafka.version()  # a str in 2.16 (the stubs say a tuple)
    version = str(raw[0] if isinstance(raw, tuple) else raw)
    if not version.startswith("2."):
        log.warning("native Kafka reads: confluent-kafka %s is not a 2.x release: not used",
                    version)
        return False
    path = _librdkafka_path()
    if path is None:
        log.warning("native Kafka reads: confluent-kafka's librdkafka not found in this process")
        return False
    try:
        _kafkaread.init(path)
    except OSError as exc:
        log.warning("native Kafka reads: %s", exc)
        return False
    _module = _kafkaread
    _state = "ready"
    return True


def consumer_config(conf: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``conf`` for a consumer ``consume`` may read from (no logger, a unique
    ``client.id`` unless the user set one), and its ``client.id``."""
    out = {k: v for k, v in conf.items() if k != "logger"}
    out.setdefault("client.id", f"dblog-read-{uuid.uuid4().hex[:12]}")
    return out, str(out["client.id"])


def consume(consumer: Any, client_id: str, max_messages: int, timeout_s: float) -> RawBatch:
    """``consumer.consume(max_messages, timeout_s)`` as one ``RawBatch``.

    ``consumer`` must be exactly a ``confluent_kafka.Consumer`` (the C side reads its
    handle's layout): anything else is a ``TypeError`` here, never a read of the wrong
    memory."""
    import numpy as np
    from confluent_kafka import Consumer

    if type(consumer) is not Consumer:
        raise TypeError(f"kafka_native.consume needs a confluent_kafka.Consumer, "
                        f"not {type(consumer).__name__}")

    data, lengths, offsets, partitions, errors = _module.consume(
        consumer, client_id, max_messages, max(0, int(timeout_s * 1000)))
    return RawBatch(data, np.frombuffer(lengths, np.int64), np.frombuffer(offsets, np.int64),
                    np.frombuffer(partitions, np.int32), errors)
