"""Where a `dblog sync` batch's time goes, job by job, from Spark's event log.

Run a sync (or `bench/sync.py`) with the event log on, e.g. a directory holding a
`spark-defaults.conf` with

    spark.eventLog.enabled true
    spark.eventLog.dir file:///tmp/sparkev

and `SPARK_CONF_DIR` pointing at it, then

    python bench/spark_jobs.py /tmp/sparkev/eventlog_v2_local-*/events_1_*.zstd
    python bench/spark_jobs.py LOG --from 45.6 --to 64.6

Prints every job: its start (seconds after the first job), wall time, tasks and the
executors' run time of its stages, and the SQL execution it belongs to (a Delta
command's name, `dblog_sync` for the batch's own plans) with its plan's top nodes; and
for the window, how much of it had a job running (busy) and how much had none (the
driver planning, committing, or Python between jobs). Compressed logs (`.zstd`, Spark's
default) are read through the `zstd` command.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def events(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".zstd":
        text = subprocess.run(["zstd", "-dc", str(path)], check=True,
                              capture_output=True).stdout.decode()
    else:
        text = path.read_text()
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--from", dest="lo", type=float, default=0.0, help="seconds after the first job")
    ap.add_argument("--to", dest="hi", type=float, default=float("inf"))
    args = ap.parse_args()

    jobs: dict[int, dict[str, Any]] = {}
    sql: dict[str, tuple[str, str]] = {}
    stages: dict[int, tuple[int, float]] = {}
    for e in events(args.log):
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            jobs[e["Job ID"]] = {"start": e["Submission Time"], "end": None,
                                 "sql": props.get("spark.sql.execution.id"),
                                 "stages": e["Stage IDs"]}
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
        elif kind.endswith("SQLExecutionStart"):
            plan = e.get("physicalPlanDescription", "").splitlines()[1:8]
            nodes = " | ".join(line.strip(" +-:") for line in plan if line.strip())
            sql[str(e["executionId"])] = (e.get("description", "").splitlines()[0][:40], nodes[:160])
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            acc = {a["Name"]: a.get("Value") for a in info.get("Accumulables", [])}
            run_ms = float(acc.get("internal.metrics.executorRunTime", 0) or 0)
            stages[info["Stage ID"]] = (info["Number of Tasks"], run_ms / 1000)
    if not jobs:
        raise SystemExit(f"{args.log}: no Spark job in this event log")
    t0 = min(j["start"] for j in jobs.values())
    spans: list[tuple[float, float]] = []
    for jid, j in sorted(jobs.items()):
        start = (j["start"] - t0) / 1000
        if j["end"] is None or not args.lo <= start < args.hi:
            continue
        end = (j["end"] - t0) / 1000
        spans.append((start, end))
        done = [stages[s] for s in j["stages"] if s in stages]
        tasks = sum(n for n, _ in done)
        run = sum(r for _, r in done)
        desc, nodes = sql.get(str(j["sql"]), ("", ""))
        print(f"job {jid:4d}  t={start:7.2f}s  {end - start:6.2f}s  tasks {tasks:3d}  "
              f"run {run:6.2f}s  {desc}  :: {nodes}")
    if not spans:
        return
    spans.sort()
    busy, (cur_lo, cur_hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > cur_hi:
            busy += cur_hi - cur_lo
            cur_lo, cur_hi = a, b
        else:
            cur_hi = max(cur_hi, b)
    busy += cur_hi - cur_lo
    lo = spans[0][0] if args.lo == 0 else args.lo
    hi = max(b for _, b in spans) if args.hi == float("inf") else args.hi
    print(f"window {hi - lo:.1f}s: {len(spans)} jobs, a job running {busy:.1f}s, "
          f"none {hi - lo - busy:.1f}s")


if __name__ == "__main__":
    main()
