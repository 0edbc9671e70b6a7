"""Per-source progress and watermarks of `dblog sync` on embedded change logs: an upgrade
from the single-source form keeps what the sinks applied (nothing re-applied or
skipped), and ``consistent = true`` applies every source up to the same commit time T
(the targets are a cut of every source at T)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from pydblog.changelog.sqlite import SqliteChangeLog, log_path
from pydblog.config import Config, parse_config
from pydblog.core.drainer import SchemaConflict
from pydblog.devtools.synth import SyntheticLoad, write_load
from pydblog.events import ChangeEvent, Op
from pydblog.ports import ColumnSchema, TableSchema
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.job import run_sync
from tests.spark.helpers import assert_delta_batches_once, assert_mirrors, history_offsets


def _config(tmp: Path, dsn: str, sources: list[dict[str, Any]] | None, **sync: Any) -> Config:
    data: dict[str, Any] = {
        "source": {"dsn": "postgresql://unused@127.0.0.1/x"},
        "log": {"path": str(tmp / "log")},
        "sync": {
            "checkpoint": str(tmp / "cp"), "trigger": "available-now", "master": "local[2]",
            "max_events_per_trigger": 1_500, "sink_retries": 0,
            "sinks": [{"type": "delta", "path": str(tmp / "lake")},
                      {"type": "history", "path": str(tmp / "lake" / "_changes")},
                      {"type": "postgres", "dsn": dsn, "schema": "mirror"}],
            **sync,
        },
    }
    if sources is not None:
        data["sync"]["sources"] = sources
    return parse_config(data)


@pytest.mark.slow  # three syncs with three sinks: over the default suite's budget
def test_single_source_progress_survives_the_upgrade(spark: Any, pg_db: str,
                                                     tmp_path: Path) -> None:
    load = SyntheticLoad(seed=41)
    write_load(tmp_path / "log", load, 3_000)
    assert run_sync(_config(tmp_path, pg_db, None), available_now=True) == 0
    # the progress table as the single-source sync made it: no source column
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE mirror.dblog_sync_progress DROP CONSTRAINT "
                     "dblog_sync_progress_pkey")
        conn.execute("ALTER TABLE mirror.dblog_sync_progress DROP COLUMN source")
        conn.execute("ALTER TABLE mirror.dblog_sync_progress ADD PRIMARY KEY (part, nparts)")
        conn.execute("DROP TABLE mirror._dblog_watermarks")
        before = conn.execute("SELECT part, applied_end FROM mirror.dblog_sync_progress "
                              "ORDER BY part").fetchall()
    assert before and all(e == 3_000 for _, e in before)
    versions = {t: DeltaTable(str(tmp_path / "lake" / "public" / t)).version()
                for t in ("orders", "order_lines")}
    # the same log as an explicit [[sync.sources]] entry named "default": a replay of the
    # whole log (fresh checkpoint) applies nothing, then only the new events are applied
    cfg = _config(tmp_path, pg_db, [{"name": "default", "log": {"path": str(tmp_path / "log")}}],
                  checkpoint=str(tmp_path / "cp2"))
    assert run_sync(cfg, available_now=True) == 0
    assert versions == {t: DeltaTable(str(tmp_path / "lake" / "public" / t)).version()
                        for t in ("orders", "order_lines")}
    end = write_load(tmp_path / "log", load, 1_000, first=False)
    assert run_sync(cfg, available_now=True) == 0
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake", pg_dsn=pg_db, pg_schema="mirror")
    assert_delta_batches_once(tmp_path / "lake")
    assert history_offsets(tmp_path / "lake" / "_changes") == list(range(end))
    with psycopg.connect(pg_db) as conn:
        rows = conn.execute("SELECT source, part, applied_end FROM mirror.dblog_sync_progress "
                            "ORDER BY part").fetchall()
        marks = conn.execute("SELECT source, progress_ms FROM mirror._dblog_watermarks").fetchall()
    assert rows == [("default", p, end) for p, _ in before]
    assert [m[0] for m in marks] == ["default"] and marks[0][1] is not None


ORDERS = TableSchema("public", "orders", (ColumnSchema("id", "integer", "int32", False),
                                          ColumnSchema("v", "text", "string", True)), ("id",))


def _write(directory: Path, events: Sequence[tuple[int, Op, int, str | None]]) -> None:
    """(commit time, op, id, v) events of public.orders, one transaction each, and a
    capture checkpoint written long ago (no heartbeat moves the log's time)."""
    from pydblog.events import encode_event
    from pydblog.ports import Checkpoint

    log = SqliteChangeLog(directory)
    try:
        enc = []
        for i, (ts, op, id_, v) in enumerate(events):
            row = None if op is Op.DELETE else {"id": id_, "v": v}
            ev = ChangeEvent(op, "public", "orders", PgPosition(Lsn(1_000 + i)), ts,
                             key={"id": id_}, before={"id": id_} if op is Op.DELETE else None,
                             after=row)
            enc.append(encode_event(ev, "postgresql", directory.name, 0))
        log.append(enc, Checkpoint(None), [ORDERS])
    finally:
        log.close()
    with sqlite3.connect(log_path(directory)) as conn:
        conn.execute("UPDATE checkpoint SET updated_ms = 0")


def test_consistent_applies_every_source_up_to_the_same_time(spark: Any, pg_db: str,
                                                             tmp_path: Path) -> None:
    a = [(1_000 + i, Op.CREATE, i, f"a{i}") for i in range(100)]
    a.append((1_080, Op.UPDATE, 3, "a-late"))  # after T: not applied
    b = [(1_000 + 2 * i, Op.CREATE, i, f"b{i}") for i in range(26)]  # newest: 1050
    b.append((1_050, Op.UPDATE, 7, "b-at-T"))
    _write(tmp_path / "a", sorted(a, key=lambda e: e[0]))
    _write(tmp_path / "b", b)
    cfg = _config(tmp_path, pg_db, [{"name": "a", "log": {"path": str(tmp_path / "a")}},
                                    {"name": "b", "log": {"path": str(tmp_path / "b")}}],
                  consistent=True, max_events_per_trigger=40,
                  routes=[{"tables": r"public\.orders", "target": "public.orders"}])
    cfg = cfg.model_copy(update={"sync": cfg.sync.model_copy(update={
        "sinks": [s for s in cfg.sync.sinks if s.type != "history"]})})
    assert run_sync(cfg, available_now=True) == 0
    want = {("a", "a", "public", i, f"a{i}") for i in range(51)}
    want |= {("b", "b", "public", i, "b-at-T" if i == 7 else f"b{i}") for i in range(26)}
    cols = ["_dblog_source", "_dblog_db", "_dblog_schema", "id", "v"]
    got = {tuple(r[c] for c in cols) for r in
           DeltaTable(str(tmp_path / "lake" / "public" / "orders")).to_pyarrow_table().to_pylist()}
    assert got == want
    with psycopg.connect(pg_db) as conn:
        got_pg = {tuple(r) for r in conn.execute(
            f"SELECT {', '.join(cols)} FROM mirror.orders").fetchall()}
        marks: dict[str, int] = dict(conn.execute(
            "SELECT source, progress_ms FROM mirror._dblog_watermarks").fetchall())
        low = conn.execute("SELECT max(low_ms) FROM mirror._dblog_watermarks").fetchone()
    assert got_pg == want
    # T is 1050: no source's progress passes what it applied, and T is their minimum
    assert marks == {"a": 1_050, "b": 1_050}
    assert low == (1_050,)


def test_incompatible_shards_stop_the_sync_before_anything_is_applied(
    spark: Any, pg_db: str, tmp_path: Path
) -> None:
    _write(tmp_path / "a", [(1_000, Op.CREATE, 1, "x")])
    log = SqliteChangeLog(tmp_path / "b")
    try:
        from pydblog.events import encode_event
        from pydblog.ports import Checkpoint

        other = TableSchema("public", "orders", (ColumnSchema("id", "integer", "int32", False),
                                                 ColumnSchema("v", "boolean", "bool", True)),
                            ("id",))
        ev = ChangeEvent(Op.CREATE, "public", "orders", PgPosition(Lsn(5)), 1_000,
                         key={"id": 1}, after={"id": 1, "v": True})
        log.append([encode_event(ev, "postgresql", "b", 0)], Checkpoint(None), [other])
    finally:
        log.close()
    cfg = _config(tmp_path, pg_db, [{"name": "a", "log": {"path": str(tmp_path / "a")}},
                                    {"name": "b", "log": {"path": str(tmp_path / "b")}}],
                  routes=[{"tables": r"public\.orders", "target": "public.orders"}])
    with pytest.raises(SchemaConflict) as err:
        run_sync(cfg, available_now=True)
    msg = str(err.value)
    assert "column 'v'" in msg and "a/a/public.orders" in msg and "b/b/public.orders" in msg
    assert not (tmp_path / "lake" / "public" / "orders").exists()
