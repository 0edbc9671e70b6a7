"""Soak: a concurrent random write load (several tables, short and long transactions)
while snapshots are requested again and again and `dblog run` is killed with -9 at
random moments. At the end the change log materializes to exactly the source."""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import kill_and_restart, kill_seed, writing
from tests.contract.capture import Capture
from tests.contract.harness import Harness

TABLES = ("k1", "k2", "k3")
KEYS = 400


def load(h: Harness, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        statements: list[tuple[str, int, str]] = []
        long_tx = rng.random() < 0.1
        for _ in range(rng.randrange(20, 200) if long_tx else rng.randrange(1, 5)):
            t = rng.choice(TABLES)
            i = rng.randrange(KEYS // 2) * 2 + seed % 2  # writers own disjoint keys
            r = rng.random()
            if r < 0.45:
                statements.append((t, i, f"DELETE FROM {t} WHERE id = {i}"))
                statements.append((t, i, f"INSERT INTO {t} (id, v, n) VALUES ({i}, 's{rng.randrange(10**6)}', 0)"))
            elif r < 0.85:
                statements.append((t, i, f"UPDATE {t} SET n = n + 1, v = 'u{rng.randrange(10**6)}' WHERE id = {i}"))
            else:
                statements.append((t, i, f"DELETE FROM {t} WHERE id = {i}"))
        # One lock order for all writers (stable: a key's statements keep their order),
        # so concurrent long transactions never deadlock.
        statements.sort(key=lambda s: (s[0], s[1]))
        h.execute(*(s[2] for s in statements))
        time.sleep(rng.uniform(0, 0.01))


def test_soak_snapshots_under_load_with_kill9(harness: Harness, tmp_path: Path) -> None:
    """Five rounds of snapshot signals and kill -9s (``test_soak_long``: twenty)."""
    soak(harness, tmp_path, rounds=5)


@pytest.mark.slow
def test_soak_long(harness: Harness, tmp_path: Path) -> None:
    soak(harness, tmp_path, rounds=20)


def soak(harness: Harness, tmp_path: Path, rounds: int) -> None:
    for t in TABLES:
        harness.execute(f"CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(40), n INT)")
        harness.execute(
            f"INSERT INTO {t} (id, v, n) VALUES "
            + ", ".join(f"({i}, 'init{i}', 0)" for i in range(0, KEYS, 2))
        )
    cap = Capture(harness, tmp_path, "[snapshot]\nchunk_size = 37")

    def snapshot_signal(round_: int, rng: random.Random) -> None:
        tables = rng.sample(TABLES, rng.randrange(1, 4))
        harness.signal(f"soak-{round_}-{uuid.uuid4().hex[:6]}", "execute-snapshot",
                       {"data-collections": [f"{harness.schema}\\.{t}" for t in tables]})

    cap.start()
    with writing(*(lambda stop, s=s: load(harness, stop, s) for s in (1, 2))):
        done = kill_and_restart(cap.kill, cap.start, rounds, kill_seed(2024), delay=(0.5, 2.5),
                                chance=0.7, each_round=snapshot_signal)
    try:
        # a last full snapshot after the load stopped, then everything must match
        final = f"soak-final-{uuid.uuid4().hex[:6]}"
        harness.signal(final, "execute-snapshot",
                       {"data-collections": [f"{harness.schema}\\.k[123]"]})

        def final_done(events: list[dict[str, Any]]) -> bool:
            # every table is queued once the final signal's notification is logged, so a
            # COMPLETED after it means all of them were read
            notes = [(i, e["notification"]) for i, e in enumerate(events) if e["op"] == "n"]
            seen = [i for i, n in notes if n["signal_id"] == final]
            return bool(seen) and any(i > seen[0] and n["type"] == "COMPLETED" for i, n in notes)

        cap.wait_until(final_done, timeout=240, what="the final snapshot to complete")
        try:
            cap.assert_oracle({t: ["id"] for t in TABLES})
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{done}") from exc
    finally:
        cap.stop()
