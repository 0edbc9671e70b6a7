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

import importlib
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


def _bind(name: str, abi: int, what: str, without: str) -> Any:
    """The extension ``pydblog.changelog.<name>`` bound to confluent-kafka's librdkafka,
    or None (why logged once): turned off, not built, stale, another confluent-kafka
    major release, or its librdkafka not found. ``what``: "reads" or "writes";
    ``without``: what the caller does instead."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        log.info("native Kafka %s off (%s=0)", what, DISABLE_ENV)
        return None
    try:
        module = importlib.import_module(f"pydblog.changelog.{name}")
    except ImportError as exc:
        log.warning("native Kafka %s not built (%s): %s (reinstall pydblog with a C "
                    "compiler to build it)", what, exc, without)
        return None
    import confluent_kafka

    if getattr(module, "VERSION", None) != abi:
        log.warning("native Kafka %s are stale (reinstall pydblog to rebuild them)", what)
        return None
    raw: Any = confluent_kafka.version()  # a str in 2.16 (the stubs say a tuple)
    version = str(raw[0] if isinstance(raw, tuple) else raw)
    if not version.startswith("2."):
        log.warning("native Kafka %s: confluent-kafka %s is not a 2.x release: not used",
                    what, version)
        return None
    path = _librdkafka_path()
    if path is None:
        log.warning("native Kafka %s: confluent-kafka's librdkafka not found in this process",
                    what)
        return None
    try:
        module.init(path)
    except OSError as exc:
        log.warning("native Kafka %s: %s", what, exc)
        return None
    return module


def available() -> bool:
    """True if ``consume`` can serve (decided once per process)."""
    global _module, _state
    if _state == "unknown":
        _module = _bind("_kafkaread", ABI_VERSION, "reads",
                        "reads make a Python object per message")
        _state = "ready" if _module is not None else "unavailable"
    return _state == "ready"


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


# -- the writer (``_kafkawrite``) ------------------------------------------------------------

WRITE_ABI_VERSION = 5
"""The ``_kafkawrite`` interface this module speaks (its ``VERSION``)."""

_write_state = "unknown"
_writer: Any = None


def writer_available() -> bool:
    """True if the writer's C path can serve (decided once per process): records produced
    by ``produce_events``/``produce_template`` and their acknowledgements counted by the
    ``_kafkawrite`` interceptor plugin (``take_acks``) instead of a Python delivery
    callback per record. Never an error: if it is not built, stale, or confluent-kafka's
    librdkafka is not found, the writer does both in Python (logged once).
    ``PYDBLOG_NATIVE_KAFKA=0`` turns it off too."""
    global _writer, _write_state
    if _write_state == "unknown":
        _writer = _bind("_kafkawrite", WRITE_ABI_VERSION, "writes",
                        "the writer produces every record from Python")
        _write_state = "ready" if _writer is not None else "unavailable"
    return _write_state == "ready"


def producer_config(conf: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``conf`` for a producer the C path serves: no ``on_delivery`` (acknowledgements are
    counted by the interceptor plugin, which ``plugin.library.paths`` loads: the
    ``_kafkawrite`` module's own file, after any plugins the user named), a unique
    ``client.id`` unless the user set one; and that ``client.id``."""
    out = {k: v for k, v in conf.items() if k != "on_delivery"}
    out.setdefault("client.id", f"dblog-write-{uuid.uuid4().hex[:12]}")
    mine = str(_writer.__file__)
    theirs = str(out.get("plugin.library.paths") or "")
    out["plugin.library.paths"] = f"{theirs};{mine}" if theirs else mine
    return out, str(out["client.id"])


def _check_producer(producer: Any) -> None:
    from confluent_kafka import Producer

    if type(producer) is not Producer and type(producer) is not _writer.Accumulator:
        raise TypeError(f"kafka_native needs a confluent_kafka.Producer, "
                        f"not {type(producer).__name__}")


def take_acks(producer: Any, client_id: str) -> tuple[list[tuple[str, int, int, int, int]], int]:
    """The records acknowledged since the last call, per partition ``(topic, partition,
    lowest offset, highest offset, records)`` (``(-1, -1, 0)``: one was acknowledged
    without its offset), and the first failed record's error code (0: none)."""
    _check_producer(producer)
    entries, err = _writer.take_acks(producer, client_id)
    return entries, int(err)


def produce_events(producer: Any, client_id: str, events: list[Any], start: int, seq: int,
                   topics: dict[str, str], tag: bytes, tombstones: bool,
                   event_type: type, source_header: bool) -> tuple[int, int, int, int, str]:
    """``_kafkawrite.produce_events``: see the C source for the statuses."""
    _check_producer(producer)
    out: tuple[int, int, int, int, str] = _writer.produce_events(
        producer, client_id, events, start, seq, topics, tag, tombstones, event_type,
        source_header)
    return out


def produce_template(producer: Any, client_id: str, topic: str, head: str, mid: str, body: str,
                     first_index: int, seq: int, tag: bytes, start: int,
                     tombstones: bool, half: bool, source_header: bool,
                     ) -> tuple[int, int, int, int, str]:
    """``_kafkawrite.produce_template``: see the C source for the key, ``half`` and the
    statuses."""
    _check_producer(producer)
    out: tuple[int, int, int, int, str] = _writer.produce_template(
        producer, client_id, topic, head, mid, body, first_index, seq, tag, start,
        tombstones, half, source_header)
    return out
