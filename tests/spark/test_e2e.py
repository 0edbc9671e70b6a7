"""End to end: a source PostgreSQL under a write load (with an initial snapshot, TOAST,
an added column, a truncate) -> `dblog run` (subprocess) -> `run_sync` -> Delta
(read back with deltalake and with Spark) and a downstream PostgreSQL equal the source."""

from __future__ import annotations

import random
import string
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
    Table,
    _key,
    _row,
    assert_tables_equal,
    delta_table,
    latest_schemas,
    pg_table,
    spark_delta_table,
)

TABLES = {"public.e_items": ["id"], "public.e_lines": ["k1", "k2"]}


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE e_items (id int PRIMARY KEY, name text, qty int, price numeric(12,3), "
            "ok boolean, ts timestamptz, doc jsonb, tags int[], big text)"
        )
        conn.execute(
            "CREATE TABLE e_lines (k1 text, k2 int, v double precision, PRIMARY KEY (k1, k2))"
        )
        conn.execute(
            "INSERT INTO e_items SELECT i, 'n' || i, i, i / 7.0, i % 2 = 0, now(), "
            "jsonb_build_object('i', i), ARRAY[i, NULL], 's' FROM generate_series(1, 300) i"
        )


def big(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(9000))


def write_load(dsn: str, rng: random.Random, n: int) -> None:
    with psycopg.connect(dsn) as conn:
        for _ in range(n):
            i = rng.randrange(1, 400)
            r = rng.random()
            if rng.random() < 0.6:
                if r < 0.45:
                    conn.execute(
                        "INSERT INTO e_items VALUES (%s, %s, %s, %s, %s, now(), %s, %s, %s) "
                        "ON CONFLICT (id) DO UPDATE SET name = excluded.name, big = excluded.big",
                        (
                            i,
                            f"n{r}",
                            i,
                            rng.randrange(10**6) / 1000,
                            r < 0.2,
                            f'{{"r": {r}}}',
                            [i, None, 2],
                            big(rng) if r < 0.1 else "s",
                        ),
                    )
                elif r < 0.85:  # leaves `big` alone: unchanged TOAST when it is stored out of line
                    conn.execute(
                        "UPDATE e_items SET qty = qty + 1, ok = NOT ok WHERE id = %s", (i,)
                    )
                else:
                    conn.execute("DELETE FROM e_items WHERE id = %s", (i,))
            else:
                k1 = f"k{i % 5}"
                if r < 0.7:
                    conn.execute(
                        "INSERT INTO e_lines VALUES (%s, %s, %s) ON CONFLICT (k1, k2) "
                        "DO UPDATE SET v = excluded.v",
                        (k1, i, rng.random()),
                    )
                else:
                    conn.execute("DELETE FROM e_lines WHERE k1 = %s AND k2 = %s", (k1, i))
            if rng.random() < 0.3:
                conn.commit()
        conn.commit()


def source_table(dsn: str, log_dir: Path, table: str, key: list[str]) -> Table:
    schema = latest_schemas(log_dir)[table]
    return {_key(schema, r): _row(schema, r) for r in source_rows(dsn, table, key).values()}


def test_capture_to_delta_and_postgres(
    spark: Any, pg_db: str, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    create_tables(pg_db)
    replica = pg_cluster.create_database(f"r_{tmp_path.name[-8:].lower()}_{int(time.time())}")
    lake = tmp_path / "lake"
    config = write_config(
        tmp_path,
        pg_db,
        extra=f"""
[snapshot]
mode = "initial"
chunk_size = 64
[sync]
checkpoint = "{tmp_path / "cp"}"
master = "local[2]"
max_events_per_trigger = 700
sink_retries = 1
sink_retry_backoff_s = 0.1
[[sync.sinks]]
type = "delta"
path = "{lake}"
[[sync.sinks]]
type = "postgres"
dsn = "{replica}"
[[sync.sinks]]
type = "history"
path = "{lake / "_changes"}"
""",
    )
    rng = random.Random(5)
    proc = start_run(config)
    try:
        write_load(pg_db, rng, 500)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("ALTER TABLE e_items ADD COLUMN extra int")
        write_load(pg_db, rng, 300)
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("TRUNCATE e_lines")
        write_load(pg_db, rng, 300)
        deadline = time.monotonic() + 120
        while True:  # the initial snapshot finishes while the load runs
            try:
                assert_oracle(config, pg_db, TABLES)
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err

    cfg = load_config(config)
    assert run_sync(cfg, available_now=True) == 0
    log_dir = tmp_path / "data"
    schemas = latest_schemas(log_dir)
    assert any(c.name == "extra" for c in schemas["public.e_items"].columns)
    history = DeltaTable(str(lake / "_changes")).to_pyarrow_table(columns=["op", "unchanged"])
    ops = history["op"].to_pylist()
    assert "r" in ops and "t" in ops  # snapshot rows and the truncate went through
    assert any(u for u in history["unchanged"].to_pylist())  # unchanged TOAST too
    for table, key in TABLES.items():
        want = source_table(pg_db, log_dir, table, key)
        assert len(want) > 50
        s = schemas[table]
        assert_tables_equal(want, delta_table(lake, s), f"delta {table}")
        assert_tables_equal(want, spark_delta_table(spark, lake, s), f"spark delta {table}")
        assert_tables_equal(want, pg_table(replica, "public", s), f"postgres {table}")
