"""Closing a snapshot reader while a chunk read runs on another thread (what the capture
service does when a worker does not stop within driver.close()'s join): the read
raises; it never returns the rows received so far as a complete chunk (the core reads
"fewer rows than asked" as the table's end: silent loss), and nothing is freed under it
(run with MALLOC_PERTURB_ so that a use after free shows). In a subprocess: a crash
must fail the test, not end pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pydblog.sources.postgres import native

ROWS = 200_000
# rows stream to the client between the sleeps; the reader is closed in the first one
SLOW = "(id % 50000 <> 0 OR pg_sleep(0.5) IS NOT NULL)"

SCRIPT = r"""
import json, sys, threading, time, psycopg
from pydblog.config import Config
from pydblog.sources.postgres.chunks import PgSnapshotReader
dsn, use_native, rows, cond, log = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4], sys.argv[5]
split = sys.argv[6] == "1"
class S: captured_tables = ()
cfg = Config.model_validate({"source": {"dsn": dsn}, "log": {"path": log},
                             "snapshot": {"parallelism": 2}})
r = PgSnapshotReader(cfg, S(), split=split)
r.native = use_native
info = r.table_info("public.big")
out = {}
def work():
    try:
        c = r.read_chunk(info, None, (rows,), rows, cond)
        out["rows"] = len(c)
    except BaseException as e:
        out["err"] = f"{type(e).__name__}: {e}"
th = threading.Thread(target=work, daemon=True)
th.start()
with psycopg.connect(dsn, autocommit=True) as admin:
    for _ in range(600):
        if admin.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                         "AND query LIKE '%%big%%'").fetchone()[0]:
            break
        time.sleep(0.02)
    else:
        out["setup"] = "the read never reached its first sleep"
r.close()
th.join(60)
out["alive"] = th.is_alive()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def db(pg_cluster: Any) -> Iterator[str]:
    dsn = pg_cluster.create_database("reader_close")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, t text)")
        conn.execute(f"INSERT INTO big SELECT g, repeat('x', 40) || g FROM generate_series(1, {ROWS}) g")
    yield dsn


@pytest.mark.parametrize("split", [False, True], ids=["one", "split"])
@pytest.mark.parametrize("use_native", [True, False], ids=["native", "sql"])
def test_closing_a_reader_mid_read_fails_the_read(
    db: str, tmp_path: Any, use_native: bool, split: bool
) -> None:
    """``split``: the chunk is read as parallel sub-reads (``SubReadPool``), whose
    connections are closed under them too."""
    if use_native and native.encoder() is None:
        pytest.skip("native encoder not built")
    env = {**os.environ, "MALLOC_PERTURB_": "165", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, db, "1" if use_native else "0", str(ROWS), SLOW,
         str(tmp_path / "log"), "1" if split else "0"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"the reading process died ({proc.returncode}): {proc.stderr[-2000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "setup" not in out, out
    assert not out["alive"], "the read did not end after close()"
    assert "rows" not in out, f"a read cut short by close() returned {out['rows']} of {ROWS} rows as complete"
    assert "err" in out
