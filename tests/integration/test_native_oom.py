"""The native encoder when libpq cannot allocate a row: the read fails (and its
connection, stuck in the COPY, is closed), it does not spin forever holding the
connection. In a subprocess under RLIMIT_AS, a little above its size, so that libpq's
buffer for one 100 MB row cannot be had; several limits, since what fails first (libpq,
the encoder, Python) depends on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pydblog.sources.postgres import native

pytestmark = pytest.mark.skipif(native.encoder() is None, reason="native encoder not built")

SCRIPT = r"""
import json, resource, sys, threading, psycopg
from pydblog.sources.postgres import native
dsn, extra_mb = sys.argv[1], int(sys.argv[2])
assert native.encoder() is not None
conn = psycopg.connect(dsn)
spec = native.build_spec([native.RAW, native.ESCAPE], [0], [True], ['{"t":', 1, '}'])
vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (extra_mb << 20), resource.RLIM_INFINITY))
out = {}
def work():
    try:
        with conn.transaction():
            out["rows"] = native.copy_chunk(conn, "COPY (SELECT id, t FROM huge) TO STDOUT", spec)[0]
    except BaseException as e:
        out["err"] = f"{type(e).__name__}: {str(e)[:100]}"
th = threading.Thread(target=work, daemon=True)
th.start()
th.join(30)
out["stuck"] = th.is_alive()
out["closed"] = conn.closed
print(json.dumps(out), flush=True)
import os; os._exit(0)
"""


@pytest.fixture(scope="module")
def db(pg_cluster: Any) -> Iterator[str]:
    dsn = pg_cluster.create_database("native_oom")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE huge (id int PRIMARY KEY, t text)")
        conn.execute("INSERT INTO huge VALUES (1, repeat('x', 100000000))")
    yield dsn


def test_no_memory_for_a_row_fails_the_read_instead_of_spinning(db: str) -> None:
    seen = []
    for extra_mb in (180, 220, 260):
        proc = subprocess.run([sys.executable, "-c", SCRIPT, db, str(extra_mb)],
                              capture_output=True, text=True, timeout=120)
        lines = proc.stdout.strip().splitlines()
        assert lines, f"no output at +{extra_mb} MB ({proc.returncode}): {proc.stderr[-1500:]}"
        out = json.loads(lines[-1])
        seen.append((extra_mb, out))
        assert not out["stuck"], f"the read spun at +{extra_mb} MB: {seen}"
        if "err" in out and "rows" not in out:
            # a failure inside the COPY leaves no connection stuck in it
            assert out["closed"] or "MemoryError" in out["err"], seen
    # at least one limit made the read itself fail (else this tests nothing)
    assert any("err" in out for _, out in seen), seen
