"""Benchmark: opening a MySQL/MariaDB connection with pymysql's per-connection TLS
context against the shared one (``sources.mysql.connect.Connection``), in one run.

For each server (a throwaway MariaDB, whose test build has no TLS, and MySQL 5.7, which
makes its own certificates and so speaks TLS), ``--n`` connections opened and closed one
after another, as the capture opens them (the reader, its forks, the binlog dump and its
control connection):
(a) raw: pymysql with ``ssl_disabled=True`` (no TLS context, no handshake);
(b) pymysql as is (a default TLS context built by each connection);
(c) the shared context.
Milliseconds per connection (median of ``--repeat`` rounds), ratios to (a).

Usage: .venv/bin/python bench/mysql_connect.py [--n 30] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import pymysql

import results
from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.sources.mysql.connect import Connection


def per_connection(open_one: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        conn = open_one()
        conn.close()
    return (time.perf_counter() - t0) / n * 1000


def run(server: TestServer, n: int, repeat: int) -> dict[str, float]:
    kw = {"host": "127.0.0.1", "port": server.port, "user": "root", "password": "root"}
    with server.admin() as cur:
        cur.execute("SHOW VARIABLES LIKE 'have_ssl'")
        tls = cur.fetchone()
    variants: dict[str, Callable[[], Any]] = {
        "(a) no TLS": lambda: pymysql.connect(**kw, ssl_disabled=True),
        "(b) pymysql": lambda: pymysql.connect(**kw),
        "(c) shared context": lambda: Connection(**kw),
    }
    got = {name: statistics.median(per_connection(f, n) for _ in range(repeat))
           for name, f in variants.items()}
    base = got["(a) no TLS"]
    print(f"{type(server).__name__} (have_ssl = {tls[1] if tls else '?'}):")
    for name, ms in got.items():
        print(f"  {name}: {ms:.1f} ms per connection ({ms / base:.2f} x a)")
    return {name: round(ms, 2) for name, ms in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    figures: dict[str, dict[str, float]] = {}
    for make in (MariaDB, MySQL57):
        server = make().start()
        try:
            figures[make.__name__] = run(server, args.n, args.repeat)
        finally:
            server.stop()
    results.write("mysql_connect", {"connections": args.n, "ms_per_connection": figures})


if __name__ == "__main__":
    main()
