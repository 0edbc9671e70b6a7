"""The chunk reader's side of concurrent windows (``ports.ConcurrentReader``): boundary
keys by keyset ``LIMIT 1 OFFSET`` queries, forks on their own connections, the default
parallelism; against MariaDB and MySQL 5.7."""

from __future__ import annotations

from typing import Any

import pytest

from pydblog.devtools.mysql57 import TestServer
from pydblog.ports import ConcurrentReader, TableInfo
from pydblog.sources.mysql.chunks import MySqlSnapshotReader
from tests.mysql.helpers import make


def _keys(reader: MySqlSnapshotReader, info: TableInfo, condition: str | None = None) -> list[tuple[Any, ...]]:
    top = reader.max_key(info, condition)
    assert top is not None
    rows = reader.read_chunk(info, None, top, 10**6, condition)
    return [tuple(r[k] for k in info.key) for r in rows]


def _read_ranges(
    reader: MySqlSnapshotReader, info: TableInfo, bounds: list[tuple[Any, ...]],
    top: tuple[Any, ...],
) -> list[tuple[Any, ...]]:
    """Every row read range by range, ``(None, b1], (b1, b2], ..., (bn, top]``."""
    out: list[tuple[Any, ...]] = []
    after: tuple[Any, ...] | None = None
    for upper in [*bounds, top]:
        rows = reader.read_chunk(info, after, upper, 10**6, None)
        out.extend(tuple(r[k] for k in info.key) for r in rows)
        after = upper
    return out


def test_bounds_on_a_composite_key(server: TestServer, db: str) -> None:
    """Composite key of INT, case-insensitive VARCHAR and BINARY: the bounds are the
    step-th, 2·step-th, ... keys in the server's order, usable as range edges (as
    ``after`` and as an upper bound) without gap or overlap."""
    server.execute(
        "CREATE TABLE t (a INT, b VARCHAR(10), c BINARY(2), n INT, PRIMARY KEY (a, b, c))", db
    )
    values = ", ".join(
        f"({a}, '{b}', x'{c:04x}', {a * 100 + i * 10 + c})"
        for a in range(4) for i, b in enumerate(["x", "Y", "z", "ä"]) for c in range(3)
    )
    server.execute(f"INSERT INTO t VALUES {values}", db)
    _, reader = make(server, db)
    try:
        info = reader.table_info(f"{db}.t")
        assert info is not None
        keys = _keys(reader, info)
        assert len(keys) == 48
        top = keys[-1]
        assert reader.chunk_bounds(info, None, top, 5, 4, None) == [keys[4], keys[9], keys[14], keys[19]]
        # From a key on, to the end: fewer than asked for near the max key.
        assert reader.chunk_bounds(info, keys[30], top, 5, 10, None) == [keys[35], keys[40], keys[45]]
        # The last key itself is a bound when the steps end exactly there.
        assert reader.chunk_bounds(info, keys[37], top, 5, 10, None) == [keys[42], keys[47]]
        # Bounded by an upper key below the max.
        assert reader.chunk_bounds(info, None, keys[11], 4, 10, None) == [keys[3], keys[7], keys[11]]
        assert reader.chunk_bounds(info, top, top, 1, 3, None) == []
        bounds = reader.chunk_bounds(info, None, top, 7, 100, None)
        assert _read_ranges(reader, info, bounds, top) == keys
        # A filter (with a '%' that is no placeholder) counts only its rows.
        even = _keys(reader, info, "n % 2 = 0")
        assert reader.chunk_bounds(info, None, top, 3, 100, "n % 2 = 0") == even[2::3]
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("ddl", "values"),
    [
        ("k DATETIME(6)", [f"'2024-01-01 00:00:0{i}.{i}'" for i in range(9)]),
        ("k DECIMAL(30,10)", [f"{i - 4}.000000000{i}" for i in range(9)]),
        ("k VARBINARY(8)", [f"x'{i:02x}ff'" for i in range(9)]),
    ],
)
def test_bounds_round_trip_key_types(
    server: TestServer, db: str, ddl: str, values: list[str]
) -> None:
    server.execute(f"CREATE TABLE kt ({ddl} PRIMARY KEY, n INT)", db)
    server.execute("INSERT INTO kt VALUES " + ", ".join(f"({v}, {i})" for i, v in enumerate(values)), db)
    _, reader = make(server, db)
    try:
        info = reader.table_info(f"{db}.kt")
        assert info is not None
        keys = _keys(reader, info)
        bounds = reader.chunk_bounds(info, None, keys[-1], 2, 10, None)
        assert bounds == [keys[1], keys[3], keys[5], keys[7]]
        # Each bound, handed back as ``after``, continues after it.
        assert reader.chunk_bounds(info, bounds[1], keys[-1], 2, 1, None) == [keys[5]]
        assert _read_ranges(reader, info, bounds, keys[-1]) == keys
    finally:
        reader.close()


def test_fork_reads_on_its_own_connection(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    server.execute("INSERT INTO t VALUES (1), (2), (3)", db)
    _, reader = make(server, db)
    concurrent: ConcurrentReader = reader
    try:
        child = concurrent.fork()
        assert isinstance(child, MySqlSnapshotReader)
        info = child.table_info(f"{db}.t")
        assert info is not None
        assert [r["id"] for r in child.read_chunk(info, None, (3,), 10, None)] == [1, 2, 3]
        assert reader.table_info(f"{db}.t") == info
        assert child._conn is not None and reader._conn is not None
        assert child._conn.thread_id() != reader._conn.thread_id()
        child_conn = child._conn
    finally:
        reader.close()
    assert child._conn is None and not child_conn.open  # closed with its parent


def test_parallelism_setting_and_default(server: TestServer, db: str) -> None:
    _, reader = make(server, db)
    try:
        assert 1 <= reader.parallelism() <= 4
    finally:
        reader.close()
    src_reader = MySqlSnapshotReader(
        reader.dsn, matcher=reader.matcher, own=reader.own, parallelism=3
    )
    assert src_reader.parallelism() == 3 and src_reader._conn is None  # no query needed
