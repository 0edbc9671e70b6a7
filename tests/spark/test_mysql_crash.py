"""``kill -9`` of the sync job (a subprocess with its own JVM) while it applies batches
to a MySQL sink: between the key partitions of one batch (one committed, the other
not), after the sink applied a batch and before Spark's commit, and at an arbitrary
moment while it streams. After a clean run the mirror equals the oracle (every column,
rows counted), and the progress table's audit shows that no step was applied twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pydblog.config import load_config
from pydblog.devtools.synth import SyntheticLoad
from pydblog.spark.job import run_sync
from pydblog.spark.sinks.mysql import PROGRESS_TABLE
from tests.chaos import kill_and_restart, kill_group, kill_seed, killed_at_faults, reporting
from tests.helpers import wait_for
from tests.spark.helpers import assert_tables_equal, latest_schemas, oracle
from tests.spark.test_crash import start_job
from tests.spark.test_mysql_sink import assert_steps_once, audit_progress, mysql_table
from tests.spark.test_sync import build_scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def write_config(tmp: Path, dsn: str, trigger: str, master: str) -> Path:
    cfg = tmp / f"dblog-{trigger.replace(' ', '')}.toml"
    cfg.write_text(
        f"""
[source]
dsn = "postgresql://unused@127.0.0.1/x"
[log]
path = "{tmp / "log"}"
[api]
sync_listen = "127.0.0.1:0"
[sync]
checkpoint = "{tmp / "cp"}"
trigger = "{trigger}"
master = "{master}"
max_events_per_trigger = 1500
sink_retries = 0
[[sync.sinks]]
type = "mysql"
dsn = "{dsn}"
parallelism = 2
"""
    )
    return cfg


def progress(server: Any, database: str) -> dict[int, int]:
    try:
        return dict(server.execute(
            f"SELECT part, applied_end FROM `{PROGRESS_TABLE}` WHERE nparts = 2", database))
    except Exception:  # not created yet
        return {}


@pytest.mark.parametrize("flavour", ["mariadb", "mysql57"])
def test_kill_9_while_applying_to_mysql(spark: Any, flavour: str, request: pytest.FixtureRequest,
                                        tmp_path: Path) -> None:
    mariadb = request.getfixturevalue(flavour)  # (either server)
    my_db = request.getfixturevalue("my_db" if flavour == "mariadb" else "my57_db")
    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=71))
    audit_progress(mariadb, my_db)
    dsn = mariadb.dsn(my_db)
    drain = write_config(tmp_path, dsn, "available-now", "local[1]")
    stream = write_config(tmp_path, dsn, "200 ms", "local[2]")

    # 1. Killed by the sink's task once the first key partition of batch 2 committed:
    #    the batch's other partition is not applied. 2. Killed by the job after the sink
    #    applied batch 3, before Spark's commit.
    def log(n: int) -> Path:
        return tmp_path / f"job-{n}.log"

    killed_at_faults(lambda fault, n: start_job(drain, fault, tmp_path, n), ["mysql-part:2"],
                     log, timeout=300)
    ends = progress(mariadb, my_db)
    assert len(set(ends[p] for p in (0, 1))) == 2, f"not mid-batch: {ends}"
    killed_at_faults(lambda fault, n: start_job(drain, fault, tmp_path, n + 1),
                     ["after-sinks:3"], lambda n: log(n + 1), timeout=300)

    # 3. Killed from outside at an arbitrary moment while it streams: once it applied a
    #    batch (the progress table moved), at once.
    before = progress(mariadb, my_db)
    job = start_job(stream, None, tmp_path, 2)

    def batch_applied(n: int, rng: object) -> None:
        wait_for(lambda: progress(mariadb, my_db) != before, 240, "a batch applied")

    try:
        kills = kill_and_restart(lambda: kill_group(job), lambda: None, 1, kill_seed(72),
                                 delay=(0.0, 0.0), each_round=batch_applied, restart_last=False,
                                 note=lambda: f"progress {progress(mariadb, my_db)}")
    finally:
        kill_group(job)

    # 4. A clean run drains the rest (in-process, on the tests' shared SparkSession).
    assert run_sync(load_config(drain), available_now=True) == 0

    schemas = latest_schemas(tmp_path / "log")
    with reporting(kills):
        for q, want in oracle(tmp_path / "log").items():
            s = schemas[q]
            got, count = mysql_table(mariadb, my_db, s)
            assert_tables_equal(want, got, f"mysql {q}", [c.name for c in s.columns])
            assert count == len(want), f"mysql {q}: {count} rows for {len(want)} keys"
        assert_steps_once(mariadb, my_db, end, 2)
