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
  messages: an exception raised inside the loop is re-raised with it.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psycopg

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
    each_round: Callable[[int, random.Random], None] | None = None,
    restart_last: bool = True,
) -> Kills:
    """``rounds`` times: ``each_round(round, rng)`` (if given), wait ``delay`` seconds
    (uniform), then, with probability ``chance``, ``kill()``, wait ``down`` seconds
    (writes while the process is down) and ``start()`` (not after the last round unless
    ``restart_last``). The process runs when this is called. Random choices come from
    ``seed`` (``kill_seed``); an exception in a round is re-raised as an
    ``AssertionError`` carrying what was done (``Kills``)."""
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
            off = rng.uniform(*down)
            if off:
                time.sleep(off)
            done.rounds.append(f"round {n}: killed after {wait:.2f} s, down {off:.2f} s")
            if n < rounds - 1 or restart_last:
                start()
        except Exception as exc:
            raise AssertionError(f"{type(exc).__name__}: {exc}\n{done}") from exc
    return done
