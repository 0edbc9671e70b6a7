"""Which statement form the MySQL sink upserts with (docs/performance.md).

A throwaway MariaDB; a table ``(id BIGINT PRIMARY KEY, qty INT, note LONGTEXT, price
DOUBLE)`` holding ``--rows`` rows; each round upserts ``--rows`` rows (half existing keys,
half new), in one transaction, with each form in turn (alternating, so drift in the
machine's load hits every form alike); reports rows/s per form, median over rounds, and
the ratio to the sink's form:

- ``iodku``: multi-row ``INSERT … VALUES (…), (…) ON DUPLICATE KEY UPDATE`` (1000 rows a
  statement: the sink's form);
- ``delete+insert``: ``DELETE … WHERE id IN (…)`` then a multi-row ``INSERT`` (1000 rows);
- ``row-by-row``: one ``INSERT … ON DUPLICATE KEY UPDATE`` per row;
- ``load-data``: ``LOAD DATA LOCAL INFILE`` into a temporary table, then ``INSERT …
  SELECT … ON DUPLICATE KEY UPDATE`` (skipped when the server refuses local files).

    .venv/bin/python bench/mysql_upsert.py --rows 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from pydblog.devtools.mariadb import MariaDB

COLS = "id, qty, note, price"
SETS = "qty = VALUES(qty), note = VALUES(note), price = VALUES(price)"
CHUNK = 1000


def rows_for(n: int, round_: int) -> list[tuple[Any, ...]]:
    # keys n/2 .. 3n/2: half update existing rows, half are new
    return [(k, k + round_, f"note {k} {round_}", k / 3.0) for k in range(n // 2, n // 2 + n)]


def iodku(cur: Any, rows: list[tuple[Any, ...]]) -> None:
    for lo in range(0, len(rows), CHUNK):
        chunk = rows[lo:lo + CHUNK]
        cur.execute(f"INSERT INTO t ({COLS}) VALUES {', '.join(['(%s, %s, %s, %s)'] * len(chunk))} "
                    f"ON DUPLICATE KEY UPDATE {SETS}", [v for r in chunk for v in r])


def delete_insert(cur: Any, rows: list[tuple[Any, ...]]) -> None:
    for lo in range(0, len(rows), CHUNK):
        chunk = rows[lo:lo + CHUNK]
        cur.execute(f"DELETE FROM t WHERE id IN ({', '.join(['%s'] * len(chunk))})",
                    [r[0] for r in chunk])
        cur.execute(f"INSERT INTO t ({COLS}) VALUES {', '.join(['(%s, %s, %s, %s)'] * len(chunk))}",
                    [v for r in chunk for v in r])


def row_by_row(cur: Any, rows: list[tuple[Any, ...]]) -> None:
    for r in rows:
        cur.execute(f"INSERT INTO t ({COLS}) VALUES (%s, %s, %s, %s) ON DUPLICATE KEY UPDATE {SETS}", r)


def load_data(cur: Any, rows: list[tuple[Any, ...]]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".tsv", delete=False) as f:
        for r in rows:
            f.write("\t".join(str(v) for v in r) + "\n")
    try:
        cur.execute("CREATE TEMPORARY TABLE IF NOT EXISTS s LIKE t")
        cur.execute("DELETE FROM s")
        cur.execute(f"LOAD DATA LOCAL INFILE '{f.name}' INTO TABLE s ({COLS})")
        cur.execute(f"INSERT INTO t ({COLS}) SELECT {COLS} FROM s ON DUPLICATE KEY UPDATE "
                    "qty = s.qty, note = s.note, price = s.price")
    finally:
        os.unlink(f.name)


FORMS: dict[str, Callable[[Any, list[tuple[Any, ...]]], None]] = {
    "iodku": iodku, "delete+insert": delete_insert, "row-by-row": row_by_row,
    "load-data": load_data,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import pymysql

    rates: dict[str, list[float]] = {f: [] for f in FORMS}
    with MariaDB(server_id=1) as server:
        server.execute("CREATE DATABASE b")
        conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", password="root",
                               database="b", local_infile=True, autocommit=False)
        cur = conn.cursor()
        for r in range(args.rounds):
            for name, form in FORMS.items():
                cur.execute("DROP TABLE IF EXISTS t")
                cur.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, qty INT, note LONGTEXT, "
                            "price DOUBLE) ENGINE=InnoDB")
                iodku(cur, [(k, 0, f"n{k}", 0.0) for k in range(args.rows)])
                conn.commit()
                rows = rows_for(args.rows, r)
                t0 = time.perf_counter()
                try:
                    form(cur, rows)
                    conn.commit()
                except pymysql.Error as exc:
                    conn.rollback()
                    print(f"{name}: skipped ({exc})")
                    continue
                rates[name].append(len(rows) / (time.perf_counter() - t0))
            print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:,.0f} rows/s" for n, v in rates.items() if v)
                  + f" (load {os.getloadavg()[0]:.1f})")
        conn.close()
    base = statistics.median(rates["iodku"])
    figures: dict[str, Any] = {"rows": args.rows, "rounds": args.rounds}
    for name, v in rates.items():
        if v:
            med = statistics.median(v)
            print(f"{name}: median {med:,.0f} rows/s = {med / base:.2f} x iodku")
            figures[name] = {"rows_per_s": v, "median_rows_per_s": med, "x_iodku": med / base}
    import results

    print(f"results: {results.write('mysql_upsert', figures)}")


if __name__ == "__main__":
    main()
