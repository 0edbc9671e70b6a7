"""Chaos: three `dblog run` members (ZooKeeper election) under a steady write load and
incremental snapshots, through at least 20 random failovers: kill -9 of the leader,
SIGSTOP (later SIGCONT) of the leader, a ZooKeeper restart. At the end the change log
materializes to exactly the source and holds no event twice. Each fault's gap (until the
change log moves again) is recorded in ``failovers.json`` beside the test's config and
printed (``pytest -m slow -s`` shows it)."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pydblog.capture.status import read_status
from pydblog.config import load_config
from pydblog.devtools.zookeeper import ZkServer
from tests.chaos import kill_seed, pg_writer, writing
from tests.ha.helpers import duplicates, ha_config, members
from tests.helpers import assert_oracle

FAILOVERS = 21
BIG_ROWS = 60_000


def wait_snapshot_active(log_dir: Path, timeout: float) -> None:
    """Until the leader's status shows a snapshot running (at most ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ((read_status(log_dir) or {}).get("snapshot") or {}).get("active"):
            return
        time.sleep(0.1)


def snapshot_signal(config: Path) -> None:
    from pydblog.capture.signals import send_signal

    send_signal(load_config(config), f"chaos-{uuid.uuid4()}", "execute-snapshot",
                {"data-collections": ["public\\.big"], "type": "incremental"})


def big_writer(dsn: str, stop: threading.Event) -> None:
    rng = random.Random(3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            i = rng.randrange(BIG_ROWS + 1000)
            if rng.random() < 0.8:
                conn.execute("INSERT INTO big VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                             "SET v = excluded.v", (i, f"b{rng.random()}"))
            else:
                conn.execute("DELETE FROM big WHERE id = %s", (i,))
            time.sleep(0.005)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_chaos_failovers(pg_db: str, tmp_path: Path, zk_server: ZkServer) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE w (id int PRIMARY KEY, v text, n int)")
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
        conn.execute(f"INSERT INTO big SELECT g, 'init' || g FROM generate_series(1, {BIG_ROWS}) g")
    config = ha_config(tmp_path, pg_db, zk_server.hosts, timeout_s=2.0,
                       extra="batch_max_events = 500",
                       tail="[snapshot]\nchunk_size = 200\nmode = \"initial\"")
    m = members(config)
    for _ in range(3):
        m.start()
    rng = random.Random(kill_seed(14))
    loads = contextlib.ExitStack()
    record: list[dict[str, Any]] = []
    stopped: list[Any] = []
    try:
        m.leader()
        m.wait_checkpoint()
        loads.enter_context(writing(pg_writer(pg_db, 11), lambda stop: big_writer(pg_db, stop)))
        time.sleep(2.0)
        for n in range(FAILOVERS):
            kind = rng.choice(["kill9", "kill9", "sigstop", "sigstop", "zk-restart"])
            leader = m.leader()
            m.wait_standbys(1)
            if n % 3 == 2:
                # Another incremental snapshot of big, and this fault inside it (a snapshot
                # of BIG_ROWS takes seconds: faults at random moments alone could miss it).
                snapshot_signal(config)
                wait_snapshot_active(m.log_dir, 20)
                time.sleep(rng.uniform(0.1, 0.5))
            else:
                time.sleep(rng.uniform(0.5, 3.0))
            leader = m.leader()
            snap = (read_status(m.log_dir) or {}).get("snapshot") or {}
            before = m.next_offset()
            t0 = time.monotonic()
            if kind == "kill9":
                leader.send_signal(signal.SIGKILL)
            elif kind == "sigstop":
                leader.send_signal(signal.SIGSTOP)
                stopped.append(leader)
            else:
                zk_server.restart(down_s=rng.uniform(0.5, 3.0))
            if kind != "zk-restart":
                new = m.leader(timeout=60, not_pid=leader.pid)
                elected = time.monotonic() - t0
            else:
                new = m.leader(timeout=60)
                elected = time.monotonic() - t0
            resumed = m.wait_progress(before, timeout=120) - t0
            record.append({"n": n, "fault": kind, "elected_s": round(elected, 3),
                           "gap_s": round(resumed, 3), "leader_changed": new.pid != leader.pid,
                           "snapshot_running": bool(snap.get("active"))})
            print(record[-1], flush=True)
            # wake the frozen ones (or find them killed as frozen lock holders), and keep
            # three members
            for p in stopped:
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)
            stopped.clear()
            while len(m.alive()) < 3:
                m.start()
    finally:
        failed = sys.exc_info()[0] is not None
        if failed:  # leave no member running
            m.stop_all()
        try:
            loads.close()  # stops the loads, raises a load's error
        except AssertionError:
            if not failed:
                raise
        for p in stopped:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
    try:
        events = assert_oracle(config, pg_db, {"public.w": ["id"], "public.big": ["id"]})
    finally:
        m.stop_all()
    dup = duplicates(events)
    # Snapshots resumed at their last chunk, never from the start: the snapshot rows of
    # big number at most one table's worth per scan started.
    scans = sum(1 for e in events if e["op"] == "n" and e["source"]["table"] == "big"
                and e["notification"]["type"] == "TABLE_SCAN_STARTED")
    completed = sum(1 for e in events if e["op"] == "n" and e["source"]["table"] == "big"
                    and e["notification"]["type"] == "TABLE_SCAN_COMPLETED")
    rows_r = sum(1 for e in events if e["op"] == "r" and e["source"]["table"] == "big")
    gaps = sorted(r["gap_s"] for r in record if r["fault"] != "zk-restart")
    summary = {
        "failovers": record, "duplicates": dup, "events": len(events),
        "big_scans_started": scans, "big_scans_completed": completed, "big_snapshot_rows": rows_r,
        "faults_during_snapshot": sum(r["snapshot_running"] for r in record),
        "gap_p50_s": statistics.median(gaps) if gaps else None,
        "gap_max_s": max(gaps) if gaps else None,
    }
    (tmp_path / "failovers.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "failovers"}), flush=True)
    assert len(record) >= 20
    assert dup == 0
    crashed = [p.pid for p in m.procs if "Traceback" in m.log_of(p)]
    assert not crashed, f"members died of an unexpected error: {crashed} (logs in {m.logs})"
    assert sum(r["leader_changed"] for r in record) >= 15
    assert completed >= 2 and sum(r["snapshot_running"] for r in record) >= 5
    assert rows_r <= scans * (BIG_ROWS + 1000)
