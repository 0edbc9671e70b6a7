"""The embedded change log: one SQLite database in WAL mode, events stored in blocks.

Like Kafka's record batches, events are stored in blocks of up to ``BLOCK_EVENTS``
consecutive offsets, one SQLite row per block: a block's bodies are the JSON
envelopes joined by newlines (orjson escapes newlines inside strings, so a body never
contains one) and its meta is one ``table US op US ts_ms`` entry per event, joined by
RS. One row insert per block instead of per event makes appends several times cheaper
and sequential reads likewise; readers split blocks and return one ``LogRecord`` per
event (or, for bulk readers, the blocks' entry and body lists). A snapshot chunk
arrives as template ``EncodedBlock``s and is stored as is: one meta entry, the envelope
parts every row shares, and the rows' tails compressed with zstd; readers expand it (a
snapshot row then costs a few bytes in the log instead of ~330, written twice: WAL and
database). A checkpointer thread copies the WAL into the database so that appends only
write and sync the WAL.

Invariants:
- Offsets are a dense integer sequence starting at 0, assigned at append in the order
  given; a block covers ``first_offset .. last_offset`` and blocks never overlap.
  Retention removes whole blocks from the front, never a hole.
- ``append`` commits the events, new table schemas and the checkpoint describing them
  in one transaction with ``synchronous=FULL``: once it returns, all survive
  ``kill -9`` and power loss. Readers in other processes see whole batches or nothing.
- Readers never block the writer (WAL mode) and see only committed batches.
- Fencing (high availability): once ``claim(epoch)`` was called, every ``append`` checks
  inside its own write transaction that the log's ``fence`` row still holds that epoch,
  and commits nothing otherwise (``Fenced``). A newer leader claims the log by writing
  its greater epoch there (``claim`` refuses a smaller one), so a frozen ex-leader that
  wakes can append nothing: SQLite serialises the two write transactions. A writer
  that never claimed (a `dblog run` without ``[ha]``) appends only while no epoch
  owns the log, checked the same way: it cannot write beside a group's leader.
  ``release_ha_claim`` removes the claim (and so fences every member out).
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from itertools import repeat
from pathlib import Path
from typing import Any

import orjson
import zstandard

from pydblog.errors import ChangeLogError, Fenced
from pydblog.events import BLOCK_EVENTS, Encoded, EncodedBlock, EncodedEvent, expand_template
from pydblog.ports import ChangeLogReader, ChangeLogWriter, Checkpoint, LogRecord, TableSchema
from pydblog.threads import name_native_thread

log = logging.getLogger(__name__)

LOG_FILE = "changelog.sqlite"
__all__ = ["BLOCK_EVENTS", "SqliteChangeLog", "SqliteChangeLogReader", "block_parts", "log_path"]
PAGE_SIZE = 16384
"""Page size of a new change log. A block of 1,024 events is ~250 KB: with 16 KiB pages
SQLite spends ~0.5 us per event on it instead of ~0.9 with the default 4 KiB, while a
small commit (a few events) costs about the same (0.49 vs 0.42 ms); 64 KiB pages made
small commits 3x slower. An existing log keeps the page size it was created with."""
_US = "\x1f"  # between a meta entry's fields
_RS = "\x1e"  # between meta entries
_GS = "\x1d"  # starts a template block's meta, and separates its fields
ZSTD_LEVEL = 1
"""Template blocks' bodies are compressed: a snapshot row's tail (~125 bytes) becomes a
few bytes for 0.14 us of the writer thread's CPU (the GIL released), against ~1 us of
kernel time to write the plain text twice (WAL, then the database)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blocks (
    first_offset INTEGER PRIMARY KEY,
    last_offset INTEGER NOT NULL,
    max_ts_ms INTEGER NOT NULL, -- when the block was appended (retention's age)
    tables TEXT NOT NULL,
    meta TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS schemas (
    tbl TEXT NOT NULL,
    from_offset INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (tbl, from_offset)
);
CREATE TABLE IF NOT EXISTS fence (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL,
    claimed_ms INTEGER NOT NULL,
    owner TEXT -- JSON {host, pid, start}: the claiming process (ha.stonith)
);
CREATE TABLE IF NOT EXISTS checkpoint (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    next_offset INTEGER NOT NULL,
    state BLOB NOT NULL,
    updated_ms INTEGER NOT NULL
);
"""


CLAIM_BUSY_MS = 200
CHECKPOINT_EVERY_S = 0.05
WAL_BACKSTOP_PAGES = 16_384
"""The writer's own automatic checkpoint, only if the checkpointer thread fell behind
this far (256 MiB of WAL)."""


class _Checkpointer:
    """Copies the WAL into the database file on its own thread and connection, so an
    append only writes and syncs the WAL. PASSIVE checkpoints never wait for readers or
    the writer; SQLite lets one run alongside a writer. (Run by the writer after its
    commits, a checkpoint copied ~16 MB and synced the database file in the middle of
    the capture's critical path every few batches: the stream's lag p99 came from
    there during large snapshots.)"""

    def __init__(self, path: Path) -> None:
        self._conn = _connect(path, readonly=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dblog-wal-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        name_native_thread()
        while not self._stop.wait(CHECKPOINT_EVERY_S):
            try:
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as exc:  # busy or I/O: the backstop still bounds the WAL
                log.debug("WAL checkpoint failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._conn.close()


def log_path(directory: str | Path) -> Path:
    return Path(directory) / LOG_FILE


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    try:
        if readonly:
            if not path.exists():
                raise ChangeLogError(
                    f"no change log at {path}",
                    hint="start `dblog run` first, or check [log] path in the config",
                )
            conn = sqlite3.connect(
                f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=10000")
        return conn
    except sqlite3.Error as exc:
        raise ChangeLogError(
            f"cannot open the change log at {path}: {exc}",
            hint="check that [log] path is a writable directory",
        ) from exc


def _block_row(first: int, events: Sequence[EncodedEvent]) -> tuple[object, ...]:
    tables = sorted({e[0] for e in events})
    meta = _RS.join([f"{e[0]}{_US}{e[1]}{_US}{e[2]}" for e in events])
    body = "\n".join([e[3] if isinstance(e[3], str) else e[3].decode() for e in events])
    return (first, first + len(events) - 1, max(e[2] for e in events), _US.join(tables), meta, body)


_codecs = threading.local()


def _compress(text: str) -> bytes:
    """zstd (level 1) of the text's UTF-8; one compressor per thread (the writer's)."""
    codec = getattr(_codecs, "compressor", None)
    if codec is None:
        codec = _codecs.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return codec.compress(text.encode())


def _decompress(blob: bytes) -> str:
    codec = getattr(_codecs, "decompressor", None)
    if codec is None:
        codec = _codecs.decompressor = zstandard.ZstdDecompressor()
    return codec.decompress(blob).decode()


def _now_ms() -> int:
    """The wall clock in ms (one place, so tests can move it)."""
    return int(time.time() * 1000)


def _bulk_row(first: int, block: EncodedBlock) -> tuple[object, ...]:
    """A pre-joined block: its meta is one entry repeated (same table, op and ts); a
    template block's meta is ``GS entry GS head GS first_index GS mid`` (the entry once;
    JSON text never holds a raw GS) and its body the envelopes' tails, zstd-compressed
    (a BLOB; any TEXT body is stored as is)."""
    entry = f"{block.table}{_US}{block.op}{_US}{block.ts_ms}"
    body: str | bytes = block.body
    if block.head:
        meta = _GS.join(("", entry, block.head, str(block.first_index), block.mid))
        body = _compress(block.body)
    else:
        meta = _RS.join(repeat(entry, block.size))
    return (first, first + block.size - 1, block.ts_ms, block.table, meta, body)


def block_parts(meta: str, body: str | bytes) -> tuple[list[str], str | list[str]]:
    """A stored block's meta entries and its bodies: the stored text of a plain block
    (the bodies joined by newlines, which a JSON text holds only escaped; a compressed
    body decompressed), the expanded bodies of a template block. For readers that split
    the text themselves (in Arrow)."""
    text = body if isinstance(body, str) else _decompress(body)
    if not meta.startswith(_GS):
        return meta.split(_RS), text
    lines = text.split("\n")
    _, entry, head, first_index, mid = meta.split(_GS)
    return [entry] * len(lines), expand_template(head, int(first_index), mid, lines)


def _unpack(meta: str, body: str | bytes) -> tuple[list[str], list[str]]:
    """A stored block's meta entries and bodies, one per event."""
    metas, bodies = block_parts(meta, body)
    return metas, bodies.split("\n") if isinstance(bodies, str) else bodies


