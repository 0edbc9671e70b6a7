"""The native chunk encoder (``_copyenc``, C): a chunk read as COPY text, turned into
the fast path's key lines and row tails without one Python object per row.

Why: with the fast path PostgreSQL writes every row's JSON text and joins the chunk
(~2.7-3.6 µs of server CPU per row, against COPY's ~0.7); reading COPY text in
Python costs the client ~1 µs per row just to receive the rows one message at a time.
Here the server pays COPY's price and the client's C loop receives and encodes the
rows without the GIL.

Invariants:
- The texts are byte for byte the SQL fast path's (``TypeRegistry.json_text_expr``,
  ``PgSnapshotReader._key_json``); tests/integration/test_pg_native_chunks.py checks
  both paths on generated values. A type without a code here (``type_code``) keeps
  its table on the SQL path; a value of an unexpected form (a session not in UTC, say)
  sends that chunk to the SQL path.
- If the extension cannot be built or loaded (no compiler, another libpq), everything
  reads by the SQL path; one log line says so. Never an error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from pydblog.events import BLOCK_EVENTS, TailBlocks
from pydblog.sources.postgres import types as t

log = logging.getLogger(__name__)

# Codes of _copyenc.c (how one column's COPY text becomes its JSON text).
RAW, BOOL, QUOTE, ESCAPE, BPCHAR, FLOAT, TSTZ, TS, TIME, BYTEA, JSON, JSONB = range(12)

_BY_OID: dict[int, int] = {
    t.INT2: RAW, t.INT4: RAW, t.INT8: RAW, t.OID: RAW,
    t.BOOL: BOOL,
    t.NUMERIC: QUOTE, t.UUID: QUOTE, t.DATE: QUOTE, t.INTERVAL: QUOTE,
    t.TEXT: ESCAPE, t.VARCHAR: ESCAPE, t.NAME: ESCAPE, t.INET: ESCAPE, t.CIDR: ESCAPE,
    t.BPCHAR: BPCHAR,
    t.FLOAT4: FLOAT, t.FLOAT8: FLOAT,
    t.TIMESTAMPTZ: TSTZ, t.TIMESTAMP: TS, t.TIME: TIME,
    t.BYTEA: BYTEA,
    t.JSON: JSON, t.JSONB: JSONB,
}

ABI_VERSION = 3
"""The ``_copyenc`` interface this module speaks (its ``VERSION``; raised together with
``COPYENC_VERSION`` in _copyenc.c whenever codes, spec or results change): a stale
build is not used."""

BLOCK_ROWS = BLOCK_EVENTS
"""Rows per tail block the encoder cuts (``TailBlocks``): the change log's block size,
so a chunk's blocks go to the log as they are."""

DISABLE_ENV = "PYDBLOG_NATIVE_CHUNKS"
"""``PYDBLOG_NATIVE_CHUNKS=0`` turns the native encoder off (benchmarks compare both)."""


def type_code(registry: t.TypeRegistry, oid: int) -> int | None:
    """How ``_copyenc`` encodes a column of ``oid`` (domains as their base type, enums
    as text); None: not natively (the table keeps the SQL path)."""
    base = registry.base_oid(oid)
    code = _BY_OID.get(base)
    if code is not None:
        return code
    info = registry.info(base)
    if info is not None and info.typtype == "e":
        return ESCAPE  # an enum's label: to_json(c::text) as for text
    return None


_module: Any = None
_state = "unloaded"  # "unloaded", "ready", "unavailable"


def _libpq_path() -> str | None:
    """The file of the libpq psycopg's connections use (a process may hold several:
    psycopg's wheel and psycopg2's each bring their own): for psycopg's binary wheel the
    copy in its ``psycopg_binary.libs``; for its ctypes implementation the library it
    opened; for its C implementation the system's (none of the wheels')."""
    impl = psycopg.pq.__impl__
    if impl == "python":
        from psycopg.pq import _pq_ctypes

        name = getattr(getattr(_pq_ctypes, "pq", None), "_name", None)
        return name if isinstance(name, str) else None
    wheel_libs = ""
    if impl == "binary":
        import psycopg_binary

        # Both sides resolved: /proc/self/maps names files by their real paths, and a
        # venv reached through a symlink gives an unresolved __file__.
        site = os.path.dirname(os.path.dirname(os.path.realpath(psycopg_binary.__file__ or "")))
        wheel_libs = os.path.join(site, "psycopg_binary.libs") + os.sep
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = "/" + line.rstrip("\n").partition("/")[2]
                name = os.path.basename(path)
                if not (name.startswith("libpq") and ".so" in name):
                    continue
                path = os.path.realpath(path)
                if wheel_libs and path.startswith(wheel_libs):
                    return path
                if not wheel_libs and ".libs/" not in path:
                    return path
    except OSError:
        return None
    return None


