"""The status page (`GET /` of `dblog run`) in headless Chromium: the page's script
fetches /api/status and renders tables, the snapshot's progress bars, the lag chart and
the health checks. A screenshot is kept for docs/ (DBLOG_SCREENSHOT=path)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.helpers import start_run, stop_run, wait_for
from tests.integration.test_api import AUTH, Api, _config

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
]


def chromium(url: str, *args: str) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Debian's chromium is needed (bash .ci/run installs it)"
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run(
            [exe, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=8000", *args, url],
            capture_output=True, text=True, timeout=120,
        )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_status_page_in_chromium(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, qty int)")
        conn.execute("INSERT INTO orders SELECT g, g FROM generate_series(1, 200000) g")
    config = _config(tmp_path, pg_db)
    config.write_text(config.read_text() + "[snapshot]\nmode = \"initial\"\nchunk_size = 256\n"
                      "adaptive = false\n")
    proc = start_run(config)
    try:
        api = Api(config)
        # pause the initial snapshot midway: the page shows its bars, deterministically
        wait_for(lambda: (api.json("GET", "/snapshots")[1]["snapshot"] or {}).get("rows", 0) > 0,
                 60, "snapshot progress")
        code, _ = api.json("POST", "/snapshots", body=b'{"type": "pause-snapshot"}', headers=AUTH)
        assert code == 202
        wait_for(lambda: bool((api.json("GET", "/snapshots")[1]["snapshot"] or {}).get("paused")),
                 30, "the snapshot paused")
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for i in range(30):
                conn.execute("UPDATE orders SET qty = qty + 1 WHERE id = %s", (i + 1,))
        # a few probe samples for the chart, while the snapshot runs
        wait_for(lambda: len(api.json("GET", "/api/status")[1]["history"]) >= 3, 30, "samples")
        url = f"http://{api.host}:{api.port}/"
        dom = chromium(url, "--dump-dom")
        assert 'data-loaded="1"' in dom, dom[-3000:]
        assert "public.orders" in dom  # the tables list, rendered by the script
        assert 'class="badge ok"' in dom or 'class="badge bad"' in dom
        assert 'id="snapshot-overall"' in dom and "paused" in dom  # progress bars
        assert 'class="series"' in dom  # the lag chart's lines
        assert "idle" in dom and "slot_lag" in dom  # health checks
        assert ":postgres@" not in dom  # the DSN's password never reaches the page
        shot = Path(os.environ.get("DBLOG_SCREENSHOT", str(tmp_path / "status.png")))
        chromium(url, f"--screenshot={shot}", "--window-size=900,1000")
        assert shot.exists() and shot.stat().st_size > 10_000
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
