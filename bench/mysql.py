"""MySQL/MariaDB source benchmark, in one run on one machine.

Results: bench/results/, docs/performance.md.

0. server: ``mariadb-binlog`` (or ``mysqlbinlog``) ``--read-from-remote-server --raw`` from
   the load's first position to the binlog's end, into a scratch directory: the fastest
   bare reader that runs here (C, no decoding: the server's binlog dump is its only
   bound), the baseline every rate below is also given against; then the same client
   decoding every row to text (``--verbose --base64-output=DECODE-ROWS``, into
   /dev/null): the fastest reader here that decodes rows, as ``pg_recvlogical`` is for
   PostgreSQL;
1. raw: a bare mysql-replication loop (``BinLogStreamReader``, rows decoded, nothing else)
   over N row events already in the binlog: the ceiling of the library's decoder; then
   the same loop with pydblog's row decoder (``fastrows``) installed;
2. source: pydblog's ``MySqlLogSource.stream()`` over the same events (decoding + value
   mapping + positions), no change log;
3. end-to-end: ``dblog run`` reading the same backlog into the durable change log, timed
   from its first logged event to the N-th.

Usage: ``.venv/bin/python bench/mysql.py [--rows 1000000] [--batch 50000] [--log kafka]
[--op insert|update|delete]``
(starts its own throwaway MariaDB; needs Debian's mariadb-server). ``--log kafka``: step 3
writes into Kafka instead (an Apache Kafka broker started for the run,
``pydblog.devtools.kafka``, or ``KAFKA_BOOTSTRAP_SERVERS``), its events counted by
bench/kafka.py's ``KafkaEnd`` (the checkpoint topic's last commit). ``--op update`` /
``--op delete``: the load updates (every non-key column) or deletes rows inserted before
the measured binlog file (one event per row).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

import results
from kafka import add_broker_cpus  # bench/kafka.py
from pydblog.changelog.sqlite import SqliteChangeLogReader, log_path
from pydblog.config import parse_config
from pydblog.devtools.mariadb import PASSWORD, SUPERUSER, MariaDB
from pydblog.devtools.proc import cpu_seconds, peak_rss_kb, thread_cpu
from pydblog.events import ChangeEvent
from pydblog.sources.mysql import fastrows
from pydblog.sources.mysql.binlog import MySqlLogSource
from pydblog.sources.mysql.factory import create

DB = "bench"
TABLE = (
    "CREATE TABLE t (id INT PRIMARY KEY, a INT NOT NULL, b VARCHAR(40), c DOUBLE, "
    "d DATETIME(6), e DECIMAL(12,2))"
)


LOADS = {
    "insert": "INSERT INTO t SELECT seq, seq % 1000, CONCAT('row-', seq), seq / 7, "
              "NOW(6), seq / 100 FROM seq_{lo}_to_{hi}",
    "update": "UPDATE t SET a = a + 1, b = CONCAT(b, '+'), c = c * 2, d = NOW(6), e = e + 1 "
              "WHERE id BETWEEN {lo} AND {hi}",
    "delete": "DELETE FROM t WHERE id BETWEEN {lo} AND {hi}",
}
"""``--op``: the statement each transaction runs over its range of ids (one row event
per row)."""
ROW_EVENTS = {"insert": WriteRowsEvent, "update": UpdateRowsEvent, "delete": DeleteRowsEvent}


BROKER_OTHERS = "the database, `dblog run` and the baselines"


def load(server: MariaDB, rows: int, batch: int, op: str = "insert") -> float:
    t0 = time.perf_counter()
    conn = server.connect(DB)
    with conn.cursor() as cur:
        for lo in range(0, rows, batch):
            hi = min(rows, lo + batch)
            cur.execute(LOADS[op].format(lo=lo + 1, hi=hi))
    conn.close()
    return time.perf_counter() - t0


def raw_rate(server: MariaDB, file: str, pos: int, rows: int, op: str = "insert") -> float:
    settings = {"host": "127.0.0.1", "port": server.port, "user": SUPERUSER, "password": PASSWORD}
    reader = BinLogStreamReader(
        connection_settings=settings,
        server_id=9001,
        blocking=False,
        resume_stream=True,
        log_file=file,
        log_pos=pos,
        only_events=[ROW_EVENTS[op]],
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


def binlog_dump_rate(server: MariaDB, file: str, rows: int, work: Path) -> tuple[float, float]:
    """Rows/s of the C client dumping the binlog from ``file`` to its end (the rows of
    the load, which starts there), and its own CPU per row (us)."""
    tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if tool is None:
        raise RuntimeError("mariadb-binlog / mysqlbinlog not found (Debian's mariadb-client)")
    out = work / "binlog-dump"
    out.mkdir()
    cmd = [tool, "--read-from-remote-server", "--raw", "--host=127.0.0.1", f"--port={server.port}",
           f"--user={SUPERUSER}", f"--password={PASSWORD}", f"--result-file={out}/", "--to-last-log", file]
    before = os.times()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    elapsed = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return rows / elapsed, cpu * 1e6 / rows


def binlog_decode_rate(server: MariaDB, file: str, rows: int) -> tuple[float, float]:
    """Rows/s of the C client decoding the same binlog's rows events to text
    (``--verbose --base64-output=DECODE-ROWS``: each row printed as pseudo-SQL, as
    ``pg_recvlogical`` prints its messages) into /dev/null, and its CPU per row (us)."""
    tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if tool is None:
        raise RuntimeError("mariadb-binlog / mysqlbinlog not found (Debian's mariadb-client)")
    cmd = [tool, "--read-from-remote-server", "--verbose", "--base64-output=DECODE-ROWS",
           "--host=127.0.0.1", f"--port={server.port}", f"--user={SUPERUSER}",
           f"--password={PASSWORD}", "--to-last-log", file]
    before = os.times()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return rows / elapsed, cpu * 1e6 / rows


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


class Log:
    """The change log step 3 writes: the embedded one under ``data``, or Kafka topics
    (``prefix``) on ``bootstrap``; counts its events and finds its last checkpoint."""

    def __init__(self, data: Path, bootstrap: str = "", prefix: str = "") -> None:
        self.data, self.bootstrap, self.prefix = data, bootstrap, prefix
        self._end: Any = None

    def keys(self) -> str:
        if not self.bootstrap:
            return ""
        return (f'type = "kafka"\nbootstrap_servers = "{self.bootstrap}"\n'
                f'topic_prefix = "{self.prefix}"\n')

    def _reader(self) -> Any:
        if not self.bootstrap:
            return SqliteChangeLogReader(self.data) if log_path(self.data).exists() else None
        from pydblog.changelog.kafka.reader import KafkaChangeLogReader
        from pydblog.config import LogConfig

        return KafkaChangeLogReader(LogConfig(type="kafka", path=str(self.data),
                                              bootstrap_servers=self.bootstrap,
                                              topic_prefix=self.prefix))

    def checkpoint(self) -> Any:
        reader = self._reader()
        if reader is None:
            return None
        try:
            return reader.last_checkpoint()
        except Exception:  # (Kafka: the topics do not exist yet)
            return None
        finally:
            reader.close()

    def count(self) -> int:
        if self.bootstrap:
            if self._end is None:
                from kafka import KafkaEnd  # bench/kafka.py

                self._end = KafkaEnd(self.bootstrap, self.prefix)
                self._end.active(True)
            return int(self._end.count())
        reader = self._reader()
        if reader is None:
            return 0
        try:
            return int(reader.next_offset())
        finally:
            reader.close()

    def close(self) -> None:
        if self._end is not None:
            self._end.close()


def end_to_end(config: Path, data: Path, rows: int, log: Log, broker_pid: int | None = None,
               ) -> tuple[float, int, dict[str, float], int]:
    """Rows/s of `dblog run` (defaults: the HTTP API on) from its first logged event to
    the ``rows``-th, its peak RSS, its CPU per row over the same span, per thread
    (and the Kafka broker's, ``[kafka broker]``, when ``broker_pid`` is given)
    (``MainThread`` is ``python``), and how often a scraper read its ``/metrics`` meanwhile
    (bench/stream.py's: every second)."""
    from stream import scrape  # bench/stream.py

    scraping = threading.Event()
    scrapes = [0]
    scraper = threading.Thread(target=scrape, args=(data, scraping, scrapes), daemon=True)
    scraper.start()
    env = {**os.environ}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pydblog", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    first_t: float | None = None
    first_n = 0
    first_cpu: dict[str, float] = {}
    base = log.count()
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(proc.communicate()[1].decode()[-3000:])
            n = log.count() - base
            now = time.perf_counter()
            if first_t is None and n > 0:
                first_t, first_n = now, n
                first_cpu = thread_cpu(proc.pid)
                first_cpu["[kafka broker]"] = cpu_seconds(broker_pid) if broker_pid else 0.0
            if n >= rows:
                assert first_t is not None
                now_cpu = thread_cpu(proc.pid)
                if broker_pid:  # not a thread of dblog run: the broker's process, same window
                    now_cpu["[kafka broker]"] = cpu_seconds(broker_pid)
                cpu = {k: (v - first_cpu.get(k, 0.0)) * 1e6 / (n - first_n)
                       for k, v in now_cpu.items()}
                return (n - first_n) / (now - first_t), peak_rss_kb(proc.pid), cpu, scrapes[0]
            time.sleep(0.05)
    finally:
        scraping.set()
        scraper.join()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def first_start(config: Path, log: Log) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pydblog", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    try:
        while log.checkpoint() is None:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("dblog run did not checkpoint its start position")
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=50_000, help="rows per transaction")
    parser.add_argument("--log", choices=["embedded", "kafka"], default="embedded",
                        help="the change log of step 3")
    parser.add_argument("--op", choices=sorted(LOADS), default="insert",
                        help="what the load does to each row")
    parser.add_argument("--log-extra", default="", metavar="TOML",
                        help='lines added to [log], e.g. \'[log.kafka]\\n"compression.type" = "none"\' '
                             "(a variant of the defaults; the defaults are what is published)")
    add_broker_cpus(parser, BROKER_OTHERS)
    args = parser.parse_args()
    if args.log != "kafka":
        run(args, "", "")
        return
    from kafka import bench_broker, isolate_broker  # bench/kafka.py

    if args.broker_cpus:
        isolate_broker(args.broker_cpus, BROKER_OTHERS)
    with bench_broker(args.broker_cpus) as (bootstrap, broker_pid):
        run(args, bootstrap, f"m{uuid.uuid4().hex[:8]}", broker_pid)


def run(args: argparse.Namespace, bootstrap: str, prefix: str,
        broker_pid: int | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="dblog-bench-") as tmp, MariaDB() as server:
        server.execute(f"CREATE DATABASE {DB}")
        server.execute(TABLE, DB)
        if args.op != "insert":  # the rows to change, in a binlog file of their own
            load(server, args.rows, args.batch)
            server.execute("FLUSH BINARY LOGS")
        work = Path(tmp)
        config = work / "dblog.toml"
        data = work / "data"
        log = Log(data, bootstrap, prefix)
        config.write_text(
            f'[source]\ntype = "mysql"\ndsn = "{server.dsn(DB)}"\nserver_id = 9003\n'
            f'[log]\npath = "{data}"\n{log.keys()}{args.log_extra.encode().decode("unicode_escape")}\n'
        )
        # Let `dblog run` checkpoint its start position, so its next start reads the backlog.
        first_start(config, log)
        file, pos = server.execute("SHOW MASTER STATUS")[0][:2]
        from pydblog.ports import Checkpoint
        from pydblog.sources.mysql.position import BinlogPosition

        start = Checkpoint(BinlogPosition(str(file), int(pos), -1))
        load_s = load(server, args.rows, args.batch, args.op)
        print(f"loaded {args.rows} rows ({args.op}) in {load_s:.1f}s "
              f"({args.batch} rows per transaction)")
        dump, dump_cpu = binlog_dump_rate(server, str(file), args.rows, work)
        print(f"binlog dump (C, --raw, no decoding): {dump:,.0f} rows/s (its CPU {dump_cpu:.2f} us/row)")
        decoded, decoded_cpu = binlog_decode_rate(server, str(file), args.rows)
        print(f"binlog decoded to text (C, --verbose): {decoded:,.0f} rows/s "
              f"(its CPU {decoded_cpu:.2f} us/row)")
        raw = raw_rate(server, str(file), int(pos), args.rows, args.op)
        print(f"raw mysql-replication loop: {raw:,.0f} rows/s ({raw / dump:.2f} x the dump)")
        fastrows.install()
        fast = raw_rate(server, str(file), int(pos), args.rows, args.op)
        print(f"same loop with pydblog's row decoder: {fast:,.0f} rows/s ({fast / raw:.2f} x raw)")
        src = source_rate(server, start, args.rows)
        print(f"pydblog MySqlLogSource.stream(): {src:,.0f} rows/s ({src / raw:.2f} x raw)")
        try:
            e2e, rss, cpu, scrapes = end_to_end(config, data, args.rows, log, broker_pid)
        finally:
            log.close()
        print(f"  /metrics scraped {scrapes} times meanwhile")
        print("  dblog run CPU per row by thread: " + ", ".join(
            f"{k} {v:.2f} us" for k, v in sorted(cpu.items()) if v >= 0.005))
        print(
            f"dblog run into the change log ({args.log}): {e2e:,.0f} rows/s ({e2e / raw:.2f} x raw, "
            f"{e2e / dump:.3f} x the dump, {e2e / decoded:.2f} x the C decoder), "
            f"peak RSS {rss / 1024:.0f} MB"
        )
    results.write("mysql", {
        "log": args.log, "op": args.op, "rows": args.rows, "rows_per_transaction": args.batch,
        "binlog_dump_rows_per_s": round(dump), "binlog_dump_cpu_us_per_row": round(dump_cpu, 3),
        "binlog_decoded_to_text_rows_per_s": round(decoded),
        "binlog_decoded_to_text_cpu_us_per_row": round(decoded_cpu, 3),
        "dblog_run_over_c_decoder": round(e2e / decoded, 3),
        "raw_mysql_replication_rows_per_s": round(raw),
        "loop_with_pydblog_decoder_rows_per_s": round(fast),
        "source_stream_rows_per_s": round(src),
        "dblog_run_rows_per_s": round(e2e), "dblog_run_over_raw": round(e2e / raw, 3),
        "dblog_run_over_binlog_dump": round(e2e / dump, 3),
        "dblog_run_cpu_us_per_row_by_thread": {k: round(v, 3) for k, v in sorted(cpu.items())},
        "peak_rss_mb": round(rss / 1024),
        "metrics_scrapes": scrapes,
    })


if __name__ == "__main__":
    main()
