"""Benchmark: failover time of `dblog run` with [ha], for kill -9 and SIGSTOP of the
leader, with the default settings (session_timeout_s = 5).

In one run, on one machine: a throwaway PostgreSQL, a ZooKeeper with Debian's default
tickTime (2000 ms), a writer committing one row every 10 ms, and three members on one
config. Each round faults the leader and measures, from the fault:
 - elected: until another member's status says it leads;
 - gap: until the change log moves again (what a consumer sees).
The baseline, measured in the same run: a bare kazoo lock holder (a process doing
nothing but hold the same kind of lock with the same session timeout) killed or stopped
the same way, timed until a contender holds the lock: the floor the election itself sets.
Each figure is printed as p50/p99/max, and the gap's p50 as a ratio to the baseline's.

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/failover.py [--rounds 15]
       [--backend zookeeper|postgres] [--keep]
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg

import results
from pydblog.devtools.hamembers import Members
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.zookeeper import ZkServer

HOLDER = """
import sys, time
from kazoo.client import KazooClient
c = KazooClient(hosts=sys.argv[1], timeout=float(sys.argv[3]))
c.start()
c.Lock(sys.argv[2], "holder").acquire()
print("held", flush=True)
time.sleep(3600)
"""

PG_HOLDER = """
import sys, time, psycopg
c = psycopg.connect(sys.argv[1], autocommit=True)
c.execute("SET idle_session_timeout = '%dms'" % int(float(sys.argv[3]) * 1000))
c.execute("SELECT pg_advisory_lock(%s)", (int(sys.argv[2]),))
print("held", flush=True)
while True:
    time.sleep(float(sys.argv[3]) / 4)
    c.execute("SELECT 1")
"""


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def show(name: str, xs: list[float]) -> str:
    return (f"{name}: p50 {statistics.median(xs):.2f} s, p99 {pct(xs, 0.99):.2f} s, "
            f"max {max(xs):.2f} s (n={len(xs)})")


def steady_writer(dsn: str, stop: threading.Event) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        while not stop.is_set():
            i += 1
            conn.execute("INSERT INTO steady (v) VALUES (%s)", (i,))
            time.sleep(0.01)


def baseline(kind: str, backend: str, zk: ZkServer, dsn: str, timeout_s: float) -> float:
    """A bare lock holder process faulted like the leader; seconds until a contender holds."""
    path = f"/bench-base/{uuid.uuid4().hex}"
    if backend == "zookeeper":
        from kazoo.client import KazooClient

        holder = subprocess.Popen([sys.executable, "-c", HOLDER, zk.hosts, path, str(timeout_s)],
                                  stdout=subprocess.PIPE)
    else:
        from pydblog.ha.pglock import lock_key

        holder = subprocess.Popen([sys.executable, "-c", PG_HOLDER, dsn, str(lock_key(path)),
                                   str(timeout_s)], stdout=subprocess.PIPE)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == b"held"
    time.sleep(1.0)
    t0 = time.monotonic()
    holder.send_signal(signal.SIGKILL if kind == "kill9" else signal.SIGSTOP)
    if backend == "zookeeper":
        client = KazooClient(hosts=zk.hosts, timeout=timeout_s)
        client.start()
        client.Lock(path, "contender").acquire()
        took = time.monotonic() - t0
        client.stop()
        client.close()
    else:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(path),)).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.5)  # the poll interval PgLockElection uses
            took = time.monotonic() - t0
    holder.kill()  # SIGKILL ends a stopped process too (no SIGCONT: it would print errors)
    holder.wait()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15, help="faults of each kind")
    ap.add_argument("--backend", choices=["zookeeper", "postgres"], default="zookeeper")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (members' logs)")
    args = ap.parse_args()
    rng = random.Random(5)
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-failover-"))
    try:
        run(args, rng, work)
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, rng: random.Random, work: Path) -> None:
    with PgCluster() as pg, ZkServer(tick_ms=2000) as zk:
        dsn = pg.create_database("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE steady (id bigserial PRIMARY KEY, v int)")
        ha = (f'backend = "zookeeper"\nhosts = "{zk.hosts}"' if args.backend == "zookeeper"
              else 'backend = "postgres"')
        config = work / "dblog.toml"
        config.write_text(f'[source]\ndsn = "{dsn}"\n[log]\npath = "{work / "data"}"\n[ha]\n{ha}\n')
        from pydblog.config import load_config

        timeout_s = load_config(config).ha.session_timeout_s  # type: ignore[union-attr]
        members = Members(config, work / "data")
        for _ in range(3):
            members.start()
        stop = threading.Event()
        load = threading.Thread(target=steady_writer, args=(dsn, stop), daemon=True)
        load.start()
        runs: dict[str, dict[str, list[float]]] = {}
        try:
            members.leader()
            members.wait_progress(0)
            kinds = ["kill9", "sigstop"] * args.rounds
            rng.shuffle(kinds)
            for n, kind in enumerate(kinds):
                members.wait_standbys(2)
                time.sleep(rng.uniform(1.0, 3.0))
                leader = members.leader()
                before = members.next_offset()
                t0 = time.monotonic()
                leader.send_signal(signal.SIGKILL if kind == "kill9" else signal.SIGSTOP)
                members.leader(timeout=120, not_pid=leader.pid)
                elected = time.monotonic() - t0
                gap = members.wait_progress(before) - t0
                r = runs.setdefault(kind, {"elected": [], "gap": [], "baseline": []})
                r["elected"].append(elected)
                r["gap"].append(gap)
                print(f"{n:3d} {kind:8s} elected {elected:6.2f} s  gap {gap:6.2f} s", flush=True)
                if leader.poll() is None:
                    leader.send_signal(signal.SIGCONT)
                    leader.send_signal(signal.SIGTERM)
                    leader.wait(60)
                members.start()
            for kind in ("kill9", "sigstop"):
                for _ in range(args.rounds):
                    runs[kind]["baseline"].append(
                        baseline(kind, args.backend, zk, dsn, timeout_s))
        finally:
            stop.set()
            members.stop_all()
    print(f"\nbackend {args.backend}, session_timeout_s {timeout_s}, ZooKeeper tickTime 2000 ms")
    for kind, r in runs.items():
        print(f"{kind}:")
        print("  " + show("elected     ", r["elected"]))
        print("  " + show("gap         ", r["gap"]))
        print("  " + show("bare lock   ", r["baseline"]))
        print(f"  gap p50 / bare lock p50: {statistics.median(r['gap']) / statistics.median(r['baseline']):.2f}")
    results.write("failover", {
        "backend": args.backend, "session_timeout_s": timeout_s, "rounds": args.rounds,
        "seconds": runs,
        "gap_p50_over_bare_lock_p50": {
            kind: round(statistics.median(r["gap"]) / statistics.median(r["baseline"]), 3)
            for kind, r in runs.items()
        },
    })


if __name__ == "__main__":
    main()
