"""The PostgreSQL snapshot reader: keyset chunk SELECTs and watermark writes.

Invariants:
- Every SELECT runs in a READ ONLY transaction with ``statement_timeout``; user
  filters are placed inside it, so a filter can never write.
- Values are read as ``col::text`` under the same session settings as the
  replication connection and mapped by the same converters, so a row read here equals
  the same row decoded from the log.
- Chunks are keyset pages ``after < key <= max_key`` in key order, NULLs first. A
  surrogate key may repeat: a chunk always ends at a complete group of equal keys, so
  paging never skips or repeats a row. After the NULL group (``after == (None,)``) the
  next page starts at the first non-NULL key.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, TypeVar

import orjson
import psycopg
from psycopg import sql

from pydblog.config import Config
from pydblog.core.sizing import default_parallelism
from pydblog.errors import SignalError, SourceError
from pydblog.events import TAIL_SEP, EncodedChunk, EncodedRow, TailBlocks, join_tails
from pydblog.ports import (
    ConcurrentReader,
    FencedKeyReader,
    FencedReader,
    IntegerKeyReader,
    ReplayWaiter,
    SnapshotReader,
    TableInfo,
    WindowFencer,
)
from pydblog.positions import Lsn, PgPosition, Position
from pydblog.sources import intkeys
from pydblog.sources.postgres import closing, native
from pydblog.sources.postgres.connect import connect
from pydblog.sources.postgres.fences import (
    SYNC_COLUMNS,
    PgLsnFence,
    PgXidFence,
    running_sql,
    snapshot_sql,
    stats_grant_error,
)
from pydblog.sources.postgres.parallel import MIN_SUB_ROWS, SubReadPool
from pydblog.sources.postgres.pgoutput import ReplicaIdentity
from pydblog.sources.postgres.relations import TABLE_COLUMNS_SQL, compile_encoder, identity_columns
from pydblog.sources.postgres.setup import split_name
from pydblog.sources.postgres.source import WATERMARK_PREFIX, PgLogSource
from pydblog.sources.postgres.types import TypeRegistry

log = logging.getLogger(__name__)
_R = TypeVar("_R")

REPLAY_WAIT_S = 10.0
"""Longest a fenced read on a hot standby waits for replay to pass the floor
(``wait_replayed``); past it the read goes ahead (and is read again if it must)."""
REPLAY_POLL_S = 0.02


class PgSnapshotReader(
    SnapshotReader, ConcurrentReader, IntegerKeyReader, FencedReader, FencedKeyReader,
    ReplayWaiter, WindowFencer,
):
    def __init__(self, cfg: Config, source: PgLogSource, *, split: bool = True) -> None:
        """``split``: read a big chunk as parallel sub-ranges (``sources.postgres.parallel``);
        a forked reader (concurrent windows, ``fork``) reads each chunk in one SELECT."""
        self.cfg = cfg
        self._source = source
        self._conn: psycopg.Connection[Any] | None = None
        self._wconn: psycopg.Connection[Any] | None = None
        self._types: TypeRegistry | None = None
        self._oids: dict[str, tuple[int, ...]] = {}
        self._pk: dict[str, tuple[str, ...]] = {}
        # table -> chunk keys that hold no NULL (primary key, replica identity index)
        self._not_null_keys: dict[str, set[tuple[str, ...]]] = {}
        self._plans: dict[tuple[Any, ...], _ChunkPlan] = {}
        self.fast_json = True  # PostgreSQL writes the row JSON where every type allows
        # ...or, where every type has a code there, the native encoder (``native``)
        # writes it from the chunk's COPY text
        self.native = native.encoder() is not None
        # ORDER BY inside the fast path's aggregates (None: from PostgreSQL 16 on)
        self.ordered_agg: bool | None = None
        self._subreads: SubReadPool | None = None
        self._in_fenced_read = False  # a read-only chunk: one snapshot for every read
        self._shared_snapshot: str | None = None  # ...exported to the sub-reads (primary)
        self._split = split
        self._forks: list[PgSnapshotReader] = []

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The read-only connection of chunk and catalog reads: every transaction on it
        begins READ ONLY, and statement_timeout is set for its whole session."""
        if self._conn is None or self._conn.closed:
            conn = self._open_read_conn()
            self._conn = conn
            self._types = TypeRegistry.load(conn)
            if self.ordered_agg is None:
                self.ordered_agg = conn.info.server_version >= 160000
        return self._conn

    def fences_watermark_windows(self) -> bool:
        """Watermark chunks are read fenced too (``CoreSettings.fenced``): PostgreSQL
        decodes a commit before it becomes visible, so a transaction the stream delivered
        before a chunk's low watermark can be invisible to the chunk's SELECT (while it
        waits for a synchronous standby; for microseconds under CPU load otherwise), and
        only the read's snapshot tells. Every supported version can (``fences.snapshot_sql``:
        ``txid_current_snapshot()`` before PostgreSQL 13)."""
        return self.server_version >= 120000

    @property
    def server_version(self) -> int:
        """The read connection's server (``fences.snapshot_sql`` picks its functions)."""
        return self.conn.info.server_version

    def _open_read_conn(self) -> psycopg.Connection[Any]:
        dsn = self.cfg.snapshot.read_dsn or self.cfg.source.dsn
        conn = connect(dsn, timeout_s=self.cfg.source.connect_timeout_s,
                       setting="[snapshot] read_dsn" if self.cfg.snapshot.read_dsn
                       else "[source] dsn")
        conn.execute(f"SET statement_timeout = {int(self.cfg.snapshot.statement_timeout_ms)}")
        # Two walls: every transaction begins READ ONLY (``read_only``), and the
        # session's default is read-only too, so that even a transaction begun by other
        # means (a COMMIT smuggled into a query) cannot write.
        conn.execute("SET default_transaction_read_only = on")
        conn.read_only = True
        return conn

    @property
    def subreads(self) -> SubReadPool:
        """The connections of parallel chunk reads (``sources.postgres.parallel``)."""
        if self._subreads is None:
            ways = self.parallelism() if self._split else 1
            self._subreads = SubReadPool(ways, self._open_read_conn)
        return self._subreads

    def fork(self) -> PgSnapshotReader:
        """Another reader on its own connections, for concurrent windows (``core.flight``:
        each chunk is one SELECT there); closed by this reader's ``close``."""
        child = PgSnapshotReader(self.cfg, self._source, split=False)
        child.fast_json = self.fast_json
        child.native = self.native
        self._forks.append(child)
        return child

    def chunk_bounds(
        self, info: TableInfo, after: tuple[Any, ...] | None, max_key: tuple[Any, ...],
        step: int, count: int, condition: str | None,
    ) -> list[tuple[Any, ...]]:
        """The keys of the ``step``-th, ``2·step``-th, ... row after ``after`` (at most
        ``count``, none beyond ``max_key``), index only (``_step_keys``)."""
        _ = self.conn  # the type registry
        if info.qualified not in self._oids:
            self.table_info(info.qualified)
        cond = sql.SQL(condition) if condition else sql.SQL("true")
        where = sql.SQL("{} <= {} AND ({})").format(
            self._cols(info), self._tuple(info, max_key), cond
        )
        return self._step_keys(info, after, where, step, count)

    def integer_key(self, info: TableInfo) -> bool:
        """The chunk key is one smallint/integer/bigint column (``ports.IntegerKeyReader``)."""
        if len(info.key) != 1 or not intkeys.enabled():
            return False
        return info.types[info.columns.index(info.key[0])] in intkeys.POSTGRES_TYPES

    def _step_keys(
        self, info: TableInfo, after: tuple[Any, ...] | None, where: sql.Composable,
        step: int, count: int,
    ) -> list[tuple[Any, ...]]:
        """The keys of the ``step``-th, ``2·step``-th, ... row (at most ``count``) of
        ``key > after AND where`` in key order: each one ``OFFSET step - 1 LIMIT 1``
        after the previous one (an index-only scan whose Limit node skips the rows:
        about a quarter of the server's CPU of one ``row_number()`` over the whole
        range). The queries are separate transactions: boundaries only partition the
        key space, and a stale one costs a short or a continued range, never a row."""
        keys: list[tuple[Any, ...]] = []
        select = self._select_list(info, info.key)
        table = sql.Identifier(info.schema, info.table)
        order = self._order(info)
        for _ in range(count):
            rows = self._read_only(
                sql.SQL("SELECT {} FROM {} WHERE {} AND {} ORDER BY {} OFFSET {} LIMIT 1").format(
                    select, table, self._after(info, keys[-1] if keys else after), where, order,
                    sql.Literal(step - 1),
                ),
                [],
            )
            if not rows:
                break
            keys.append(self._map_key(info, rows[0]))
        return keys

    def parallelism(self) -> int:
        """``[snapshot] parallelism``, else a default from the machine and the server:
        half the machine's cores (at least 2, at most 4), and no more than a tenth of
        the server's free connections."""
        configured = self.cfg.snapshot.parallelism
        if configured is not None:
            return configured
        row = self.conn.execute(
            "SELECT current_setting('max_connections')::int - count(*) FROM pg_stat_activity"
        ).fetchone()
        self.conn.commit()
        free = int(row[0]) if row and row[0] is not None else 0
        return default_parallelism(os.cpu_count(), free)

    @property
    def writer(self) -> psycopg.Connection[Any]:
        """The connection watermarks are written on (autocommit, one row or message)."""
        if self._wconn is None or self._wconn.closed:
            self._wconn = connect(self.cfg.source.dsn, timeout_s=self.cfg.source.connect_timeout_s)
        return self._wconn

    def captured_tables(self) -> list[str]:
        """The log source's list (its last publication refresh): no query, so the
        capture thread, which asks for every signal, never waits behind a chunk read on
        this reader's connection (tests/integration/test_signal_during_chunk.py)."""
        return self._source.captured_tables

    def table_info(self, qualified: str, surrogate_key: str | None = None) -> TableInfo | None:
        """Columns, chunk key and row identity (``TableInfo``): the identity as the
        stream decoder decides it (``relations.identity_columns``), the chunk key the
        primary key, else the replica-identity index (unique, not null: no surrogate key
        needed), else ``surrogate_key``."""
        schema, table = split_name(qualified)
        conn = self.conn
        # One catalog query: columns in order, each one's place in the primary key and in
        # the replica identity index, and the table's replica identity setting.
        rows = conn.execute(
            TABLE_COLUMNS_SQL,
            (schema, table),
        ).fetchall()
        conn.commit()
        if not rows:
            return None
        # Generated columns are left out: pgoutput (before PostgreSQL 18) does not publish
        # them, and a snapshot row must have the shape of the table's stream events.
        names = tuple(r[0] for r in rows)
        self._oids[qualified] = tuple(int(r[2]) for r in rows)

        def ordered(pos: int) -> tuple[str, ...]:
            return tuple(r[0] for r in sorted((r for r in rows if r[pos] is not None), key=lambda r: r[pos]))

        pk = ordered(3)
        index = ordered(4) if rows[0][5] == ReplicaIdentity.INDEX else ()
        # The stream knows an identity index's columns in column order (pgoutput's key
        # flags), so the event key lists them so; the chunk key keeps the index's order.
        identity = identity_columns(names, pk, tuple(c for c in names if c in index))
        self._pk[qualified] = pk
        self._not_null_keys[qualified] = {k for k in (pk, index) if k}
        if surrogate_key is not None:
            if surrogate_key not in names:
                raise SignalError(
                    f"surrogate key {surrogate_key!r} is not a column of {qualified}",
                    hint=f"columns are: {', '.join(names)}",
                )
            key: tuple[str, ...] = (surrogate_key,)
        else:
            key = pk or index
        return TableInfo(schema, table, names, tuple(r[1] for r in rows), key, identity)

    # -- read-only queries ----------------------------------------------------------
    def _read_only(
        self, query: sql.Composed | sql.SQL, params: list[Any],
        conn: psycopg.Connection[Any] | None = None, snapshot: str | None = None,
    ) -> list[tuple[Any, ...]]:
        """``query`` in a READ ONLY transaction on ``conn`` (the reader's own by
        default); with ``snapshot`` (an exported snapshot id) it reads exactly what that
        snapshot saw (REPEATABLE READ, ``SET TRANSACTION SNAPSHOT``)."""
        # No parameters: psycopg then sends the text as is, so a '%' in a column
        # name or a filter (LIKE 'a%') is not taken for a placeholder. binary=True makes
        # psycopg send it by the extended protocol (PQsendQueryParams), which runs
        # exactly one statement: a filter holding "...; COMMIT; DELETE ..." is refused
        # instead of leaving the READ ONLY transaction (the simple protocol, used for a
        # text result without parameters, runs them all). Every column read here is
        # text or an integer, whose binary forms load to the same values.
        def run(c: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
            return c.execute(query, params or None, binary=True).fetchall()

        return self._run_read_only(run, conn, snapshot)

    def _run_read_only(
        self, run: Callable[[psycopg.Connection[Any]], _R],
        conn: psycopg.Connection[Any] | None = None, snapshot: str | None = None,
    ) -> _R:
        """``run(conn)`` in a READ ONLY transaction (``_read_only``), its errors named."""
        conn = conn or self.conn
        timeout = self.cfg.snapshot.statement_timeout_ms
        try:
            with conn.transaction():
                if snapshot is not None:
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
                return run(conn)
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            raise SignalError(f"a snapshot filter tried to write: {str(exc).strip()}") from None
        except psycopg.errors.SyntaxError as exc:
            if "multiple commands" in str(exc):
                raise SignalError(
                    "a snapshot filter must be one SQL condition: it holds several "
                    "statements (a ';'), and was not run",
                    hint="remove the ';' and what follows it from the filter",
                ) from None
            raise SignalError(f"invalid snapshot query/filter: {str(exc).strip().splitlines()[0]}") from None
        except (psycopg.errors.UndefinedColumn,
                psycopg.errors.UndefinedFunction, psycopg.errors.DatatypeMismatch,
                psycopg.errors.InvalidTextRepresentation) as exc:
            raise SignalError(f"invalid snapshot query/filter: {str(exc).strip().splitlines()[0]}") from None
        except psycopg.errors.QueryCanceled as exc:
            raise SourceError(
                f"chunk query exceeded statement_timeout ({timeout} ms): {str(exc).strip()}",
                hint="lower [snapshot] chunk_size or raise [snapshot] statement_timeout_ms",
            ) from None

    def check_filter(self, info: TableInfo, condition: str) -> None:
        """Refuses a filter that is not one read-only condition (a syntax error, an
        unknown column, a write, several statements), naming it."""
        try:
            self._read_only(
                sql.SQL("SELECT 1 FROM {} WHERE ({}) LIMIT 0").format(
                    sql.Identifier(info.schema, info.table), sql.SQL(condition)
                ),
                [],
            )
        except SignalError as exc:
            raise SignalError(f"snapshot filter {condition!r} of {info.qualified} refused: {exc.message}",
                              hint=exc.hint) from None

    def _key_param(self, info: TableInfo, col: str, value: Any) -> sql.Composable:
        typ = info.types[info.columns.index(col)]
        if typ == "bytea":
            return sql.SQL("decode({}, 'base64')").format(sql.Literal(str(value)))
        if isinstance(value, list) and typ.endswith("[]"):
            return _array_literal(value, typ)
        return sql.SQL("{}::{}").format(sql.Literal(_text_of(value)), sql.SQL(typ))

    def _tuple(self, info: TableInfo, key: tuple[Any, ...]) -> sql.Composable:
        return sql.SQL("({})").format(
            sql.SQL(", ").join(self._key_param(info, c, v) for c, v in zip(info.key, key, strict=True))
        )

    def _cols(self, info: TableInfo) -> sql.Composable:
        return sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in info.key))

    def _nullable(self, info: TableInfo) -> bool:
        """A surrogate key may hold NULLs; a primary key or a replica identity index never
        does. Those get the plain index order (a btree scan, no sort); surrogate keys
        NULLS FIRST."""
        return info.key not in self._not_null_keys.get(info.qualified, ())

    def _order(
        self, info: TableInfo, desc: bool = False, names: tuple[str, ...] | None = None,
        prefix: str = "",
    ) -> sql.Composable:
        """ORDER BY of the chunk key (``names``: the key's columns under other names)."""
        if not self._nullable(info):
            suffix = sql.SQL(" DESC" if desc else "")
        else:
            suffix = sql.SQL(" DESC NULLS LAST" if desc else " NULLS FIRST")
        return sql.SQL(", ").join(
            sql.SQL("{}{}{}").format(sql.SQL(prefix), sql.Identifier(c), suffix)
            for c in (names or info.key)
        )

    def _after(self, info: TableInfo, after: tuple[Any, ...] | None) -> sql.Composable:
        if after is None:
            return sql.SQL("true")
        if any(v is None for v in after):
            # Only a single nullable surrogate key can hold NULL: past the NULL group.
            return sql.SQL("{} IS NOT NULL").format(sql.Identifier(info.key[0]))
        return sql.SQL("{} > {}").format(self._cols(info), self._tuple(info, after))

    def max_key(self, info: TableInfo, condition: str | None) -> tuple[Any, ...] | None:
        if info.qualified not in self._oids:
            self.table_info(info.qualified)
        where = sql.SQL(condition) if condition else sql.SQL("true")
        query = sql.SQL("SELECT {} FROM {} WHERE ({}) ORDER BY {} LIMIT 1").format(
            self._select_list(info, info.key),
            sql.Identifier(info.schema, info.table),
            where,
            self._order(info, desc=True),
        )
        rows = self._read_only(query, [])
        if not rows:
            return None
        return self._map_key(info, rows[0])

    def _select_list(self, info: TableInfo, columns: tuple[str, ...]) -> sql.Composable:
        assert self._types is not None
        oids = self._oids[info.qualified]
        conn = self.conn
        # Aliased: an output column named like the table's column would win over it in
        # ORDER BY, which would then sort by the text form.
        return sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(
                sql.SQL(
                    self._types.text_expr(
                        sql.Identifier(c).as_string(conn), oids[info.columns.index(c)]
                    )
                ),
                sql.Identifier(f"_dblog_{i}"),
            )
            for i, c in enumerate(columns)
        )

    def _map_key(self, info: TableInfo, raw: tuple[Any, ...]) -> tuple[Any, ...]:
        assert self._types is not None
        oids = self._oids[info.qualified]
        out = []
        for c, v in zip(info.key, raw, strict=True):
            oid = oids[info.columns.index(c)]
            out.append(None if v is None else self._types.converter(oid)(v))
        return tuple(out)

    def read_chunk(
        self,
        info: TableInfo,
        after: tuple[Any, ...] | None,
        max_key: tuple[Any, ...],
        limit: int,
        condition: str | None,
    ) -> list[EncodedRow] | EncodedChunk:
        assert self._types is not None
        if info.qualified not in self._oids:
            self.table_info(info.qualified)
        if any(v is None for v in max_key):
            upper: sql.Composable = sql.SQL("true")
        elif self._nullable(info):  # NULLs sort first: they are below any max key
            upper = sql.SQL("({} <= {} OR {} IS NULL)").format(
                self._cols(info), self._tuple(info, max_key), sql.Identifier(info.key[0])
            )
        else:
            upper = sql.SQL("{} <= {}").format(self._cols(info), self._tuple(info, max_key))
        where = sql.SQL("{} AND {} AND ({})").format(
            self._after(info, after), upper,
            sql.SQL(condition) if condition else sql.SQL("true"),
        )
        plan = self._plan(info)
        if plan.bulk is not None:
            splittable = not self._in_fenced_read or self._shared_snapshot is not None
            if splittable and not self._nullable(info) and limit >= 2 * MIN_SUB_ROWS:
                pool = self.subreads
                if pool.split(limit) > 1:
                    return self._read_split(info, plan, plan.bulk, after, upper, condition, limit)
            return self._read_bulk(info, plan, plan.bulk, where, limit)
        rows = self._read_only(plan.query(where, limit=limit), [])
        if len(rows) == limit and self._nullable(info):
            # A surrogate key may repeat: extend the chunk to the end of the last key group.
            rows = self._read_only(
                plan.query(self._group_end(info, where, rows[-1][plan.key_text_index])), []
            )
        decode = plan.decode
        assert decode is not None
        return [decode(r) for r in rows]

    def read_keys(
        self, info: TableInfo, keys: Sequence[tuple[Any, ...]]
    ) -> list[EncodedRow] | EncodedChunk:
        """The rows of these identities (``info.key``), in key order (a key re-read)."""
        assert self._types is not None
        if info.qualified not in self._oids:
            self.table_info(info.qualified)
        if not keys:
            return []
        where = sql.SQL("{} IN ({})").format(
            self._cols(info), sql.SQL(", ").join(self._tuple(info, k) for k in keys)
        )
        plan = self._plan(info)
        if plan.bulk is not None:
            return self._read_bulk(info, plan, plan.bulk, where, None)
        decode = plan.decode
        assert decode is not None
        return [decode(r) for r in self._read_only(plan.query(where), [])]

    def _read_bulk(
        self, info: TableInfo, plan: _ChunkPlan, bulk: _Bulk, where: sql.Composable,
        limit: int | None,
    ) -> EncodedChunk:
        """The chunk as one result row: PostgreSQL joins the rows' texts itself."""
        count, keys, tails = self._bulk_read(plan, where, limit)
        if limit is not None and count == limit and self._nullable(info):
            last = orjson.loads(keys.rpartition("\n")[2])
            text = None if last is None else str(last)
            count, keys, tails = self._bulk_read(plan, self._group_end(info, where, text), None)
        # string_agg of no rows is NULL
        return EncodedChunk(count, tails or "", keys or "", bulk.decode_key, bulk.arity,
                            int_keys=bulk.int_keys)

    def _read_split(
        self, info: TableInfo, plan: _ChunkPlan, bulk: _Bulk, after: tuple[Any, ...] | None,
        upper: sql.Composable, condition: str | None, limit: int,
    ) -> EncodedChunk:
        """One chunk read as ``k`` sub-ranges at once (see ``sources.postgres.parallel``
        for why this keeps the window exact)."""
        pool = self.subreads
        k = pool.split(limit)
        step = limit // k
        cond = sql.SQL(condition) if condition else sql.SQL("true")
        where = sql.SQL("{} AND {} AND ({})").format(self._after(info, after), upper, cond)
        # k - 1 boundaries, each below the chunk's last row (step·(k-1) < limit)
        keys = self._step_keys(info, after, sql.SQL("{} AND ({})").format(upper, cond), step, k - 1)
        if not keys:  # fewer than one step of rows left
            return self._read_bulk(info, plan, bulk, where, limit)
        lows: list[tuple[Any, ...] | None] = [after, *keys]
        parts: list[Callable[[psycopg.Connection[Any] | None], tuple[Any, ...]]] = []
        for i, low in enumerate(lows):
            if i < len(keys):
                top = sql.SQL("{} <= {}").format(self._cols(info), self._tuple(info, keys[i]))
                part = sql.SQL("{} AND {} AND ({})").format(self._after(info, low), top, cond)
                part_limit: int | None = None
            else:
                part = sql.SQL("{} AND {} AND ({})").format(self._after(info, low), upper, cond)
                part_limit = limit - len(keys) * step
            parts.append(functools.partial(
                self._sub_read, plan, part, part_limit, self._shared_snapshot))
        results = pool.run(parts)
        last_limit = limit - len(keys) * step
        total = sum(r[0] for r in results)
        if results[-1][0] == last_limit and total < limit:  # deletes since the boundaries
            last_key = bulk.decode_key(orjson.loads(results[-1][1].rpartition("\n")[2]))
            part = sql.SQL("{} AND {} AND ({})").format(self._after(info, last_key), upper, cond)
            results.append(self._bulk_read(plan, part, limit - total))
        filled = [r for r in results if r[0]]
        return EncodedChunk(
            sum(r[0] for r in filled), join_tails([r[2] for r in filled]),
            "\n".join(r[1] for r in filled), bulk.decode_key, bulk.arity, int_keys=bulk.int_keys,
        )

    def _sub_read(
        self, plan: _ChunkPlan, where: sql.Composable, limit: int | None, snapshot: str | None,
        conn: psycopg.Connection[Any] | None,
    ) -> tuple[int, str, str | TailBlocks]:
        """One sub-range; on a pool connection (``conn``) in a read-only chunk with the
        chunk's exported ``snapshot``, so that the read's fence holds for every row."""
        return self._bulk_read(plan, where, limit, conn, snapshot if conn is not None else None)

    def _bulk_read(
        self, plan: _ChunkPlan, where: sql.Composable, limit: int | None,
        conn: psycopg.Connection[Any] | None = None, snapshot: str | None = None,
    ) -> tuple[int, str, str | TailBlocks]:
        """A bulk plan's rows ``where`` (at most ``limit``) as ``(count, keys, tails)``,
        in key order: by the native encoder where the plan has one (``native``), else
        as the one result row of the SQL fast path."""
        spec = plan.native_spec
        if spec is not None and self.native:
            query = plan.copy(where, limit=limit).as_string(conn or self.conn)
            try:
                return self._run_read_only(
                    lambda c: native.copy_chunk(c, query, spec), conn, snapshot)
            except native.Unencodable as exc:
                log.info("native chunk encoder: %s; this chunk takes the SQL path", exc)
        ((count, keys, tails, *ords),) = self._read_only(
            plan.query(where, limit=limit), [], conn, snapshot)
        return _in_key_order(plan.check, int(count), keys or "", tails or "", ords)

    def _group_end(self, info: TableInfo, where: sql.Composable, last: str | None) -> sql.Composable:
        """``where`` extended to the end of the group of the (surrogate) key text ``last``."""
        k = info.key[0]
        typ = info.types[info.columns.index(k)]
        group = (
            sql.SQL("{} IS NULL").format(sql.Identifier(k))
            if last is None
            else sql.SQL("({} IS NULL OR {} <= {}::{})").format(
                sql.Identifier(k), sql.Identifier(k), sql.Literal(last), sql.SQL(typ)
            )
        )
        return sql.SQL("{} AND {}").format(where, group)

    def _plan(self, info: TableInfo) -> _ChunkPlan:
        """The chunk query's shape and row decoder, cached per column list and chunk key.

        Where every column has a ``TypeRegistry.json_text_expr``, PostgreSQL writes each
        row's JSON text (and the key's) and joins a whole chunk into one result row (an
        ``EncodedChunk``); otherwise every column is selected as text and a generated
        encoder builds the JSON per row. Either way
        the event key is the table's row identity (``TableInfo.identity``), as the
        stream's events of the table have it.
        """
        assert self._types is not None
        oids = self._oids[info.qualified]
        cache_key = (info.qualified, info.columns, oids, info.key, info.identity)
        plan = self._plans.get(cache_key)
        if plan is None:
            plan = self._plans[cache_key] = self._build_plan(info, oids)
        return plan

    def _build_plan(self, info: TableInfo, oids: tuple[int, ...]) -> _ChunkPlan:
        types = self._types
        assert types is not None
        conn = self.conn
        ident_idx = tuple(info.columns.index(c) for c in info.identity or info.columns)
        key_idx = tuple(info.columns.index(c) for c in info.key)
        table = sql.Identifier(info.schema, info.table)
        order = self._order(info)
        quoted = [sql.Identifier(c).as_string(conn) for c in info.columns]
        json_exprs = [types.json_text_expr(q, o) for q, o in zip(quoted, oids, strict=True)]
        # The event key must be byte for byte the stream's (orjson's) text: consumers
        # compare key texts. PostgreSQL prints floats differently (1.5e-07 vs 1.5e-7),
        # so an identity with a "dumps" column (floats, json) takes the text path.
        canonical_key = all(types.fragment(oids[i])[0] != "dumps" for i in ident_idx)
        if self.fast_json and canonical_key and all(e is not None for e in json_exprs):

            def obj(indexes: tuple[int, ...]) -> list[str | sql.Composable]:
                """The pieces of the JSON object text of these columns: literal texts
                and each column's JSON text expression."""
                if not indexes:
                    return ["{}"]
                parts: list[str | sql.Composable] = []
                for n, i in enumerate(indexes):
                    parts.append(("{" if n == 0 else ",") + encode_basestring(info.columns[i]) + ":")
                    parts.append(sql.SQL("coalesce({}, 'null')").format(sql.SQL(str(json_exprs[i]))))
                parts.append("}")
                return parts

            # One row per chunk: the keys and the row tails, each joined by newlines in
            # key order. PostgreSQL 16+ is told so (ORDER BY inside the aggregates, free
            # there: the subquery's sorted output is recognised as presorted). Before 16
            # that ORDER BY sorts again (2.2-2.4x slower chunk queries on 15), and SQL
            # does not promise that a plain aggregate takes its input in the sorted
            # subquery's order, so the client checks it (``_in_key_order``): a single
            # NOT NULL integer key by its values, any other key by the rows' ordinals
            # in key order (a row_number() beside the subquery's ORDER BY).
            key_json = [self._key_json(quoted[i], oids[i]) for i in key_idx]
            if len(key_json) == 1:
                key_expr = key_json[0]
            else:
                key_expr = sql.SQL("('[' || {} || ']')").format(sql.SQL(" || ',' || ").join(key_json))
            tail = _concat([*obj(ident_idx), TAIL_SEP, *obj(tuple(range(len(info.columns)))), "}"])
            inner = sql.SQL("{} AS _dblog_k, {} AS _dblog_t").format(key_expr, tail)
            agg_order = ""
            extra_agg = ""
            int_key = len(key_idx) == 1 and types.converter(oids[key_idx[0]]) is int
            check = "" if self.ordered_agg else (
                "keys" if int_key and not self._nullable(info) else "ordinals"
            )
            if check == "ordinals":
                inner = sql.SQL(
                    "{}, row_number() OVER (ORDER BY {} ROWS UNBOUNDED PRECEDING) AS _dblog_n"
                ).format(inner, order)
                extra_agg = ", string_agg(_dblog_n::text, ',')"
            if self.ordered_agg:
                names = tuple(f"_dblog_o{n}" for n in range(len(key_idx)))
                inner = sql.SQL("{}, {}").format(inner, sql.SQL(", ").join(
                    sql.SQL("{} AS {}").format(sql.SQL(quoted[i]), sql.Identifier(o))
                    for i, o in zip(key_idx, names, strict=True)
                ))
                agg_order = " ORDER BY " + self._order(info, names=names).as_string(conn)
            head = sql.SQL("SELECT {} FROM {} WHERE ").format(inner, table)
            outer = sql.SQL(
                f"SELECT count(*), string_agg(_dblog_k, E'\\n'{agg_order}), "
                f"string_agg(_dblog_t, E'\\n'{agg_order}){extra_agg} FROM ({{}}) _dblog_s"
            )
            converters = tuple(types.converter(oids[i]) for i in key_idx)
            codes = [native.type_code(types, o) for o in oids]
            spec: native.NativeSpec | None = None
            copy_head: sql.Composable | None = None
            if all(c is not None for c in codes):
                pieces: list[str | int] = []
                for piece_list, idx in ((ident_idx, 0), (tuple(range(len(info.columns))), 1)):
                    if not piece_list:
                        pieces.append("{}")
                    for n, i in enumerate(piece_list):
                        pieces += [("{" if n == 0 else ",") + encode_basestring(info.columns[i]) + ":", i]
                    if piece_list:
                        pieces.append("}")
                    pieces.append(TAIL_SEP if idx == 0 else "}")
                spec = native.build_spec(
                    [c for c in codes if c is not None], key_idx,
                    [types.converter(oids[i]) is int for i in key_idx], pieces,
                )
                copy_head = sql.SQL("SELECT {} FROM {} WHERE ").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in info.columns), table
                )
            return _ChunkPlan(head, order, 0, None, _bulk(converters), outer, check,
                              copy_head, spec)
        select = self._select_list(info, info.columns)
        head = sql.SQL("SELECT {} FROM {} WHERE ").format(select, table)
        encoder = compile_encoder(
            info.columns, tuple(types.fragment(o) for o in oids), key_idx, ident_idx
        )
        return _ChunkPlan(head, order, key_idx[0] if key_idx else 0, encoder)

    def read_chunk_fenced(
        self,
        info: TableInfo,
        after: tuple[Any, ...] | None,
        max_key: tuple[Any, ...],
        limit: int,
        condition: str | None,
    ) -> tuple[list[EncodedRow] | EncodedChunk, PgXidFence | PgLsnFence]:
        """``read_chunk`` in one REPEATABLE READ transaction, with the fence of its
        snapshot (``sources.postgres.fences``). Writes nothing; on a hot standby too."""
        return self._fenced(
            info, limit, lambda: self.read_chunk(info, after, max_key, limit, condition)
        )

    def read_keys_fenced(
        self, info: TableInfo, keys: Sequence[tuple[Any, ...]]
    ) -> tuple[list[EncodedRow] | EncodedChunk, PgXidFence | PgLsnFence]:
        """``read_keys`` (a key re-read) fenced as ``read_chunk_fenced`` is."""
        return self._fenced(info, 0, lambda: self.read_keys(info, keys))

    def max_key_fenced(
        self, info: TableInfo, condition: str | None
    ) -> tuple[tuple[Any, ...] | None, PgXidFence | PgLsnFence]:
        """``max_key`` fenced as ``read_chunk_fenced`` is (a read-only table start)."""
        return self._fenced(info, 0, lambda: self.max_key(info, condition))

    def _fenced(
        self, info: TableInfo, limit: int, read: Callable[[], _R]
    ) -> tuple[_R, PgXidFence | PgLsnFence]:
        """``read()`` in one REPEATABLE READ transaction, and the fence of its snapshot
        (``limit``: the rows it may read, whether parallel sub-reads may share it)."""
        conn = self.conn
        if info.qualified not in self._oids:
            self.table_info(info.qualified)  # (commits: not inside the transaction below)
        split = limit >= 2 * MIN_SUB_ROWS
        pool = self.subreads if split else None  # created (it asks the server) before
        # Before the read's snapshot: on a standby what it had replayed, on a primary
        # the running transactions (``fences`` module docstring).
        standby, low, running, committing = self._before_fence()
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            # The snapshot is taken when this statement starts; the insert position is
            # read while it runs, so after the snapshot.
            row = conn.execute(
                f"SELECT {snapshot_sql(self.server_version)[0]}::text, "
                "CASE WHEN pg_is_in_recovery() THEN NULL "
                "ELSE pg_current_wal_insert_lsn()::text END"
            ).fetchone()
            assert row is not None
            self._in_fenced_read = True
            if not standby and pool is not None and pool.split(limit) > 1:
                # Parallel sub-reads share this snapshot (a standby cannot export one).
                exported = conn.execute("SELECT pg_export_snapshot()").fetchone()
                self._shared_snapshot = exported[0] if exported else None
            try:
                rows = read()
            finally:
                self._in_fenced_read = False
                self._shared_snapshot = None
            # After the read: past every commit its snapshot can see (they were
            # replayed). Received WAL can be behind replay (after a restart the
            # walreceiver starts again at the replay point's segment, and it is NULL
            # while a standby replays archived or local WAL without streaming): the
            # greater of the two (GREATEST skips a NULL).
            end = self._lsn(
                "GREATEST(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())",
                commit=False) if standby else None
        if not standby:
            return rows, PgXidFence.parse(row[0], row[1], running, committing)
        if row[1] is not None:
            # Promoted between ``_before_fence`` and the snapshot (out of recovery when
            # the first statement ran): the snapshot may see commits after the promotion,
            # past ``end`` (the replay position, static since): read again, as a
            # primary's read (docs/snapshots.md, "Promotion").
            return self._fenced(info, limit, read)
        if low is None or end is None:
            raise SourceError(
                "read-only snapshots on a standby need a hot standby that has replayed "
                "WAL: pg_last_wal_replay_lsn() returned NULL",
                hint="read chunks from a hot standby, or from the primary",
            )
        return rows, PgLsnFence(low, end)

    def wait_replayed(self, position: Position) -> bool:
        """``ports.ReplayWaiter``: on a hot standby, poll ``pg_last_wal_replay_lsn()``
        until it is past ``position``'s commit record (what ``PgLsnFence.covers`` asks
        of the read's ``low``), at most ``REPLAY_WAIT_S``; at once on a primary."""
        if not isinstance(position, PgPosition):
            return True
        target = position.commit_lsn.value
        deadline = time.monotonic() + REPLAY_WAIT_S
        conn = self.conn
        while True:
            row = conn.execute(
                "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text"
            ).fetchone()
            conn.commit()
            assert row is not None
            standby, replayed = row
            if not standby or (replayed is not None and Lsn.parse(replayed).value > target):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(REPLAY_POLL_S)

    def _before_fence(self) -> tuple[bool, int | None, list[int], list[int] | None]:
        """(in recovery, replayed LSN on a standby, running and committing xids on a
        primary with synchronous standbys; ``fences.RUNNING_SQL``). Raises
        ``fences.stats_grant_error`` where the role cannot see other roles' wait states."""
        conn = self.conn
        row = conn.execute(
            f"SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text, {SYNC_COLUMNS}"
        ).fetchone()
        assert row is not None
        standby, replayed, sync, stats, user = row
        if standby:
            conn.commit()
            return True, None if replayed is None else Lsn.parse(replayed).value, [], None
        if not sync:
            conn.commit()
            return False, None, [], []
        if not stats:
            conn.rollback()
            raise stats_grant_error(str(user))
        rows = conn.execute(running_sql(self.server_version)).fetchall()
        conn.commit()
        return False, None, [int(r[0]) for r in rows], [int(r[0]) for r in rows if r[1]]

    def _lsn(self, function: str, *, commit: bool) -> int | None:
        """An LSN function's value (None for NULL); ``commit`` ends the implicit
        transaction it ran in (False inside an open ``transaction()`` block)."""
        conn = self.conn
        row = conn.execute(f"SELECT {function}::text").fetchone()
        if commit:
            conn.commit()
        return None if row is None or row[0] is None else Lsn.parse(row[0]).value

    def _key_json(self, quoted: str, oid: int) -> sql.Composable:
        """A chunk key column as JSON text: integers as numbers, anything else as the
        JSON string of the text its converter reads; NULL as null."""
        assert self._types is not None
        if self._types.converter(oid) is int:
            return sql.SQL("coalesce({}::text, 'null')").format(sql.SQL(quoted))
        return sql.SQL("coalesce(to_json({})::text, 'null')").format(
            sql.SQL(self._types.text_expr(quoted, oid))
        )

    def write_watermark(self, watermark_id: str) -> None:
        conn = self.writer
        if self.cfg.snapshot.watermark == "message":
            conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (WATERMARK_PREFIX, watermark_id))
        else:
            schema, table = split_name(self.cfg.snapshot.watermark_table)
            conn.execute(
                sql.SQL("UPDATE {} SET value = %s WHERE id = 1").format(sql.Identifier(schema, table)),
                (watermark_id,),
            )

    def close(self) -> None:
        for child in self._forks:
            child.close()
        self._forks.clear()
        if self._subreads is not None:
            self._subreads.close()
            self._subreads = None
        for conn in (self._conn, self._wconn):
            closing.close(conn)  # never freed under a read in progress on another thread
        self._conn = self._wconn = None


