"""Debezium-compatible snapshot signals: parsed once, at the edge, into a frozen ``Signal``.

A signal is a row ``(id, type, data)`` of the signal table (or the same triple sent by
the CLI / HTTP API). ``data`` is a JSON object::

    execute-snapshot  {"data-collections": ["public\\\\.orders", "app\\\\..*"],   # required
                       "type": "incremental" | "blocking",              # default incremental
                       "additional-conditions": [{"data-collection": "public\\\\.orders",
                                                  "filter": "status = 'open'"}],
                       "surrogate-key": "created_id",
                       "repair": [{"data-collection": "public\\\\.orders",        # a repair
                                   "ranges": [{"lo": [100], "hi": [200]}]}]}
    stop-snapshot     {"data-collections": [...], "type": "incremental"}   # both optional
    pause-snapshot    {} or empty          resume-snapshot  {} or empty

Rules (each violation raises ``SignalError`` naming the field and what to do):

- ``type`` must be one of ``SignalType`` (exact, lower case, as Debezium spells them);
- ``data`` must be a JSON object (or empty / null where no field is required); unknown
  fields are rejected, so a typo (``data-collection`` for ``data-collections``) is not
  silently ignored;
- every ``data-collections`` entry and every ``additional-conditions[].data-collection``
  must be a non-empty string that compiles as a Python regular expression; they are
  matched with ``fullmatch`` against ``schema.table`` names (see ``match_tables``);
- ``filter`` must be a non-empty string (it is checked against the database by the
  chunk reader, inside a read-only transaction, not here);
- ``surrogate-key`` is a non-empty string or null;
- ``repair`` makes the snapshot of the tables it names a repair (``core.repair``): each
  entry's ``ranges`` are key ranges ``(lo, hi]`` (arrays of key values, null: open), or
  null for the whole table; the table's TABLE_SCAN_COMPLETED notification then carries
  the ranges and the keys the sinks keep, and the sinks delete the others of the ranges.
  The rows read are those of ``additional-conditions`` (the requester restricts them to
  the ranges).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from pydblog.errors import SignalError
from pydblog.events import SnapshotKind


class SignalType(StrEnum):
    EXECUTE_SNAPSHOT = "execute-snapshot"
    STOP_SNAPSHOT = "stop-snapshot"
    PAUSE_SNAPSHOT = "pause-snapshot"
    RESUME_SNAPSHOT = "resume-snapshot"


KeyBound = tuple[Any, ...] | None
KeyRange = tuple[KeyBound, KeyBound]


class RepairSpec(NamedTuple):
    """The repaired key ranges of the tables whose ``schema.table`` fullmatches
    ``data_collection`` (``((None, None),)``: the whole table)."""

    data_collection: str
    ranges: tuple[KeyRange, ...]


class AdditionalCondition(NamedTuple):
    """A filter for the tables whose ``schema.table`` fullmatches ``data_collection``."""

    data_collection: str
    filter: str


@dataclass(frozen=True, slots=True)
class Signal:
    """A validated signal. ``data_collections`` are regexes (already compiled once by
    ``parse_signal``, so ``re.fullmatch`` on them cannot raise)."""

    id: str
    type: SignalType
    data_collections: tuple[str, ...] = ()
    snapshot_type: SnapshotKind = SnapshotKind.INCREMENTAL
    additional_conditions: tuple[AdditionalCondition, ...] = ()
    surrogate_key: str | None = None
    repair: tuple[RepairSpec, ...] = ()

    def repair_for(self, table: str) -> tuple[KeyRange, ...] | None:
        """The repaired ranges of ``table`` (None: not a repair)."""
        found = [r for r in self.repair if re.fullmatch(r.data_collection, table)]
        if not found:
            return None
        return tuple(rng for r in found for rng in r.ranges)

    def condition_for(self, table: str) -> str | None:
        """The filter for ``table``: the conditions whose regex fullmatches it, each in
        parentheses, joined with ``AND`` (None when none matches)."""
        filters = [
            c.filter for c in self.additional_conditions if re.fullmatch(c.data_collection, table)
        ]
        if not filters:
            return None
        if len(filters) == 1:
            return filters[0]
        return " AND ".join(f"({f})" for f in filters)


_ALLOWED_FIELDS: dict[SignalType, frozenset[str]] = {
    SignalType.EXECUTE_SNAPSHOT: frozenset(
        {"data-collections", "type", "additional-conditions", "surrogate-key", "repair"}
    ),
    SignalType.STOP_SNAPSHOT: frozenset({"data-collections", "type"}),
    SignalType.PAUSE_SNAPSHOT: frozenset({"type"}),
    SignalType.RESUME_SNAPSHOT: frozenset({"type"}),
}


def parse_signal(id: str, type: str, data: str | None) -> Signal:
    """Validate one signal; raises ``SignalError`` with a message naming the problem."""
    sid = str(id)
    try:
        stype = SignalType(type)
    except ValueError:
        known = ", ".join(t.value for t in SignalType)
        raise SignalError(
            f"signal {sid!r}: unknown signal type {type!r}", hint=f"use one of: {known}"
        ) from None
    fields = _parse_data(sid, data)
    unknown = sorted(set(fields) - _ALLOWED_FIELDS[stype])
    if unknown:
        allowed = ", ".join(sorted(_ALLOWED_FIELDS[stype])) or "none"
        raise SignalError(
            f"signal {sid!r} ({stype}): unknown field(s) {', '.join(unknown)}",
            hint=f"fields allowed for {stype}: {allowed}",
        )
    required = stype is SignalType.EXECUTE_SNAPSHOT
    return Signal(
        id=sid,
        type=stype,
        data_collections=_collections(sid, fields, required=required),
        snapshot_type=_snapshot_kind(sid, fields.get("type")),
        additional_conditions=_conditions(sid, fields.get("additional-conditions")),
        surrogate_key=_surrogate_key(sid, fields.get("surrogate-key")),
        repair=_repairs(sid, fields.get("repair")),
    )


def parse_signal_row(row: Mapping[str, Any]) -> Signal:
    """``parse_signal`` over a signal-table row (``id``, ``type``, ``data`` columns)."""
    for column in ("id", "type"):
        if not isinstance(row.get(column), str):
            raise SignalError(
                f"signal row {dict(row)!r}: column {column!r} must be a text value",
                hint="the signal table is (id text primary key, type text, data text)",
            )
    data = row.get("data")
    if data is not None and not isinstance(data, str):
        raise SignalError(f"signal {row['id']!r}: column 'data' must be text (JSON) or null")
    return parse_signal(row["id"], row["type"], data)


def match_tables(patterns: Iterable[str], tables: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(matched tables, patterns matching nothing)``.

    Each pattern is fullmatched against every table; matched tables come in pattern
    order, then in ``tables`` order, each once (duplicates across patterns are dropped).
    """
    matched: dict[str, None] = {}
    unmatched: list[str] = []
    for pattern in patterns:
        hits = [t for t in tables if re.fullmatch(pattern, t)]
        if not hits:
            unmatched.append(pattern)
        for table in hits:
            matched.setdefault(table, None)
    return list(matched), unmatched


