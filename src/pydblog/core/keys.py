"""Chunk keys: taken from chunk rows and from stream events, compared by equality only.

Two forms of a key:

- the *raw* key, ``tuple`` of the key columns' JSON values in key-column order, as the
  chunk reader and the state store see them (``after_key``, ``max_key``);
- the *match* key (``match_key(raw)``), the same values made hashable (lists become
  tuples, objects become sorted tuples of pairs), used to find a stream event's row in
  a chunk buffer.

The core never orders keys itself (collations, NULL placement and type casts are the
database's business); it only tests equality, which is why rows and events must map
values the same way (the ``SnapshotReader`` contract).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from pydblog.events import ChangeEvent, EncodedRow, Op

RawKey = tuple[Any, ...]
MatchKey = tuple[Hashable, ...]


def hashable(value: Any) -> Hashable:
    """A hashable stand-in for a JSON value, equal iff the values are equal."""
    if isinstance(value, list | tuple):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), hashable(v)) for k, v in value.items()))
    result: Hashable = value
    return result


def match_key(raw: Sequence[Any]) -> MatchKey:
    return tuple(hashable(v) for v in raw)


def row_key(row: Mapping[str, Any] | EncodedRow, columns: Sequence[str]) -> RawKey | None:
    """The raw key of ``row``, or None if one of ``columns`` is missing from it (an
    ``EncodedRow`` carries its chunk key, in ``columns`` order, itself)."""
    if type(row) is EncodedRow:
        return row.chunk_key if len(row.chunk_key) == len(columns) else None
    assert not isinstance(row, EncodedRow)
    try:
        return tuple(row[c] for c in columns)
    except KeyError:
        return None


def event_keys(event: ChangeEvent, columns: Sequence[str]) -> list[MatchKey] | None:
    """The chunk keys a stream event touches, or None if they cannot be determined.

    c: the key of ``after``; u: of ``after`` and of ``before`` when present (a key
    change touches both); d: of ``before``. Each falls back to ``event.key`` (the
    primary key) when the image lacks a key column, e.g. a delete under REPLICA
    IDENTITY DEFAULT while chunking by a surrogate key; if that fails too the answer
    is None and the caller must treat the window as inconclusive.
    """
    if event.op is Op.CREATE:
        images = [event.after]
    elif event.op is Op.UPDATE:
        images = [event.after, event.before] if event.before is not None else [event.after]
    elif event.op is Op.DELETE:
        images = [event.before]
    else:
        return []
    keys: list[MatchKey] = []
    for image in images:
        raw = _image_key(image, event.key, columns)
        if raw is None:
            return None
        keys.append(match_key(raw))
    return keys


def _image_key(
    image: Mapping[str, Any] | None, key: Mapping[str, Any] | None, columns: Sequence[str]
) -> RawKey | None:
    if image is not None:
        raw = row_key(image, columns)
        if raw is not None:
            return raw
    if key is not None:
        return row_key(key, columns)
    return None
