"""A MySQL/MariaDB source through `dblog run` and `dblog sync` into PostgreSQL and Delta:
MySQL column types land on valid target types with the same values."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from deltalake import DeltaTable

from pydblog.config import load_config
from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.pgcluster import PgCluster
from pydblog.spark.job import run_sync
from tests.contract.capture import Capture
from tests.mysql.harness import MariaHarness


def test_mysql_types_into_postgres_and_delta(
    mariadb: MariaDB, my_db: str, pg_cluster: PgCluster, tmp_path: Path, spark: Any
) -> None:
    h = MariaHarness(mariadb, my_db)
    h.execute(
        "CREATE TABLE t (id INT PRIMARY KEY, u BIGINT UNSIGNED, d DECIMAL(12,2), "
        "dt DATETIME(6), f DOUBLE, e ENUM('a','b'), j JSON, b BLOB, y YEAR, v VARCHAR(20))"
    )
    replica = pg_cluster.create_database(f"r_{my_db}")
    cap = Capture(h, tmp_path, (
        f'[sync]\ncheckpoint = "{tmp_path}/cp"\n'
        f'[[sync.sinks]]\ntype = "postgres"\ndsn = "{replica}"\nschema = "public"\n'
        f'[[sync.sinks]]\ntype = "delta"\npath = "{tmp_path}/lake"\n'
    )).start()
    try:
        h.execute(
            "INSERT INTO t VALUES (1, 18446744073709551615, 12.5, '2024-01-02 03:04:05.123456', "
            "1.5, 'a', '{\"k\": [1, 2]}', x'00ff', 2024, 'hé')",
            "INSERT INTO t VALUES (2, 5, -0.01, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
        )
        h.execute("UPDATE t SET d = 99.99 WHERE id = 2")
        cap.caught_up()
    finally:
        cap.stop()
    assert run_sync(load_config(cap.config), available_now=True) == 0
    with psycopg.connect(replica) as conn:
        rows = conn.execute("SELECT * FROM public.t ORDER BY id").fetchall()
    assert rows == [
        (1, Decimal("18446744073709551615"), Decimal("12.50"),
         dt.datetime(2024, 1, 2, 3, 4, 5, 123456), 1.5, "a", {"k": [1, 2]}, b"\x00\xff", 2024, "hé"),
        (2, Decimal(5), Decimal("99.99"), None, None, None, None, None, None, None),
    ]
    lake = DeltaTable(str(tmp_path / "lake" / my_db / "t")).to_pyarrow_table().to_pylist()
    by_id = {r["id"]: r for r in lake}
    assert by_id[1]["u"] == Decimal("18446744073709551615") and by_id[2]["d"] == Decimal("99.99")
    assert by_id[1]["dt"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456) and by_id[1]["v"] == "hé"
