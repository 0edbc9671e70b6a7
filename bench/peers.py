"""Benchmark: `dblog run` beside Debezium's embedded engine, on the same server and loads.

What a user would pick instead of pydblog, measured in one run against one throwaway
PostgreSQL (PostgreSQL connector of Debezium 3.6.1.Final, its embedded engine with the JSON
format, in a single-file Java program: bench/java/DebeziumPeer.java):

 (s) initial snapshot of a table of --rows rows: rows/s from the first row delivered to the
     last, and CPU per row of the capturing process (every thread) over the same span;
 (t) a stream of --rows single-row inserts in --tx transactions, committed before the
     capture starts (each side's slot made before the load): events/s and CPU per event,
     timed the same way;
 (l) commit -> event latency (p50/p99) at --rate events/s (10-row transactions) for
     --seconds.

`dblog run` runs with its default configuration (into the embedded change log: an event
counts once it is durable there and a reader sees it); Debezium with its defaults (an
event counts when the engine hands it to the program's consumer; offsets in a file), and
with Debezium's throughput settings as a second row (``THROUGHPUT``: larger batches and
queue, a shorter poll interval, a larger snapshot fetch size, no schema in the JSON). Each
figure is also printed as dblog's ratio to the Debezium row.

The Debezium jars come from Maven Central (``mvn dependency:copy-dependencies`` of a
small pom) into ``$PYDBLOG_MAVEN_CACHE/debezium-3.6.1`` (default /var/cache/pydblog/maven)
on the first run.

Usage: .venv/bin/python bench/peers.py [--rows 1000000] [--tx 100] [--rate 5000]
           [--seconds 20] [--only s,t,l] [--source postgres|mysql|mariadb]

``--source mysql``: the same parts against MySQL 5.7 (``pydblog.devtools.mysql57``) with
Debezium's MySQL connector (schema history in a file). MySQL's binary log stamps events in
whole seconds, so (l) times each row by a column the load writes just before its commit
(epoch microseconds), on both sides.

``--source mariadb``: the same parts against MariaDB (``pydblog.devtools.mariadb``) with
Debezium's MariaDB connector. Maven Central as reachable here serves that connector up to
3.5.0.Final only, so this run takes all of Debezium at that version (its own cache
directory, ``debezium-3.5.0-mariadb``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

import results
from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.devtools.pgcluster import PASSWORD, SUPERUSER, PgCluster
from pydblog.devtools.proc import cpu_seconds

DEBEZIUM = "3.6.1.Final"
DEBEZIUM_MARIADB = "3.5.0.Final"
"""The newest Debezium MariaDB connector served here (the 3.6 line is not)."""
MAVEN_CACHE = Path(os.environ.get("PYDBLOG_MAVEN_CACHE", "/var/cache/pydblog/maven"))
CACHE = MAVEN_CACHE / "debezium-3.6.1"
JAVA_SOURCE = Path(__file__).resolve().parent / "java" / "DebeziumPeer.java"
POM_TEMPLATE = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pydblog.bench</groupId>
  <artifactId>debezium-peer</artifactId>
  <version>1</version>
  <dependencies>
    <dependency><groupId>io.debezium</groupId><artifactId>debezium-api</artifactId><version>{version}</version></dependency>
    <dependency><groupId>io.debezium</groupId><artifactId>debezium-embedded</artifactId><version>{version}</version></dependency>
{connectors}
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
"""

THROUGHPUT = {
    "max.batch.size": "20480",  # default 2048
    "max.queue.size": "81920",  # default 8192
    "poll.interval.ms": "50",  # default 500
    "snapshot.fetch.size": "20480",  # default 10240
    "converter.schemas.enable": "false",  # the JSON without its schema part
}
"""Debezium's throughput settings (the second row)."""

TABLE_DDL = "(id bigint PRIMARY KEY, a int, b text, c numeric, d timestamptz)"
ROW_SQL = "SELECT g, g % 1000, 'text-' || g, g * 1.5, now() FROM generate_series({lo}::bigint, {hi}::bigint) g"


