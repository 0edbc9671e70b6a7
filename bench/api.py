"""Benchmark: does the HTTP API slow the capture?

One throwaway PostgreSQL; each round loads ``--rows`` inserts while `dblog run` is
stopped, then starts `dblog run` and times its drain of that backlog into the change log
(from its first new event in the change log to the last). Rounds alternate (ABBA...):
 (off) `[api] listen = ""`: no API at all (the baseline);
 (on)  the API served, a scraper GETting /metrics every second and an /events consumer
       (server-sent events, reading every event as it is logged) attached during the
       whole drain, both in this process (`dblog run` hands /events to its events
       process, whose CPU is reported apart).
Prints each round and the ratio of the medians (on / off); the target is >= 0.95. Also
the CPU time of the `dblog run` process per event (all threads, including the API's
serving of the consumer): on a machine shared with other work this is the steadier figure.

Usage: flock /tmp/pydblog-bench.lock .venv/bin/python bench/api.py [--rows 1000000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import psycopg

import results
from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.proc import cpu_seconds


def write_config(directory: Path, dsn: str, api: bool) -> Path:
    path = directory / ("on.toml" if api else "off.toml")
    listen = "127.0.0.1:0" if api else ""
    path.write_text(
        f'[source]\ndsn = "{dsn}"\ntables = ["public\\\\.bench"]\n'
        f'slot = "dblogbench"\npublication = "dblogpub"\n'
        f'[log]\npath = "{directory / "data"}"\n'
        f'[api]\nlisten = "{listen}"\ntoken = "bench-token-0123456789"\n'
    )
    return path


def load(dsn: str, first_id: int, rows: int, txs: int) -> None:
    per = rows // txs
    with psycopg.connect(dsn) as conn:
        for t in range(txs):
            lo = first_id + t * per
            conn.execute(
                "INSERT INTO bench SELECT g, g %% 1000, 'text-' || g, g * 1.5, now() "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (lo, lo + per - 1),
            )
            conn.commit()


class Clients:
    """A /metrics scraper (every second) and an SSE /events consumer, on threads."""

    def __init__(self, api_file: Path, start_offset: int) -> None:
        deadline = time.monotonic() + 30
        while not api_file.exists():
            if time.monotonic() > deadline:
                raise SystemExit("the API did not start")
            time.sleep(0.02)
        url = orjson.loads(api_file.read_bytes())["url"].removeprefix("http://")
        self.host, _, port = url.partition(":")
        self.port = int(port)
        self.stop = threading.Event()
        self.scrapes = 0
        self.events = 0
        self.threads = [
            threading.Thread(target=self._scrape, daemon=True),
            threading.Thread(target=self._consume, args=(start_offset,), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _scrape(self) -> None:
        while not self.stop.wait(1.0):
            conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            conn.close()
            assert b"dblog_events_total" in body or self.scrapes < 3
            self.scrapes += 1

    def _consume(self, start: int) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        conn.request("GET", f"/events?from={start}", headers={
            "Accept": "text/event-stream", "Authorization": "Bearer bench-token-0123456789"})
        resp = conn.getresponse()
        while not self.stop.is_set():
            line = resp.fp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                self.events += 1
        conn.close()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def drain(config: Path, work: Path, target: int, api: bool) -> tuple[float, float, str]:
    reader = SqliteChangeLogReader(work / "data")
    start = reader.next_offset()
    api_file = work / "data" / "api.json"
    api_file.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "pydblog", "run", "--config", str(config)],
                            stderr=subprocess.DEVNULL)
    clients = Clients(api_file, start) if api else None
    first: tuple[float, int, float, float] | None = None
    while True:
        time.sleep(0.005)
        n = reader.next_offset()
        if first is None and n > start:
            first = (time.perf_counter(), n, cpu_seconds(proc.pid),
                     sum(cpu_seconds(w) for w in _children(proc.pid)))
        if n >= target:
            break
    end = time.perf_counter()
    assert first is not None
    rate = (target - first[1]) / (end - first[0])
    cpu_us = (cpu_seconds(proc.pid) - first[2]) * 1e6 / (target - first[1])
    worker_us = ((sum(cpu_seconds(w) for w in _children(proc.pid)) - first[3]) * 1e6
                 / (target - first[1]))
    note = ""
    if clients is not None:
        time.sleep(0.5)  # let the consumer catch up before counting
        clients.close()
        note = (f" (scrapes {clients.scrapes}, SSE events received {clients.events:,}; "
                f"the events process: {worker_us:.2f} us/event)")
    proc.terminate()
    proc.wait(timeout=60)
    reader.close()
    return rate, cpu_us, note


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--tx", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4, help="even; ABBA order")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-api-"))
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[bool, list[float]] = {False: [], True: []}
    with PgCluster() as cluster:
        dsn = cluster.create_database("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE bench (id bigint PRIMARY KEY, a int, b text, c numeric, d timestamptz)"
            )
        configs = {api: write_config(work, dsn, api) for api in (False, True)}
        # create the slot and publication once
        proc = subprocess.Popen([sys.executable, "-m", "pydblog", "run", "--config",
                                 str(configs[False])], stderr=subprocess.DEVNULL)
        time.sleep(3)
        proc.terminate()
        proc.wait()
        reader = SqliteChangeLogReader(work / "data")
        order = [False, True, True, False] * (args.rounds // 4 + 1)
        for i, api in enumerate(order[: args.rounds]):
            base = reader.next_offset()
            load(dsn, i * args.rows, args.rows, args.tx)
            rate, cpu_us, note = drain(configs[api], work, base + args.rows, api)
            rates[api].append(rate)
            cpus[api].append(cpu_us)
            print(f"round {i + 1} API {'on ' if api else 'off'}: {rate:,.0f} events/s, "
                  f"dblog run CPU {cpu_us:.2f} us/event{note}", flush=True)
        reader.close()
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"median without API {off:,.0f} events/s, with scraper + SSE consumer {on:,.0f} "
          f"events/s: {on / off:.3f} x")
    c_off, c_on = statistics.median(cpus[False]), statistics.median(cpus[True])
    print(f"dblog run CPU per event (all its threads): {c_off:.2f} us without, {c_on:.2f} us "
          f"with: the API costs {c_on / c_off - 1:+.1%} (throughput {c_off / c_on:.3f} x when "
          "the capture process is the bound)")
    results.write("api", {
        "rows_per_round": args.rows, "rounds": args.rounds,
        "events_per_s_api_off": rates[False], "events_per_s_api_on": rates[True],
        "median_events_per_s_api_off": round(off), "median_events_per_s_api_on": round(on),
        "on_over_off": round(on / off, 3),
        "dblog_run_cpu_us_per_event_api_off": round(c_off, 2),
        "dblog_run_cpu_us_per_event_api_on": round(c_on, 2),
    })


if __name__ == "__main__":
    main()
