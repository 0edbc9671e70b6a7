"""The layout of a Kafka change log's topics and messages: topic names, header names,
the notification topic's value, and the envelope a data message carries (``event_value``,
``parse_value``). No client and no IO."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson

INTERNAL = "__dblog"
HEADER_SOURCE = "dblog.source"
HEADER_WRITER = "dblog.writer"
HEADER_FANOUT = "dblog.fanout"
"""Marked the copies of a truncate or table notification that logs written before
notifications had their own topic held in every partition but 0 (readers skip them)."""
HEADER_EVENT = "dblog.event"
"""The event's envelope (``{"offset": ...}``), which readers take instead of the value:
on a notification-topic message (the value is Debezium's notification shape), and on
every table record of a log with a Kafka Connect ``[log] value_format`` (``event_value``)."""
_BAD_TOPIC_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def data_topic(prefix: str, qualified: str) -> str:
    """``P.<schema>.<table>`` (Debezium's naming; invalid characters become ``_``)."""
    return _BAD_TOPIC_CHARS.sub("_", f"{prefix}.{qualified}")


def checkpoint_topic(prefix: str) -> str:
    return f"{prefix}.{INTERNAL}.checkpoint"


def schemas_topic(prefix: str) -> str:
    return f"{prefix}.{INTERNAL}.schemas"


def notifications_topic(prefix: str) -> str:
    """Every snapshot notification, as Debezium's Kafka notification channel sends them
    (``notification_value``)."""
    return f"{prefix}.{INTERNAL}.notifications"


def truncates_topic(prefix: str) -> str:
    """Truncates under ``[log] truncates = "skip"``: out of the tables' topics, for
    pydblog's own readers (the envelope, as a table topic would hold it)."""
    return f"{prefix}.{INTERNAL}.truncates"


def notification_value(text: str) -> tuple[bytes, bytes]:
    """``(key, value)`` of a notification in the notification topic, from its envelope
    (``events.ChangeEvent.envelope``'s JSON), in the shape of Debezium's Kafka
    notification channel (``notification.sink.topic.name``): key ``{"id": ...}``, value
    ``{"id", "aggregate_type", "type", "additional_data", "timestamp"}``. ``id`` is the
    signal's id (as Debezium's incremental snapshot notifications carry the
    execute-snapshot signal's); ``additional_data`` is a map of strings as Debezium's
    (a list of strings joined with ``", "``, other values as JSON text, nulls left
    out); ``timestamp`` is the envelope's ``ts_ms``. pydblog's readers read the
    envelope itself, from the ``dblog.event`` header."""
    env = orjson.loads(text)
    note = env.get("notification") or {}
    ident = str(note.get("signal_id") or "")
    data: dict[str, str] = {}
    for name, v in (note.get("additional_data") or {}).items():
        if v is None:
            continue
        if isinstance(v, str):
            data[name] = v
        elif isinstance(v, list) and all(isinstance(x, str) for x in v):
            data[name] = ", ".join(v)
        else:
            data[name] = orjson.dumps(v).decode()
    value = {"id": ident, "aggregate_type": note.get("aggregate_type"), "type": note.get("type"),
             "additional_data": data, "timestamp": env.get("ts_ms")}
    return orjson.dumps({"id": ident}), orjson.dumps(value)


def header(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> bytes | None:
    for k, v in headers or ():
        if k == name:
            return v
    return None


def event_value(m: Any) -> bytes | None:
    """A data message's event as pydblog's JSON envelope (``parse_value`` reads it): the
    ``dblog.event`` header of a record in a Kafka Connect format, else the value (the
    ``json`` format; a null value, a tombstone, stays null)."""
    value: bytes | None = m.value()
    if value is None:
        return None
    headers = m.headers()
    if headers and len(headers) > 1:
        event = header(headers, HEADER_EVENT)
        if event is not None:
            return event
    return value


def parse_value(value: bytes) -> tuple[int, bytes]:
    """A data message's global offset and the envelope without it (as stored by the
    embedded log: ``events.with_offset`` puts it back)."""
    comma = value.index(b",")
    return int(value[10:comma]), b"{" + value[comma + 1 :]
