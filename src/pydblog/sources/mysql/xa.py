"""Two-phase XA transactions in the binlog: held from their ``XA PREPARE`` to their
``XA COMMIT``, dropped at their ``XA ROLLBACK`` (docs/exactness.md, "XA transactions").

What the servers write (read from MariaDB 10.11 and MySQL 5.7.29 binlogs):

- the PREPARE group: MySQL ``GTID; Query "XA START X'7831',X'',1"; rows; Query "XA END
  ..."; XA_PREPARE_LOG_EVENT``; MariaDB 10.5+ the same without the ``XA START`` query
  (its GTID event carries the xid and the flag ``FL_PREPARED_XA``). The rows are in the
  binlog here, but invisible to every reader until the commit;
- the COMMIT (or ROLLBACK) group, later and separate: ``GTID; Query "XA COMMIT
  X'7831',X'',1"`` (MariaDB's GTID flagged ``FL_COMPLETED_XA``); on MySQL a GTID of its
  own. The rows become visible here, in binlog order like any commit;
- ``XA COMMIT ... ONE PHASE``: MySQL, one group ending in an XA_PREPARE_LOG_EVENT with
  ``one_phase`` set; MariaDB 10.11, an ordinary transaction (``GTID; rows; XID``).

Both servers print an xid the same way in every query: ``X'<gtrid hex>',X'<bqual
hex>',<formatID>``, and the XA_PREPARE event carries the same three parts, so an xid is
keyed here by ``(formatID, gtrid, bqual)`` (``Xid``), written ``fmt:gtrid-hex:bqual-hex``
in the checkpoint.

Invariants of ``PreparedXa`` (the source owns one):
- it holds every transaction prepared (and not yet committed or rolled back) since
  capture began whose group has captured rows, with those rows in binlog order, as
  JSON-ready values (the row mapper's output, so they round-trip through the checkpoint);
- ``to_json`` is what the checkpoint carries (``SourceState`` at the PREPARE, COMMIT or
  ROLLBACK group that changed it): a checkpoint at or after a PREPARE holds its rows, one
  before it does not (the PREPARE group is then read again);
- ``before_start``: xids ``XA RECOVER`` listed at a fresh start (prepared before the
  start position: their rows are not here); their commit is reported once, loudly.
- bounded (``MAX_HELD_BYTES``): every checkpoint carries the held rows in full, so their
  encoded size is checked at each PREPARE (``encoded_size``) and capture stops with a
  SourceError above the limit, instead of writing ever larger checkpoints (a Kafka
  change log's checkpoint message above the broker's 1 MB limit fails every commit and
  stalls the whole capture). Storing each transaction's rows once, outside the
  checkpoint, would lift the limit (not done yet).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from pydblog.errors import SourceError
from pydblog.events import ChangeEvent, Op
from pydblog.ports import SourceState
from pydblog.sources.mysql.position import OpenTx

log = logging.getLogger(__name__)

XA_KEY = "mysql_xa_prepared"
"""``Checkpoint.extra`` key of the prepared XA transactions."""

MAX_HELD_BYTES = int(os.environ.get("PYDBLOG_XA_MAX_HELD_BYTES", str(256 * 1024)))
"""Largest encoded size of the held rows of prepared XA transactions (all of them, as
the checkpoint carries them) before capture stops with a SourceError; default 256 KiB,
well under a Kafka message's default 1 MB limit."""

Xid = tuple[int, bytes, bytes]
"""``(formatID, gtrid, bqual)``."""

_LITERAL = r"(?:[xX]'[0-9a-fA-F]*'|0[xX][0-9a-fA-F]+|'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\")"
_XID = re.compile(
    rf"\s*({_LITERAL})\s*(?:,\s*({_LITERAL})\s*(?:,\s*(\d+)\s*)?)?", re.DOTALL
)
_STATEMENT = re.compile(r"\s*XA\s+(COMMIT|ROLLBACK|START|BEGIN|END|PREPARE)\s+(.*)$",
                        re.IGNORECASE | re.DOTALL)


