"""The native row decoder (``_pgrow``, C): a pgoutput Insert, Update or Delete of a
captured relation decoded straight into row dicts, each value mapped by its column's
converter.

Why: decoding a change message into text values (``pgoutput.decode``) and mapping them
(``RelationState.row``) in Python cost ~4 µs of the capture thread per event on this
machine kind, about a third of ``dblog run``'s CPU per stream event; in C it is a few
hundred ns.

Invariants:
- The dicts are exactly ``RelationState.row`` of the Python decoder's tuples (same
  values, same order; NULL is None, an unchanged TOAST value ``pgoutput.UNCHANGED``):
  the common converters (``CODES``) are written in C as the same functions of the text,
  every other converter is called; tests/property/test_native_rows.py checks both
  paths on generated values and messages.
- Anything the C decoder does not decode exactly as the Python path would (another
  message, a malformed one, invalid UTF-8, a converter that raises) returns None: the
  caller decodes that message in Python, which raises the error naming the problem.
- If the extension is missing (no compiler at install) or stale, or
  ``PYDBLOG_NATIVE_STREAM=0``, everything is decoded in Python; one log line says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import orjson

from pydblog.sources.postgres import types as t
from pydblog.sources.postgres.pgoutput import UNCHANGED
from pydblog.sources.postgres.relations import RelationState

log = logging.getLogger(__name__)

# Codes of _pgrow.c: the converters written in C (CALL: call the converter).
STR, INT, BPCHAR, BOOL, TSTZ, TS, TIME, FLOAT, CALL = range(9)

CODES: dict[Any, int] = {
    str: STR,
    int: INT,
    t._bpchar: BPCHAR,
    t._BOOL.__getitem__: BOOL,
    t._timestamptz: TSTZ,
    t._timestamp: TS,
    t._time: TIME,
    t._float: FLOAT,
}
"""Converter -> the C code that maps a text exactly as it does."""

ABI_VERSION = 4
"""The ``_pgrow`` interface this module speaks (its ``VERSION``)."""

DISABLE_ENV = "PYDBLOG_NATIVE_STREAM"
"""``PYDBLOG_NATIVE_STREAM=0`` turns the native decoder off (benchmarks, tests)."""

Spec = tuple[RelationState, tuple[str, ...], bytes, tuple[Callable[[str], Any], ...], tuple[int, ...]]
Decoded = tuple[int, RelationState, dict[str, Any] | None, dict[str, Any] | None, bool, int,
                dict[str, Any] | None]
"""``(kind, rel, new, old, old_is_key_only, unchanged values in new, insert key)``;
``kind`` is the message byte (``ord('I')``, ``ord('U')``, ``ord('D')``); ``insert key`` an
Insert's event key (``rel.key_names`` of ``new``), None for the others."""


def spec(rel: RelationState) -> Spec:
    """What the C decoder needs of a relation (``decode``'s ``specs`` values)."""
    codes = bytes(CODES.get(c, CALL) for c in rel.converters)
    return rel, rel.names, codes, rel.converters, rel.key_idx


FastSpec = tuple[RelationState, tuple[bytes, ...], bytes, tuple[Callable[[str], Any], ...],
                 tuple[int, ...]]


def fast_spec(rel: RelationState) -> FastSpec:
    """What ``Tails.add`` needs of a relation: its spec with each column name as the
    JSON text ``orjson.dumps`` writes before the value in a dict (``"name":``)."""
    codes = bytes(CODES.get(c, CALL) for c in rel.converters)
    names = tuple(orjson.dumps(n) + b":" for n in rel.names)
    return rel, names, codes, rel.converters, rel.key_idx


RUNS_ENV = "PYDBLOG_NATIVE_RUNS"
"""``PYDBLOG_NATIVE_RUNS=0`` turns only the runs off (each Insert or Update is then a
``ChangeEvent`` from the native row decoder: benchmarks compare the two)."""


def tails(max_rows: int) -> Any:
    """A ``_pgrow.Tails`` accumulator (Inserts, and Updates without an old row, encoded
    straight into change-log tails, at most ``max_rows`` held), or None where the native decoder is not in use (or
    ``PYDBLOG_NATIVE_RUNS=0``)."""
    if decoder() is None or os.environ.get(RUNS_ENV, "1") == "0":
        return None
    return _module.Tails(orjson.dumps, max_rows)


_module: Any = None
_state = "unloaded"


def decoder() -> Callable[[bytes, dict[int, Spec], Any], Decoded | None] | None:
    """``decode(payload, specs, UNCHANGED)`` of the extension, or None (Python path)."""
    global _module, _state
    if _state == "unloaded":
        _state = "unavailable"
        if os.environ.get(DISABLE_ENV, "1") == "0":
            log.info("native stream decoder off (%s=0): decoding in Python", DISABLE_ENV)
        else:
            try:
                from pydblog.sources.postgres import _pgrow  # type: ignore[attr-defined]
            except ImportError as exc:
                log.warning("native stream decoder not available (%s): decoding in Python "
                            "(reinstall pydblog with a C compiler and Python's headers)", exc)
            else:
                if getattr(_pgrow, "VERSION", None) != ABI_VERSION:
                    log.warning("native stream decoder is a stale build (version %s, want %s): "
                                "decoding in Python (reinstall pydblog)",
                                getattr(_pgrow, "VERSION", None), ABI_VERSION)
                else:
                    _module = _pgrow
                    _state = "ready"
                    log.info("native stream decoder in use")
    if _module is None:
        return None
    fn: Callable[[bytes, dict[int, Spec], Any], Decoded | None] = _module.decode
    return fn


def reset() -> None:
    """Forget the loaded state (tests switch the decoder off and on)."""
    global _module, _state
    _module = None
    _state = "unloaded"


__all__ = ["CODES", "UNCHANGED", "decoder", "fast_spec", "reset", "spec", "tails"]
