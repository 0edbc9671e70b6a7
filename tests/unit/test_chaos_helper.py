"""The shared load-and-kill helper (tests/chaos.py): the same seed gives the same
rounds, a failure names the seed and the kills done, a load's error fails the block, a
group kill leaves nothing of the group running."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.chaos import (
    StepKills,
    at_progress,
    kill_and_restart,
    kill_group,
    kill_seed,
    killed_at_faults,
    reporting,
    writing,
)


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


def test_each_round_comes_first_and_notes_go_into_the_kills() -> None:
    calls: list[str] = []
    seen = iter(["v1", "v2"])
    done = kill_and_restart(lambda: calls.append("kill"), lambda: calls.append("start"), 2, 3,
                            delay=(0.0, 0.0), each_round=lambda n, rng: calls.append(f"wait{n}"),
                            restart_last=False, note=lambda: next(seen))
    assert calls == ["wait0", "kill", "start", "wait1", "kill"]
    assert "(v1)" in done.rounds[0] and "(v2)" in done.rounds[1]


def test_kill_group_kills_the_whole_group() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    kill_group(proc)
    assert proc.returncode == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):  # no process of its group is left
        for _ in range(100):
            os.killpg(proc.pid, 0)
            threading.Event().wait(0.05)  # (a killed child is reaped by init shortly)
    kill_group(proc)  # again: nothing to do


def test_killed_at_faults_wants_each_job_dead_by_sigkill(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("the job's last words")

    def start(fault: str, n: int) -> subprocess.Popen[bytes]:  # "kill" dies, "exit" does not
        script = "kill -9 $$" if fault == "kill" else "exit 3"
        return subprocess.Popen(["sh", "-c", script], start_new_session=True)

    killed_at_faults(start, ["kill", "kill"], lambda n: log)
    with pytest.raises(AssertionError, match=r"job 1 did not die at exit \(exit 3\):\n.*last words"):
        killed_at_faults(start, ["kill", "exit"], lambda n: log)


def test_reporting_adds_the_kills_to_a_failure() -> None:
    kills = kill_and_restart(lambda: None, lambda: None, 1, 9, delay=(0.0, 0.0))
    with pytest.raises(AssertionError, match=r"rows differ\nkill seed 9 .*1 kills"), \
            reporting(kills):
        raise AssertionError("rows differ")
    with reporting(kills):  # nothing raised: nothing to add
        pass


def test_at_progress_waits_for_sorted_points_of_the_seed() -> None:
    waited: list[float] = []
    kill_and_restart(lambda: None, lambda: None, 3, 4, delay=(0.0, 0.0),
                     each_round=at_progress(waited.append, 3, 100, 700))
    assert waited == sorted(waited) and len(set(waited)) == 3
    assert all(100 <= w <= 700 for w in waited)
    again: list[float] = []
    kill_and_restart(lambda: None, lambda: None, 3, 4, delay=(0.0, 0.0),
                     each_round=at_progress(again.append, 3, 100, 700))
    assert again == waited


def test_step_kills_fall_on_the_seeds_steps_and_restart_later() -> None:
    def run(seed: int) -> tuple[list[str], list[float], StepKills]:
        calls: list[str] = []
        kills = StepKills(lambda: calls.append("kill"), lambda: calls.append("start"), seed,
                          range(2, 40), 6, down=(1, 6), pause=0.0)
        for step in range(40):
            kills.at(step)
            calls.append(f"{step}")
        kills.finish()
        return calls, [kills.rng.random()], kills

    calls, workload, kills = run(11)
    assert (calls, workload) == run(11)[:2]  # the same seed: the same kills and workload
    # Every kill is followed by a start; a step between them runs while it is down.
    assert calls.count("kill") == calls.count("start") == kills.done.killed >= 1
    kill_steps = [int(r.split()[1].rstrip(":")) for r in kills.done.rounds]
    assert set(kill_steps) <= kills.steps and all(2 <= s < 40 for s in kill_steps)
    first = calls.index("kill")
    assert calls[first + 1] != "start" and "DBLOG_KILL_SEED=11" in str(kills.done)
