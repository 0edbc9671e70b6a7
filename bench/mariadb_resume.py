"""Benchmark: does a MariaDB GTID resume late in a large binlog file cost what MySQL 5.7's
plain GTID resume did (``bench/mysql_resume.py``: the server read the file from its start)?

A throwaway MariaDB; ``--tx`` one-row transactions (~1 KB each) in one binlog file; the
capture reads them and keeps its last Commit position. Then one more transaction, and
each resume is timed until that transaction's event: (a) the raw baseline, a file +
offset dump from the checkpoint's coordinates (mysql-replication); (b) ``MySqlLogSource``
resuming from the checkpoint (MariaDB: by its GTID state, ``@slave_connect_state``);
(e) a fresh start, timed until one transaction written right after it. Medians of
``--repeat``.

Usage: .venv/bin/python bench/mariadb_resume.py [--tx 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent

import results
from pydblog.devtools.mariadb import PASSWORD, SUPERUSER, MariaDB
from pydblog.ports import Checkpoint, Commit
from pydblog.sources.mysql.position import BinlogPosition

sys.path.insert(0, os.path.dirname(__file__))
import mysql_resume as mr


def raw_resume(server: MariaDB, file: str, pos: int) -> float:
    t0 = time.perf_counter()
    r = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": server.port, "user": SUPERUSER,
                             "passwd": PASSWORD},
        server_id=4343, blocking=True, resume_stream=True, log_file=file, log_pos=pos,
        only_events=[WriteRowsEvent], is_mariadb=True,
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
    server = MariaDB(settings={"max_binlog_size": "1G"}).start()
    try:
        server.execute("CREATE DATABASE b")
        server.execute("CREATE TABLE b.t (id INT AUTO_INCREMENT PRIMARY KEY, v TEXT)")
        src = mr.source(server)  # type: ignore[arg-type]  # (a MariaDB serves as well)
        src.open(None)
        with server.admin("b") as cur:
            for _ in range(args.tx):
                cur.execute("INSERT INTO t (v) VALUES (REPEAT('x', 900))")
        last: BinlogPosition | None = None
        seen = 0
        for item in src.stream():
            if isinstance(item, Commit):
                seen += 1
                assert isinstance(item.position, BinlogPosition)
                last = item.position
                if seen == args.tx:
                    break
        src.close()
        assert last is not None
        size = int(server.execute("SHOW MASTER STATUS")[0][1])
        server.execute("INSERT INTO b.t (v) VALUES ('marker')")
        version = server.execute("SELECT VERSION()")[0][0]
        print(f"{version}, {args.tx} transactions before the checkpoint, binlog file "
              f"{size / 1e6:.1f} MB, checkpoint at {last.file}:{last.pos} ({last.gtid})")
        raw, resume = [], []
        for _ in range(args.repeat):
            raw.append(raw_resume(server, last.file, last.pos))
            resume.append(mr.timed_resume(server, Checkpoint(last), "marker")[0])  # type: ignore[arg-type]
        fresh = [mr.timed_fresh_start(server, settle=True)  # type: ignore[arg-type]
                 for _ in range(args.repeat)]
        a, b, e = (statistics.median(x) for x in (raw, resume, fresh))
        print(f"(a) raw file+offset dump: {a * 1000:.0f} ms")
        print(f"(b) GTID resume:          {b * 1000:.0f} ms ({b / a:.1f} x a)")
        print(f"(e) fresh start:          {e * 1000:.0f} ms")
        print(f"load average {' '.join(str(round(x, 1)) for x in os.getloadavg())}")
        results.write("mariadb_resume", {
            "server": version, "transactions": args.tx, "binlog_mb": round(size / 1e6, 1),
            "a_raw_file_offset_dump_ms": round(a * 1000), "b_gtid_resume_ms": round(b * 1000),
            "b_over_a": round(b / a, 2), "e_fresh_start_ms": round(e * 1000),
        })
    finally:
        server.stop()


if __name__ == "__main__":
    main()
