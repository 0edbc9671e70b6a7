"""The embedded change log: one SQLite database in WAL mode.

Invariants:
- Offsets are a dense integer sequence starting at 0, assigned at append in the order
  given; retention removes a prefix, never a hole.
- ``append`` commits the events and the checkpoint describing them in one
  transaction with ``synchronous=FULL``: once it returns, both survive ``kill -9`` and
  power loss. Readers in other processes see whole batches or nothing.
- Readers never block the writer (WAL mode) and see only committed batches.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from pydblog.errors import ChangeLogError
from pydblog.events import EncodedEvent
from pydblog.ports import ChangeLogReader, ChangeLogWriter, Checkpoint, LogRecord, TableSchema

LOG_FILE = "changelog.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    "offset" INTEGER PRIMARY KEY,
    tbl TEXT NOT NULL,
    op TEXT NOT NULL,
    ts_ms INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS schemas (
    tbl TEXT NOT NULL,
    from_offset INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (tbl, from_offset)
);
CREATE TABLE IF NOT EXISTS checkpoint (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    next_offset INTEGER NOT NULL,
    state BLOB NOT NULL,
    updated_ms INTEGER NOT NULL
);
"""


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
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None,
                                   check_same_thread=False)
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
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise ChangeLogError(f"cannot initialise the change log at {self.path}: {exc}") from exc
        row = self._conn.execute('SELECT max("offset") FROM events').fetchone()
        cp = self._conn.execute("SELECT next_offset FROM checkpoint WHERE id = 1").fetchone()
        last = row[0] if row and row[0] is not None else -1
        self._next = max(last + 1, cp[0] if cp else 0)

    @property
    def next_offset(self) -> int:
        return self._next

    def append(
        self,
        events: Sequence[EncodedEvent],
        checkpoint: Checkpoint,
        schemas: Sequence[TableSchema] = (),
    ) -> int:
        start = self._next
        rows = [
            (start + i, e.table, e.op, e.ts_ms, e.body) for i, e in enumerate(events)
        ]
        end = start + len(rows)
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            if schemas:
                conn.executemany(
                    "INSERT OR REPLACE INTO schemas (tbl, from_offset, body) VALUES (?,?,?)",
                    [(s.qualified, start, orjson.dumps(s.to_json())) for s in schemas],
                )
            if rows:
                conn.executemany(
                    'INSERT INTO events ("offset", tbl, op, ts_ms, body) VALUES (?,?,?,?,?)', rows
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
        """Delete the oldest events beyond the age or size limit; returns how many.

        The newest event is always kept, so ``next_offset`` survives any retention.
        """
        conn = self._conn
        (last,) = conn.execute('SELECT max("offset") FROM events').fetchone()
        if last is None:
            return 0
        cut = -1
        if max_age_ms is not None:
            limit = int(time.time() * 1000) - max_age_ms
            (c,) = conn.execute(
                'SELECT max("offset") FROM events WHERE ts_ms < ? AND "offset" < ?', (limit, last)
            ).fetchone()
            if c is not None:
                cut = max(cut, c)
        if max_bytes is not None:
            size = self.size_bytes()
            if size > max_bytes:
                (first,) = conn.execute('SELECT min("offset") FROM events').fetchone()
                count = last - first + 1
                drop = int(count * (1 - max_bytes / size)) + 1
                cut = max(cut, min(first + drop - 1, last - 1))
        if cut < 0:
            return 0
        cur = conn.execute('DELETE FROM events WHERE "offset" <= ?', (cut,))
        return cur.rowcount

    def size_bytes(self) -> int:
        (pages,) = self._conn.execute("PRAGMA page_count").fetchone()
        (free,) = self._conn.execute("PRAGMA freelist_count").fetchone()
        (size,) = self._conn.execute("PRAGMA page_size").fetchone()
        return int((pages - free) * size)

    def close(self) -> None:
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
                "SELECT count(*) FROM sqlite_master WHERE name IN ('events', 'checkpoint', 'schemas')"
            ).fetchone()
            self._ready = n == 3
        return self._ready

    def read(
        self, from_offset: int, limit: int, tables: Sequence[str] | None = None
    ) -> list[LogRecord]:
        if not self.ready():
            return []
        if tables:
            marks = ",".join("?" * len(tables))
            sql = (
                f'SELECT "offset", tbl, op, ts_ms, CAST(body AS BLOB) FROM events WHERE "offset" >= ? '
                f'AND tbl IN ({marks}) ORDER BY "offset" LIMIT ?'
            )
            params: tuple[object, ...] = (from_offset, *tables, limit)
        else:
            sql = (
                'SELECT "offset", tbl, op, ts_ms, CAST(body AS BLOB) FROM events WHERE "offset" >= ? '
                'ORDER BY "offset" LIMIT ?'
            )
            params = (from_offset, limit)
        return [LogRecord(*r) for r in self._conn.execute(sql, params)]

    def read_range(self, start: int, end: int) -> list[LogRecord]:
        """Records with ``start <= offset < end`` (a deterministic re-read)."""
        if not self.ready():
            return []
        return [
            LogRecord(*r)
            for r in self._conn.execute(
                'SELECT "offset", tbl, op, ts_ms, CAST(body AS BLOB) FROM events '
                'WHERE "offset" >= ? AND "offset" < ? ORDER BY "offset"',
                (start, end),
            )
        ]

    def schemas(self, table: str | None = None) -> list[tuple[int, TableSchema]]:
        return _schemas(self._conn, table) if self.ready() else []

    def first_offset(self) -> int:
        if not self.ready():
            return 0
        (first,) = self._conn.execute('SELECT min("offset") FROM events').fetchone()
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
            batch = self.read(offset, 10_000, tables)
            if batch:
                yield from batch
                offset = batch[-1].offset + 1
                continue
            # A filtered read may return nothing while the log moved on: skip ahead.
            if tables:
                offset = max(offset, self.next_offset())
            time.sleep(poll_s)

    def close(self) -> None:
        self._conn.close()
