"""The native chunk encoder (``sources.postgres.native``: COPY text encoded in C) gives
byte for byte the SQL fast path's chunks (PostgreSQL's JSON expressions): the same key
lines and row tails, for generated values of every type it encodes, NULLs, odd text
(quotes, backslashes, control characters, non-BMP), the edges of timestamps (infinity,
BC, years past 9999), numeric NaN/Infinity, float specials, json with newlines."""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydblog.config import Config
from pydblog.events import EncodedChunk, TailBlocks
from pydblog.ports import TableInfo
from pydblog.sources.postgres import native
from pydblog.sources.postgres.chunks import PgSnapshotReader

pytestmark = pytest.mark.skipif(native.encoder() is None, reason="native encoder not built")


class _Source:
    captured_tables: tuple[str, ...] = ()


COLUMNS = {
    "i2": "int2", "i4": "int4", "i8": "int8", "o": "oid", "t": "text", "vc": "varchar(20)",
    "bp": "char(5)", "nm": "name", "b": "bool", "n": "numeric", "f4": "float4", "f8": "float8",
    "ts": "timestamp", "tz": "timestamptz", "d": "date", "tm": "time", "u": "uuid", "j": "json",
    "jb": "jsonb", "by": "bytea", "ip": "inet", "ci": "cidr", "e": "mood", "iv": "interval",
    "dm": "posint", 'we"ird\\col': "text",
}

_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_ts_text = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)).map(
    lambda d: d.isoformat(sep=" ")
) | st.sampled_from([
    "infinity", "-infinity", "4713-01-01 00:00:00 BC", "0001-12-31 23:59:59.5 BC",
    "10000-01-01 00:00:00", "294276-12-31 23:59:59.999999", "2024-02-29 12:00:00.000001",
])
_zone = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))])


def _tz_text(draw: Any) -> str:
    return str(draw(st.one_of(
        st.builds(lambda d, z: d.replace(tzinfo=z).isoformat(sep=" "),
                  st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)), _zone),
        st.sampled_from(["infinity", "-infinity", "0044-03-15 12:00:00+00 BC",
                         "10000-01-01 00:00:00+00", "1999-12-31 23:59:59.1-01"]),
    )))


@st.composite
def rows(draw: Any) -> dict[str, Any]:
    def opt(strategy: st.SearchStrategy[Any]) -> Any:
        return draw(st.none() | strategy)

    return {
        "i2": opt(st.integers(-(2**15), 2**15 - 1)),
        "i4": opt(st.integers(-(2**31), 2**31 - 1)),
        "i8": opt(st.integers(-(2**63), 2**63 - 1)),
        "o": opt(st.integers(0, 2**32 - 1)),
        "t": opt(_text),
        "vc": opt(_text.map(lambda s: s[:20])),
        "bp": opt(st.text(st.sampled_from("ab é\\\"\t"), max_size=5)),
        "nm": opt(st.text(string.ascii_letters + " \"\\", max_size=10)),
        "b": opt(st.booleans()),
        "n": opt(st.decimals(allow_nan=False, allow_infinity=False)
                 | st.decimals(allow_nan=False, allow_infinity=False, places=3)
                 | st.sampled_from([Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity"),
                                    Decimal("0.000"), Decimal("1e30")])),
        "f4": opt(st.floats(width=32).map(repr)),
        "f8": opt(st.floats().map(repr)),
        "ts": opt(_ts_text),
        "tz": opt(st.just(None).map(lambda _: _tz_text(draw))),
        "d": opt(st.dates().map(date.isoformat) | st.sampled_from(["infinity", "0044-03-15 BC"])),
        "tm": opt(st.times().map(time.isoformat)),
        "u": opt(st.uuids()),
        "j": opt(st.builds(lambda v, ind: json.dumps(v, indent=ind), _json_value,
                           st.sampled_from([None, 1]))),
        "jb": opt(_json_value.map(json.dumps)),
        "by": opt(st.binary(max_size=20)),
        "ip": opt(st.ip_addresses().map(str)),
        "ci": opt(st.sampled_from(["10.0.0.0/8", "192.168.1.0/24", "::/0", "2001:db8::/32"])),
        "e": opt(st.sampled_from(["happy", 'qu"ote', "new\nline", "tab\there", "ß"])),
        "iv": opt(st.timedeltas(min_value=timedelta(days=-9999), max_value=timedelta(days=9999))),
        "dm": opt(st.integers(1, 2**31 - 1)),
        'we"ird\\col': opt(_text),
    }