def _block_rows(start: int, items: Sequence[Encoded]) -> tuple[list[tuple[object, ...]], int]:
    """The blocks of ``items`` from offset ``start``, and the offset after them: runs of
    single events in blocks of up to ``BLOCK_EVENTS``, each ``EncodedBlock`` as its own
    block (the encoder keeps those within ``BLOCK_EVENTS`` too)."""
    bulk = [i for i, e in enumerate(items) if type(e) is EncodedBlock]
    rows: list[tuple[object, ...]] = []
    offset, lo = start, 0
    for hi in [*bulk, len(items)]:
        run = items[lo:hi]
        for i in range(0, len(run), BLOCK_EVENTS):
            rows.append(_block_row(offset + i, run[i : i + BLOCK_EVENTS]))  # type: ignore[arg-type]
        offset += len(run)
        if hi < len(items):
            block = items[hi]
            assert type(block) is EncodedBlock
            if block.size:
                rows.append(_bulk_row(offset, block))
                offset += block.size
        lo = hi + 1
    return rows, offset


def _split(row: tuple[int, str, str | bytes]) -> Iterator[LogRecord]:
    first, meta, body = row
    for i, (m, b) in enumerate(zip(*_unpack(meta, body), strict=True)):
        table, op, ts = m.split(_US)
        yield LogRecord(first + i, table, op, int(ts), b.encode())


