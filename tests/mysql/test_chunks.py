"""The chunk reader: keyset chunks, bounds, filters, NULL surrogate keys, watermarks."""

from __future__ import annotations

from typing import Any

import pytest

from pydblog.devtools.mysql57 import TestServer
from pydblog.errors import SignalError, SourceUnavailable
from pydblog.ports import TableInfo
from pydblog.sources.mysql.chunks import MySqlSnapshotReader
from tests.mysql.helpers import changes, commits, make, read_until


def _all_chunks(
    reader: MySqlSnapshotReader, info: TableInfo, limit: int, condition: str | None = None
) -> list[list[dict[str, Any]]]:
    top = reader.max_key(info, condition)
    assert top is not None
    chunks: list[list[dict[str, Any]]] = []
    after: tuple[Any, ...] | None = None
    while True:
        rows = reader.read_chunk(info, after, top, limit, condition)
        if not rows:
            return chunks
        chunks.append(rows)
        after = tuple(rows[-1][k] for k in info.key)


def test_composite_key_chunks_bounded_by_max_key(server: TestServer, db: str) -> None:
    server.execute(
        "CREATE TABLE t (a INT, b VARCHAR(10), c BINARY(2), n INT, PRIMARY KEY (a, b, c))", db
    )
    values = ", ".join(
        f"({a}, '{b}', x'{c:04x}', {a * 10 + c})" for a in range(3) for b in "xyz" for c in range(2)
    )
    server.execute(f"INSERT INTO t VALUES {values}", db)
    _, reader = make(server, db)
    try:
        assert reader.captured_tables() == [f"{db}.t"]
        info = reader.table_info(f"{db}.t")
        assert info is not None and info.key == ("a", "b", "c")
        chunks = _all_chunks(reader, info, 4)
        rows = [r for ch in chunks for r in ch]
        assert [len(ch) for ch in chunks] == [4, 4, 4, 4, 2]
        assert [(r["a"], r["b"], r["c"]) for r in rows] == sorted(
            (r["a"], r["b"], r["c"]) for r in rows
        )
        assert len(rows) == 18
        # Rows added above the max key taken at the start are not read (the stream has them).
        top = reader.max_key(info, None)
        server.execute("INSERT INTO t VALUES (9, 'a', x'0000', 0)", db)
        assert top is not None
        last = reader.read_chunk(info, tuple(rows[-2][k] for k in info.key), top, 10, None)
        assert last == [rows[-1]]
        # Filters run inside the chunk transaction; '%' is not a placeholder.
        even = [r for ch in _all_chunks(reader, info, 5, "n % 2 = 0") for r in ch]
        assert even == [r for r in rows if r["n"] % 2 == 0] + [
            {"a": 9, "b": "a", "c": "AAA=", "n": 0}
        ]
    finally:
        reader.close()


def test_a_filter_holding_several_statements_changes_nothing(server: TestServer, db: str) -> None:
    """A filter is user text inside the chunk queries: the reader's connection does not
    ask for CLIENT.MULTI_STATEMENTS (pymysql's default), so the server refuses a text
    of several statements, whichever query the filter lands in, and nothing changes."""
    from pymysql.constants import CLIENT

    from pydblog.errors import DblogError

    server.execute("CREATE TABLE t (id INT PRIMARY KEY, n INT)", db)
    server.execute("INSERT INTO t VALUES (1, 1), (2, 2)", db)
    _, reader = make(server, db)
    try:
        info = reader.table_info(f"{db}.t")
        assert info is not None
        assert not reader._connection().client_flag & CLIENT.MULTI_STATEMENTS
        cond = ("1 = 1) LIMIT 0; COMMIT; CREATE TABLE pwned (x INT); DELETE FROM t WHERE id = 2; "
                "START TRANSACTION READ ONLY; SELECT id FROM t WHERE (1 = 1")
        for attempt in (lambda: reader.check_filter(info, cond),
                        lambda: reader.max_key(info, cond),
                        lambda: reader.read_chunk(info, None, (2,), 10, cond)):
            with pytest.raises(DblogError):
                attempt()
        assert server.execute("SELECT id, n FROM t ORDER BY id", db) == [(1, 1), (2, 2)]
        assert server.execute(
            f"SELECT count(*) FROM information_schema.tables WHERE table_schema = '{db}' "
            "AND table_name = 'pwned'") == [(0,)]
    finally:
        reader.close()


