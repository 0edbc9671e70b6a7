"""kill -9 `dblog run` repeatedly under a write load: nothing lost, nothing twice."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.chaos import kill_and_restart, kill_seed, pg_writer, writing
from tests.helpers import assert_oracle, kill9, start_run, stop_run, wait_for_marker, write_config


def test_kill9_during_load(pg_db: str, tmp_path: Path) -> None:
    """Four kill -9s at random moments under a write load (``test_kill9_during_load_long``:
    sixteen)."""
    kill9_during_load(pg_db, tmp_path, kills=4)


@pytest.mark.slow
def test_kill9_during_load_long(pg_db: str, tmp_path: Path) -> None:
    kill9_during_load(pg_db, tmp_path, kills=16)


def kill9_during_load(pg_db: str, tmp_path: Path, kills: int) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)")
    config = write_config(tmp_path, pg_db, extra="batch_max_events = 200")
    # The slot exists before the first write (mode "never": a row written before it and
    # never touched again is in no event; with four kills the load is short enough that
    # this happened in 3 runs of 5 under load, "public.w: 1 missing").
    procs = [start_run(config)]
    with writing(pg_writer(pg_db, 5)):
        done = kill_and_restart(lambda: kill9(procs[-1]), lambda: procs.append(start_run(config)),
                                kills, kill_seed(9), restart_last=False)
    proc = start_run(config)
    try:
        events = assert_oracle(config, pg_db, {"public.w": ["id"]}, context=done)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
    positions = [(e["source"]["lsn"], e["source"]["index"]) for e in events]
    assert len(positions) == len(set(positions)), f"a source position was logged twice ({done})"
    assert positions == sorted(positions), done


def test_crash_between_log_state_and_ack(pg_db: str, tmp_path: Path) -> None:
    """Die right after the change log commit, then right after the state save."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)")
    config = write_config(tmp_path, pg_db)
    for step in ("after-log", "after-state", "after-log"):
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for i in range(20):
                conn.execute(
                    "INSERT INTO w VALUES (%s, 'a', 0) ON CONFLICT (id) DO UPDATE SET n = w.n + 1", (i,)
                )
        proc = start_run(config, env={"DBLOG_CRASH_AT": step}, wait=False)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 137, err.decode()
    proc = start_run(config)
    try:
        events = wait_for_marker(config, pg_db)
        assert_oracle(config, pg_db, {"public.w": ["id"]})
    finally:
        stop_run(proc)
    positions = [(e["source"]["lsn"], e["source"]["index"]) for e in events]
    assert len(positions) == len(set(positions))
