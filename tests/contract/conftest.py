"""The contract suite runs every scenario against every source harness.

PostgreSQL and MariaDB run every scenario. MySQL 5.7 runs those marked ``mysql57`` (the
ones that exercise paths where MySQL differs: GTID sets, column names from the schema,
surrogate keys, DDL) in the slow set (``-m slow``; ``tests/mysql`` covers MySQL 5.7's own
paths in the default run); ``PYDBLOG_MYSQL57_ALL=1`` runs every scenario against it.

The Kafka change log: ``postgres+kafka`` and ``mysql+kafka`` are the PostgreSQL and
MariaDB sources writing a Kafka log (Tansu, one broker for the session; a fresh topic
prefix per scenario, three partitions per table) instead of the embedded one. The
default run takes on Kafka every scenario whose behaviour can differ by log backend
(``KAFKA_SCENARIOS``, ``MYSQL_KAFKA_SCENARIOS``):

- the checkpoint in Kafka: kill -9 and restarts mid-snapshot (snapshot progress, a
  surrogate key's identity, several tables), ``initial`` mode's "started" flag, the
  read-only signal inbox (202 = in a durable checkpoint);
- notifications on Kafka (fanned out to a table's partitions, or on the notifications
  topic): signals, rejected signals, blocking snapshots;
- Kafka message keys (the partitioner): composite and whole-row (keyless) keys;
- snapshots under writes.

MariaDB on Kafka runs a representative subset (snapshot under writes, kill -9 mid
snapshot, signals), the rest of the MySQL side being the same code on either log.
The scenarios that exercise only the source and the snapshot core (chunking, ranges,
parallel windows, DDL, slices, standbys) stay on the embedded log.
``PYDBLOG_KAFKA_ALL=1`` runs every scenario on both Kafka harnesses (about 10 minutes on
the shared 2-core machine; it found the MySQL position decode bug of ``dblog snapshot
--wait`` on Kafka); ``test_soak_long`` (slow) runs on ``postgres+kafka`` with ``-m
slow``. Resuming on another host (an empty ``[log] path``, everything from Kafka) is
``tests/kafka/test_resume_elsewhere.py``.

The budget chose this split: the Kafka scenarios of the default run take about 2
minutes (``--durations``: the ones added to the former seven 60-80 s with the machine
idle or loaded, the largest ``test_stop_pause_resume_then_new_snapshot`` at ~19 s), plus
11-16 s for ``test_resume_elsewhere`` (PostgreSQL; MariaDB and MySQL 5.7 are ``slow``). The
scenarios left to ``PYDBLOG_KAFKA_ALL`` pass on both Kafka harnesses. With all of the
above CI took ~25 min, so two Kafka scenarios went back to ``PYDBLOG_KAFKA_ALL`` (~25 s):
stop/pause/resume (its notifications on a Kafka log are also ``tests/kafka/test_signals.py``, through the signal topic) and the
short soak (kill -9s under load on Kafka: ``test_soak_long[postgres+kafka]`` with ``-m
slow``, and ``tests/kafka/test_capture.py::test_kill9_during_load`` and
``tests/kafka/test_resume_elsewhere.py`` by default).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.contract.harness import Harness, KafkaLogHarness, PgHarness
from tests.mysql.harness import MariaHarness

KAFKA_SCENARIOS = {
    "test_snapshot_only",
    "test_writes_during_snapshot",
    "test_kill9_mid_snapshot_resumes",
    "test_several_tables_with_restart",
    "test_composite_four_column_key",
    "test_surrogate_key_snapshot_keeps_identity_across_restart",
    "test_keyless_table_whole_row_identity",
    "test_bad_signals_are_rejected_and_capture_goes_on",
    "test_blocking_snapshot",
    "test_initial_mode_on_first_start",
    "test_read_only_signals_go_to_the_capture",
    "test_soak_long",
}
"""The scenarios that also run on ``postgres+kafka`` by default (see the module doc)."""

MYSQL_KAFKA_SCENARIOS = {
    "test_writes_during_snapshot",
    "test_kill9_mid_snapshot_resumes",
    "test_bad_signals_are_rejected_and_capture_goes_on",
}
"""The scenarios that also run on ``mysql+kafka`` (MariaDB) by default."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness" not in metafunc.fixturenames:
        return
    name = metafunc.function.__name__
    every = os.environ.get("PYDBLOG_KAFKA_ALL") == "1"
    sources: list[Any] = ["postgres", "mysql"]
    if os.environ.get("PYDBLOG_MYSQL57_ALL") == "1":
        sources.append("mysql57")
    elif metafunc.definition.get_closest_marker("mysql57"):
        sources.append(pytest.param("mysql57", marks=pytest.mark.slow))
    if name in KAFKA_SCENARIOS or every:
        sources.append("postgres+kafka")
    if name in MYSQL_KAFKA_SCENARIOS or every:
        sources.append("mysql+kafka")
    metafunc.parametrize("harness", sources, indirect=True)


@pytest.fixture
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "postgres":
        yield PgHarness(request.getfixturevalue("pg_db"))
    elif request.param == "postgres+kafka":
        pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")
        yield KafkaLogHarness(PgHarness(request.getfixturevalue("pg_db")),
                              request.getfixturevalue("kafka_bootstrap"))
    elif request.param == "mysql":
        yield MariaHarness(request.getfixturevalue("mariadb"), request.getfixturevalue("my_db"))
    elif request.param == "mysql+kafka":
        pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")
        yield KafkaLogHarness(
            MariaHarness(request.getfixturevalue("mariadb"), request.getfixturevalue("my_db")),
            request.getfixturevalue("kafka_bootstrap"))
    else:
        yield MariaHarness(request.getfixturevalue("mysql57"), request.getfixturevalue("my57_db"))
