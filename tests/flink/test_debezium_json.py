"""A consumer no one here wrote reads the table topics as Debezium's: Flink SQL's
``debezium-json`` format (``pydblog.devtools.flink``) materializes a capture's topic of a
table, after an initial snapshot, inserts, updates, deletes and key changes, into a
table equal to the source, every column.

Flink needs ``before`` on updates and deletes: the source table has ``REPLICA IDENTITY
FULL`` (as Debezium's users set it for Flink). Flink reads the topic from Kafka through
its own Kafka connector (``'connector' = 'kafka'``, read_committed, from the earliest to
the latest offsets).

Slow (a Flink job). The default run covers what Flink relies on:
``tests/kafka/test_envelope.py`` (a capture's table topics hold only ``c``, ``u``, ``d``,
``r`` and, with ``truncates = "include"``, one ``t``; the notifications in Debezium's
channel shape) and ``tests/kafka/test_kafka_log.py::test_table_topics_hold_what_debeziums_hold``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pydblog.devtools import flink
from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.kafka.conftest import kafka_log_toml


@pytest.fixture(scope="module", autouse=True)
def _flink() -> None:
    """Flink's venv (``python -m pydblog.devtools.flink install``): skipped without it,
    unless ``PYDBLOG_REQUIRE_FLINK=1`` (set by ``.ci/run -m slow``, which installs it)."""
    if flink.python() is None or not flink.connector_jar().exists():
        reason = f"Flink is not installed in {flink.home()}: python -m pydblog.devtools.flink install"
        if os.environ.get("PYDBLOG_REQUIRE_FLINK") == "1":
            pytest.fail(f"PYDBLOG_REQUIRE_FLINK=1 but {reason}")
        pytest.skip(reason)


COLUMNS = [("id", "INT"), ("name", "STRING"), ("amount", "DECIMAL(10, 2)"), ("ratio", "DOUBLE"),
           ("flag", "BOOLEAN"), ("at", "TIMESTAMP(6)"), ("day", "DATE"), ("big", "BIGINT")]


def source_table(dsn: str) -> list[list[Any]]:
    with psycopg.connect(dsn) as conn:
        cols = ", ".join(f'"{name}"' for name, _ in COLUMNS)
        return [[flink.plain(v) for v in r] for r in conn.execute(f"SELECT {cols} FROM t")]


def _sorted(rows: list[list[Any]]) -> list[list[Any]]:
    return sorted(rows, key=lambda r: r[0])


@pytest.mark.slow  # a Flink job: 60-100 s on the shared 2-core machine, beyond the default run's budget
def test_flink_debezium_json_materializes_the_source(pg_db: str, tmp_path: Path,
                                                     kafka_bootstrap: str) -> None:
    h = PgHarness(pg_db)
    row = ("({i}, 'n{i}', {i}.25, {i}.5, {flag}, '2024-01-02 03:04:05.123456'::timestamp "
           "+ interval '{i} minutes', date '2024-03-01' + {i}, {i} * 10000000000)")
    h.execute("CREATE TABLE t (id int PRIMARY KEY, name text, amount numeric(10,2), "
              "ratio double precision, flag boolean, at timestamp, day date, big bigint)",
              "ALTER TABLE t REPLICA IDENTITY FULL",
              "INSERT INTO t VALUES " + ", ".join(row.format(i=i, flag=i % 2 == 0) for i in range(1, 201)),
              "INSERT INTO t (id) VALUES (500)")  # nulls in every other column
    prefix = f"f{uuid.uuid4().hex[:8]}"
    extra = 'partitions = 3\ntombstones = true\n[snapshot]\nmode = "initial"\nchunk_size = 16\n'
    with Capture(h, tmp_path, kafka_log_toml(kafka_bootstrap, prefix, extra)) as cap:
        for i in range(1, 200, 7):  # during the snapshot
            h.execute(f"UPDATE t SET name = 'during{i}', amount = amount + 1 WHERE id = {i}")
        h.execute("DELETE FROM t WHERE id IN (3, 4)")
        cap.wait_notification("COMPLETED")
        h.execute("INSERT INTO t VALUES " + ", ".join(row.format(i=i, flag="true") for i in range(201, 221)))
        h.execute("UPDATE t SET ratio = ratio * 2, flag = NOT flag WHERE id % 5 = 0")
        h.execute("UPDATE t SET name = NULL, day = NULL WHERE id IN (6, 7)")
        h.execute("DELETE FROM t WHERE id IN (10, 11, 205)")
        h.execute("UPDATE t SET id = 1000 WHERE id = 12")  # key changes
        h.execute("UPDATE t SET id = 1001, name = 'moved' WHERE id = 13")
        h.execute("UPDATE t SET id = 2000 WHERE id = 14", "UPDATE t SET id = 14 WHERE id = 15",
                  "UPDATE t SET id = 15 WHERE id = 1000")
        h.execute("INSERT INTO t VALUES " + row.format(i=10, flag="false"))  # a deleted key again
        cap.caught_up()
        events = cap.events()
    ops = {e["op"] for e in events if e["source"]["table"] == "t"}
    assert {"r", "c", "u", "d", "n"} <= ops, ops  # (notifications are in the log, not the topic)
    rows, changes = flink.materialize_kafka(kafka_bootstrap, f"{prefix}.public.t", COLUMNS, ["id"])
    assert changes > 250
    want = source_table(pg_db)
    assert len(want) == 217
    assert _sorted(rows) == _sorted(want)
