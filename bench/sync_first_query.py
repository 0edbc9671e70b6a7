"""A/B of the sync's first query (the cold-start drain of ``bench/sync.py``).

Each run is a fresh process (its own Spark session, i.e. a cold JVM and fresh Python
workers) that drains the whole change log into a fresh Delta lake with
``trigger(availableNow=True)`` and reports the seconds from ``start_query`` to the
end of the query. Variants alternate run by run, so that the machine's drift hits them
alike; the summary gives each variant's median, min and max.

A variant is ``NAME`` or ``NAME:VAR=VALUE[,VAR=VALUE...]`` (environment of its runs).
To compare code versions, point ``PYTHONPATH`` at a worktree's ``src``::

    git worktree add /tmp/wt-before <commit>
    flock /tmp/pydblog-bench.lock .venv/bin/python -u bench/sync_first_query.py \\
        --rounds 5 before:PYTHONPATH=/tmp/wt-before/src after

The change log (``--events``, default 1M, ``SyntheticLoad(seed=1)``) is written once
into ``--workdir`` and reused by every run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import results

HERE = Path(__file__).resolve().parent


def _bench() -> Any:
    """bench/sync.py as a module (its config, applier and query helpers)."""
    spec = importlib.util.spec_from_file_location("bench_sync", HERE / "sync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child(work: Path, events: int, master: str, max_events: int) -> None:
    bench = _bench()

    for old in ("lake", "cp-delta"):
        shutil.rmtree(work / old, ignore_errors=True)
    spark = bench.spark_session(master)
    cfg = bench.config(
        work,
        "delta",
        [{"type": "delta", "path": str(work / "lake")}],
        "available-now",
        master,
        max_events,
    )
    applier = bench.TimedApplier(cfg.log.path, [bench.build_sink(s) for s in cfg.sync.sinks], 0, 0)
    t0 = time.monotonic()
    query = bench.start_query(spark, cfg, applier, available_now=True)
    query.awaitTermination()
    elapsed = time.monotonic() - t0
    applier.close()
    if query.exception() is not None or applier.events != events:
        raise SystemExit(f"query failed: {query.exception()} ({applier.events} events)")
    entered = (applier.entered or t0) - t0
    print(f"RESULT {elapsed:.3f} {entered:.3f}")
    spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+", help="NAME or NAME:VAR=VALUE[,VAR=VALUE...]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--max-events-per-trigger", type=int, default=500_000)
    ap.add_argument("--workdir", default="/tmp/dblog-bench-sync-ab")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.workdir)
    if args.child:
        child(work, args.events, args.master, args.max_events_per_trigger)
        return
    variants: dict[str, dict[str, str]] = {}
    for spec in args.variants:
        name, _, envs = spec.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in envs.split(",") if kv)

    from pydblog.devtools.synth import SyntheticLoad, write_load

    if _bench()._log_events(work / "log") != args.events:
        shutil.rmtree(work / "log", ignore_errors=True)
        write_load(work / "log", SyntheticLoad(seed=1), args.events, chunk=50_000)
        os.sync()
    measured: dict[str, list[tuple[float, float]]] = {n: [] for n in variants}
    cmd = [sys.executable, "-u", __file__, "--child", "--workdir", str(work),
           "--events", str(args.events), "--master", args.master,
           "--max-events-per-trigger", str(args.max_events_per_trigger), "x"]
    for r in range(args.rounds):
        for name, env in variants.items():
            out = subprocess.run(
                cmd, env={**os.environ, **env}, capture_output=True, text=True, check=False
            )
            m = re.search(r"^RESULT ([0-9.]+) ([0-9.]+)$", out.stdout, re.M)
            if m is None:
                print(f"round {r} {name}: failed\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
                continue
            run = (float(m.group(1)), float(m.group(2)))
            measured[name].append(run)
            print(f"round {r} {name}: first query {run[0]:.2f}s "
                  f"({args.events / run[0]:,.0f} events/s), first batch in foreachBatch "
                  f"after {run[1]:.2f}s", flush=True)
    for name, runs in measured.items():
        if not runs:
            continue
        secs = [s for s, _ in runs]
        med = statistics.median(secs)
        print(f"{name}: median {med:.2f}s = {args.events / med:,.0f} events/s "
              f"(min {min(secs):.2f}s, max {max(secs):.2f}s, {len(secs)} runs); "
              f"first batch in foreachBatch median {statistics.median(b for _, b in runs):.2f}s")
    results.write("sync_first_query", {
        "events": args.events, "master": args.master,
        "max_events_per_trigger": args.max_events_per_trigger,
        "variants": variants,
        "first_query_seconds": {n: [s for s, _ in rs] for n, rs in measured.items()},
        "first_batch_seconds": {n: [b for _, b in rs] for n, rs in measured.items()},
        "median_events_per_s": {n: round(args.events / statistics.median(s for s, _ in rs))
                                for n, rs in measured.items() if rs},
    })


if __name__ == "__main__":
    main()