def test_check_filter(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY, n INT)", db)
    server.execute("INSERT INTO t VALUES (1, 1)", db)
    server.execute("CREATE TABLE log (x INT)", db)
    server.execute(
        "CREATE FUNCTION sneaky() RETURNS INT DETERMINISTIC MODIFIES SQL DATA "
        "BEGIN INSERT INTO log VALUES (1); RETURN 1; END",
        db,
    )
    _, reader = make(server, db)
    try:
        info = reader.table_info(f"{db}.t")
        assert info is not None
        reader.check_filter(info, "n > 0 AND id IN (1, 2)")
        with pytest.raises(SignalError, match="does not parse"):
            reader.check_filter(info, "n >")
        with pytest.raises(SignalError, match="does not parse"):
            reader.check_filter(info, "1 = 1; DELETE FROM t")
        with pytest.raises(SignalError, match="unknown column"):
            reader.check_filter(info, "nope = 1")
        with pytest.raises(SignalError, match="tries to write"):
            reader.check_filter(info, "sneaky() = 1")
        assert server.execute("SELECT COUNT(*) FROM log", db) == [(0,)]
        with pytest.raises(SignalError, match="surrogate-key 'zz' is not a column"):
            reader.table_info(f"{db}.t", "zz")
        assert reader.table_info(f"{db}.missing") is None
    finally:
        reader.close()


def test_nullable_surrogate_key_chunk_size_1(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE nk (k INT NULL, v VARCHAR(5), UNIQUE KEY (k))", db)
    server.execute(
        "INSERT INTO nk VALUES (NULL, 'n1'), (3, 'c'), (NULL, 'n2'), (1, 'a'), (2, 'b')", db
    )
    _, reader = make(server, db)
    try:
        info = reader.table_info(f"{db}.nk", "k")
        assert info is not None and info.key == ("k",)
        chunks = _all_chunks(reader, info, 1)
        assert sorted(r["v"] for r in chunks[0]) == ["n1", "n2"]  # all NULL keys at once
        assert [ch for ch in chunks[1:]] == [
            [{"k": 1, "v": "a"}],
            [{"k": 2, "v": "b"}],
            [{"k": 3, "v": "c"}],
        ]
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("ddl", "values"),
    [
        ("k DATETIME(6)", ["'2024-01-01 00:00:00'", "'2024-01-01 00:00:00.5'", "'2025-01-01'"]),
        ("k TIMESTAMP(3)", ["'2024-01-01 00:00:00'", "'2024-01-01 00:00:00.5'", "'2025-01-01'"]),
        ("k DECIMAL(30,10)", ["-1.5", "0.0000000001", "12345678901234567890.1234567891"]),
        ("k VARBINARY(8)", ["x'00'", "x'0001'", "x'ff'"]),
        ("k DATE", ["'2020-01-01'", "'2020-01-02'", "'2020-02-01'"]),
        ("k CHAR(3)", ["'a'", "'b'", "'c'"]),
    ],
)
def test_key_types_round_trip_as_bounds(
    server: TestServer, db: str, ddl: str, values: list[str]
) -> None:
    server.execute(f"CREATE TABLE kt ({ddl} PRIMARY KEY, n INT)", db)
    for i, v in enumerate(values):
        server.execute(f"INSERT INTO kt VALUES ({v}, {i})", db)
    _, reader = make(server, db)
    try:
        info = reader.table_info(f"{db}.kt")
        assert info is not None
        chunks = _all_chunks(reader, info, 1)
        assert [ch[0]["n"] for ch in chunks] == [0, 1, 2]
    finally:
        reader.close()


def test_watermark_comes_back_through_the_binlog(server: TestServer, db: str) -> None:
    src, reader = make(server, db)
    src.open(None)
    try:
        stream = src.stream()
        reader.write_watermark("wm-1")
        reader.write_watermark("wm-2")
        items = read_until(stream, commits(2))
    finally:
        src.close()
        reader.close()
    evs = changes(items)
    assert [e.qualified_table for e in evs] == ["public.dblog_watermark"] * 2
    assert [e.after["value"] for e in evs if e.after] == ["wm-1", "wm-2"]


def test_statement_timeout(server: TestServer, db: str) -> None:
    server.execute("CREATE TABLE t (id INT PRIMARY KEY)", db)
    server.execute("INSERT INTO t VALUES (1), (2), (3)", db)
    _, reader = make(server, db)
    reader.statement_timeout_ms = 50
    try:
        info = reader.table_info(f"{db}.t")
        assert info is not None
        with pytest.raises(SourceUnavailable, match="statement timeout"):
            reader.read_chunk(info, None, (3,), 10, "SLEEP(0.2) = 0")
        assert reader.read_chunk(info, None, (3,), 10, None) == [{"id": i} for i in (1, 2, 3)]
    finally:
        reader.close()
