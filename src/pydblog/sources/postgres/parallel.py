"""Parallel chunk reads: one chunk, one window, several PostgreSQL backends.

A chunk of ``n`` rows after ``after`` is split at boundary keys found by one index-only
query (``row_number() OVER (ORDER BY key)`` over ``key > after ORDER BY key LIMIT n``,
every ``n/k``-th key), and its ``k`` sub-ranges are read at once, each on its own
connection, in its own READ ONLY transaction; the texts are joined in key order. On two
cores PostgreSQL's backend building each row's JSON is the longest link of a snapshot;
this spreads it over ``k`` backends.

Why the window stays exact. The worker still writes L before and H after the whole
chunk: every sub-read's snapshot T_i lies between L and H. The DBLog argument
(docs/snapshots.md) is per row and needs only that: an event before L is older than
every T_i, an event between L and H drops its key whatever T_i is, an event after H is
newer than every T_i. The sub-ranges ``(after, b1], (b1, b2], ..., (b_k-1, max]`` cover
``(after, last key read]`` without gap or overlap, so every key there was read (or had
no row at its T_i, and then its insert is an event after L, as for a single read).

The last sub-read takes ``LIMIT n - (k-1)·n/k``; if it is full but rows were deleted
from the earlier ranges since the boundary query (fewer than ``n`` in all), one more
read after the last key tops the chunk up, so "fewer than ``n`` rows" still means "the
table's end" to the core. Only primary-key (NOT NULL) chunks of the bulk plan are split.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from pydblog.sources.postgres import closing

MIN_SUB_ROWS = 2048
"""A chunk is split only into sub-reads of at least this many rows."""


class SubReadPool:
    """``parallelism - 1`` extra read-only connections and the threads that use them
    (the caller's thread reads the first sub-range on the reader's own connection)."""

    def __init__(self, parallelism: int, open_conn: Callable[[], psycopg.Connection[Any]]) -> None:
        self.parallelism = parallelism
        self._open = open_conn
        self._local = threading.local()
        self._conns: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._pool = (
            ThreadPoolExecutor(parallelism - 1, thread_name_prefix="dblog-subread")
            if parallelism > 1 else None
        )

    def conn(self) -> psycopg.Connection[Any]:
        """This pool thread's connection (opened on first use)."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._open()
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def split(self, limit: int) -> int:
        """How many sub-reads a chunk of ``limit`` rows gets."""
        return max(1, min(self.parallelism, limit // MIN_SUB_ROWS))

    def run(self, tasks: list[Callable[[psycopg.Connection[Any] | None], Any]]) -> list[Any]:
        """Run ``tasks[0]`` here (with None: the caller's connection) and the others on
        the pool's connections, at once; results in order."""
        assert self._pool is not None or len(tasks) == 1
        pool = self._pool
        futures = [pool.submit(self._call, t) for t in tasks[1:]] if pool is not None else []
        first = tasks[0](None)
        return [first, *(f.result() for f in futures)]

    def _call(self, task: Callable[[psycopg.Connection[Any] | None], Any]) -> Any:
        return task(self.conn())

    def close(self) -> None:
        """Closes the connections first (a sub-read in progress is ended at its socket,
        ``closing``), then waits for the threads."""
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for conn in conns:
            closing.close(conn)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