def debezium_classpath(version: str = DEBEZIUM, connectors: tuple[str, ...] = ("postgres", "mysql"),
                       cache: Path = CACHE) -> str:
    """The jars of Debezium ``version`` with these connectors (resolved from Maven Central
    into ``cache`` the first time)."""
    if not list(cache.glob("debezium-embedded-*.jar")):
        cache.mkdir(parents=True, exist_ok=True)
        deps = "\n".join(
            f"    <dependency><groupId>io.debezium</groupId><artifactId>debezium-connector-{c}"
            f"</artifactId><version>{version}</version></dependency>" for c in connectors)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "pom.xml").write_text(POM_TEMPLATE.format(version=version, connectors=deps))
            subprocess.run(["mvn", "-q", "-B", "dependency:copy-dependencies",
                            f"-DoutputDirectory={cache}"], cwd=tmp, check=True)
    return ":".join(str(p) for p in sorted(cache.glob("*.jar")))


class Debezium:
    """One run of DebeziumPeer.java (see its header) with these connector properties."""

    def __init__(self, cp: str, work: Path, name: str, props: dict[str, str]) -> None:
        self.cp = cp
        self.path = work / f"{name}.properties"
        self.path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.log = work / f"{name}.log"

    def start(self, expect: int, mode: str, seconds: float) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["java", "-cp", self.cp, str(JAVA_SOURCE), str(self.path), str(expect), mode, str(seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log.open("a"), text=True)

    @staticmethod
    def result(proc: subprocess.Popen[str], stop: bool = False) -> dict[str, Any]:
        """What the program printed; ``stop``: tell it to stop first (start, latency)."""
        out, _ = proc.communicate("stop\n" if stop else None)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"Debezium printed no result (exit {proc.returncode}): {out[-2000:]}")
        got: dict[str, Any] = json.loads(lines[-1])
        return got


def pg_props(cluster: PgCluster, db: str, work: Path, name: str, table: str, mode: str,
             tuned: bool) -> dict[str, str]:
    props = {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(work / f"{name}.offsets"),
        "database.hostname": "127.0.0.1",
        "database.port": str(cluster.port),
        "database.user": SUPERUSER,
        "database.password": PASSWORD,
        "database.dbname": db,
        "topic.prefix": name,
        "plugin.name": "pgoutput",
        "slot.name": name,
        "publication.name": name,
        "publication.autocreate.mode": "filtered",
        "table.include.list": f"public.{table}",
        "snapshot.mode": mode,
        "bench.tables": table,
    }
    if tuned:
        props.update(THROUGHPUT)
    return props


def dblog_config(work: Path, name: str, dsn: str, table: str, snapshot: bool = False) -> Path:
    """Default settings but the API's port (a free one) and, with ``snapshot``, the
    initial snapshot (``mode = "initial"``: Debezium's ``initial``; dblog's default is
    none)."""
    directory = work / name
    directory.mkdir()
    path = directory / "dblog.toml"
    path.write_text(
        f'[source]\ndsn = "{dsn}"\ntables = ["public\\\\.{table}"]\n'
        f'slot = "{name}"\npublication = "{name}"\n'
        f'[log]\npath = "{directory / "data"}"\n'
        # The API on, as by default, on a free port (another run may hold 8083).
        f'[api]\nlisten = "127.0.0.1:0"\n'
        + ('[snapshot]\nmode = "initial"\n' if snapshot else "")
    )
    return path


def start_dblog(config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "pydblog", "run", "--config", str(config)],
                            stderr=(config.parent / "run.log").open("a"))


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_slot(dsn: str, slot: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                               (slot,)).fetchone()
            if row is not None and row[0]:
                return
            time.sleep(0.2)
    raise RuntimeError(f"slot {slot} was not made within {timeout:.0f} s")


