"""Load and kill, shared by the crash and chaos tests: write loads running in threads
while a process is killed with SIGKILL at random moments and started again, then the
test compares the result with the source.

- ``writing(*loads)``: runs each load (``load(stop)``, until ``stop`` is set) in a
  thread for the duration of a ``with`` block; leaving the block stops and joins them
  and raises the first load's error, so a writer that died fails the test instead of
  leaving it comparing a source that stopped changing.
- ``pg_writer(dsn, seed, per_s)``: the usual load of the ``w (id int PRIMARY KEY, v
  text, n int)`` table (``writer``: the same as a thread target).
- ``kill_and_restart(kill, start, rounds, seed)``: the loop. Each round waits a random
  delay, kills, optionally waits with the process down, and starts it again; the delays
  come from ``seed`` (``DBLOG_KILL_SEED`` overrides it: ``kill_seed``), and what was
  done comes back as ``Kills``, whose text (the seed and each kill) goes into failure
  messages: an exception raised inside the loop is re-raised with it. ``each_round``
  runs first in every round (wait for a point of progress: the delay counts from
  there), ``note`` adds what the test saw at each kill to its line.
- ``at_progress(wait, rounds, low, high)``: an ``each_round`` for kills at random
  points of a progress (rows logged, say) instead of the clock's.
- ``reporting(*kills)``: a ``with`` block whose assertion errors also carry the kills
  (the oracle's comparison after the loops).
- ``StepKills``: kills at random steps of a scripted workload that the test's thread
  runs itself (``at(step)`` each step): the kills fall at the same steps for a seed,
  some steps run while the process is down.
- ``kill_group(proc)``: SIGKILL a process started with ``start_new_session`` and its
  whole group (a Spark job with its JVM and Python workers), and reap it.
- ``killed_at_faults(start, faults, log)``: jobs that kill themselves at injected
  fault points, one after the other, each checked to have died there.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from pydblog.devtools.proc import end_process

Load = Callable[[threading.Event], None]


@contextlib.contextmanager
def writing(*loads: Load) -> Iterator[threading.Event]:
    """Run each of ``loads`` in a thread until the block ends (or the returned event is
    set); then join them and raise the first error a load raised."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(load: Load) -> None:
        try:
            load(stop)
        except BaseException as exc:  # raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(load,), daemon=True) for load in loads]
    for t in threads:
        t.start()
    try:
        yield stop
    finally:
        stop.set()
        for t in threads:
            t.join()
    if errors:
        raise AssertionError(f"a write load failed: {errors[0]!r}") from errors[0]


def writer(dsn: str, stop: threading.Event, seed: int, per_s: float | None = None) -> None:
    """Random upserts, updates and deletes of 300 keys of ``w``, 1-19 a transaction,
    until ``stop``; with ``per_s``, at most that many statements a second (a paced load:
    the log's size does not grow with the machine's speed)."""
    rng = random.Random(seed)
    start, done = time.monotonic(), 0
    with psycopg.connect(dsn) as conn:
        while not stop.is_set():
            for _ in range(rng.randrange(1, 20)):
                i = rng.randrange(300)
                r = rng.random()
                if r < 0.5:
                    conn.execute(
                        "INSERT INTO w VALUES (%s, %s, 1) ON CONFLICT (id) DO UPDATE "
                        "SET v = excluded.v, n = w.n + 1",
                        (i, f"x{rng.random()}"),
                    )
                elif r < 0.8:
                    conn.execute("UPDATE w SET n = n + 1 WHERE id = %s", (i,))
                else:
                    conn.execute("DELETE FROM w WHERE id = %s", (i,))
                done += 1
            conn.commit()
            ahead = 0.0 if per_s is None else start + done / per_s - time.monotonic()
            if ahead > 0:
                stop.wait(ahead)


def pg_writer(dsn: str, seed: int, per_s: float | None = None) -> Load:
    """``writer`` as a load for ``writing``."""
    return lambda stop: writer(dsn, stop, seed, per_s)


def kill_seed(default: int) -> int:
    """``DBLOG_KILL_SEED`` when set (to run a failure's delays again), else ``default``
    (a fixed seed: the default suite runs the same delays each time)."""
    env = os.environ.get("DBLOG_KILL_SEED")
    return int(env) if env else default


@dataclass
class Kills:
    """What ``kill_and_restart`` did: its seed and one line per round."""

    seed: int
    rounds: list[str] = field(default_factory=list)
    killed: int = 0

    def __str__(self) -> str:
        return (f"kill seed {self.seed} (DBLOG_KILL_SEED={self.seed} runs the same delays "
                f"again); {self.killed} kills: " + "; ".join(self.rounds))


