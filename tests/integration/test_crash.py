"""kill -9 `dblog run` repeatedly under a write load: nothing lost, nothing twice."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import psycopg
import pytest

from tests.helpers import assert_oracle, kill9, start_run, stop_run, wait_for_marker, write_config


def writer(dsn: str, stop: threading.Event, seed: int, per_s: float | None = None) -> None:
    """Random upserts, updates and deletes of 300 keys of ``w``, 1-19 a transaction,
    until ``stop``; with ``per_s``, at most that many statements a second (a paced load:
    the log's size does not grow with the machine's speed)."""
    rng = random.Random(seed)
    start, done = time.monotonic(), 0
    with psycopg.connect(dsn) as conn:
        while not stop.is_set():
            for _ in range(rng.randrange(1, 20)):
                i = rng.randrange(300)
                r = rng.random()
                if r < 0.5:
                    conn.execute(
                        "INSERT INTO w VALUES (%s, %s, 1) ON CONFLICT (id) DO UPDATE "
                        "SET v = excluded.v, n = w.n + 1",
                        (i, f"x{rng.random()}"),
                    )
                elif r < 0.8:
                    conn.execute("UPDATE w SET n = n + 1 WHERE id = %s", (i,))
                else:
                    conn.execute("DELETE FROM w WHERE id = %s", (i,))
                done += 1
            conn.commit()
            ahead = 0.0 if per_s is None else start + done / per_s - time.monotonic()
            if ahead > 0:
                stop.wait(ahead)


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
    stop = threading.Event()
    load = threading.Thread(target=writer, args=(pg_db, stop, 5))
    rng = random.Random(9)
    # The slot exists before the first write (mode "never": a row written before it and
    # never touched again is in no event; with four kills the load is short enough that
    # this happened in 3 runs of 5 under load, "public.w: 1 missing").
    proc = start_run(config)
    load.start()
    try:
        for k in range(kills):
            if k:
                proc = start_run(config)
            time.sleep(rng.uniform(0.8, 2.5))
            kill9(proc)
    finally:
        stop.set()
        load.join()
    proc = start_run(config)
    try:
        events = assert_oracle(config, pg_db, {"public.w": ["id"]})
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
    positions = [(e["source"]["lsn"], e["source"]["index"]) for e in events]
    assert len(positions) == len(set(positions)), "a source position was logged twice"
    assert positions == sorted(positions)


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
