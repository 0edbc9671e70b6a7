"""Exact mirrors on real-world schemas, end to end in one Spark run (kept to
one test: Spark is slow to start): `dblog run` against PostgreSQL, `run_sync` into Delta
and a downstream PostgreSQL, each mirror compared with the source *and counted* (a stale
duplicate would vanish in a comparison by key).

- ``nk``: no primary key, ``REPLICA IDENTITY FULL``, NULLs in columns (item 4): the
  identity is the whole row, matched null-safely; the PostgreSQL sink must not make it a
  NOT NULL primary key, Delta must match NULL with NULL on delete/update;
- ``orders``: a partitioned table, rows moving between leaves (item 2): one mirror;
- ``ri``: a primary key plus ``REPLICA IDENTITY USING INDEX`` (item 3): keyed by the index;
- ``kc``: a key change leaving a TOASTed column alone (item 1): the re-read row lands;
- ``rc``: dropped and created again with other rows (the hunt): the old rows leave the
  mirrors (a truncate), the new ones, written before dblog published the new table,
  arrive (its snapshot).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
from deltalake import DeltaTable

from pydblog.config import load_config
from pydblog.devtools.pgcluster import PgCluster
from pydblog.spark.job import run_sync
from tests.helpers import assert_oracle, source_rows, start_run, stop_run, write_config
from tests.spark.helpers import (
    _key,
    _row,
    assert_tables_equal,
    delta_table,
    latest_schemas,
    pg_table,
)

TABLES = {
    "public.nk": ["a", "b", "c"],
    "public.orders": ["id", "region"],
    "public.ri": ["code"],
    "public.kc": ["id"],
    "public.rc": ["id"],
}
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g)"


def setup_source(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for st in (
            "CREATE TABLE nk (a int, b text, c int)",
            "ALTER TABLE nk REPLICA IDENTITY FULL",
            "INSERT INTO nk VALUES (1, 'x', NULL), (2, NULL, 2), (NULL, 'y', 3), (4, 'z', 4),"
            " (NULL, NULL, 5), (6, NULL, NULL)",
            "CREATE TABLE orders (id int, region text, qty int, PRIMARY KEY (id, region))"
            " PARTITION BY LIST (region)",
            "CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu')",
            "CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us')",
            "INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g"
            " FROM generate_series(1, 40) g",
            "CREATE TABLE ri (id int PRIMARY KEY, code text NOT NULL, v text)",
            "CREATE UNIQUE INDEX ri_code ON ri (code)",
            "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_code",
            "INSERT INTO ri SELECT g, 'c' || g, 'v' || g FROM generate_series(1, 30) g",
            "CREATE TABLE kc (id int PRIMARY KEY, n int, big text)",
            "ALTER TABLE kc ALTER COLUMN big SET STORAGE EXTERNAL",
            f"INSERT INTO kc SELECT g, 0, {BIG} || g FROM generate_series(1, 10) g",
            "CREATE TABLE rc (id int PRIMARY KEY, v text)",
            "INSERT INTO rc SELECT g, 'old' || g FROM generate_series(1, 12) g",
        ):
            conn.execute(st)


def writes(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for st in (
            "UPDATE nk SET c = 10 WHERE a = 1",  # a row with a NULL: delete + create
            "DELETE FROM nk WHERE a IS NULL AND b = 'y'",
            "DELETE FROM nk WHERE a = 6",
            "UPDATE nk SET b = 'w' WHERE a IS NULL AND b IS NULL",
            "INSERT INTO nk VALUES (7, NULL, 7)",
            "UPDATE orders SET region = 'us' WHERE id = 2",
            "UPDATE orders SET qty = -1 WHERE id < 10",
            "DELETE FROM orders WHERE id = 5",
            "DELETE FROM ri WHERE id = 3",
            "UPDATE ri SET v = 'new' WHERE id = 4",
            "UPDATE kc SET id = id + 100 WHERE id <= 3",
            "DROP TABLE rc",
            "CREATE TABLE rc (id int PRIMARY KEY, v text)",
            "INSERT INTO rc SELECT g, 'new' || g FROM generate_series(8, 20) g",
        ):
            conn.execute(st)


def wait_oracle(config: Path, dsn: str, tables: dict[str, list[str]]) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            assert_oracle(config, dsn, tables)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def count_delta(root: Path, schema: str, table: str) -> int:
    return int(DeltaTable(str(root / schema / table)).to_pyarrow_table().num_rows)


def count_pg(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM public.{table}").fetchone()
        assert row is not None
        return int(row[0])


def test_exact_mirrors_of_real_world_schemas(
    spark: Any, pg_db: str, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    setup_source(pg_db)
    replica = pg_cluster.create_database(f"x_{tmp_path.name[-8:].lower()}_{int(time.time())}")
    lake = tmp_path / "lake"
    config = write_config(tmp_path, pg_db, extra=f"""
[snapshot]
mode = "initial"
chunk_size = 8
[sync]
checkpoint = "{tmp_path / "cp"}"
master = "local[2]"
sink_retries = 0
[[sync.sinks]]
type = "delta"
path = "{lake}"
[[sync.sinks]]
type = "postgres"
dsn = "{replica}"
""")
    proc = start_run(config)
    try:
        # The initial snapshot rejects nk (no key to order chunks by); once it is done,
        # nk is snapshotted with a surrogate key.
        others = {t: k for t, k in TABLES.items() if t != "public.nk"}
        wait_oracle(config, pg_db, others)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO dblog_signal VALUES ('nk1', 'execute-snapshot', "
                """'{"data-collections": ["public\\\\.nk"], "surrogate-key": "c"}')"""
            )
        wait_oracle(config, pg_db, TABLES)
        cfg = load_config(config)
        assert run_sync(cfg, available_now=True) == 0  # mirrors of the snapshot first
        writes(pg_db)
        wait_oracle(config, pg_db, TABLES)  # rc: at the next heartbeats
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
    assert run_sync(cfg, available_now=True) == 0
    schemas = latest_schemas(tmp_path / "data")
    assert "public.orders_eu" not in schemas and "public.orders_us" not in schemas
    assert schemas["public.ri"].key == ("code",)
    for table, key in TABLES.items():
        s = schemas[table]
        want = {_key(s, r): _row(s, r) for r in source_rows(pg_db, table, key).values()}
        name = s.table
        assert_tables_equal(want, delta_table(lake, s), f"delta {table}")
        assert_tables_equal(want, pg_table(replica, "public", s), f"postgres {table}")
        assert count_delta(lake, "public", name) == len(want), f"delta {table}: duplicates"
        assert count_pg(replica, name) == len(want), f"postgres {table}: duplicates"