def _literal(text: str) -> bytes:
    if text[:2] in ("X'", "x'"):
        return bytes.fromhex(text[2:-1])
    if text[:2] in ("0x", "0X"):
        digits = text[2:]
        return bytes.fromhex(digits if len(digits) % 2 == 0 else "0" + digits)
    quote = text[0]
    body = text[1:-1].replace(quote * 2, quote)
    body = re.sub(r"\\(.)", lambda m: m.group(1), body)
    return body.encode()


def parse_statement(query: str) -> tuple[str, Xid, str] | None:
    """``"XA COMMIT X'7831',X'',1"`` -> ``("COMMIT", (1, b"x1", b""), rest)`` (``rest``:
    what follows the xid, e.g. ``ONE PHASE``); None if not an XA statement with an xid."""
    m = _STATEMENT.match(query)
    if m is None:
        return None
    verb, tail = m.group(1).upper(), m.group(2)
    x = _XID.match(tail)
    if x is None:
        return None
    gtrid, bqual, fmt = x.group(1), x.group(2), x.group(3)
    xid = (int(fmt) if fmt else 1, _literal(gtrid), _literal(bqual) if bqual else b"")
    return verb, xid, tail[x.end():].strip()


def xid_key(xid: Xid) -> str:
    """The checkpoint's name of an xid."""
    return f"{xid[0]}:{xid[1].hex()}:{xid[2].hex()}"


def xid_text(xid: Xid) -> str:
    """An xid as the servers print it (``X'7831',X'',1``)."""
    return f"X'{xid[1].hex()}',X'{xid[2].hex()}',{xid[0]}"


def _key_xid(key: str) -> Xid:
    fmt, gtrid, bqual = key.split(":")
    return int(fmt), bytes.fromhex(gtrid), bytes.fromhex(bqual)


@dataclass(slots=True)
class _Prepared:
    at: str  # where its PREPARE group is, for messages
    rows: list[ChangeEvent]