def encoder() -> Any:
    """The bound ``_copyenc`` module, or None (logged once) if it cannot serve."""
    global _module, _state
    if _state == "ready":
        return _module
    if _state == "unavailable":
        return None
    _state = "unavailable"
    if os.environ.get(DISABLE_ENV, "1") == "0":
        log.info("native chunk encoder off (%s=0): snapshot chunks use the SQL path", DISABLE_ENV)
        return None
    try:
        from pydblog.sources.postgres import _copyenc  # type: ignore[attr-defined]
    except ImportError as exc:
        log.warning("native chunk encoder not built (%s): snapshot chunks use the SQL path "
                    "(reinstall pydblog with a C compiler and Python's headers to build it)", exc)
        return None
    version = getattr(_copyenc, "VERSION", None)
    if version != ABI_VERSION:
        log.warning("native chunk encoder is stale (built for version %s, this pydblog needs "
                    "%s): snapshot chunks use the SQL path; reinstall pydblog to rebuild it "
                    "(pip install --force-reinstall pydblog, or pip install -e . in a checkout)",
                    version, ABI_VERSION)
        return None
    _ = psycopg.pq.version()  # libpq is loaded
    path = _libpq_path()
    if path is None:
        log.warning("native chunk encoder: psycopg's libpq not found in this process: "
                    "snapshot chunks use the SQL path")
        return None
    try:
        _copyenc.init(path)
    except OSError as exc:
        log.warning("native chunk encoder: %s: snapshot chunks use the SQL path", exc)
        return None
    _module = _copyenc
    _state = "ready"
    log.info("native chunk encoder ready (libpq %s): PostgreSQL snapshot chunks are read as COPY text", path)
    return _module


@dataclass(frozen=True, slots=True)
class NativeSpec:
    """One table's encoding: a type code per selected column, the chunk key's columns
    (with whether the text is the JSON: integers), and the tail's pieces (literal,
    column) and last literal."""

    types: bytes
    keys: tuple[tuple[int, int], ...]
    tail: tuple[tuple[tuple[bytes, int], ...], bytes]


def build_spec(
    codes: Sequence[int], key_idx: Sequence[int], key_raw: Sequence[bool],
    pieces: Sequence[str | int],
) -> NativeSpec:
    """``pieces``: the tail as literal texts and column indexes in order (adjacent
    literals are merged; a column must follow each literal but the last)."""
    out: list[tuple[bytes, int]] = []
    lit = ""
    for piece in pieces:
        if isinstance(piece, str):
            lit += piece
        else:
            out.append((lit.encode(), piece))
            lit = ""
    return NativeSpec(
        bytes(codes),
        tuple((i, int(raw)) for i, raw in zip(key_idx, key_raw, strict=True)),
        (tuple(out), lit.encode()),
    )


class Unencodable(Exception):
    """A value had a form the encoder does not know: read this chunk by the SQL path."""


def copy_chunk(
    conn: psycopg.Connection[Any], query: str, spec: NativeSpec,
) -> tuple[int, str, TailBlocks]:
    """Runs ``query`` (``COPY (...) TO STDOUT``) on ``conn`` (inside the caller's
    transaction) and returns ``(count, keys, tails)``, the tails cut into blocks of
    ``BLOCK_ROWS``; a server error raises the psycopg error of its SQLSTATE, an unknown
    value form ``Unencodable``."""
    block_rows = BLOCK_ROWS
    module = encoder()
    assert module is not None
    pgconn: Any = conn.pgconn  # (``pgconn_ptr``: the implementations have it, the protocol not)
    with conn.lock:
        result = module.copy_chunk(
            pgconn.pgconn_ptr, query.encode(), spec.types, spec.keys, spec.tail, block_rows
        )
        if result[0] is None and pgconn.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
            # libpq could not end the COPY (no memory for a row): the connection is
            # stuck in it; closed here, with its lock held (``closing``), and the
            # reader opens another.
            conn.close()
    if result[0] is not None:
        return int(result[0]), result[1], TailBlocks.cut(int(result[0]), result[2], block_rows)
    if len(result) == 4:
        raise Unencodable(result[3])
    _, sqlstate, message = result
    text = (message or "").strip()
    if sqlstate:
        try:
            cls: type[psycopg.Error] = psycopg.errors.lookup(sqlstate)
        except KeyError:  # a SQLSTATE psycopg does not know (a function's own code)
            cls = psycopg.DatabaseError
        raise cls(text)
    raise psycopg.OperationalError(text)
