"""RSS of `dblog run` while a fenced snapshot is paused and a table of wide rows is updated.

While a snapshot is queued or paused, the capture keeps the events of its tables that no
read's fence has shown visible yet (``core.fence.Unsettled``). This measures what that
costs: a paused read-only (or fenced watermark) snapshot of ``w`` (``--rows`` rows), then
``--updates`` updates that each write a new ``--width``-byte text value, and the capture's
peak RSS (VmHWM) before and after them, against an idle capture's (no snapshot) in the
same run.

    flock /tmp/pydblog-bench.lock python bench/unsettled_rss.py --updates 10000 --width 10000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

import results
from pydblog.changelog import log_exists, open_reader
from pydblog.devtools.pgcluster import PgCluster
from pydblog.devtools.proc import peak_rss_kb

DBLOG = [sys.executable, "-m", "pydblog"]


def config(directory: Path, dsn: str, watermark: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "dblog.toml"
    path.write_text(
        f'[source]\ntype = "postgres"\ndsn = "{dsn}"\nheartbeat_interval_s = 0.5\n'
        f'[log]\npath = "{directory / "data"}"\n'
        f'[snapshot]\nwatermark = "{watermark}"\n[api]\nlisten = "127.0.0.1:0"\n'
    )
    return path


def caught_up(path: Path, conn: psycopg.Connection[object], timeout: float = 900) -> None:
    """Until the change log holds a marker row inserted now (one more every 5 s: the
    first may precede the capture's slot)."""
    from pydblog.config import load_config

    cfg = load_config(path).log
    deadline = time.monotonic() + timeout
    offset, tokens, last = 0, set[str](), 0.0
    while time.monotonic() < deadline:
        if time.monotonic() - last > 5:
            token = uuid.uuid4().hex
            conn.execute("INSERT INTO marker VALUES (%s)", (token,))
            tokens.add(token)
            last = time.monotonic()
        if log_exists(cfg):
            reader = open_reader(cfg)
            try:
                for r in reader.read(offset, 10_000):
                    offset = r.offset + 1
                    if any(t in str(r.body) for t in tokens):
                        return
            finally:
                reader.close()
        time.sleep(0.2)
    raise SystemExit("the capture did not catch up")


def run(dsn: str, root: Path, watermark: str, paused: bool, updates: int, width: int,
        rows: int) -> tuple[int, int]:
    path = config(root / f"{watermark}-{paused}", dsn, watermark)
    with open(path.parent / "run.log", "wb") as err:
        proc = subprocess.Popen([*DBLOG, "run", "--config", str(path)],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            caught_up(path, conn)
            if paused:
                for kind, data in (("execute-snapshot", '{"data-collections": ["public\\\\.w"]}'),
                                   ("pause-snapshot", "{}")):
                    conn.execute("INSERT INTO dblog_signal (id, type, data) VALUES (%s, %s, %s)",
                                 (uuid.uuid4().hex, kind, data))
            caught_up(path, conn)
            before = peak_rss_kb(proc.pid)
            for n in range(updates):
                conn.execute(
                    "UPDATE w SET doc = repeat(md5(%s::text), %s) WHERE id = %s",
                    (n, width // 32, n % rows + 1),
                )
            caught_up(path, conn)
            return before, peak_rss_kb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=10_000)
    ap.add_argument("--width", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=1_000)
    ap.add_argument("--watermark", default="read-only")
    ap.add_argument("--only-paused", type=int, default=0, help="1: the paused case only")
    args = ap.parse_args()
    cluster = PgCluster().start()
    root = Path(tempfile.mkdtemp(prefix="dblog-unsettled-"))
    figures: dict[str, dict[str, float]] = {}
    try:
        for paused in (False, True)[args.only_paused:]:
            name = f"db_{int(paused)}"
            dsn = cluster.create_database(name)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE w (id int PRIMARY KEY, doc text)")
                conn.execute("ALTER TABLE w ALTER doc SET STORAGE EXTERNAL")
                conn.execute("INSERT INTO w SELECT g, 'x' FROM generate_series(1, %s) g",
                             (args.rows,))
                conn.execute("CREATE TABLE marker (id text PRIMARY KEY)")
                conn.execute("CREATE TABLE dblog_signal (id text PRIMARY KEY, type text NOT NULL, "
                             "data text)")
            before, after = run(dsn, root, args.watermark, paused, args.updates, args.width,
                                args.rows)
            what = "paused snapshot" if paused else "no snapshot"
            print(f"{what:>16}: peak RSS {before / 1024:7.1f} MiB before the updates, "
                  f"{after / 1024:7.1f} MiB after ({args.updates} x {args.width} B, "
                  f"watermark {args.watermark}, load {os.getloadavg()[0]:.1f})", flush=True)
            figures[what] = {"peak_rss_mib_before": round(before / 1024, 1),
                             "peak_rss_mib_after": round(after / 1024, 1)}
    finally:
        cluster.stop()
        if not os.environ.get("KEEP"):
            subprocess.run(["rm", "-rf", str(root)], check=False)
        else:
            print(f"kept {root}")
    results.write("unsettled_rss", {"updates": args.updates, "width_bytes": args.width,
                                    "rows": args.rows, "watermark": args.watermark,
                                    "peak_rss": figures})


if __name__ == "__main__":
    main()