def dblog_drain(config: Path, expect: int) -> dict[str, float]:
    """`dblog run` until its change log holds ``expect`` events: events/s and CPU per
    event from its first event to its last (the process's own CPU, every thread)."""
    proc = start_dblog(config)
    data = config.parent / "data"
    try:
        while not (data / "changelog.sqlite").exists():
            if proc.poll() is not None:
                raise RuntimeError(f"dblog run exited: {(config.parent / 'run.log').read_text()[-2000:]}")
            time.sleep(0.05)
        reader = SqliteChangeLogReader(data)
        first: tuple[float, int, float] | None = None
        while True:
            time.sleep(0.005)
            n = reader.next_offset()
            if first is None and n > 0:
                first = (time.perf_counter(), n, cpu_seconds(proc.pid))
            if n >= expect:
                break
        end, cpu = time.perf_counter(), cpu_seconds(proc.pid)
    finally:
        stop(proc)
    assert first is not None
    counted = expect - first[1]
    return {"per_s": counted / (end - first[0]), "cpu_us": (cpu - first[2]) * 1e6 / counted}


def steady_load(dsn: str, table: str, start: int, rate: int, seconds: float) -> int:
    """Inserts of 10 rows per transaction at ``rate`` rows/s; the rows inserted."""
    per_tx = 10
    interval = per_tx / rate
    i = start
    with psycopg.connect(dsn, autocommit=True) as conn:
        t_end = time.monotonic() + seconds
        nxt = time.monotonic()
        while time.monotonic() < t_end:
            with conn.transaction():
                conn.execute(f"INSERT INTO {table} SELECT g, 1 FROM generate_series(%s::bigint, %s::bigint) g",
                             (i, i + per_tx - 1))
            i += per_tx
            nxt += interval
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    return i - start


