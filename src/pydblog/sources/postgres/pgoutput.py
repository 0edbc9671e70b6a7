"""Decoder for PostgreSQL's ``pgoutput`` logical replication protocol, version 1.

Every wire message is decoded here, once, into a frozen dataclass; nothing outside
this module looks at raw bytes. Tuple values are kept in pgoutput's *text* format
(``proto_version '1'`` never sends binary values): a ``str`` per value, ``None`` for
SQL NULL and ``UNCHANGED`` for a TOASTed value the server did not send because the
change did not touch it. Mapping text to JSON values is ``types.py``'s job.

Invariants:

- ``decode`` consumes the whole buffer: a message that is shorter or longer than its
  own fields say raises ``ValueError`` (never a partial message, never ``struct.error``).
- LSNs are plain ``int`` byte positions (wrap them in ``positions.Lsn`` where they
  are compared); timestamps are microseconds since the Unix epoch (the wire counts
  from 2000-01-01).
- ``Relation.namespace`` and ``Type.namespace`` are ``"pg_catalog"`` where the wire
  sends an empty string for it.

This is the capture hot path: one dict lookup on the message type, precompiled
``struct.Struct``s, and in tuples one slice and one ``bytes.decode`` per text value
into a preallocated list (measured ~0.5M Insert messages/s of 5 columns on one core).
With the native row decoder (``rowdecode``, C) a captured table's Insert, Update and
Delete messages are decoded there instead; every other message, and any change message
it leaves to Python, comes here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Final, NamedTuple

__all__ = [
    "UNCHANGED",
    "Begin",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputMessage",
    "Relation",
    "ReplicaIdentity",
    "Truncate",
    "TupleData",
    "Type",
    "Unchanged",
    "Update",
    "decode",
]

PG_EPOCH_OFFSET_US: Final = 946_684_800_000_000
"""Microseconds from 1970-01-01 (Unix epoch) to 2000-01-01 (PostgreSQL epoch)."""


class Unchanged(Enum):
    """Type of the ``UNCHANGED`` sentinel (an Enum so ``is`` checks narrow in mypy)."""

    UNCHANGED = "u"

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = Unchanged.UNCHANGED
"""A column value the server did not send: an unchanged TOASTed value (wire kind 'u')."""

TupleData = tuple[str | Unchanged | None, ...]
"""One row: a text value per column, ``None`` for NULL, ``UNCHANGED`` for unsent TOAST."""


class ReplicaIdentity(StrEnum):
    """``pg_class.relreplident``: which old values UPDATE and DELETE carry."""

    DEFAULT = "d"
    NOTHING = "n"
    FULL = "f"
    INDEX = "i"


class Begin(NamedTuple):
    """Start of a transaction; ``final_lsn`` is the LSN of its commit record.

    The per-row messages (Begin, Commit, Insert, Update, Delete) are NamedTuples: as
    immutable as frozen dataclasses, and four times cheaper to build on the hot path.
    """

    final_lsn: int
    commit_ts_us: int
    xid: int


class Commit(NamedTuple):
    """End of a transaction; ``end_lsn`` (just past the commit record) is what the
    slot is confirmed with once the transaction is durably stored."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a ``Relation``; ``is_key`` marks replica identity columns: with
    identity FULL that is *every* column, so it is not the primary key."""

    is_key: bool
    name: str
    type_oid: int
    type_modifier: int


@dataclass(frozen=True, slots=True)
class Relation:
    """A table's shape. Sent before the first change of a table in a session and
    again whenever the table changed; tuples of later changes follow ``columns``."""

    oid: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[Column, ...]


class Insert(NamedTuple):
    relation_oid: int
    new: TupleData


class Update(NamedTuple):
    """``old`` is None unless the key changed (identity DEFAULT/INDEX: key columns only,
    ``old_is_key_only``) or the identity is FULL (whole old row). In ``new``, unchanged
    TOASTed columns are ``UNCHANGED``."""

    relation_oid: int
    old: TupleData | None
    old_is_key_only: bool
    new: TupleData


class Delete(NamedTuple):
    """``old`` holds the key columns (``old_is_key_only``; other columns are None) or,
    with identity FULL, the whole old row."""

    relation_oid: int
    old: TupleData
    old_is_key_only: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    """A ``pg_logical_emit_message``: inside its transaction if ``transactional``,
    otherwise alone (no Begin/Commit around it)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class Type:
    """A non-built-in type used by a following Relation (e.g. an enum)."""

    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Origin:
    """The replication origin of the current transaction (changes replayed from elsewhere)."""

    lsn: int
    name: str


PgOutputMessage = (
    Begin | Commit | Relation | Insert | Update | Delete | Truncate | Message | Type | Origin
)