def _parse_data(sid: str, data: str | None) -> dict[str, Any]:
    if data is None or not data.strip():
        return {}
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise SignalError(
            f"signal {sid!r}: data is not valid JSON ({exc})",
            hint='data must be a JSON object, e.g. {"data-collections": ["public\\\\.orders"]}',
        ) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SignalError(f"signal {sid!r}: data must be a JSON object, not {_json_type(value)}")
    return value


def _collections(sid: str, fields: dict[str, Any], *, required: bool) -> tuple[str, ...]:
    value = fields.get("data-collections")
    if value is None:
        if required:
            raise SignalError(
                f"signal {sid!r}: 'data-collections' is required",
                hint='give an array of regexes on schema.table, e.g. ["public\\\\.orders"]',
            )
        return ()
    if not isinstance(value, list):
        raise SignalError(
            f"signal {sid!r}: 'data-collections' must be an array of strings, "
            f"not {_json_type(value)}"
        )
    if required and not value:
        raise SignalError(f"signal {sid!r}: 'data-collections' is empty; name at least one table")
    return tuple(_regex(sid, f"data-collections[{i}]", v) for i, v in enumerate(value))


def _snapshot_kind(sid: str, value: Any) -> SnapshotKind:
    if value is None:
        return SnapshotKind.INCREMENTAL
    if isinstance(value, str) and value.lower() in ("incremental", "blocking"):
        return SnapshotKind(value.lower())
    raise SignalError(
        f'signal {sid!r}: \'type\' must be "incremental" or "blocking", not {value!r}'
    )


