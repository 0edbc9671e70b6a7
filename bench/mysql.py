"""MySQL/MariaDB source benchmark, in one run on one machine.

Results: bench/results/, docs/performance.md.

1. raw: a bare mysql-replication loop (``BinLogStreamReader``, rows decoded, nothing else)
   over N row events already in the binlog: the ceiling of the library's decoder; then
   the same loop with pydblog's row decoder (``fastrows``) installed;
2. source: pydblog's ``MySqlLogSource.stream()`` over the same events (decoding + value
   mapping + positions), no change log;
3. end-to-end: ``dblog run`` reading the same backlog into the durable change log, timed
   from its first logged event to the N-th.

Usage: ``.venv/bin/python bench/mysql.py [--rows 1000000] [--batch 50000]``
(starts its own throwaway MariaDB; needs Debian's mariadb-server).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import WriteRowsEvent

import results
from pydblog.changelog.sqlite import SqliteChangeLogReader, log_path
from pydblog.config import parse_config
from pydblog.devtools.mariadb import PASSWORD, SUPERUSER, MariaDB
from pydblog.devtools.proc import peak_rss_kb
from pydblog.events import ChangeEvent
from pydblog.sources.mysql import fastrows
from pydblog.sources.mysql.binlog import MySqlLogSource
from pydblog.sources.mysql.factory import create

DB = "bench"
TABLE = (
    "CREATE TABLE t (id INT PRIMARY KEY, a INT NOT NULL, b VARCHAR(40), c DOUBLE, "
    "d DATETIME(6), e DECIMAL(12,2))"
)


def load(server: MariaDB, rows: int, batch: int) -> float:
    t0 = time.perf_counter()
    conn = server.connect(DB)
    with conn.cursor() as cur:
        for lo in range(0, rows, batch):
            hi = min(rows, lo + batch)
            cur.execute(
                "INSERT INTO t SELECT seq, seq % 1000, CONCAT('row-', seq), seq / 7, "
                f"NOW(6), seq / 100 FROM seq_{lo + 1}_to_{hi}"
            )
    conn.close()
    return time.perf_counter() - t0


def raw_rate(server: MariaDB, file: str, pos: int, rows: int) -> float:
    settings = {"host": "127.0.0.1", "port": server.port, "user": SUPERUSER, "password": PASSWORD}
    reader = BinLogStreamReader(
        connection_settings=settings,
        server_id=9001,
        blocking=False,
        resume_stream=True,
        log_file=file,
        log_pos=pos,
        only_events=[WriteRowsEvent],
        enable_logging=False,
    )
    n = 0
    t0 = time.perf_counter()
    for event in reader:
        n += len(event.rows)
        if n >= rows:
            break
    elapsed = time.perf_counter() - t0
    reader.close()
    assert n >= rows, f"raw loop saw {n} rows"
    return n / elapsed


def source_rate(server: MariaDB, checkpoint: Any, rows: int) -> float:
    cfg = parse_config({"source": {"type": "mysql", "dsn": server.dsn(DB), "server_id": 9002}})
    src, _ = create(cfg)
    assert isinstance(src, MySqlLogSource)
    src.open(checkpoint)
    n = 0
    t0 = time.perf_counter()
    for item in src.stream():
        if type(item) is ChangeEvent:
            n += 1
            if n >= rows:
                break
    elapsed = time.perf_counter() - t0
    src.close()
    return n / elapsed


def end_to_end(config: Path, data: Path, rows: int) -> tuple[float, int]:
    env = {**os.environ}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pydblog", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    path = log_path(data)
    first_t: float | None = None
    first_n = 0
    base = _count(path)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(proc.communicate()[1].decode()[-3000:])
            n = _count(path) - base
            now = time.perf_counter()
            if first_t is None and n > 0:
                first_t, first_n = now, n
            if n >= rows:
                assert first_t is not None
                return (n - first_n) / (now - first_t), peak_rss_kb(proc.pid)
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def first_start(config: Path, data: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pydblog", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    path = log_path(data)
    deadline = time.monotonic() + 60
    try:
        while _checkpoint(path) is None:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("dblog run did not checkpoint its start position")
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _checkpoint(path: Path) -> Any:
    if not path.exists():
        return None
    reader = SqliteChangeLogReader(path.parent)
    try:
        return reader.last_checkpoint()
    finally:
        reader.close()


def _count(path: Path) -> int:
    if not path.exists():
        return 0
    reader = SqliteChangeLogReader(path.parent)
    try:
        return reader.next_offset()
    finally:
        reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000, help="rows per transaction")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dblog-bench-") as tmp, MariaDB() as server:
        server.execute(f"CREATE DATABASE {DB}")
        server.execute(TABLE, DB)
        work = Path(tmp)
        config = work / "dblog.toml"
        data = work / "data"
        config.write_text(
            f'[source]\ntype = "mysql"\ndsn = "{server.dsn(DB)}"\nserver_id = 9003\n'
            f'[log]\npath = "{data}"\n'
        )
        # Let `dblog run` checkpoint its start position, so its next start reads the backlog.
        first_start(config, data)
        file, pos = server.execute("SHOW MASTER STATUS")[0][:2]
        from pydblog.ports import Checkpoint
        from pydblog.sources.mysql.position import BinlogPosition

        start = Checkpoint(BinlogPosition(str(file), int(pos), -1))
        load_s = load(server, args.rows, args.batch)
        print(f"loaded {args.rows} rows in {load_s:.1f}s ({args.batch} rows per transaction)")
        raw = raw_rate(server, str(file), int(pos), args.rows)
        print(f"raw mysql-replication loop: {raw:,.0f} rows/s")
        fastrows.install()
        fast = raw_rate(server, str(file), int(pos), args.rows)
        print(f"same loop with pydblog's row decoder: {fast:,.0f} rows/s ({fast / raw:.2f} x raw)")
        src = source_rate(server, start, args.rows)
        print(f"pydblog MySqlLogSource.stream(): {src:,.0f} rows/s ({src / raw:.2f} x raw)")
        e2e, rss = end_to_end(config, data, args.rows)
        print(
            f"dblog run into the change log: {e2e:,.0f} rows/s ({e2e / raw:.2f} x raw), "
            f"peak RSS {rss / 1024:.0f} MB"
        )
    results.write("mysql", {
        "rows": args.rows, "rows_per_transaction": args.batch,
        "raw_mysql_replication_rows_per_s": round(raw),
        "loop_with_pydblog_decoder_rows_per_s": round(fast),
        "source_stream_rows_per_s": round(src),
        "dblog_run_rows_per_s": round(e2e), "dblog_run_over_raw": round(e2e / raw, 3),
        "peak_rss_mb": round(rss / 1024),
    })


if __name__ == "__main__":
    main()
