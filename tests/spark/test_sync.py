"""The sync job in-process (shared SparkSession) against real Delta tables and a real
PostgreSQL: the mirrors equal the materialized change log (the oracle)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from pydblog.changelog.sqlite import SqliteChangeLog
from pydblog.changelog.sqlite_spark import plan_partitions
from pydblog.config import Config, LogConfig, parse_config
from pydblog.devtools.synth import ORDERS, SyntheticLoad, append_events, write_load
from pydblog.errors import ChangeLogError, ConfigError, SinkError
from pydblog.events import ChangeEvent, Op
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.batch import Batch
from pydblog.spark.decode import ARROW_BATCH_EVENTS
from pydblog.spark.job import BatchApplier, run_sync
from pydblog.spark.sinks import build_sink
from tests.spark.helpers import assert_mirrors, history_offsets


def make_config(
    tmp: Path,
    dsn: str | None,
    *,
    max_events: int = 500_000,
    retries: int = 2,
    pg_schema: str = "mirror",
) -> Config:
    sinks: list[dict[str, Any]] = [
        {"type": "delta", "path": str(tmp / "lake")},
        {"type": "history", "path": str(tmp / "lake" / "_changes")},
    ]
    if dsn is not None:
        sinks.append({"type": "postgres", "dsn": dsn, "schema": pg_schema, "parallelism": 2})
    return parse_config(
        {
            "source": {"dsn": "postgresql://unused@127.0.0.1/x"},
            "log": {"path": str(tmp / "log")},
            "sync": {
                "checkpoint": str(tmp / "cp"),
                "trigger": "available-now",
                "master": "local[2]",
                "max_events_per_trigger": max_events,
                "sink_retries": retries,
                "sink_retry_backoff_s": 0.0,
                "sinks": sinks,
            },
        }
    )


def never_seen_delete(i: int) -> ChangeEvent:
    return ChangeEvent(
        Op.DELETE,
        "public",
        "orders",
        PgPosition(Lsn(10**12 + i)),
        0,
        key={"id": 10**9 + i},
        before={"id": 10**9 + i},
    )


def build_scenario(log_dir: Path, load: SyntheticLoad, size: float = 1.0) -> int:
    """Snapshot rows, a mixed load with unchanged-TOAST updates, deletes of keys never
    seen, an added column, a truncate: what every mirror must follow. 7,605 events;
    ``size`` scales the snapshot and the loads (the same steps, fewer rows)."""

    def n(count: int) -> int:
        return max(1, round(count * size))

    log = SqliteChangeLog(log_dir)
    try:
        schemas = list(load.schemas.values())
        append_events(log, [load.next_event(snapshot=True) for _ in range(n(600))], schemas)
        append_events(log, list(load.events(n(3_000))))
        append_events(log, [never_seen_delete(i) for i in range(5)])
        append_events(log, list(load.events(n(1_500))), [load.add_column()])
        append_events(log, [load.truncate("public.order_lines"), *load.events(n(1_500))])
        return append_events(log, list(load.events(n(1_000))))
    finally:
        log.close()


def test_oracle_delta_postgres_history(spark: Any, pg_db: str, tmp_path: Path) -> None:
    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=21))
    cfg = make_config(tmp_path, pg_db, max_events=5_000)  # two batches: the truncate in the 2nd
    assert run_sync(cfg, available_now=True) == 0
    expected = assert_mirrors(
        tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror", spark=spark
    )
    assert sum(len(t) for t in expected.values()) > 1_000
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))
    dt = DeltaTable(str(tmp_path / "lake" / "public" / "orders"))
    assert "rating" in dt.schema().to_arrow().names
    assert dt.transaction_version("pydblog-sync") == end
    with psycopg.connect(pg_db) as conn:
        cols = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = 'mirror' "
                "AND table_name = 'orders'"
            ).fetchall()
        ]
        assert "rating" in cols
        pk = conn.execute(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'p' AND "
            "conrelid = 'mirror.order_lines'::regclass"
        ).fetchone()
        assert pk == (1,)

    # More events later: the restarted job resumes after the last committed batch.
    load2 = SyntheticLoad(seed=22)
    load2.schemas[ORDERS.qualified] = load2.add_column()
    load2.next_id = 10**6
    end2 = write_load(tmp_path / "log", load2, 2_000, first=False)
    assert run_sync(cfg, available_now=True) == 0
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror")
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end2))


@pytest.mark.slow
def test_large_batch_in_one_trigger(spark: Any, pg_db: str, tmp_path: Path) -> None:
    """One trigger of 50k events: two Spark partitions (``MIN_PARTITION_EVENTS`` 10k,
    ``local[2]``), each read in several Arrow batches (``ARROW_BATCH_EVENTS`` 20k), from
    a log appended in 20k-event blocks (was 120k events: the same paths, 2.4 x the time)."""
    load = SyntheticLoad(seed=41)
    end = write_load(tmp_path / "log", load, 50_000, chunk=20_000)
    parts = plan_partitions(str(tmp_path / "log"), 0, end, 2)
    assert len(parts) == 2 and all(p.end - p.start > ARROW_BATCH_EVENTS for p in parts)
    cfg = make_config(tmp_path, pg_db, max_events=200_000)
    sinks = [build_sink(s) for s in cfg.sync.sinks]
    applier = BatchApplier(LogConfig(path=str(tmp_path / "log")), sinks, retries=0, backoff_s=0)
    from pydblog.spark.job import start_query

    q = start_query(spark, cfg, applier, available_now=True)
    q.awaitTermination(240)
    applier.close()
    assert q.exception() is None
    assert applier.batches == 1 and applier.events == end == 50_000
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror")


def test_sink_error_names_the_table_and_stops(spark: Any, pg_db: str, tmp_path: Path) -> None:
    write_load(tmp_path / "log", SyntheticLoad(seed=51), 300)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA mirror")
        conn.execute(
            "CREATE TABLE mirror.orders (id bigint PRIMARY KEY, qty integer CHECK (qty < 0))"
        )
    cfg = make_config(tmp_path, pg_db, retries=1)
    with pytest.raises(SinkError, match=r"mirror\.orders") as info:
        run_sync(cfg, available_now=True)
    assert "after 2 attempts" in str(info.value) and "check constraint" in str(info.value)
    # Nothing was committed by Spark: after the target is fixed, the batch is applied.
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE mirror.orders DROP CONSTRAINT orders_qty_check")
    assert run_sync(cfg, available_now=True) == 0
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror")


def test_bad_input_is_reported(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, None)
    with pytest.raises(ChangeLogError, match="no change log"):
        run_sync(cfg, available_now=True)
    write_load(tmp_path / "log", SyntheticLoad(seed=1), 10)
    no_sinks = cfg.model_copy(update={"sync": cfg.sync.model_copy(update={"sinks": []})})
    with pytest.raises(ConfigError, match="no sinks"):
        run_sync(no_sinks)
    shutil.rmtree(tmp_path / "log")


def test_batch_of_empty_events_is_none() -> None:
    import pyarrow as pa

    from pydblog.spark.decode import ARROW_SCHEMA

    assert Batch.of(0, ARROW_SCHEMA.empty_table(), []) is None
    assert isinstance(pa.Table, type)


def test_postgres_targets_and_collisions() -> None:
    from pydblog.spark.sinks.postgres import PostgresSink

    own = PostgresSink("postgresql://x@127.0.0.1/db")
    assert own.target("shop", "t") == ("shop", "t") and own.target("public", "t") == ("public", "t")
    one = PostgresSink("postgresql://x:secret@127.0.0.1/db", "mirror")
    assert one.target("shop", "t") == ("mirror", "t")
    with pytest.raises(SinkError, match=r"shop\.t and public\.t would both"):
        one.target("public", "t")
    assert "secret" not in one.name
    own.close()
    one.close()


def test_events_removed_before_applied_stop_the_job(spark: Any, tmp_path: Path) -> None:
    load = SyntheticLoad(seed=71)
    write_load(tmp_path / "log", load, 1_000)
    cfg = make_config(tmp_path, None)
    assert run_sync(cfg, available_now=True) == 0
    write_load(tmp_path / "log", load, 2_000, chunk=1_000, first=False)
    log = SqliteChangeLog(tmp_path / "log")
    assert log.enforce_retention(None, 1) > 0  # only the newest block is left
    log.close()
    with pytest.raises(ChangeLogError, match=r"no longer holds offsets \[1000"):
        run_sync(cfg, available_now=True)