def _text_of(value: Any) -> str:
    """A key value (as events carry it) as the text its SQL type reads."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return orjson.dumps(value).decode()
    return str(value)


def _array_literal(value: list[Any], typ: str) -> sql.Composable:
    """An array key value (a JSON list, possibly nested, NULL elements as None) as
    ``ARRAY[...]::typ``: a JSON list is not an array literal (the second chunk of a
    table keyed by an array failed)."""
    elem = typ[:-2]

    def build(items: list[Any]) -> sql.Composable:
        parts: list[sql.Composable] = []
        for v in items:
            if isinstance(v, list):
                parts.append(build(v))
            elif v is None:
                parts.append(sql.SQL("NULL::{}").format(sql.SQL(elem)))
            else:
                parts.append(sql.SQL("{}::{}").format(sql.Literal(_text_of(v)), sql.SQL(elem)))
        return sql.SQL("ARRAY[{}]").format(sql.SQL(", ").join(parts))

    if not value:
        return sql.SQL("'{{}}'::{}").format(sql.SQL(typ))
    return sql.SQL("{}::{}").format(build(value), sql.SQL(typ))


def _concat(pieces: Sequence[str | sql.Composable]) -> sql.Composable:
    """``pieces`` joined by ``||``, adjacent literal texts merged into one literal (every
    ``||`` is a function call per row: a row of n columns has 2n + 1 of them, not 2n + 5)."""
    merged: list[str | sql.Composable] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    return sql.SQL("({})").format(sql.SQL(" || ").join(
        sql.Literal(p) if isinstance(p, str) else p for p in merged
    ))


@functools.lru_cache(maxsize=16)
def _ordinals(count: int) -> str:
    """``"1,2,...,count"``: what a bulk chunk's ordinals are when its rows are in order."""
    return ",".join(map(str, range(1, count + 1)))