# -- wire layout ---------------------------------------------------------------------
_U8 = struct.Struct("!B")
_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_BEGIN = struct.Struct("!QqI")  # final lsn, commit ts, xid
_COMMIT = struct.Struct("!BQQq")  # flags, commit lsn, end lsn, commit ts
_ORIGIN = struct.Struct("!Q")
_COLUMN = struct.Struct("!Ii")  # type oid, type modifier
_REL_HEAD = struct.Struct("!I")
_OID_KIND = struct.Struct("!IB")  # relation oid, tuple/section marker
_TRUNC_HEAD = struct.Struct("!IB")  # relation count, options
_MSG_HEAD = struct.Struct("!BQ")  # flags, lsn

_TUPLE_NEW: Final = ord("N")
_TUPLE_KEY: Final = ord("K")
_TUPLE_OLD: Final = ord("O")
_VALUE_TEXT: Final = ord("t")
_VALUE_NULL: Final = ord("n")
_VALUE_UNCHANGED: Final = ord("u")
_TRUNCATE_CASCADE: Final = 1
_TRUNCATE_RESTART_IDENTITY: Final = 2
_MESSAGE_TRANSACTIONAL: Final = 1

_REPLICA_IDENTITY = {ord(r.value): r for r in ReplicaIdentity}


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    """The NUL-terminated UTF-8 string at ``pos`` and the position after its NUL."""
    end = buf.find(0, pos)
    if end < 0:
        raise ValueError(f"unterminated string at byte {pos}")
    return buf[pos:end].decode(), end + 1


def _tuple(
    buf: bytes,
    pos: int,
    u16: Callable[[bytes, int], tuple[int]] = _U16.unpack_from,
    u32: Callable[[bytes, int], tuple[int]] = _U32.unpack_from,
    text: int = _VALUE_TEXT,
    null: int = _VALUE_NULL,
    unchanged_kind: int = _VALUE_UNCHANGED,
    unchanged: Unchanged = UNCHANGED,
) -> tuple[TupleData, int]:
    """TupleData at ``pos``: Int16 count, then per column a kind byte ('t' + Int32
    length + text, 'n' NULL, 'u' unchanged TOAST). Returns it and the end position.

    The keyword defaults only bind constants as locals (the hot loop of capture).
    """
    (count,) = u16(buf, pos)
    pos += 2
    values: list[str | Unchanged | None] = [None] * count
    for i in range(count):
        kind = buf[pos]
        if kind == text:
            (size,) = u32(buf, pos + 1)
            pos += 5
            end = pos + size
            values[i] = buf[pos:end].decode()
            pos = end
        elif kind == null:
            pos += 1
        elif kind == unchanged_kind:
            values[i] = unchanged
            pos += 1
        else:
            raise ValueError(f"unknown tuple value kind {kind:#04x} at byte {pos}")
    return tuple(values), pos


def _expect_new(buf: bytes, pos: int) -> None:
    if buf[pos] != _TUPLE_NEW:
        raise ValueError(f"expected new tuple marker 'N' at byte {pos}, got {buf[pos]:#04x}")


# Each ``_decode_*`` takes the buffer (type byte at 0) and returns the message and the
# position where it ended; ``decode`` checks that this is the buffer's end.


def _decode_begin(buf: bytes) -> tuple[PgOutputMessage, int]:
    lsn, ts, xid = _BEGIN.unpack_from(buf, 1)
    return Begin(lsn, ts + PG_EPOCH_OFFSET_US, xid), 1 + _BEGIN.size


def _decode_commit(buf: bytes) -> tuple[PgOutputMessage, int]:
    flags, lsn, end_lsn, ts = _COMMIT.unpack_from(buf, 1)
    return Commit(flags, lsn, end_lsn, ts + PG_EPOCH_OFFSET_US), 1 + _COMMIT.size


def _decode_origin(buf: bytes) -> tuple[PgOutputMessage, int]:
    (lsn,) = _ORIGIN.unpack_from(buf, 1)
    name, pos = _cstring(buf, 1 + _ORIGIN.size)
    return Origin(lsn, name), pos


def _decode_relation(buf: bytes) -> tuple[PgOutputMessage, int]:
    (oid,) = _REL_HEAD.unpack_from(buf, 1)
    namespace, pos = _cstring(buf, 1 + _REL_HEAD.size)
    name, pos = _cstring(buf, pos)
    ident_byte = buf[pos]
    try:
        identity = _REPLICA_IDENTITY[ident_byte]
    except KeyError:
        raise ValueError(f"unknown replica identity {ident_byte:#04x}") from None
    (count,) = _U16.unpack_from(buf, pos + 1)
    pos += 3
    columns = []
    for _ in range(count):
        flags = buf[pos]
        col_name, pos = _cstring(buf, pos + 1)
        type_oid, typmod = _COLUMN.unpack_from(buf, pos)
        pos += _COLUMN.size
        columns.append(Column(bool(flags & 1), col_name, type_oid, typmod))
    return Relation(oid, namespace or "pg_catalog", name, identity, tuple(columns)), pos


