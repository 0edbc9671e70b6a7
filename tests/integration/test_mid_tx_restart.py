"""A restart from a checkpoint inside a transaction, on a real PostgreSQL (the server
test owed for the runner's ``mid_tx`` checkpoint, see tests/unit/test_runner_mid_tx.py).

``batch_max_events`` is small, so the capture checkpoints many times inside one large
transaction; it is killed (-9) while it logs that transaction, and started again. The
slot then sends the whole transaction again (PostgreSQL decodes it completely first:
the stream is idle meanwhile), and a read-only snapshot signal arrives through the API
straight into the capture (``capture.inbox``) right after the restart, typically in
that idle moment: its notification used to take the checkpoint's position + 1, which
the replayed transaction's next event has too (a second restart then skipped that
event). The oracle: the materialized log equals the source, no position appears twice,
also after a second kill -9 and restart.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson

from pydblog.changelog import open_reader
from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.helpers import wait_for

TOKEN = "mid-tx-token-0123456789"
ROWS = 4000


def post(cap: Capture, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"{url}/snapshots", data=orjson.dumps(body), method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def api_url(cap: Capture, old: str | None) -> str:
    """The API URL of the running capture (a new one after a restart)."""
    path = cap.log_dir / "api.json"
    box: list[str] = []

    def fresh() -> bool:
        try:
            url = str(orjson.loads(path.read_bytes())["url"])
        except (OSError, ValueError, KeyError):
            return False
        box[:] = [url]
        return url != old

    wait_for(fresh, 60, "the capture's API")
    return box[0]


def next_offset(cap: Capture) -> int:
    reader = open_reader(cap.log_cfg)
    try:
        return reader.next_offset()
    finally:
        reader.close()


def test_restart_inside_a_large_transaction_with_a_direct_signal(
    pg_db: str, tmp_path: Path
) -> None:
    h = PgHarness(pg_db)
    h.execute("CREATE TABLE big (id int PRIMARY KEY, v text)",
              "INSERT INTO big SELECT g, 'old' FROM generate_series(1, 50) g")
    extra = (
        'batch_max_events = 10\n'  # (in [log]: write_config's last section)
        '[snapshot]\nchunk_size = 1000\nwatermark = "read-only"\n'
        f'[api]\nlisten = "127.0.0.1:0"\ntoken = "{TOKEN}"\n'
    )
    cap = Capture(h, tmp_path, extra).start()
    try:
        url = api_url(cap, None)
        for attempt in range(3):
            # One transaction of ROWS inserts and ROWS / 2 updates, logged in batches of
            # 10, each ending in a checkpoint inside the transaction; killed once ~200
            # of its events are logged (if the capture was faster, again).
            first = 51 + attempt * ROWS
            before = next_offset(cap)
            h.execute(
                f"INSERT INTO big SELECT g, 'new' FROM generate_series({first}, {first + ROWS - 1}) g",
                f"UPDATE big SET v = 'upd' WHERE id % 2 = 0 AND id >= {first}",
            )
            deadline = time.monotonic() + 120
            while next_offset(cap) < before + 200 and time.monotonic() < deadline:
                time.sleep(0.002)
            cap.kill()
            inside = next_offset(cap) < before + ROWS + ROWS // 2
            cap.start()
            if inside:
                break
            url = api_url(cap, url)
        else:
            raise AssertionError("the capture logged the whole transaction before each kill")
        url = api_url(cap, url)
        body = {"id": f"mt-{uuid.uuid4().hex[:8]}", "type": "execute-snapshot",
                "data": {"data-collections": ["public\\.big"]}}
        answers: list[tuple[int, dict[str, Any]]] = []

        def taken() -> bool:  # 503 until the capture runs: retried with the same id
            answers.append(post(cap, url, body))
            return answers[-1][0] != 503

        wait_for(taken, 60, "the signal taken")
        code, answer = answers[-1]
        assert code == 202 and answer["applied"] is True, answer
        cap.wait_notification("COMPLETED", timeout=120)
        h.execute("UPDATE big SET v = 'after' WHERE id <= 10")
        cap.assert_oracle({"big": ["id"]})
        cap.kill()  # a second restart must skip nothing (nor log anything twice)
        cap.start()
        h.execute("UPDATE big SET v = 'last' WHERE id % 1000 = 1")
        events = cap.assert_oracle({"big": ["id"]})
    finally:
        if cap.proc is not None:
            cap.stop()
    assert sum(1 for e in events if e["op"] == "r") >= 50 + ROWS
