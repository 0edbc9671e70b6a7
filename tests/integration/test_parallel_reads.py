"""Parallel chunk reads (``sources.postgres.parallel``): a chunk split over several
connections reads exactly what one SELECT reads."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pydblog.config import parse_config
from pydblog.events import EncodedChunk
from pydblog.sources.postgres.chunks import PgSnapshotReader
from pydblog.sources.postgres.source import PgLogSource


def reader(dsn: str, parallelism: int) -> PgSnapshotReader:
    cfg = parse_config({"source": {"dsn": dsn}, "snapshot": {"parallelism": parallelism}})
    return PgSnapshotReader(cfg, PgLogSource(cfg))


@pytest.mark.parametrize("key", ["bigint", "text", "composite"])
def test_split_chunks_equal_single_reads(
    pg_db: str, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        if key == "composite":
            conn.execute("CREATE TABLE t (a int, b text, v text, d timestamptz, PRIMARY KEY (a, b))")
            conn.execute("INSERT INTO t SELECT g / 3, 'k' || (g % 3), 'v' || g, now() "
                         "FROM generate_series(1, 30000) g")
        else:
            conn.execute(f"CREATE TABLE t (id {key} PRIMARY KEY, v text, d timestamptz)")
            conn.execute("INSERT INTO t SELECT g, 'v' || g, now() FROM generate_series(1, 30000) g "
                         "WHERE g % 7 <> 3")  # gaps in the integer keys
    one, four = reader(pg_db, 1), reader(pg_db, 4)
    info = one.table_info("public.t")
    assert info is not None and four.table_info("public.t") == info
    splits: list[int] = []
    split = four._read_split

    def counted(*args: Any) -> EncodedChunk:
        splits.append(1)
        return split(*args)

    monkeypatch.setattr(four, "_read_split", counted)
    top = one.max_key(info, None)
    assert top is not None
    for cond in (None, "v <> 'v100'"):
        after = None
        chunks = 0
        while True:
            a = one.read_chunk(info, after, top, 10_000, cond)
            b = four.read_chunk(info, after, top, 10_000, cond)
            assert isinstance(a, EncodedChunk) and isinstance(b, EncodedChunk)
            assert (b.size, b.keys, b.tails) == (a.size, a.keys, a.tails)
            chunks += 1
            if a.size < 10_000:
                break
            after = a[len(a) - 1].chunk_key
        assert chunks >= 3
    assert four.subreads.split(10_000) == 4
    assert len(splits) >= 6  # every full chunk (and the last) went through the split
    one.close()
    four.close()