def this_process() -> dict[str, Any]:
    """``{host, pid, start}`` of this process (start: kernel ticks since boot, so that a
    recycled pid is not mistaken for it)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": process_start(os.getpid())}


def process_start(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``None``: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def release_ha_claim(directory: str | Path) -> int | None:
    """Remove a high-availability group's claim on the log at ``directory`` (the epoch
    it had, ``None`` if none): a writer without ``[ha]`` may then append, and every
    member that still runs is fenced out of its next append."""
    if not log_path(directory).exists():
        return None
    conn = _connect(log_path(directory), readonly=False)
    try:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT epoch FROM fence WHERE id = 1").fetchone()
        conn.execute("DELETE FROM fence")
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise ChangeLogError(f"cannot release the change log at {log_path(directory)}: {exc}") from None
    finally:
        conn.close()
    return int(row[0]) if row else None


def _schemas(conn: sqlite3.Connection, table: str | None) -> list[tuple[int, TableSchema]]:
    if table is None:
        rows = conn.execute("SELECT from_offset, body FROM schemas ORDER BY from_offset, tbl")
    else:
        rows = conn.execute(
            "SELECT from_offset, body FROM schemas WHERE tbl = ? ORDER BY from_offset", (table,)
        )
    return [(int(o), TableSchema.from_json(orjson.loads(b))) for o, b in rows]


class SqliteChangeLog(ChangeLogWriter):
    """The writer side. One writer per directory (the capture process)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = log_path(directory)
        self._conn = _connect(self.path, readonly=False)
        try:
            self._conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # no-op once the file exists
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES}")
            self._conn.executescript(_SCHEMA)
            cols = {r[1] for r in self._conn.execute("PRAGMA table_info(fence)")}
            if "owner" not in cols:  # a log created before the owner was recorded
                self._conn.execute("ALTER TABLE fence ADD COLUMN owner TEXT")
        except sqlite3.Error as exc:
            raise ChangeLogError(f"cannot initialise the change log at {self.path}: {exc}") from exc
        self._checkpointer = _Checkpointer(self.path)
        row = self._conn.execute("SELECT max(last_offset) FROM blocks").fetchone()
        cp = self._conn.execute("SELECT next_offset FROM checkpoint WHERE id = 1").fetchone()
        last = row[0] if row and row[0] is not None else -1
        self._next = max(last + 1, cp[0] if cp else 0)
        self._epoch: int | None = None  # set by claim(): appends are then fenced

    def claim(self, epoch: int) -> None:
        """Own the log with ``epoch`` (see the module's fencing invariant). Re-reads
        the next offset: an earlier leader may have appended since this was opened.
        Waits at most ``CLAIM_BUSY_MS`` for the write lock (``ChangeLogError``; the
        caller retries and may look at who holds it)."""
        conn = self._conn
        try:
            conn.execute(f"PRAGMA busy_timeout={CLAIM_BUSY_MS}")
            try:
                conn.execute("BEGIN IMMEDIATE")
            finally:
                conn.execute("PRAGMA busy_timeout=10000")
            row = conn.execute("SELECT epoch FROM fence WHERE id = 1").fetchone()
            if row is not None and row[0] > epoch:
                conn.execute("ROLLBACK")
                raise Fenced(
                    f"the change log at {self.path} was claimed by epoch {row[0]}, newer than "
                    f"this leader's {epoch}"
                )
            conn.execute(
                "INSERT INTO fence (id, epoch, claimed_ms, owner) VALUES (1, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, "
                "claimed_ms = excluded.claimed_ms, owner = excluded.owner",
                (epoch, int(time.time() * 1000), orjson.dumps(this_process()).decode()),
            )
            last = conn.execute("SELECT max(last_offset) FROM blocks").fetchone()[0]
            cp = conn.execute("SELECT next_offset FROM checkpoint WHERE id = 1").fetchone()
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise ChangeLogError(f"cannot claim the change log at {self.path}: {exc}") from exc
        self._next = max((last if last is not None else -1) + 1, cp[0] if cp else 0)
        self._epoch = epoch

    def fence_epoch(self) -> int | None:
        """The epoch that owns the log now (``None``: never claimed)."""
        row = self._conn.execute("SELECT epoch FROM fence WHERE id = 1").fetchone()
        return int(row[0]) if row else None

    def check_unclaimed(self) -> None:
        """Raise unless the log is free for a writer without ``[ha]`` (no epoch owns it)."""
        epoch = self.fence_epoch()
        if epoch is not None:
            raise self._claimed(epoch)

    def _claimed(self, epoch: int) -> ChangeLogError:
        return ChangeLogError(
            f"the change log at {self.path} belongs to a high-availability group (claimed "
            f"by epoch {epoch}) and this `dblog run` has no [ha] section",
            hint="give this process the group's [ha] section; to stop using high "
            "availability on this log, stop every member and run `dblog run --release-ha` once",
        )

    def fence_owner(self) -> dict[str, Any] | None:
        """The process that made the last claim (``{host, pid, start}``), if recorded."""
        row = self._conn.execute("SELECT owner FROM fence WHERE id = 1").fetchone()
        if not row or not row[0]:
            return None
        owner: dict[str, Any] = orjson.loads(row[0])
        return owner

    @property
    def next_offset(self) -> int:
        return self._next

    def append(
        self,
        events: Sequence[Encoded],
        checkpoint: Checkpoint,
        schemas: Sequence[TableSchema] = (),
    ) -> int:
        start = self._next
        blocks, end = _block_rows(start, events)
        # Retention ages a block by when it was appended, not by its events' source
        # time: a capture lagging more than retention_hours must not delete what it
        # just wrote. (The column keeps its old name; it holds the append time.)
        now_ms = _now_ms()
        blocks = [(r[0], r[1], now_ms, *r[3:]) for r in blocks]
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT epoch FROM fence WHERE id = 1").fetchone()
            if self._epoch is None and row is not None:
                conn.execute("ROLLBACK")
                raise self._claimed(row[0])
            if self._epoch is not None and (row is None or row[0] != self._epoch):
                conn.execute("ROLLBACK")
                raise Fenced(
                    f"the change log at {self.path} now belongs to epoch "
                    f"{row[0] if row else None}; this leader's epoch {self._epoch} may not "
                    "write to it"
                )
            if schemas:
                conn.executemany(
                    "INSERT OR REPLACE INTO schemas (tbl, from_offset, body) VALUES (?,?,?)",
                    [(s.qualified, start, orjson.dumps(s.to_json())) for s in schemas],
                )
            if blocks:
                conn.executemany(
                    "INSERT INTO blocks (first_offset, last_offset, max_ts_ms, tables, meta, body) "
                    "VALUES (?,?,?,?,?,?)",
                    blocks,
                )
            conn.execute(
                "INSERT INTO checkpoint (id, next_offset, state, updated_ms) VALUES (1, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET next_offset = excluded.next_offset, "
                "state = excluded.state, updated_ms = excluded.updated_ms",
                (end, checkpoint.to_bytes(), int(time.time() * 1000)),
            )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise ChangeLogError(f"cannot append to the change log at {self.path}: {exc}") from exc
        self._next = end
        return end

    def last_checkpoint(self) -> Checkpoint | None:
        row = self._conn.execute("SELECT state FROM checkpoint WHERE id = 1").fetchone()
        return Checkpoint.from_bytes(row[0]) if row else None

    def schemas(self, table: str | None = None) -> list[tuple[int, TableSchema]]:
        return _schemas(self._conn, table)

    def enforce_retention(self, max_age_ms: int | None, max_bytes: int | None) -> int:
        """Delete the oldest blocks beyond the age or size limit; returns how many
        events went. The newest block is always kept."""
        conn = self._conn
        (newest,) = conn.execute("SELECT max(first_offset) FROM blocks").fetchone()
        if newest is None:
            return 0
        cut = -1  # delete blocks whose last_offset <= cut
        if max_age_ms is not None:
            limit = _now_ms() - max_age_ms
            (c,) = conn.execute(
                "SELECT max(last_offset) FROM blocks WHERE max_ts_ms < ? AND first_offset < ?",
                (limit, newest),
            ).fetchone()
            if c is not None:
                cut = max(cut, c)
        if max_bytes is not None:
            size = self.size_bytes()
            if size > max_bytes:
                (first,) = conn.execute("SELECT min(first_offset) FROM blocks").fetchone()
                share = 1 - max_bytes / size
                target = first + int((self._next - first) * share)
                (c,) = conn.execute(
                    "SELECT max(last_offset) FROM blocks WHERE last_offset <= ? AND first_offset < ?",
                    (target, newest),
                ).fetchone()
                if c is not None:
                    cut = max(cut, c)
        if cut < 0:
            return 0
        (first,) = conn.execute("SELECT min(first_offset) FROM blocks").fetchone()
        conn.execute("DELETE FROM blocks WHERE last_offset <= ?", (cut,))
        return int(cut - first + 1)

    def size_bytes(self) -> int:
        (pages,) = self._conn.execute("PRAGMA page_count").fetchone()
        (free,) = self._conn.execute("PRAGMA freelist_count").fetchone()
        (size,) = self._conn.execute("PRAGMA page_size").fetchone()
        return int((pages - free) * size)

    def close(self) -> None:
        self._checkpointer.close()
        self._conn.close()


