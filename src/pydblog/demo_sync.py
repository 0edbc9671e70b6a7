"""The `dblog demo` sync step: `dblog sync --available-now` into Delta Lake, a second
PostgreSQL database and a change history, then the mirrors compared with the source."""

from __future__ import annotations

import time
from pathlib import Path

from pydblog.config import load_config
from pydblog.console import SETTINGS, configure
from pydblog.verify import compare, delta_table, postgres_table, schemas, source_table


def sync_and_verify(config: Path, dsn: str, replica: str, work: Path, tables: dict[str, list[str]]) -> int:
    from pydblog.spark.job import run_sync

    cfg = load_config(config)
    configure(SETTINGS.verbose, cfg.log_dir)  # Spark's output into the demo's log directory
    print("dblog sync --available-now (PySpark, local[2]) ...")
    t0 = time.monotonic()
    code = run_sync(cfg, available_now=True)
    print(f"sync finished in {time.monotonic() - t0:.0f}s (exit {code})")
    if code != 0:
        return code
    found = schemas(cfg.log_dir)
    print("mirrors vs source:")
    ok = True
    for table in tables:
        schema = found[table]
        src = source_table(dsn, schema)
        for target, rows in (
            ("delta", delta_table(work / "lake", schema)),
            ("postgres", postgres_table(replica, "public", schema)),
        ):
            result = compare(table, target, src, rows)
            ok = ok and result.ok
            print(result.line())
    print("all mirrors equal the source" if ok else "MISMATCH: the mirrors differ from the source")
    return 0 if ok else 1
