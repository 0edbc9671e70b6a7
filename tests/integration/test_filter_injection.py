"""A snapshot filter (user text placed inside the chunk queries) can never run more
than the one read-only query it is part of: PostgreSQL receives every query that embeds
a filter by the extended protocol (one statement; ``...; COMMIT; DELETE ...`` is refused,
not run), and the read session's default_transaction_read_only is on as a second wall.
The oracle: after each attempt the server is unchanged (rows, tables, no file written by
``COPY ... TO PROGRAM``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pydblog.config import Config
from pydblog.errors import SignalError
from pydblog.ports import TableInfo
from pydblog.sources.postgres import native
from pydblog.sources.postgres.chunks import PgSnapshotReader


class _Source:
    captured_tables: tuple[str, ...] = ()


def _escape(mark: Path) -> str:
    """SQL that leaves the READ ONLY transaction and writes (a user's filter can try)."""
    return (f"COMMIT; CREATE TABLE pwned AS SELECT 1 AS x; DELETE FROM victim WHERE id = 2; "
            f"COPY (SELECT 'owned') TO PROGRAM 'touch {mark}'; BEGIN READ ONLY")


# Each one closes the query it is placed in so that the whole text parses as several
# statements (simple protocol), then reopens a query the reader's suffix completes.
FILTERS = {
    "check_filter": "true) LIMIT 0; {escape}; SELECT 1 FROM victim WHERE (true",
    "max_key": "true) LIMIT 0; {escape}; SELECT id::text FROM victim WHERE (true",
    "read_chunk_sql": "true) LIMIT 0; {escape}; SELECT 1 FROM victim WHERE (true",
    "read_chunk_native": "true) ORDER BY id) TO STDOUT; {escape}; COPY (SELECT id FROM victim WHERE (true",
    "chunk_bounds": "true) LIMIT 0; {escape}; SELECT id::text FROM victim WHERE id > 0 AND (true",
}


@pytest.fixture(scope="module")
def db(pg_cluster: Any) -> Iterator[str]:
    yield pg_cluster.create_database("filter_injection")


@pytest.fixture
def reader(db: str, tmp_path: Path) -> Iterator[PgSnapshotReader]:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS victim, pwned")
        conn.execute("CREATE TABLE victim (id int PRIMARY KEY, t text)")
        conn.execute("INSERT INTO victim VALUES (1, 'a'), (2, 'b')")
    cfg = Config.model_validate({"source": {"dsn": db}, "log": {"path": str(tmp_path / "log")}})
    r = PgSnapshotReader(cfg, _Source())  # type: ignore[arg-type]
    try:
        yield r
    finally:
        r.close()


def _attempt(reader: PgSnapshotReader, info: TableInfo, how: str, condition: str) -> None:
    if how == "check_filter":
        reader.check_filter(info, condition)
    elif how == "max_key":
        reader.max_key(info, condition)
    elif how == "chunk_bounds":
        reader.chunk_bounds(info, None, (2,), 1, 1, condition)
    else:
        if how == "read_chunk_native" and native.encoder() is None:
            pytest.skip("native encoder not built")
        reader.native = how == "read_chunk_native"
        reader.read_chunk(info, None, (2,), 10, condition)


@pytest.mark.parametrize("how", sorted(FILTERS))
def test_a_filter_holding_several_statements_is_refused_and_changes_nothing(
    db: str, reader: PgSnapshotReader, how: str
) -> None:
    # where the server's own user may write (not pytest's private tmp directory)
    mark = Path(f"/tmp/pydblog-filter-injection-{uuid.uuid4().hex}")
    condition = FILTERS[how].format(escape=_escape(mark))
    info = reader.table_info("public.victim")
    assert info is not None
    # (the SQL path's bulk query nests the filter in a subquery: a syntax error there)
    with pytest.raises(SignalError, match=r"several statements|invalid snapshot query/filter") as caught:
        _attempt(reader, info, how, condition)
    if how == "check_filter":  # what the user is told names the filter
        assert condition in str(caught.value)
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT id, t FROM victim ORDER BY id").fetchall() == [(1, "a"), (2, "b")]
        assert conn.execute("SELECT to_regclass('pwned')").fetchone() == (None,)
    assert not mark.exists()
    # the reader goes on working
    reader.native = native.encoder() is not None
    chunk = reader.read_chunk(info, None, (2,), 10, "t <> 'zz'")
    assert len(chunk) == 2


def test_the_read_session_defaults_to_read_only(reader: PgSnapshotReader) -> None:
    """The second wall: a transaction begun on the read connection by any means is
    read-only (``SET default_transaction_read_only = on``)."""
    conn = reader.conn
    conn.autocommit = True
    try:
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE pwned (x int)")
    finally:
        conn.autocommit = False
