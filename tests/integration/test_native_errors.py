"""A server error inside the native COPY is the SQL path's error: the same class (a
SQLSTATE psycopg does not know gives DatabaseError, not KeyError) and the same primary
primary message (no "ERROR:  " prefix)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pydblog.config import Config
from pydblog.sources.postgres import native
from pydblog.sources.postgres.chunks import PgSnapshotReader

pytestmark = pytest.mark.skipif(native.encoder() is None, reason="native encoder not built")


class _Source:
    captured_tables: tuple[str, ...] = ()


@pytest.fixture(scope="module")
def reader(pg_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgSnapshotReader]:
    dsn = pg_cluster.create_database("native_errors")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""CREATE FUNCTION boom(i int) RETURNS bool LANGUAGE plpgsql STABLE AS $$
            BEGIN IF i > 3 THEN RAISE EXCEPTION 'custom failure' USING ERRCODE = 'ZZ999',
            DETAIL = 'some detail'; END IF; RETURN true; END $$""")
        conn.execute("CREATE TABLE t_ke (id int PRIMARY KEY, t text)")
        conn.execute("INSERT INTO t_ke SELECT g, 'x' FROM generate_series(1, 10) g")
    log = Path(tmp_path_factory.mktemp("log")) / "log"
    r = PgSnapshotReader(Config.model_validate({"source": {"dsn": dsn}, "log": {"path": str(log)}}),
                         _Source())  # type: ignore[arg-type]
    try:
        yield r
    finally:
        r.close()


@pytest.mark.parametrize("condition", ["boom(id)", "no_such_col > 0"])
def test_native_errors_are_the_sql_paths(reader: PgSnapshotReader, condition: str) -> None:
    info = reader.table_info("public.t_ke")
    assert info is not None
    seen = []
    for use_native in (False, True):
        reader.native = use_native
        with pytest.raises(Exception) as caught:
            reader.read_chunk(info, None, (10,), 10, condition)
        seen.append((type(caught.value), str(caught.value)))
    # the same class; the message is the primary one (psycopg's str() of an error
    # also carries CONTEXT/DETAIL lines after it)
    assert seen[1][0] is seen[0][0]
    assert seen[1][1] == seen[0][1].splitlines()[0]
    assert "ERROR:" not in seen[1][1]
    if condition == "boom(id)":
        assert issubclass(seen[1][0], psycopg.DatabaseError) and seen[1][1] == "custom failure"
    # the connection goes on working
    assert len(reader.read_chunk(info, None, (10,), 10, None)) == 10
