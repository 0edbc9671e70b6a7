"""How far a MySQL/MariaDB source's change log is complete, in source time.

The binlog stamps a transaction's events with whole seconds (a commit at 10.7 s is at
10.000 s), so a time the log claims to be complete up to (its newest commit time, or
the capture's clock when it wrote a checkpoint outside a transaction: a heartbeat) must
never reach a second a later commit can still be stamped with: the sync's ``T`` and
``consistent = true``'s rounds are built on that claim."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

from pydblog.changelog import complete_ms
from pydblog.devtools.mysql57 import TestServer
from tests.contract.capture import Capture
from tests.mysql.harness import MariaHarness


def _logged(id_: int, events: list[dict[str, Any]]) -> bool:
    return any((e.get("after") or {}).get("id") == id_ for e in events)


def test_the_log_is_never_complete_up_to_a_second_still_to_come(
        server: TestServer, db: str, tmp_path: Path) -> None:
    h = MariaHarness(server, db)
    h.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    cap = Capture(h, tmp_path)
    log = cap.log_cfg.model_dump_json()
    seen = 0
    with cap:
        cap.caught_up()
        for i in range(1, 6):
            while time.time() % 1 > 0.3:  # early in a second: room for two commits in it
                time.sleep(0.01)
            second = int(time.time())
            h.execute(f"INSERT INTO t VALUES ({2 * i})")
            cap.wait_until(partial(_logged, 2 * i), 10, "the first commit")
            claimed = complete_ms(log)
            h.execute(f"INSERT INTO t VALUES ({2 * i + 1})")
            if int(time.time()) != second:
                continue  # the machine was too slow: the second passed, try again
            events = cap.wait_until(partial(_logged, 2 * i + 1), 10, "the second commit")
            stamp = next(e["source"]["ts_ms"] for e in events
                         if (e.get("after") or {}).get("id") == 2 * i + 1)
            assert claimed is not None and stamp > claimed, (
                f"the log claimed to be complete up to {claimed}, then a commit stamped "
                f"{stamp} was logged")
            seen += 1
            if seen == 2:
                break
    assert seen >= 2, "no two commits fell in one second"
