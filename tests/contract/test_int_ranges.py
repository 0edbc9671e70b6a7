"""Integer keys cut into ranges by arithmetic (``core.intsplit``) against real servers,
``parallelism = 4``: sparse, skewed and negative keys up to the limits of bigint
(PostgreSQL) and of unsigned bigint (MySQL/MariaDB), while a writer inserts rows into
the gaps between keys, updates and deletes; the change log must materialize to the
table (every key once, none skipped, none read twice, no overflow in a bound)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import Harness
from tests.contract.test_snapshots import q
from tests.helpers import sid


def domain(h: Harness) -> tuple[str, int, int]:
    """(column type, lowest, highest key) of the source's widest integer type."""
    if h.name.startswith("postgres"):
        return "BIGINT", -(2**63), 2**63 - 1
    return "BIGINT UNSIGNED", 0, 2**64 - 1


def skewed_keys(rng: random.Random, lo: int, hi: int, n: int) -> list[int]:
    """Both extremes, a dense run at each end and in the middle, sparse keys between."""
    mid = (lo + hi) // 2
    keys = {lo, hi}
    keys.update(range(lo + 1, lo + 1 + n // 4))
    keys.update(range(hi - n // 4, hi))
    keys.update(range(mid - n // 8, mid + n // 8))
    while len(keys) < n:
        keys.add(rng.randrange(lo, hi + 1))
    return sorted(keys)


def writer(h: Harness, keys: list[int], lo: int, hi: int, stop: threading.Event) -> None:
    rng = random.Random(5)
    while not stop.is_set():
        r = rng.random()
        if r < 0.4:  # a new key in a gap (or next to a dense run), maybe above the max
            base = rng.choice(keys)
            k = min(hi, max(lo, base + rng.choice([-1, 1]) * rng.randrange(1, 2**rng.randrange(1, 62))))
            h.execute(f"DELETE FROM t1 WHERE id = {k}",
                      f"INSERT INTO t1 (id, v, n) VALUES ({k}, 'w{rng.random():.6f}', 1)")
            keys.append(k)
        elif r < 0.8:
            h.execute(f"UPDATE t1 SET n = n + 1 WHERE id = {rng.choice(keys)}")
        else:
            h.execute(f"DELETE FROM t1 WHERE id = {rng.choice(keys)}")
        time.sleep(0.002)


@pytest.mark.mysql57
def test_sparse_skewed_integer_keys_at_the_type_limits(harness: Harness, tmp_path: Path) -> None:
    h = harness
    pg = h.name.startswith("postgres")
    typ, lo, hi = domain(h)
    rows, chunk = (12_000, 256) if pg else (3_000, 64)
    keys = skewed_keys(random.Random(3), lo, hi, rows)
    h.execute(f"CREATE TABLE t1 (id {typ} PRIMARY KEY, v VARCHAR(40), n INT)")
    for i in range(0, len(keys), 2_000):
        values = ", ".join(f"({k}, 'v{k % 1000}', 0)" for k in keys[i:i + 2_000])
        h.execute(f"INSERT INTO t1 (id, v, n) VALUES {values}")
    with Capture(h, tmp_path, f"[snapshot]\nchunk_size = {chunk}\nparallelism = 4") as cap:
        stop = threading.Event()
        th = threading.Thread(target=writer, args=(h, list(keys), lo, hi, stop))
        th.start()
        try:
            h.signal(sid(), "execute-snapshot", {"data-collections": [q(h, "t1")]})
            cap.wait_notification("COMPLETED", timeout=180)
        finally:
            stop.set()
            th.join()
        events = cap.assert_oracle({"t1": ["id"]})
        err = cap.stop()
    read = [e["after"]["id"] for e in snapshot_rows(events, "t1")]
    assert len(read) == len(set(read))  # no key read twice
    assert lo in read or hi in read
    assert "cut by arithmetic" in err