@dataclass(slots=True)
class PreparedXa:
    """The prepared XA transactions with captured rows (see the module docstring)."""

    prepared: dict[str, _Prepared] = field(default_factory=dict)
    before_start: set[str] = field(default_factory=set)

    def prepare(self, xid: Xid, at: str, rows: list[ChangeEvent]) -> None:
        self.prepared[xid_key(xid)] = _Prepared(at, rows)

    def take(self, xid: Xid) -> list[ChangeEvent] | None:
        """The prepared rows of ``xid`` (None: not prepared here), forgotten."""
        found = self.prepared.pop(xid_key(xid), None)
        return found.rows if found is not None else None

    def hold(self, xid: Xid, at: str, rows: list[ChangeEvent]) -> None:
        """An ``XA PREPARE`` group at ``at`` with captured ``rows``: held until its
        COMMIT / ROLLBACK. Raises ``SourceError`` when the held rows of all prepared
        transactions exceed ``MAX_HELD_BYTES`` encoded (every checkpoint carries them)."""
        self.prepare(xid, at, rows)
        log.info("XA transaction %s prepared at %s with %d captured row change(s): held "
                 "until its XA COMMIT / XA ROLLBACK", xid_text(xid), at, len(rows))
        size = self.encoded_size()
        if size > MAX_HELD_BYTES:
            raise SourceError(
                f"XA transaction {xid_text(xid)}, prepared at {at} with "
                f"{len(rows)} captured row change(s), brings the held rows of prepared XA "
                f"transactions ({self.rows()} rows, {size:,} bytes encoded) over the "
                f"limit of {MAX_HELD_BYTES:,} bytes: every checkpoint carries them until "
                "their XA COMMIT / XA ROLLBACK (a Kafka change log cannot commit a "
                "checkpoint above its 1 MB message limit). Fix: set "
                "PYDBLOG_XA_MAX_HELD_BYTES higher and restart (with a Kafka change log "
                "only if the checkpoint topic's max.message.bytes and the broker's limits "
                "allow it); capture resumes before this PREPARE, so resolving the XA "
                "alone does not help. Keep XA transactions on captured tables small "
                "(README, Limits)"
            )

    def resolve(self, verb: str, xid: Xid, at: str) -> tuple[list[ChangeEvent], bool]:
        """A two-phase ``XA COMMIT`` / ``XA ROLLBACK`` (``verb``) group at ``at``:
        ``(rows to log there, whether the held transactions changed)``. A COMMIT logs
        the rows its PREPARE held; a ROLLBACK forgets them; one of a transaction
        prepared before a fresh start is warned about once (its rows are not here)."""
        rows = self.take(xid)
        if rows is None:
            if not (self.prepared_before_start(xid) and verb == "COMMIT"):
                return [], False
            log.warning(
                "XA transaction %s, prepared before capture started, committed at %s: "
                "its row changes were written to the binlog at its XA PREPARE, before "
                "the start position, and are not in the change log; if it changed "
                "captured tables, snapshot them again (dblog snapshot ...) to log their "
                "rows as they are now",
                xid_text(xid), at,
            )
            return [], True
        return (rows if verb == "COMMIT" else []), True

    def recovered(self, rows: list[tuple[Any, ...]], where: str) -> bool:
        """A fresh start: ``XA RECOVER``'s ``rows`` (transactions prepared now, on the
        server at ``where``) are remembered and warned about; whether there were any.
        Their rows are in the binlog before the start position and they commit later
        in a group without rows: their changes are not captured."""
        if not rows:
            return False
        xids = recover_xids(rows)
        self.note_before_start(xids)
        names = [x[1].decode(errors="replace") for x in xids[:5]]
        log.warning(
            "MySQL at %s has %d prepared XA transaction(s) (%s): if they change captured "
            "tables, their changes are not captured when they commit (their rows were "
            "written to the binlog at XA PREPARE, before capture starts); a warning names "
            "each one when it commits: then snapshot the tables it changed again "
            "(or resolve them before starting capture)",
            where, len(rows), ", ".join(repr(x) for x in names),
        )
        return True

    def prepared_before_start(self, xid: Xid) -> bool:
        """Whether ``xid`` was prepared before a fresh start (reported once)."""
        key = xid_key(xid)
        if key in self.before_start:
            self.before_start.discard(key)
            return True
        return False

    def note_before_start(self, xids: Iterable[Xid]) -> None:
        self.before_start.update(xid_key(x) for x in xids)

    def rows(self) -> int:
        return sum(len(p.rows) for p in self.prepared.values())

    def encoded_size(self) -> int:
        """Bytes of ``to_json`` as the checkpoint encodes it (JSON)."""
        return len(orjson.dumps(self.to_json()))

    def to_json(self) -> dict[str, Any]:
        return {
            "prepared": {
                key: {
                    "at": p.at,
                    "rows": [[e.op.value, e.schema, e.table, e.ts_ms, e.key, e.before, e.after]
                             for e in p.rows],
                }
                for key, p in self.prepared.items()
            },
            "before_start": sorted(self.before_start),
        }

    @classmethod
    def load(cls, data: Any, position: Any) -> PreparedXa:
        """``from_json`` of a checkpoint's ``XA_KEY``; a ``SourceError`` naming the fix
        when it cannot be read."""
        try:
            return cls.from_json(data, position)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SourceError(
                f"the checkpoint's prepared XA transactions cannot be read: {exc!r}",
                hint="this change log was written by a newer pydblog; use that version, or "
                "start with a fresh [log] path and snapshot the tables again",
            ) from None

    @classmethod
    def from_json(cls, data: Any, position: Any) -> PreparedXa:
        """Back from ``to_json``; rows get ``position`` until their commit places them."""
        out = cls()
        if not data:
            return out
        for key, p in dict(data.get("prepared") or {}).items():
            _key_xid(key)  # checks the name
            rows = [
                ChangeEvent(Op(op), str(schema), str(table), position, int(ts), k, before, after)
                for op, schema, table, ts, k, before, after in p["rows"]
            ]
            out.prepared[key] = _Prepared(str(p["at"]), rows)
        out.before_start = {str(k) for k in data.get("before_start") or ()}
        return out


def recover_xids(rows: Iterable[tuple[Any, ...]]) -> list[Xid]:
    """``XA RECOVER``'s rows (formatID, gtrid_length, bqual_length, data) as xids."""
    out: list[Xid] = []
    for r in rows:
        fmt, glen, blen, data = int(r[0]), int(r[1]), int(r[2]), r[3]
        raw = data if isinstance(data, bytes) else str(data).encode()
        out.append((fmt, raw[:glen], raw[glen:glen + blen]))
    return out