def kill_and_restart(
    kill: Callable[[], object],
    start: Callable[[], object],
    rounds: int,
    seed: int,
    *,
    delay: tuple[float, float] = (0.8, 2.5),
    down: tuple[float, float] = (0.0, 0.0),
    chance: float = 1.0,
    each_round: Callable[[int, random.Random], object] | None = None,
    restart_last: bool = True,
    note: Callable[[], str] | None = None,
) -> Kills:
    """``rounds`` times: ``each_round(round, rng)`` (if given), wait ``delay`` seconds
    (uniform), then, with probability ``chance``, ``kill()``, wait ``down`` seconds
    (writes while the process is down) and ``start()`` (not after the last round unless
    ``restart_last``). The process runs when this is called. Random choices come from
    ``seed`` (``kill_seed``); an exception in a round is re-raised as an
    ``AssertionError`` carrying what was done (``Kills``). ``note()``, called right
    after each kill, is added to that round's line (what the killed process had done)."""
    rng = random.Random(seed)
    done = Kills(seed)
    for n in range(rounds):
        try:
            if each_round is not None:
                each_round(n, rng)
            wait = rng.uniform(*delay)
            time.sleep(wait)
            if rng.random() >= chance:
                done.rounds.append(f"round {n}: {wait:.2f} s, not killed")
                continue
            kill()
            done.killed += 1
            seen = f" ({note()})" if note is not None else ""
            off = rng.uniform(*down)
            if off:
                time.sleep(off)
            done.rounds.append(f"round {n}: killed after {wait:.2f} s{seen}, down {off:.2f} s")
            if n < rounds - 1 or restart_last:
                start()
        except Exception as exc:
            raise AssertionError(f"{type(exc).__name__}: {exc}\n{done}") from exc
    return done


def at_progress(wait: Callable[[float], object], rounds: int, low: float,
                high: float) -> Callable[[int, random.Random], None]:
    """An ``each_round`` for ``kill_and_restart``: its first round draws ``rounds``
    points uniform in ``[low, high]`` (from the loop's seed), sorted; round ``n`` calls
    ``wait(points[n])`` (returns once the progress reached it). For kills at random
    points of what the process does, whatever its speed on a loaded machine."""
    points: list[float] = []

    def each_round(n: int, rng: random.Random) -> None:
        if not points:
            points.extend(sorted(rng.uniform(low, high) for _ in range(rounds)))
        wait(points[n])

    return each_round


@contextlib.contextmanager
def reporting(*kills: Kills) -> Iterator[None]:
    """Re-raise an ``AssertionError`` of the block with ``kills`` (each loop's seed and
    what it did) added to its message: the oracle's failure after kill loops names them."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError("\n".join([str(exc), *map(str, kills)])) from exc


class StepKills:
    """Kills at random steps of a scripted workload, for a test that runs the workload
    in its own thread: ``kills`` steps drawn from ``steps`` with the seed; at such a step
    ``at(step)`` waits 0-``pause`` s, kills, and starts the process again ``down`` steps
    later (a uniform integer: those steps run while it is down); a kill step that falls
    while it is down is passed. ``finish()`` starts it if it is down. ``done`` (a
    ``Kills``) has a line per kill for failure messages; ``rng`` (the seed's) is the
    workload's own, so the seed reproduces the steps and the kills together."""

    def __init__(self, kill: Callable[[], object], start: Callable[[], object], seed: int,
                 steps: range, kills: int, *, down: tuple[int, int] = (1, 6),
                 pause: float = 0.3) -> None:
        self.kill, self.start, self.pause, self.down = kill, start, pause, down
        self.rng = random.Random(seed)
        chooser = random.Random(seed + 1)
        self.steps = set(chooser.sample(steps, kills))
        self._chooser = chooser
        self.done = Kills(seed)
        self._up_at: int | None = None  # the step it starts again at, while it is down

    def at(self, step: int) -> None:
        """Call before running ``step``: kills or starts the process as scheduled."""
        if self._up_at is not None and step >= self._up_at:
            self.start()
            self._up_at = None
        if step in self.steps and self._up_at is None:
            wait = self._chooser.uniform(0.0, self.pause)
            time.sleep(wait)
            self.kill()
            self.done.killed += 1
            off = self._chooser.randint(*self.down)
            self._up_at = step + off
            self.done.rounds.append(f"step {step}: killed after {wait:.2f} s, down {off} steps")

    def finish(self) -> None:
        """Start the process if it is down (the workload ended before its restart)."""
        if self._up_at is not None:
            self.start()
            self._up_at = None


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and every process of its group (it was started with
    ``start_new_session``: a job's JVM and workers die with it) and reap it; nothing of
    it is left running. Safe on a process that already ended (its group is killed)."""
    end_process(proc, 60, kill=True, group=True)


def killed_at_faults(start: Callable[[str, int], subprocess.Popen[bytes]], faults: Sequence[str],
                     log: Callable[[int], Path], timeout: float = 240) -> None:
    """Start one process per fault (``start(fault, n)``: a job told, by a fault
    injection, to SIGKILL its own process group at that point) and wait up to
    ``timeout`` s for it to die there; whatever happened its group is killed
    (``kill_group``). Fails naming the fault, the exit code and the end of ``log(n)``
    when one did not die by SIGKILL (it failed, finished, or never reached the point)."""
    for n, fault in enumerate(faults):
        job = start(fault, n)
        try:
            code = job.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # not left running (its JVM, its Python workers), whatever happened
            kill_group(job)
        how = f"still ran after {timeout:.0f} s" if code is None else f"exit {code}"
        assert code == -signal.SIGKILL, (
            f"job {n} did not die at {fault} ({how}):\n"
            + log(n).read_text(errors="replace")[-5000:])