def _in_key_order(
    check: str, count: int, keys: str, tails: str, ords: list[Any]
) -> tuple[int, str, str]:
    """A bulk chunk's joined keys and tails, made sure to be in key order.

    ``check`` (``_ChunkPlan.check``): "" - the aggregates were ordered by the key (the
    order is guaranteed); "keys" - a single NOT NULL integer key, whose values give the
    order; "ordinals" - ``ords[0]`` joins each row's ``row_number()`` in key order, in
    the order the aggregate took the rows. If the aggregate took them out of order
    (PostgreSQL before 16 does not promise it), the rows are sorted here."""
    if not check or count < 2:
        return count, keys, tails
    if check == "keys":
        rank: list[int] = orjson.loads(f"[{keys.replace(chr(10), ',')}]")
        if rank == sorted(rank):
            return count, keys, tails
    else:
        text = ords[0] if ords else None
        if text == _ordinals(count):
            return count, keys, tails
        rank = [int(n) for n in (text or "").split(",")]
    log.info("a chunk's aggregate took its rows out of key order: sorting %d rows", count)
    order = sorted(range(count), key=rank.__getitem__)
    key_lines, tail_lines = keys.split("\n"), tails.split("\n")
    return (count, "\n".join([key_lines[i] for i in order]),
            "\n".join([tail_lines[i] for i in order]))