class XaGroups:
    """The XA groups of one binlog stream, as the source reads them (module docstring):
    the rows of an open XA group are held in its transaction (``OpenTx.xa``) until the
    group ends; an ``XA PREPARE`` moves them to ``held`` (``PreparedXa``, which the
    checkpoint carries from that group on); the later ``XA COMMIT`` places them at its
    own group's positions, an ``XA ROLLBACK`` drops them.

    Every method yields the items for the group it ends (rows and the ``SourceState`` of
    the held transactions) and leaves ending the transaction (its ``Commit``) to the
    source, after them."""

    def __init__(self, held: PreparedXa | None = None) -> None:
        self.held = held if held is not None else PreparedXa()
        self.opening: SourceState | None = None
        """A fresh start's ``SourceState`` of the transactions prepared then, to yield
        first (``recovered``)."""

    def recovered(self, rows: list[tuple[Any, ...]], where: str) -> None:
        """A fresh start: ``XA RECOVER``'s ``rows``. XA transactions prepared now have
        their rows in the binlog before the start position, and commit later in a group
        without rows: if they change captured tables, those changes are not in the change
        log (and a snapshot chunk read before their commit reads the rows as before
        them). ``XA RECOVER`` lists them (all of them on MariaDB and MySQL 5.7; MySQL 8
        shows others' only with XA_RECOVER_ADMIN): warned about now, and again when one
        of them commits (``PreparedXa.before_start``, kept in the checkpoint)."""
        if self.held.recovered(rows, where):
            self.opening = self.state(None)

    def state(self, position: Any) -> SourceState:
        return SourceState(XA_KEY, self.held.to_json(), position)

    @staticmethod
    def starts(tx: OpenTx) -> None:
        """``XA START`` (or MariaDB's GTID event flagged ``FL_PREPARED_XA``): ``tx``'s
        rows are held until its group ends."""
        tx.explicit = True
        tx.xa = []

    def prepared(self, tx: OpenTx, xid: Xid) -> Iterator[SourceState]:
        """The ``XA PREPARE`` that ends ``tx``'s group (two-phase): its rows are in the
        binlog now but become visible (or vanish) only at a later, separate ``XA COMMIT``
        / ``XA ROLLBACK`` group, so they are held and logged there, at that group's
        position, as one transaction. The checkpoint carries them from here on
        (``SourceState`` at this group): a restart or kill -9 before their commit finds
        them in it, one before this group reads the group again. None of them stays at
        this group's position (``tx.count`` back to 0)."""
        rows, tx.xa = tx.xa or [], None
        tx.count = 0
        if rows:
            self.held.hold(xid, str(tx.position(0)), rows)
            yield self.state(tx.position(0))

    def resolved(self, tx: OpenTx, verb: str, xid: Xid, ts_ms: int) -> Iterator[Any]:
        """A two-phase ``XA COMMIT`` / ``XA ROLLBACK`` (``verb``), a group of its own
        (``tx``): a COMMIT logs the rows its PREPARE held, at this group's positions
        (index 0..n-1, its ``Commit`` at n: the commit is where they become visible, so
        snapshot windows and read fences judge them there); a ROLLBACK forgets them.
        Either way the checkpoint's held transactions change at this group (a restart
        before its ``Commit`` is durable reads it again, with the rows still held)."""
        rows, changed = self.held.resolve(verb, xid, str(tx.position(0)))
        for ev in rows:
            yield ev._replace(position=tx.position(tx.count), ts_ms=ts_ms)
            tx.count += 1
        if changed:
            yield self.state(tx.position(tx.count))

    @staticmethod
    def two_phase_end(query: str, tx: OpenTx | None) -> tuple[str, Xid] | None:
        """``(verb, xid)`` of an ``XA COMMIT`` / ``XA ROLLBACK`` query that ends a
        prepared transaction; None for one that ends its own group (``XA COMMIT ... ONE
        PHASE`` on MariaDB before 10.5: the group's own rows commit there)."""
        parsed = parse_statement(query)
        if parsed is None or (tx is not None and tx.xa is not None):
            return None
        return parsed[0], parsed[1]
