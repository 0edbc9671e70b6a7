"""Benchmark of a `dblog sync` of several sources (docs/sync.md, "Several sources").

1. throughput: the same number of events (synthetic inserts/updates/deletes over three
   tables) in 1 embedded change log, then spread over 4, merged by routes into one
   Delta lake with ``--available-now``; reports events/s of each drain (query start
   included, Spark session start excluded) and the ratio 4 sources / 1 source.
2. watermark lag: 4 writers append to their logs at a steady rate (events carry their
   append time as commit time) while the sync streams (1-second trigger); every 0.5 s
   it samples T (the least source progress) against the newest source progress and
   against the wall clock; reports p50/p99/max after a warm-up. With ``consistent =
   true`` it also samples the last complete cut (the time of the last round every
   source finished) against the newest source progress and the wall clock.

Both run with ``[sync] consistent`` off and on (``--consistent off|on``, both by
default); every log gets a heartbeat after it is written, so a consistent drain applies
the same events. Figures are ratios to the run without ``consistent`` measured in the
same process (the machine may be shared).

    .venv/bin/python bench/drainer.py --events 200000 --master 'local[2]'

Results go to stdout and ``bench/results/drainer-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from pydblog.api.sync import SYNC
from pydblog.config import Config, parse_config
from pydblog.devtools.synth import SyntheticLoad, write_load
from pydblog.spark.job import run_sync, spark_session

ROUTES = [{"tables": r"public\.orders", "target": "public.orders"},
          {"tables": r"public\.order_lines", "target": "public.order_lines"},
          {"tables": r"shop\.accounts", "target": "shop.accounts"}]


def config(work: Path, n: int, trigger: str, master: str, max_events: int,
           consistent: bool = False) -> Config:
    return parse_config({
        "sync": {
            "consistent": consistent,
            "checkpoint": str(work / "cp"),
            "trigger": trigger,
            "master": master,
            "max_events_per_trigger": max_events,
            "sink_retries": 0,
            "sources": [{"name": f"s{i}", "log": {"path": str(work / f"log{i}")}}
                        for i in range(n)],
            "routes": ROUTES,
            "sinks": [{"type": "delta", "path": str(work / "lake")}],
        },
        "log": {"path": str(work / "state")},
    })


def heartbeat(directory: Path) -> None:
    """An idle capture's checkpoint (no events): the log is complete up to now."""
    from pydblog.changelog.sqlite import SqliteChangeLog
    from pydblog.ports import Checkpoint

    log = SqliteChangeLog(directory)
    try:
        log.append([], Checkpoint(None))
    finally:
        log.close()


