"""Benchmark: a MySQL 5.7 GTID resume late in a large binlog file, at the checkpoint's
coordinates (``sources.mysql.dumpstart``) against the plain GTID resume (the server reads
the file from its start, skipping every transaction in the GTID set), in one run.

A throwaway MySQL 5.7; ``--tx`` small transactions (one ~1 KB row each) into a captured
table, all in one binlog file; the capture reads them (one ``MySqlLogSource``) and keeps
its last Commit position and its dump record. Then one more transaction, and each resume
(a fresh ``MySqlLogSource.open(checkpoint)``) is timed until that transaction's event:
(a) the raw baseline, a file + offset binlog dump from the checkpoint's coordinates
    (mysql-replication, no GTIDs: what reading from there costs the server);
(b) plain: the checkpoint without the dump record (the GTID set alone);
(c) coordinates: with the record;
and a fresh start (no checkpoint) timed until one transaction written right after it:
(d) the plain GTID dump from ``gtid_executed``, (e) the dump from the binlog's end.
Figures are the median of ``--repeat`` resumes, with ratios to (a).

Usage: .venv/bin/python bench/mysql_resume.py [--tx 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent

import results
from pydblog.config import parse_config
from pydblog.devtools.mysql57 import MySQL57
from pydblog.events import ChangeEvent
from pydblog.ports import Checkpoint, Commit, SourceState
from pydblog.sources.mysql.binlog import MySqlLogSource
from pydblog.sources.mysql.dumpstart import DUMP_SERVER_KEY
from pydblog.sources.mysql.factory import create
from pydblog.sources.mysql.position import BinlogPosition


def source(server: MySQL57) -> MySqlLogSource:
    cfg = parse_config({"source": {"type": "mysql", "dsn": server.dsn("b"), "server_id": 4242}})
    src, _ = create(cfg)
    assert isinstance(src, MySqlLogSource)
    return src


def timed_resume(server: MySQL57, checkpoint: Checkpoint, marker: str) -> tuple[float, bool]:
    t0 = time.perf_counter()
    src = source(server)
    src.open(checkpoint)
    try:
        for item in src.stream():
            if isinstance(item, ChangeEvent) and (item.after or {}).get("v") == marker:
                return time.perf_counter() - t0, src.dump_started_at is not None
    finally:
        src.close()
    raise AssertionError("stream ended")


def timed_fresh_start(server: MySQL57, *, settle: bool) -> float:
    """A fresh start (no checkpoint), then one transaction: until its event. Without
    ``settle`` the dump asks with the GTID set alone (the behaviour before)."""
    src = source(server)
    if not settle:
        def plain(file: str, offset: int) -> tuple[Any, None]:
            executed, _ = MySqlLogSource._settled_executed(src, file, offset)
            return executed, None
        src._settled_executed = plain  # type: ignore[method-assign]
    t0 = time.perf_counter()
    src.open(None)
    marker = f"fresh{time.monotonic_ns()}"
    try:
        server.execute(f"INSERT INTO b.t (v) VALUES ('{marker}')")
        for item in src.stream():
            if isinstance(item, ChangeEvent) and (item.after or {}).get("v") == marker:
                return time.perf_counter() - t0
    finally:
        src.close()
    raise AssertionError("stream ended")


def raw_resume(server: MySQL57, file: str, pos: int) -> float:
    t0 = time.perf_counter()
    r = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": server.port, "user": "root",
                             "passwd": "root"},
        server_id=4343, blocking=True, resume_stream=True, log_file=file, log_pos=pos,
        only_events=[WriteRowsEvent],
    )
    try:
        for _ in r:
            return time.perf_counter() - t0
    finally:
        r.close()
    raise AssertionError("stream ended")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tx", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    server = MySQL57(settings={"max_binlog_size": "1G"}).start()
    try:
        server.execute("CREATE DATABASE b")
        server.execute("CREATE TABLE b.t (id INT AUTO_INCREMENT PRIMARY KEY, v TEXT)")
        src = source(server)
        src.open(None)
        with server.admin("b") as cur:
            for _ in range(args.tx):
                cur.execute("INSERT INTO t (v) VALUES (REPEAT('x', 900))")
        last: BinlogPosition | None = None
        record: Any = None
        seen = 0
        for item in src.stream():
            if isinstance(item, SourceState) and item.key == DUMP_SERVER_KEY:
                record = item.value
            if isinstance(item, Commit):
                seen += 1
                assert isinstance(item.position, BinlogPosition)
                last = item.position
                if seen == args.tx:
                    break
        src.close()
        assert last is not None and record is not None
        size = int(server.execute("SHOW MASTER STATUS")[0][1])
        server.execute("INSERT INTO b.t (v) VALUES ('marker')")
        print(f"MySQL 5.7, {args.tx} transactions before the checkpoint, binlog file "
              f"{size / 1e6:.1f} MB, checkpoint at {last.file}:{last.pos}")
        raw, plain, fast = [], [], []
        for _ in range(args.repeat):
            raw.append(raw_resume(server, last.file, last.pos))
            t, at = timed_resume(server, Checkpoint(last), "marker")
            assert not at
            plain.append(t)
            t, at = timed_resume(server, Checkpoint(last, extra={DUMP_SERVER_KEY: record}),
                                 "marker")
            assert at
            fast.append(t)
        fresh_plain, fresh = [], []
        for _ in range(args.repeat):
            fresh_plain.append(timed_fresh_start(server, settle=False))
            fresh.append(timed_fresh_start(server, settle=True))
        a, b, c = (statistics.median(x) for x in (raw, plain, fast))
        print(f"(a) raw file+offset dump: {a * 1000:.0f} ms")
        print(f"(b) plain GTID resume:    {b * 1000:.0f} ms ({b / a:.1f} x a; "
              f"{size / 1e6 / b:.1f} MB/s of binlog skipped)")
        print(f"(c) at the coordinates:   {c * 1000:.0f} ms ({c / a:.1f} x a; {b / c:.0f} x faster than b)")
        d, e = statistics.median(fresh_plain), statistics.median(fresh)
        print(f"(d) fresh start, plain GTID dump from gtid_executed: {d * 1000:.0f} ms")
        print(f"(e) fresh start at the binlog's end: {e * 1000:.0f} ms ({d / e:.0f} x faster than d)")
        results.write("mysql_resume", {
            "transactions": args.tx, "binlog_mb": round(size / 1e6, 1),
            "a_raw_file_offset_dump_ms": round(a * 1000), "b_plain_gtid_resume_ms": round(b * 1000),
            "c_resume_at_coordinates_ms": round(c * 1000), "c_over_a": round(c / a, 2),
            "d_fresh_start_plain_ms": round(d * 1000), "e_fresh_start_at_end_ms": round(e * 1000),
        })
    finally:
        server.stop()


if __name__ == "__main__":
    main()
