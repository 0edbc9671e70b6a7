"""The shared load-and-kill helper (tests/chaos.py): the same seed gives the same
rounds, a failure names the seed and the kills done, a load's error fails the block."""

from __future__ import annotations

import threading

import pytest

from tests.chaos import kill_and_restart, kill_seed, writing


def test_rounds_follow_the_seed_and_restart_what_was_killed() -> None:
    calls: list[str] = []
    fast = (0.0, 0.001)
    a = kill_and_restart(lambda: calls.append("kill"), lambda: calls.append("start"), 6, 5,
                         delay=fast, chance=0.5)
    b = kill_and_restart(lambda: None, lambda: None, 6, 5, delay=fast, chance=0.5)
    assert [r.split(" after")[0] for r in a.rounds] == [r.split(" after")[0] for r in b.rounds]
    assert calls == ["kill", "start"] * a.killed and 0 < a.killed < 6
    assert "DBLOG_KILL_SEED=5" in str(a)
    calls.clear()
    kill_and_restart(lambda: calls.append("kill"), lambda: calls.append("start"), 2, 1,
                     delay=fast, restart_last=False)
    assert calls == ["kill", "start", "kill"]


def test_a_failing_round_names_the_seed_and_the_kills() -> None:
    def start() -> None:
        raise RuntimeError("did not come back")

    with pytest.raises(AssertionError, match=r"did not come back\nkill seed 7 .*1 kills"):
        kill_and_restart(lambda: None, start, 3, 7, delay=(0.0, 0.0))


def test_a_load_that_fails_fails_the_block() -> None:
    def bad(stop: threading.Event) -> None:
        raise ValueError("lost the connection")

    ran: list[bool] = []

    def good(stop: threading.Event) -> None:
        stop.wait()
        ran.append(True)

    with pytest.raises(AssertionError, match="lost the connection"), writing(good, bad):
        pass
    assert ran == [True]


def test_kill_seed_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DBLOG_KILL_SEED", raising=False)
    assert kill_seed(3) == 3
    monkeypatch.setenv("DBLOG_KILL_SEED", "42")
    assert kill_seed(3) == 42
