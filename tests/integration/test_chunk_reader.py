"""The PostgreSQL chunk reader's two row paths give the same rows.

Fast path: PostgreSQL writes each row's JSON text (``TypeRegistry.json_text_expr``
concatenated per column). Text path: every column as text, a generated Python encoder.
Both must give the stream's values (test_pg_types checks each type); this checks the
assembled rows: column order, odd column names, NULLs, the identity key, surrogate keys
with NULLs and repeated values, and that tables with an array column take the text path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from pydblog.config import Config
from pydblog.events import EncodedRow
from pydblog.ports import TableInfo
from pydblog.sources.postgres.chunks import PgSnapshotReader


class _Source:
    captured_tables: tuple[str, ...] = ()


@pytest.fixture
def reader(table: str, tmp_path: Path) -> Iterator[PgSnapshotReader]:
    cfg = Config.model_validate({"source": {"dsn": table}, "log": {"path": str(tmp_path / "log")}})
    r = PgSnapshotReader(cfg, _Source())  # type: ignore[arg-type]
    try:
        yield r
    finally:
        r.close()


def _all(reader: PgSnapshotReader, info: TableInfo, fast: bool, limit: int) -> list[EncodedRow]:
    reader.fast_json = fast
    reader._plans.clear()
    top = reader.max_key(info, None)
    assert top is not None
    out: list[EncodedRow] = []
    after: tuple[Any, ...] | None = None
    while True:
        rows = reader.read_chunk(info, after, top, limit, None)
        out.extend(rows)
        if len(rows) < limit or rows[-1].chunk_key == top:
            return out
        after = rows[-1].chunk_key


def _parsed(rows: list[EncodedRow]) -> list[tuple[Any, ...]]:
    return [(r.chunk_key, orjson.loads(r.key_json), orjson.loads(r.after_json)) for r in rows]


ODD = ['we"ird', "back\\slash", "ünï", "per%cent", "new\nline", "{brace}"]


@pytest.fixture
def table(pg_db: str) -> str:
    cols = ", ".join(psycopg.sql.Identifier(c).as_string() + " text" for c in ODD)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE odd (id int, k text, ts timestamptz, n numeric, b bool, j jsonb, "
            f"f float8, bin bytea, {cols}, PRIMARY KEY (k, id))"
        )
        conn.execute(
            "INSERT INTO odd SELECT g, 'k' || (g % 3), "
            "CASE WHEN g % 4 = 0 THEN NULL ELSE '2024-01-02 03:04:05+00'::timestamptz + g * interval '1.5 s' END, "
            "g / 7.0, g % 2 = 0, jsonb_build_object('g', g, 's', 'x\"y'), "
            "CASE WHEN g = 5 THEN 'NaN'::float8 ELSE g / 3.0 END, "
            "CASE WHEN g % 5 = 0 THEN NULL ELSE decode(md5(g::text), 'hex') END, "
            + ", ".join("CASE WHEN g % 6 = 0 THEN NULL ELSE E'v\\\\' || g || '\"' END" for _ in ODD)
            + " FROM generate_series(1, 50) g"
        )
        conn.execute("CREATE TABLE arr (id int PRIMARY KEY, tags text[])")
        conn.execute("INSERT INTO arr SELECT g, ARRAY['a', g::text, NULL] FROM generate_series(1, 9) g")
    return pg_db


def test_fast_and_text_paths_agree(table: str, reader: PgSnapshotReader) -> None:
    info = reader.table_info("public.odd")
    assert info is not None and info.key == ("k", "id")
    fast = _all(reader, info, True, 7)
    text = _all(reader, info, False, 7)
    assert len(fast) == 50
    assert _parsed(fast) == _parsed(text)
    first = orjson.loads(fast[0].after_json)
    assert list(first) == list(info.columns)  # column order
    assert set(orjson.loads(fast[0].key_json)) == {"k", "id"}


def test_surrogate_key_with_nulls_and_repeats(table: str, reader: PgSnapshotReader) -> None:
    """Chunked by a nullable, repeating column; the event key stays the primary key."""
    info = reader.table_info("public.odd", surrogate_key="ts")
    assert info is not None and info.key == ("ts",)
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("UPDATE odd SET ts = '2030-01-01+00' WHERE id BETWEEN 20 AND 30")
    fast = _all(reader, info, True, 3)
    text = _all(reader, info, False, 3)
    assert _parsed(fast) == _parsed(text)
    assert sorted(orjson.loads(r.after_json)["id"] for r in fast) == list(range(1, 51))
    assert all(set(orjson.loads(r.key_json)) == {"k", "id"} for r in fast)


def test_array_tables_take_the_text_path(table: str, reader: PgSnapshotReader) -> None:
    info = reader.table_info("public.arr")
    assert info is not None
    rows = _all(reader, info, True, 4)
    assert [orjson.loads(r.after_json)["tags"] for r in rows][:2] == [["a", "1", None], ["a", "2", None]]
    assert reader._plan(info).bulk is None
    assert reader._plan(reader.table_info("public.odd") or info).bulk is not None


def test_percent_signs_in_filters(table: str, reader: PgSnapshotReader) -> None:
    """A filter with LIKE 'x%' (and a column named per%cent) is SQL, not a placeholder."""
    info = reader.table_info("public.odd")
    assert info is not None
    condition = "k LIKE 'k1%' AND \"per%cent\" IS NOT NULL"
    reader.check_filter(info, condition)
    top = reader.max_key(info, condition)
    assert top is not None
    rows = reader.read_chunk(info, None, top, 100, condition)
    ids = sorted(orjson.loads(r.after_json)["id"] for r in rows)
    assert ids == [g for g in range(1, 51) if g % 3 == 1 and g % 6 != 0]


def test_fast_path_with_ordered_aggregates_agrees(table: str, reader: PgSnapshotReader) -> None:
    """The fast path with ORDER BY inside its aggregates (PostgreSQL 16+'s default; here
    forced) gives the same chunks as the text path, for a primary key and for a nullable
    surrogate key (NULLS FIRST in the aggregates' order too)."""
    info = reader.table_info("public.odd")
    assert info is not None
    text = _all(reader, info, False, 7)
    reader.ordered_agg = True
    assert _parsed(_all(reader, info, True, 7)) == _parsed(text)
    sk = reader.table_info("public.odd", surrogate_key="ts")
    assert sk is not None
    reader.ordered_agg = False
    plain = _all(reader, sk, True, 50)
    reader.ordered_agg = True
    assert _parsed(_all(reader, sk, True, 50)) == _parsed(plain)
    assert plain[0].chunk_key == (None,)


def test_rows_come_in_key_order_even_if_the_aggregate_takes_them_out_of_order(
    table: str, reader: PgSnapshotReader
) -> None:
    """Before PostgreSQL 16 the fast path's aggregates are not ordered (an ORDER BY there
    sorts again), and SQL does not promise that they take the sorted subquery's rows in
    order. Here the subquery is made to hand them over in random order (the chunk's
    rows are still the right ones: the chunk holds the whole table): the reader must
    notice and return key order, by the key's values (an integer primary key) or by the
    rows' ordinals (a composite key; a nullable, repeating surrogate key)."""
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("CREATE TABLE ints (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO ints SELECT g, 'v' || g FROM generate_series(1, 60) g")
    for qualified, surrogate, check in (
        ("public.ints", None, "keys"), ("public.odd", None, "ordinals"), ("public.odd", "ts", "ordinals"),
    ):
        info = reader.table_info(qualified, surrogate_key=surrogate)
        assert info is not None
        reader.ordered_agg = False
        reader.native = False  # the SQL fast path's aggregates (the native path is COPY's order)
        want = _all(reader, info, False, 1000)  # the text path: a top-level ORDER BY
        reader.fast_json = True
        reader._plans.clear()
        plan = reader._plan(info)
        assert plan.bulk is not None and plan.check == check
        (cache_key,) = [k for k, v in reader._plans.items() if v is plan]
        top = reader.max_key(info, None)
        assert top is not None
        scrambled = dataclasses.replace(plan, order=sql.SQL("random()"))
        reader._plans[cache_key] = dataclasses.replace(scrambled, check="")
        unchecked = list(reader.read_chunk(info, None, top, 1000, None))
        assert [r.chunk_key for r in unchecked] != [r.chunk_key for r in want]  # out of order
        reader._plans[cache_key] = scrambled
        got = list(reader.read_chunk(info, None, top, 1000, None))
        assert [r.chunk_key for r in got] == [r.chunk_key for r in want]
        assert sorted(_parsed(got), key=str) == sorted(_parsed(want), key=str)
        if surrogate is None:  # a key re-read (no LIMIT) too
            keys = [r.chunk_key for r in want][::-1]
            reread = list(reader.read_keys(info, keys))
            assert _parsed(reread) == _parsed(want)


@pytest.mark.parametrize("condition", [None, "id % 4 <> 0"])
def test_chunk_bounds_are_every_step_th_key(
    table: str, reader: PgSnapshotReader, condition: str | None
) -> None:
    """Boundary keys (``chunk_bounds``) are the keys of the step-th, 2·step-th, ... row
    after ``after`` in key order, under the filter, never beyond ``max_key``."""
    info = reader.table_info("public.odd")
    assert info is not None and info.key == ("k", "id")
    top = reader.max_key(info, condition)
    assert top is not None
    reader.fast_json = False
    reader._plans.clear()
    every = [r.chunk_key for r in reader.read_chunk(info, None, top, 1000, condition)]
    assert len(every) >= 30
    assert reader.chunk_bounds(info, None, top, 7, 3, condition) == [every[6], every[13], every[20]]
    after = every[4]
    assert reader.chunk_bounds(info, after, top, 5, 100, condition) == every[9::5]
    # max_key bounds the boundaries: none past it
    assert reader.chunk_bounds(info, None, every[11], 4, 10, condition) == [every[3], every[7], every[11]]
    assert reader.chunk_bounds(info, every[-1], top, 1, 3, condition) == []


@pytest.mark.parametrize("key", ["composite", "text"])
def test_boundary_query_is_index_only(pg_db: str, reader: PgSnapshotReader, key: str) -> None:
    """The boundary queries that cut a non-integer key into ranges (``chunk_bounds``)
    read the key's index only: an Index Only Scan in key order, no sort, no heap (a
    query that read the table's rows to skip them would cost the server a pass over
    every row of the range)."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        if key == "composite":
            conn.execute("CREATE TABLE wide (k text, id int, pad text, PRIMARY KEY (k, id))")
            conn.execute("INSERT INTO wide SELECT 'k' || (g % 7), g, repeat('x', 200) "
                         "FROM generate_series(1, 20000) g")
        else:
            conn.execute("CREATE TABLE wide (k text PRIMARY KEY, pad text)")
            conn.execute("INSERT INTO wide SELECT 'k' || lpad(g::text, 6, '0'), "
                         "repeat('x', 200) FROM generate_series(1, 20000) g")
        conn.execute("VACUUM ANALYZE wide")
    info = reader.table_info("public.wide")
    assert info is not None
    top = reader.max_key(info, None)
    assert top is not None
    seen: list[Any] = []
    real = reader._read_only

    def spy(query: Any, params: list[Any], *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        seen.append(query)
        return real(query, params, *args, **kwargs)

    reader._read_only = spy  # type: ignore[method-assign]
    bounds = reader.chunk_bounds(info, None, top, 1000, 3, None)
    assert len(bounds) == 3 and len(seen) == 3
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for query in seen:
            text = query.as_string(conn)
            assert "OFFSET" in text
            row = conn.execute(f"EXPLAIN (FORMAT JSON) {text}").fetchone()
            assert row is not None
            plan = orjson.dumps(row[0]).decode()
            assert '"Index Only Scan"' in plan, plan
            assert '"Sort"' not in plan and '"Seq Scan"' not in plan, plan