class SqliteChangeLogReader(ChangeLogReader):
    """A reader; any number may run in other processes while the writer appends."""

    def __init__(self, directory: str | Path) -> None:
        self.path = log_path(directory)
        self._conn = _connect(self.path, readonly=True)
        self._ready = False

    def ready(self) -> bool:
        """False while the writer has created the file but not yet its tables."""
        if not self._ready:
            (n,) = self._conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('blocks', 'checkpoint', 'schemas')"
            ).fetchone()
            self._ready = n == 3
        return self._ready

    def _blocks(self, start: int, end: int | None, tables: Sequence[str] | None) -> Iterator[LogRecord]:
        """Records with ``start <= offset [< end]`` in offset order, block by block."""
        if not self.ready():
            return
        first_block = self._conn.execute(
            "SELECT max(first_offset) FROM blocks WHERE first_offset <= ?", (start,)
        ).fetchone()[0]
        lower = first_block if first_block is not None else start
        wanted = set(tables) if tables else None
        while True:
            rows = self._conn.execute(
                "SELECT first_offset, meta, body, tables FROM blocks WHERE first_offset >= ? "
                + ("AND first_offset < ? " if end is not None else "")
                + "ORDER BY first_offset LIMIT 16",
                (lower, end) if end is not None else (lower,),
            ).fetchall()
            if not rows:
                return
            for first, meta, body, tbls in rows:
                if wanted is not None and wanted.isdisjoint(tbls.split(_US)):
                    continue
                for rec in _split((first, meta, body)):
                    if rec.offset < start or (end is not None and rec.offset >= end):
                        continue
                    if wanted is None or rec.table in wanted:
                        yield rec
            lower = rows[-1][0] + 1

    def read(
        self, from_offset: int, limit: int, tables: Sequence[str] | None = None
    ) -> list[LogRecord]:
        out: list[LogRecord] = []
        for rec in self._blocks(from_offset, None, tables):
            out.append(rec)
            if len(out) >= limit:
                break
        return out

    def read_range(self, start: int, end: int) -> list[LogRecord]:
        """Records with ``start <= offset < end`` (a deterministic re-read)."""
        return list(self._blocks(start, end, None))

    def read_range_stored(self, start: int, end: int) -> list[tuple[int, str, str | bytes]]:
        """The stored blocks that hold events of ``start <= offset < end``, in offset
        order and not clipped to the range: ``(first offset, meta, body)`` as stored
        (``block_parts`` unpacks one). A range retention removed is simply absent."""
        if not self.ready() or end <= start:
            return []
        first_block = self._conn.execute(
            "SELECT max(first_offset) FROM blocks WHERE first_offset <= ?", (start,)
        ).fetchone()[0]
        lower = first_block if first_block is not None else start
        rows: list[tuple[int, str, str | bytes]] = self._conn.execute(
            "SELECT first_offset, meta, body FROM blocks WHERE first_offset >= ? "
            "AND first_offset < ? ORDER BY first_offset",
            (lower, end),
        ).fetchall()
        return rows

    def read_range_blocks(self, start: int, end: int) -> list[tuple[int, list[str], list[str]]]:
        """The events ``start <= offset < end`` as the stored blocks hold them, clipped to
        the range: ``(first offset, meta entries, bodies)`` per block in offset order, the
        i-th entry being offset ``first + i``; a meta entry is ``table US op US ts_ms``.
        The same events as ``read_range`` without one ``LogRecord`` per event (the bulk
        readers decode bodies themselves); a range retention removed is simply absent."""
        out: list[tuple[int, list[str], list[str]]] = []
        for first, meta, body in self.read_range_stored(start, end):
            metas, bodies = _unpack(meta, body)
            lo, hi = max(0, start - first), min(len(bodies), end - first)
            if lo >= hi:
                continue
            if lo > 0 or hi < len(bodies):
                metas, bodies = metas[lo:hi], bodies[lo:hi]
            out.append((first + lo, metas, bodies))
        return out

    def first_offset(self) -> int:
        if not self.ready():
            return 0
        (first,) = self._conn.execute("SELECT min(first_offset) FROM blocks").fetchone()
        return int(first) if first is not None else self.next_offset()

    def next_offset(self) -> int:
        if not self.ready():
            return 0
        row = self._conn.execute("SELECT next_offset FROM checkpoint WHERE id = 1").fetchone()
        return int(row[0]) if row else 0

    def last_checkpoint(self) -> Checkpoint | None:
        if not self.ready():
            return None
        row = self._conn.execute("SELECT state FROM checkpoint WHERE id = 1").fetchone()
        return Checkpoint.from_bytes(row[0]) if row else None

    def schemas(self, table: str | None = None) -> list[tuple[int, TableSchema]]:
        return _schemas(self._conn, table) if self.ready() else []

    def heartbeat(self) -> tuple[int, int] | None:
        """``(updated_ms, next_offset)`` of the capture's last checkpoint when it was
        written outside a transaction (a heartbeat or the end of one): the log then held
        every source change up to when the capture wrote it (wall clock, ms; for a
        source stamping whole seconds the end of the second before:
        ``Checkpoint.complete_ms``), below ``next_offset``. None before any checkpoint
        or mid-transaction. One read."""
        if not self.ready():
            return None
        row = self._conn.execute(
            "SELECT updated_ms, next_offset, state FROM checkpoint WHERE id = 1").fetchone()
        if row is None or row[0] is None:
            return None
        cp = Checkpoint.from_bytes(row[2])
        if cp.extra.get("mid_tx"):
            return None
        return cp.complete_ms(int(row[0])), int(row[1])

    def describe(self) -> dict[str, object]:
        nxt = self.next_offset()
        return {
            "path": str(self.path),
            "size_bytes": self.size_bytes(),
            "first_offset": self.first_offset(),
            "last_offset": nxt - 1 if nxt > 0 else None,
        }

    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            p = Path(str(self.path) + suffix)
            if p.exists():
                total += os.path.getsize(p)
        return total

    def follow(
        self, from_offset: int, poll_s: float = 0.2, tables: Sequence[str] | None = None
    ) -> Iterator[LogRecord]:
        offset = from_offset
        while True:
            end = self.next_offset()
            progressed = False
            for rec in self._blocks(offset, end, tables):
                progressed = True
                yield rec
            if end > offset:
                offset = end
            if not progressed:
                time.sleep(poll_s)

    def close(self) -> None:
        self._conn.close()