def throughput(root: Path, n: int, events: int, master: str, max_events: int,
               consistent: bool = False) -> float:
    work = root / f"tp{n}-{'on' if consistent else 'off'}"
    for i in range(n):
        load = SyntheticLoad(seed=100 + i)
        load.next_id = i * 10**8
        write_load(work / f"log{i}", load, events // n)
    time.sleep(0.01)
    for i in range(n):
        heartbeat(work / f"log{i}")
    cfg = config(work, n, "available-now", master, max_events, consistent)
    t0 = time.monotonic()
    assert run_sync(cfg, available_now=True) == 0
    return time.monotonic() - t0


def lag(root: Path, n: int, rate: float, seconds: float, warm_s: float, master: str,
        max_events: int, consistent: bool = False) -> dict[str, Any]:
    work = root / f"lag-{'on' if consistent else 'off'}"
    SYNC.watermarks, SYNC.low_ms, SYNC.cut_ms = {}, None, None
    loads = []
    for i in range(n):
        load = SyntheticLoad(seed=200 + i)
        load.next_id = i * 10**8
        write_load(work / f"log{i}", load, 100)
        loads.append(load)
    stop = threading.Event()

    def writer(i: int) -> None:
        per = max(1, int(rate / n / 10))  # ten appends a second
        while not stop.is_set():
            write_load(work / f"log{i}", loads[i], per, first=False)
            stop.wait(0.1)

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    cfg = config(work, n, "1 second", master, max_events, consistent)
    sync_stop = threading.Event()
    job = threading.Thread(target=run_sync, args=(cfg,), kwargs={"stop_event": sync_stop},
                           daemon=True)
    t0 = time.monotonic()
    job.start()
    spread: list[float] = []
    behind: list[float] = []
    cut_spread: list[float] = []
    cut_behind: list[float] = []
    while time.monotonic() - t0 < seconds:
        time.sleep(0.5)
        low = SYNC.low_ms
        marks = [v for v in SYNC.watermarks.values() if v is not None]
        if time.monotonic() - t0 < warm_s or low is None or len(marks) < n:
            continue
        spread.append(max(marks) - low)
        behind.append(time.time() * 1000 - low)
        cut = SYNC.cut_ms
        if consistent and cut is not None:
            cut_spread.append(max(marks) - cut)
            cut_behind.append(time.time() * 1000 - cut)
    stop.set()
    sync_stop.set()
    job.join(120)

    def q(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[int(p) - 1] if len(xs) > 1 else float("nan")

    def stats(xs: list[float]) -> dict[str, float]:
        return {"p50": q(xs, 50), "p99": q(xs, 99), "max": max(xs, default=float("nan"))}

    out = {"samples": len(spread), "t_behind_newest_source_ms": stats(spread),
           "t_behind_now_ms": stats(behind)}
    if consistent:
        out["cut_behind_newest_source_ms"] = stats(cut_spread)
        out["cut_behind_now_ms"] = stats(cut_behind)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--max-events-per-trigger", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=2_000, help="events/s, all writers together")
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--warm-up", type=float, default=30)
    ap.add_argument("--only", action="append", choices=["throughput", "lag"])
    ap.add_argument("--consistent", action="append", choices=["off", "on"],
                    help="[sync] consistent of the runs (default: both)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("DBLOG_SPARK_DRIVER_MEMORY", "1g")
    spark_session(args.master)  # the session's start is not measured
    out: dict[str, Any] = {"events": args.events, "master": args.master,
                           "load_before": os.getloadavg()}
    modes = [m == "on" for m in (args.consistent or ["off", "on"])]
    with tempfile.TemporaryDirectory(prefix="dblog-drainer-bench-") as tmp:
        root = Path(tmp)
        for consistent in modes:
            tag = "consistent" if consistent else "plain"
            if not args.only or "throughput" in args.only:
                for n in (1, 4):
                    s = throughput(root, n, args.events, args.master,
                                   args.max_events_per_trigger, consistent)
                    out[f"{tag}_sources_{n}_s"] = s
                    out[f"{tag}_sources_{n}_events_per_s"] = args.events / s
                    print(f"{tag}: {n} source(s): {args.events:,} events in {s:.1f}s = "
                          f"{args.events / s:,.0f} events/s", flush=True)
                out[f"{tag}_ratio_4_to_1"] = (out[f"{tag}_sources_4_events_per_s"]
                                              / out[f"{tag}_sources_1_events_per_s"])
                print(f"{tag}: 4 sources / 1 source: {out[f'{tag}_ratio_4_to_1']:.2f}")
            if not args.only or "lag" in args.only:
                res = lag(root, 4, args.rate, args.seconds, args.warm_up, args.master,
                          args.max_events_per_trigger, consistent)
                out[f"{tag}_lag"] = res
                print(f"{tag}: T behind the newest source: {res['t_behind_newest_source_ms']}; "
                      f"behind now: {res['t_behind_now_ms']} ({res['samples']} samples)")
                if consistent:
                    print(f"{tag}: the last complete cut behind the newest source: "
                          f"{res['cut_behind_newest_source_ms']}; behind now: "
                          f"{res['cut_behind_now_ms']}")
        if len(modes) == 2 and "consistent_sources_1_events_per_s" in out:
            for n in (1, 4):
                r = out[f"consistent_sources_{n}_events_per_s"] / out[f"plain_sources_{n}_events_per_s"]
                out[f"consistent_to_plain_sources_{n}"] = r
                print(f"{n} source(s): consistent / plain throughput: {r:.2f}")
    out["load_after"] = os.getloadavg()
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (results / f"drainer-{stamp}.json").write_text(json.dumps(out, indent=2))
    print(f"load average before {out['load_before']}, after {out['load_after']}")


if __name__ == "__main__":
    main()