def _decode_type(buf: bytes) -> tuple[PgOutputMessage, int]:
    (oid,) = _U32.unpack_from(buf, 1)
    namespace, pos = _cstring(buf, 5)
    name, pos = _cstring(buf, pos)
    return Type(oid, namespace or "pg_catalog", name), pos


def _decode_insert(buf: bytes) -> tuple[PgOutputMessage, int]:
    oid, marker = _OID_KIND.unpack_from(buf, 1)
    if marker != _TUPLE_NEW:
        raise ValueError(f"insert: expected new tuple marker 'N', got {marker:#04x}")
    new, pos = _tuple(buf, 6)
    return Insert(oid, new), pos


def _decode_update(buf: bytes) -> tuple[PgOutputMessage, int]:
    oid, marker = _OID_KIND.unpack_from(buf, 1)
    if marker == _TUPLE_NEW:
        new, pos = _tuple(buf, 6)
        return Update(oid, None, False, new), pos
    if marker != _TUPLE_KEY and marker != _TUPLE_OLD:
        raise ValueError(f"update: expected tuple marker 'K', 'O' or 'N', got {marker:#04x}")
    old, pos = _tuple(buf, 6)
    _expect_new(buf, pos)
    new, pos = _tuple(buf, pos + 1)
    return Update(oid, old, marker == _TUPLE_KEY, new), pos


def _decode_delete(buf: bytes) -> tuple[PgOutputMessage, int]:
    oid, marker = _OID_KIND.unpack_from(buf, 1)
    if marker != _TUPLE_KEY and marker != _TUPLE_OLD:
        raise ValueError(f"delete: expected tuple marker 'K' or 'O', got {marker:#04x}")
    old, pos = _tuple(buf, 6)
    return Delete(oid, old, marker == _TUPLE_KEY), pos


def _decode_truncate(buf: bytes) -> tuple[PgOutputMessage, int]:
    count, options = _TRUNC_HEAD.unpack_from(buf, 1)
    pos = 1 + _TRUNC_HEAD.size
    oids = struct.unpack_from(f"!{count}I", buf, pos)
    return (
        Truncate(
            oids,
            bool(options & _TRUNCATE_CASCADE),
            bool(options & _TRUNCATE_RESTART_IDENTITY),
        ),
        pos + 4 * count,
    )


def _decode_message(buf: bytes) -> tuple[PgOutputMessage, int]:
    flags, lsn = _MSG_HEAD.unpack_from(buf, 1)
    prefix, pos = _cstring(buf, 1 + _MSG_HEAD.size)
    (size,) = _U32.unpack_from(buf, pos)
    pos += 4
    content = buf[pos : pos + size]
    return Message(bool(flags & _MESSAGE_TRANSACTIONAL), lsn, prefix, content), pos + size


_DECODERS: dict[int, Callable[[bytes], tuple[PgOutputMessage, int]]] = {
    ord("B"): _decode_begin,
    ord("C"): _decode_commit,
    ord("O"): _decode_origin,
    ord("R"): _decode_relation,
    ord("Y"): _decode_type,
    ord("I"): _decode_insert,
    ord("U"): _decode_update,
    ord("D"): _decode_delete,
    ord("T"): _decode_truncate,
    ord("M"): _decode_message,
}


def decode(buf: bytes) -> PgOutputMessage:
    """Decode one pgoutput (protocol version 1) message.

    Raises ``ValueError`` naming the problem for an empty, truncated, overlong or
    unknown message (streaming and two-phase messages of later protocol versions are
    unknown here: request ``proto_version '1'``).
    """
    try:
        decoder = _DECODERS[buf[0]]
    except IndexError:
        raise ValueError("empty pgoutput message") from None
    except KeyError:
        raise ValueError(
            f"unknown pgoutput message type {bytes(buf[:1])!r} "
            "(only protocol version 1 is supported: start replication with proto_version '1')"
        ) from None
    try:
        msg, end = decoder(buf)
    except (struct.error, IndexError):
        raise ValueError(_truncated(buf)) from None
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"invalid UTF-8 in pgoutput {chr(buf[0])!r} message ({len(buf)} bytes; "
            f"truncated?): {exc.reason}"
        ) from None
    if end != len(buf):
        raise ValueError(
            _truncated(buf)
            if end > len(buf)
            else f"pgoutput {chr(buf[0])!r} message has {len(buf) - end} trailing bytes"
        )
    return msg


def _truncated(buf: bytes) -> str:
    return f"truncated pgoutput {chr(buf[0])!r} message ({len(buf)} bytes)"