@pytest.fixture(scope="module")
def db(pg_cluster: Any) -> Iterator[str]:
    name = "native_chunks"
    dsn = pg_cluster.create_database(name)
    cols = ", ".join(f"{psycopg.sql.Identifier(c).as_string()} {t}" for c, t in COLUMNS.items())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('happy', 'qu\"ote', E'new\\nline', E'tab\\there', 'ß')")
        conn.execute("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
        conn.execute(f"CREATE TABLE wide (id bigint PRIMARY KEY, {cols})")
        conn.execute("CREATE TABLE keyed (k text, b bool, c char(3), n numeric, t timestamptz, "
                     "v text, PRIMARY KEY (k, b, c, n, t))")
    yield dsn


@pytest.fixture(scope="module")
def reader(db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgSnapshotReader]:
    log = tmp_path_factory.mktemp("log")
    cfg = Config.model_validate({"source": {"dsn": db}, "log": {"path": str(Path(log) / "log")}})
    r = PgSnapshotReader(cfg, _Source())  # type: ignore[arg-type]
    try:
        yield r
    finally:
        r.close()


def _chunks(reader: PgSnapshotReader, info: TableInfo, use_native: bool, limit: int) -> list[tuple[Any, ...]]:
    reader.native = use_native
    top = reader.max_key(info, None)
    out: list[tuple[Any, ...]] = []
    after: tuple[Any, ...] | None = None
    while top is not None:
        chunk = reader.read_chunk(info, after, top, limit, None)
        assert isinstance(chunk, EncodedChunk)
        # (before ``tails`` joins them) the change log's blocks hold the same rows
        blocks = chunk.blocks(2)
        last = chunk[-1] if chunk.size else None
        assert "\n".join(t for _, t in blocks) == chunk.tails
        assert all(1 <= n <= 2 for n, _ in blocks) and sum(n for n, _ in blocks) == chunk.size
        out.append((chunk.size, chunk.keys, chunk.tails, last))
        if chunk.size < limit or chunk.key_at(-1) == top:
            break
        after = chunk.key_at(-1)
    return out


def _both(reader: PgSnapshotReader, info: TableInfo, limit: int,
          monkeypatch: pytest.MonkeyPatch, block_rows: int = native.BLOCK_ROWS,
          ) -> tuple[list[Any], list[Any]]:
    """The chunks by the SQL fast path and by the native encoder, which must have read
    every chunk itself (no fallback to the SQL path), its tails cut into blocks of
    ``block_rows``."""
    calls: list[int] = []
    real = native.copy_chunk

    def spy(*args: Any) -> tuple[int, str, TailBlocks]:
        result = real(*args)  # Unencodable propagates: the test fails
        calls.append(result[0])
        assert all(1 <= n <= block_rows for n in result[2].sizes)
        assert sum(result[2].sizes) == result[0]
        return result

    sql_path = _chunks(reader, info, False, limit)
    with monkeypatch.context() as m:
        m.setattr(native, "copy_chunk", spy)
        m.setattr(native, "BLOCK_ROWS", block_rows)
        native_path = _chunks(reader, info, True, limit)
    assert len(calls) == len(native_path)
    return sql_path, native_path


_SETTINGS = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_SETTINGS
@given(st.lists(rows(), min_size=1, max_size=12), st.integers(1, 5), st.sampled_from([1, 2, 1024]))
def test_native_chunks_equal_the_sql_path(
    db: str, reader: PgSnapshotReader, monkeypatch: pytest.MonkeyPatch,
    data: list[dict[str, Any]], limit: int, block_rows: int,
) -> None:
    names = ["id", *COLUMNS]
    placeholders = ", ".join(["%s"] * len(names))
    target = ", ".join(psycopg.sql.Identifier(c).as_string() for c in names)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("TRUNCATE wide")
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO wide ({target}) VALUES ({placeholders})",
                [[i * 7 - 20, *row.values()] for i, row in enumerate(data)],
            )
    info = reader.table_info("public.wide")
    assert info is not None
    assert reader._plan(info).native_spec is not None
    sql_path, native_path = _both(reader, info, limit, monkeypatch, block_rows)
    assert native_path == sql_path
    assert sum(c[0] for c in native_path) == len(data)


@_SETTINGS
@given(st.lists(st.tuples(_text, st.booleans(), st.text("ab ", max_size=3),
                          st.decimals(allow_nan=False, allow_infinity=False),
                          st.builds(lambda d: d.replace(tzinfo=UTC), st.datetimes()), _text),
                min_size=1, max_size=10, unique_by=lambda r: r[:4]),
       st.integers(1, 4))
def test_native_composite_keys_equal_the_sql_path(
    db: str, reader: PgSnapshotReader, monkeypatch: pytest.MonkeyPatch,
    data: list[tuple[Any, ...]], limit: int,
) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("TRUNCATE keyed")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO keyed VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                            list(data))
    info = reader.table_info("public.keyed")
    assert info is not None and len(info.key) == 5
    sql_path, native_path = _both(reader, info, limit, monkeypatch)
    assert native_path == sql_path


def test_native_read_errors_are_named_and_the_connection_stays_usable(
    db: str, reader: PgSnapshotReader
) -> None:
    """A server error inside the native COPY (a bad filter, statement_timeout) is the
    same named error as on the SQL path, and the next read on the connection works."""
    from pydblog.errors import SignalError, SourceError

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("TRUNCATE wide")
        conn.execute("INSERT INTO wide (id, t) SELECT g, 'v' || g FROM generate_series(1, 5) g")
        conn.execute("CREATE SEQUENCE IF NOT EXISTS wide_seq")
    reader.native = True
    info = reader.table_info("public.wide")
    assert info is not None
    with pytest.raises(SignalError, match="invalid snapshot query/filter"):
        reader.read_chunk(info, None, (5,), 10, "no_such_column > 1")
    with pytest.raises(SignalError, match="tried to write"):
        reader.read_chunk(info, None, (5,), 10, "nextval('wide_seq') > 0")
    reader.conn.execute("SET statement_timeout = 50")
    try:
        with pytest.raises(SourceError, match="statement_timeout"):
            reader.read_chunk(info, None, (5,), 10, "pg_sleep(0.2) IS NOT NULL")
    finally:
        reader.conn.execute("SET statement_timeout = 60000")
        reader.conn.commit()
    chunk = reader.read_chunk(info, None, (5,), 10, None)
    assert isinstance(chunk, EncodedChunk) and chunk.size == 5