def dblog_latency(config: Path, load: Callable[[], int], time_field: str | None = None) -> dict[str, float]:
    """Commit -> event of ``dblog run`` under ``load``: each record's commit time (its
    ``ts_ms``, or with ``time_field`` that column of its after row: epoch microseconds
    written just before the commit) against the wall clock when a reader sees it."""
    proc = start_dblog(config)
    data = config.parent / "data"
    try:
        while not (data / "api.json").exists():
            time.sleep(0.05)
        time.sleep(2)
        reader = SqliteChangeLogReader(data)
        offset = reader.next_offset()
        stop_follow = threading.Event()
        latencies: list[float] = []

        def follow() -> None:
            nonlocal offset
            while not stop_follow.is_set():
                recs = reader.read(offset, 10_000)
                now_ms = time.time() * 1000
                if time_field is None:
                    latencies.extend(now_ms - r.ts_ms for r in recs)
                else:
                    latencies.extend(now_ms - json.loads(r.body)["after"][time_field] / 1000
                                     for r in recs if r.op in ("c", "u"))
                if recs:
                    offset = recs[-1].offset + 1
                else:
                    time.sleep(0.001)

        th = threading.Thread(target=follow)
        th.start()
        load()
        time.sleep(1)
        stop_follow.set()
        th.join()
    finally:
        stop(proc)
    lat = sorted(latencies)
    return {"p50_ms": statistics.median(lat), "p99_ms": lat[int(len(lat) * 0.99)], "events": len(lat)}


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f} x" if b else "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--tx", type=int, default=100)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--only", default="s,t,l", help="which parts: s (snapshot), t (stream), l (latency)")
    ap.add_argument("--source", choices=["postgres", "mysql", "mariadb"], default="postgres",
                    help="mysql: MySQL 5.7 and Debezium's MySQL connector; mariadb: MariaDB and "
                         "Debezium's MariaDB connector")
    args = ap.parse_args()
    if args.source in ("mysql", "mariadb"):
        mysql_main(args)
        return
    parts = set(args.only.split(","))
    cp = debezium_classpath()
    work = Path(tempfile.mkdtemp(prefix="dblog-bench-peers-"))
    figures: dict[str, Any] = {"debezium": DEBEZIUM, "rows": args.rows, "transactions": args.tx,
                               "throughput_settings": THROUGHPUT}
    rows_of = {"default": "Debezium (defaults)", "tuned": "Debezium (throughput settings)"}
    with PgCluster() as cluster:
        dsn = cluster.create_database("bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for t in ("snap", "stream"):
                conn.execute(f"CREATE TABLE {t} {TABLE_DDL}")
            conn.execute("CREATE TABLE steady (id bigint PRIMARY KEY, v int)")

        if "s" in parts:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO snap " + ROW_SQL.format(lo=0, hi=args.rows - 1))
                conn.execute("VACUUM ANALYZE snap")
            got = dblog_drain(dblog_config(work, "dblog_snap", dsn, "snap", snapshot=True), args.rows)
            figures["snapshot_dblog"] = got
            print(f"(s) snapshot of {args.rows:,} rows: dblog run {got['per_s']:,.0f} rows/s, "
                  f"{got['cpu_us']:.2f} us CPU per row")
            for variant in ("default", "tuned"):
                dbz = Debezium(cp, work, f"dbz_snap_{variant}", pg_props(
                    cluster, "bench", work, f"dbz_snap_{variant}", "snap", "initial_only", variant == "tuned"))
                r = Debezium.result(dbz.start(args.rows, "count", 1800))
                per_s = r["records"] / r["seconds"] if r["seconds"] else 0.0
                cpu_us = r["cpu_seconds"] * 1e6 / r["records"] if r["records"] else 0.0
                figures[f"snapshot_debezium_{variant}"] = {"per_s": per_s, "cpu_us": cpu_us, **r}
                print(f"    {rows_of[variant]}: {per_s:,.0f} rows/s, {cpu_us:.2f} us CPU per row "
                      f"(dblog: {ratio(got['per_s'], per_s)} the rate, "
                      f"{ratio(got['cpu_us'], cpu_us)} the CPU)")

        if "t" in parts:
            config = dblog_config(work, "dblog_stream", dsn, "stream")
            proc = start_dblog(config)
            wait_slot(dsn, "dblog_stream")
            time.sleep(1)
            stop(proc)
            peers = {}
            for variant in ("default", "tuned"):
                name = f"dbz_stream_{variant}"
                dbz = Debezium(cp, work, name, pg_props(cluster, "bench", work, name, "stream", "no_data",
                                                        variant == "tuned"))
                p = dbz.start(0, "start", 600)
                wait_slot(dsn, name)
                time.sleep(2)
                Debezium.result(p, stop=True)
                peers[variant] = dbz
            per = args.rows // args.tx
            t0 = time.perf_counter()
            with psycopg.connect(dsn) as conn:
                for k in range(args.tx):
                    conn.execute("INSERT INTO stream " + ROW_SQL.format(lo=k * per, hi=(k + 1) * per - 1))
                    conn.commit()
            print(f"loaded {args.rows:,} rows in {args.tx} transactions in {time.perf_counter() - t0:.1f}s")
            got = dblog_drain(config, args.rows)
            figures["stream_dblog"] = got
            print(f"(t) stream of {args.rows:,} inserts: dblog run {got['per_s']:,.0f} events/s, "
                  f"{got['cpu_us']:.2f} us CPU per event")
            for variant, dbz in peers.items():
                r = Debezium.result(dbz.start(args.rows, "count", 1800))
                per_s = r["records"] / r["seconds"] if r["seconds"] else 0.0
                cpu_us = r["cpu_seconds"] * 1e6 / r["records"] if r["records"] else 0.0
                figures[f"stream_debezium_{variant}"] = {"per_s": per_s, "cpu_us": cpu_us, **r}
                print(f"    {rows_of[variant]}: {per_s:,.0f} events/s, {cpu_us:.2f} us CPU per event "
                      f"(dblog: {ratio(got['per_s'], per_s)} the rate, "
                      f"{ratio(got['cpu_us'], cpu_us)} the CPU)")

        if "l" in parts:
            got = dblog_latency(dblog_config(work, "dblog_steady", dsn, "steady"),
                                lambda: steady_load(dsn, "steady", 0, args.rate, args.seconds))
            figures["latency_dblog"] = got
            print(f"(l) commit -> event at {args.rate:,} events/s: dblog run p50 {got['p50_ms']:.1f} ms, "
                  f"p99 {got['p99_ms']:.1f} ms")
            for k, variant in enumerate(("default", "tuned"), start=1):
                name = f"dbz_steady_{variant}"
                dbz = Debezium(cp, work, name, pg_props(cluster, "bench", work, name, "steady", "no_data",
                                                        variant == "tuned"))
                p = dbz.start(0, "latency", args.seconds + 60)
                wait_slot(dsn, name)
                time.sleep(3)
                steady_load(dsn, "steady", k * 10_000_000, args.rate, args.seconds)
                time.sleep(1)
                r = Debezium.result(p, stop=True)
                figures[f"latency_debezium_{variant}"] = r
                print(f"    {rows_of[variant]}: p50 {r.get('p50_ms', float('nan'))} ms, "
                      f"p99 {r.get('p99_ms', float('nan'))} ms ({r['records']} events)")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    figures["load_average_end"] = os.getloadavg()[0]
    results.write("peers", figures)
    print(f"work directory (logs): {work}")


MY_DDL = "(id BIGINT PRIMARY KEY, a INT, b VARCHAR(40), c DECIMAL(20,2), d DATETIME(6))"
MY_NUMS = ("INSERT INTO nums SELECT n FROM (SELECT a.i + 10 * b.i + 100 * c.i + 1000 * d.i + 10000 * e.i "
           "+ 100000 * f.i + 1000000 * g.i AS n FROM digits a, digits b, digits c, digits d, digits e, "
           "digits f, digits g) x WHERE n < {rows}")
MY_ROWS = "SELECT n, n % 1000, CONCAT('text-', n), n * 1.5, NOW(6) FROM nums WHERE n BETWEEN {lo} AND {hi}"


def my_props(server: Any, work: Path, name: str, table: str, mode: str, tuned: bool, sid: int,
             connector: str) -> dict[str, str]:
    from pydblog.devtools.mariadb import PASSWORD as MY_PASSWORD
    from pydblog.devtools.mariadb import SUPERUSER as MY_USER

    props = {
        "name": name,
        "connector.class": connector,
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(work / f"{name}.offsets"),
        "database.hostname": "127.0.0.1",
        "database.port": str(server.port),
        "database.user": MY_USER,
        "database.password": MY_PASSWORD,
        "database.server.id": str(sid),
        "topic.prefix": name,
        "database.include.list": "peer",
        "table.include.list": f"peer.{table}",
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(work / f"{name}.history"),
        "snapshot.mode": mode,
        "bench.tables": table,
    }
    if tuned:
        props.update(THROUGHPUT)
    return props


def my_dblog_config(work: Path, name: str, server: Any, table: str, sid: int, snapshot: bool = False) -> Path:
    directory = work / name
    directory.mkdir()
    path = directory / "dblog.toml"
    path.write_text(
        f'[source]\ntype = "mysql"\ndsn = "{server.dsn("peer")}"\nserver_id = {sid}\n'
        f'tables = ["peer\\\\.{table}"]\n'
        f'[log]\npath = "{directory / "data"}"\n'
        f'[api]\nlisten = "127.0.0.1:0"\n'
        + ('[snapshot]\nmode = "initial"\n' if snapshot else "")
    )
    return path


def my_steady_load(server: Any, start: int, rate: int, seconds: float) -> int:
    """Inserts of 10 rows per transaction at ``rate`` rows/s into ``peer.steady``, each row's
    ``t`` the client's clock (epoch microseconds) just before the statement and its commit;
    the rows inserted."""
    per_tx = 10
    interval = per_tx / rate
    i = start
    conn = server.connect("peer")
    try:
        conn.autocommit(False)
        with conn.cursor() as cur:
            t_end = time.monotonic() + seconds
            nxt = time.monotonic()
            while time.monotonic() < t_end:
                t = int(time.time() * 1e6)
                cur.execute("INSERT INTO steady VALUES " + ",".join(
                    f"({k},{t})" for k in range(i, i + per_tx)))
                conn.commit()
                i += per_tx
                nxt += interval
                delay = nxt - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
    finally:
        conn.close()
    return i - start


def dump_threads(server: Any) -> int:
    rows = server.execute("SHOW PROCESSLIST")
    return sum(1 for r in rows if str(r[4]).startswith("Binlog Dump"))


def mysql_main(args: argparse.Namespace) -> None:
    """The parts against MySQL 5.7 (``pydblog.devtools.mysql57``) with Debezium's MySQL
    connector, or against MariaDB (``pydblog.devtools.mariadb``) with its MariaDB
    connector; each side's start position is taken before the load (a first start that
    checkpoints, or streams, then stops)."""
    server_cm: Any
    if args.source == "mariadb":
        from pydblog.devtools.mariadb import MariaDB

        server_cm, version = MariaDB(), DEBEZIUM_MARIADB
        connector = "io.debezium.connector.mariadb.MariaDbConnector"
        cp = debezium_classpath(version, ("mariadb",), MAVEN_CACHE / "debezium-3.5.0-mariadb")
    else:
        from pydblog.devtools.mysql57 import MySQL57

        server_cm, version = MySQL57(), DEBEZIUM
        connector = "io.debezium.connector.mysql.MySqlConnector"
        cp = debezium_classpath()
    parts = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix=f"dblog-bench-peers-{args.source}-"))
    figures: dict[str, Any] = {"debezium": version, "rows": args.rows,
                               "transactions": args.tx, "throughput_settings": THROUGHPUT}
    rows_of = {"default": "Debezium (defaults)", "tuned": "Debezium (throughput settings)"}
    with server_cm as server:
        figures["source"] = f"{args.source} {server.execute('SELECT VERSION()')[0][0]}"
        server.execute("CREATE DATABASE peer")
        for t in ("snap", "stream"):
            server.execute(f"CREATE TABLE {t} {MY_DDL}", "peer")
        server.execute("CREATE TABLE steady (id BIGINT PRIMARY KEY, t BIGINT)", "peer")
        server.execute("CREATE TABLE digits (i INT PRIMARY KEY)", "peer")
        server.execute("INSERT INTO digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)", "peer")
        server.execute("CREATE TABLE nums (n BIGINT PRIMARY KEY)", "peer")
        server.execute(MY_NUMS.format(rows=args.rows), "peer")
        sid = iter(range(7001, 7100))
        if "s" in parts:
            server.execute("INSERT INTO snap " + MY_ROWS.format(lo=0, hi=args.rows - 1), "peer")
            got = dblog_drain(my_dblog_config(work, "dblog_snap", server, "snap", next(sid), snapshot=True),
                              args.rows)
            figures["snapshot_dblog"] = got
            print(f"(s) {args.source} snapshot of {args.rows:,} rows: dblog run {got['per_s']:,.0f} rows/s, "
                  f"{got['cpu_us']:.2f} us CPU per row")
            for variant in ("default", "tuned"):
                name = f"dbz_snap_{variant}"
                dbz = Debezium(cp, work, name, my_props(server, work, name, "snap", "initial_only",
                                                        variant == "tuned", next(sid), connector))
                r = Debezium.result(dbz.start(args.rows, "count", 1800))
                per_s = r["records"] / r["seconds"] if r["seconds"] else 0.0
                cpu_us = r["cpu_seconds"] * 1e6 / r["records"] if r["records"] else 0.0
                figures[f"snapshot_debezium_{variant}"] = {"per_s": per_s, "cpu_us": cpu_us, **r}
                print(f"    {rows_of[variant]}: {per_s:,.0f} rows/s, {cpu_us:.2f} us CPU per row "
                      f"(dblog: {ratio(got['per_s'], per_s)} the rate, {ratio(got['cpu_us'], cpu_us)} the CPU)")
        if "t" in parts:
            config = my_dblog_config(work, "dblog_stream", server, "stream", next(sid))
            proc = start_dblog(config)
            deadline = time.monotonic() + 180
            data = config.parent / "data"
            while True:  # its start position checkpointed (a restart reads the backlog)
                if (data / "changelog.sqlite").exists():
                    reader = SqliteChangeLogReader(data)
                    try:
                        if reader.last_checkpoint() is not None:
                            break
                    finally:
                        reader.close()
                assert time.monotonic() < deadline, "dblog run did not checkpoint its start"
                time.sleep(0.2)
            stop(proc)
            peers = {}
            for variant in ("default", "tuned"):
                name = f"dbz_stream_{variant}"
                dbz = Debezium(cp, work, name, my_props(server, work, name, "stream", "no_data",
                                                        variant == "tuned", next(sid), connector))
                deadline = time.monotonic() + 180
                while dump_threads(server) > 0:  # the previous reader's dump is gone
                    assert time.monotonic() < deadline, "a binlog dump thread stays"
                    time.sleep(0.2)
                p = dbz.start(0, "start", 600)
                while dump_threads(server) < 1:
                    assert time.monotonic() < deadline, f"{name} did not start streaming"
                    time.sleep(0.2)
                time.sleep(2)
                Debezium.result(p, stop=True)
                assert (work / f"{name}.offsets").exists(), f"{name} stored no offsets"
                peers[variant] = dbz
            per = args.rows // args.tx
            t0 = time.perf_counter()
            for k in range(args.tx):
                server.execute("INSERT INTO stream " + MY_ROWS.format(lo=k * per, hi=(k + 1) * per - 1), "peer")
            print(f"loaded {args.rows:,} rows in {args.tx} transactions in {time.perf_counter() - t0:.1f}s")
            got = dblog_drain(config, args.rows)
            figures["stream_dblog"] = got
            print(f"(t) {args.source} stream of {args.rows:,} inserts: dblog run {got['per_s']:,.0f} events/s, "
                  f"{got['cpu_us']:.2f} us CPU per event")
            for variant, dbz in peers.items():
                r = Debezium.result(dbz.start(args.rows, "count", 1800))
                per_s = r["records"] / r["seconds"] if r["seconds"] else 0.0
                cpu_us = r["cpu_seconds"] * 1e6 / r["records"] if r["records"] else 0.0
                figures[f"stream_debezium_{variant}"] = {"per_s": per_s, "cpu_us": cpu_us, **r}
                print(f"    {rows_of[variant]}: {per_s:,.0f} events/s, {cpu_us:.2f} us CPU per event "
                      f"(dblog: {ratio(got['per_s'], per_s)} the rate, {ratio(got['cpu_us'], cpu_us)} the CPU)")
        if "l" in parts:
            got = dblog_latency(my_dblog_config(work, "dblog_steady", server, "steady", next(sid)),
                                lambda: my_steady_load(server, 0, args.rate, args.seconds), "t")
            figures["latency_dblog"] = got
            print(f"(l) {args.source} commit -> event at {args.rate:,} events/s: dblog run p50 "
                  f"{got['p50_ms']:.1f} ms, p99 {got['p99_ms']:.1f} ms")
            for k, variant in enumerate(("default", "tuned"), start=1):
                name = f"dbz_steady_{variant}"
                props = my_props(server, work, name, "steady", "no_data", variant == "tuned", next(sid),
                                 connector)
                props["bench.time_field"] = "t"
                dbz = Debezium(cp, work, name, props)
                deadline = time.monotonic() + 180
                while dump_threads(server) > 0:
                    assert time.monotonic() < deadline, "a binlog dump thread stays"
                    time.sleep(0.2)
                p = dbz.start(0, "latency", args.seconds + 60)
                while dump_threads(server) < 1:
                    assert time.monotonic() < deadline, f"{name} did not start streaming"
                    time.sleep(0.2)
                time.sleep(3)
                my_steady_load(server, k * 10_000_000, args.rate, args.seconds)
                time.sleep(1)
                r = Debezium.result(p, stop=True)
                figures[f"latency_debezium_{variant}"] = r
                print(f"    {rows_of[variant]}: p50 {r.get('p50_ms', float('nan'))} ms, "
                      f"p99 {r.get('p99_ms', float('nan'))} ms ({r['records']} events)")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    figures["load_average_end"] = os.getloadavg()[0]
    results.write(f"peers-{args.source}", figures)
    print(f"work directory (logs): {work}")


if __name__ == "__main__":
    main()