def _conditions(sid: str, value: Any) -> tuple[AdditionalCondition, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SignalError(
            f"signal {sid!r}: 'additional-conditions' must be an array of objects, "
            f"not {_json_type(value)}"
        )
    return tuple(_condition(sid, i, item) for i, item in enumerate(value))


def _condition(sid: str, i: int, item: Any) -> AdditionalCondition:
    where = f"additional-conditions[{i}]"
    if not isinstance(item, dict):
        raise SignalError(f"signal {sid!r}: {where} must be an object, not {_json_type(item)}")
    extra = sorted(set(item) - {"data-collection", "filter"})
    if extra:
        raise SignalError(
            f"signal {sid!r}: {where} has unknown field(s) {', '.join(extra)}",
            hint='each condition is {"data-collection": REGEX, "filter": SQL}',
        )
    regex = _regex(sid, f"{where}.data-collection", item.get("data-collection"))
    sql = item.get("filter")
    if not isinstance(sql, str) or not sql.strip():
        raise SignalError(
            f"signal {sid!r}: {where}.filter must be a non-empty SQL boolean expression"
        )
    return AdditionalCondition(regex, sql.strip())


def _repairs(sid: str, value: Any) -> tuple[RepairSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SignalError(f"signal {sid!r}: 'repair' must be an array of objects, not {_json_type(value)}")
    out = []
    for i, item in enumerate(value):
        where = f"repair[{i}]"
        if not isinstance(item, dict):
            raise SignalError(f"signal {sid!r}: {where} must be an object, not {_json_type(item)}")
        extra = sorted(set(item) - {"data-collection", "ranges"})
        if extra:
            raise SignalError(
                f"signal {sid!r}: {where} has unknown field(s) {', '.join(extra)}",
                hint='each repair is {"data-collection": REGEX, "ranges": [{"lo": [...], "hi": [...]}] or null}',
            )
        regex = _regex(sid, f"{where}.data-collection", item.get("data-collection"))
        ranges = item.get("ranges")
        if ranges is None:
            out.append(RepairSpec(regex, ((None, None),)))
            continue
        if not isinstance(ranges, list) or not ranges:
            raise SignalError(f"signal {sid!r}: {where}.ranges must be a non-empty array or null")
        parsed: list[KeyRange] = []
        for j, rng in enumerate(ranges):
            if not isinstance(rng, dict) or set(rng) - {"lo", "hi"}:
                raise SignalError(
                    f"signal {sid!r}: {where}.ranges[{j}] must be an object {{\"lo\": [...], \"hi\": [...]}}"
                )
            bounds = []
            for end in ("lo", "hi"):
                b = rng.get(end)
                if b is not None and (not isinstance(b, list) or not b):
                    raise SignalError(
                        f"signal {sid!r}: {where}.ranges[{j}].{end} must be an array of key values or null"
                    )
                bounds.append(None if b is None else tuple(b))
            parsed.append((bounds[0], bounds[1]))
        out.append(RepairSpec(regex, tuple(parsed)))
    return tuple(out)


def _surrogate_key(sid: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SignalError(f"signal {sid!r}: 'surrogate-key' must be a column name (a string)")
    return value.strip()


def _regex(sid: str, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise SignalError(
            f"signal {sid!r}: {where} must be a non-empty string (a regex on schema.table), "
            f"not {value!r}"
        )
    try:
        re.compile(value)
    except re.error as exc:
        raise SignalError(
            f"signal {sid!r}: {where} {value!r} is not a valid regular expression ({exc})",
            hint='escape dots as \\\\. in JSON, e.g. "public\\\\.orders"',
        ) from None
    return value


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"