@dataclass(frozen=True, slots=True)
class _ChunkPlan:
    """A table's chunk query, ``head WHERE-clause ORDER BY order [LIMIT n]``, and
    the decoder of its rows. ``key_text_index``: where the first key column's text is
    in a result row (for extending a chunk to the end of a surrogate key's group)."""

    head: sql.Composable
    order: sql.Composable
    key_text_index: int
    decode: Callable[[Any], EncodedRow] | None  # the text plan's row encoder
    bulk: _Bulk | None = None
    outer: sql.SQL | None = None  # wraps the row query: one result row per chunk
    check: str = ""  # how a bulk chunk's key order is checked (``_in_key_order``)
    copy_head: sql.Composable | None = None  # the native encoder's SELECT of the columns
    native_spec: native.NativeSpec | None = None  # ...and how it encodes them

    def copy(self, where: sql.Composable, *, limit: int | None = None) -> sql.Composed:
        """The native encoder's ``COPY (SELECT columns ... ORDER BY key) TO STDOUT``
        (COPY writes a query's rows in the query's order)."""
        assert self.copy_head is not None
        cap = sql.SQL(" LIMIT {}").format(sql.Literal(limit)) if limit is not None else sql.SQL("")
        return sql.SQL("COPY ({}{} ORDER BY {}{}) TO STDOUT").format(
            self.copy_head, where, self.order, cap)

    def query(self, where: sql.Composable, *, limit: int | None = None) -> sql.Composed:
        cap = sql.SQL(" LIMIT {}").format(sql.Literal(limit)) if limit is not None else sql.SQL("")
        rows = sql.SQL("{}{} ORDER BY {}{}").format(self.head, where, self.order, cap)
        return rows if self.outer is None else self.outer.format(rows)


@dataclass(frozen=True, slots=True)
class _Bulk:
    """How an ``EncodedChunk`` of a bulk plan decodes its keys."""

    decode_key: Callable[[Any], tuple[Any, ...]]
    arity: int
    int_keys: bool


def _bulk(converters: tuple[Callable[[str], Any], ...]) -> _Bulk:
    """Key lines are JSON: a number (integer columns) or the text the converter reads;
    several columns as an array of those."""
    if len(converters) == 1:
        (conv,) = converters
        if conv is int:
            return _Bulk(lambda v: (v,), 1, True)
        return _Bulk(lambda v: (None if v is None else conv(v),), 1, False)

    def many(v: list[Any]) -> tuple[Any, ...]:
        return tuple(None if x is None else c(x) for c, x in zip(converters, v, strict=True))

    return _Bulk(many, len(converters), False)
