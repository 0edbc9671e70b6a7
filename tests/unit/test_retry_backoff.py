"""``core.retry.RetryBackoff``: no tight loop of reads that cannot decide (an
uncovered table start or chunk read again at once, each time a fenced transaction and
its queries against the source)."""

from __future__ import annotations

from pydblog.core.retry import WARN_AFTER, RetryBackoff


def test_inconclusive_reads_in_a_row_wait_longer_up_to_a_cap_and_a_decided_read_ends_the_run() -> None:
    b = RetryBackoff(base_s=0.05, max_s=2.0)
    now, again = 100.0, 0
    assert not b.note(again, now) and b.ready(now)  # nothing inconclusive yet
    b.submitted()
    waits = []
    for _ in range(10):
        again += 1  # the read just submitted could not decide
        b.note(again, now)
        assert not b.ready(now)  # never at once
        wait = 0.0
        while not b.ready(now + wait):
            b.note(again, now + wait)  # looking again changes nothing
            wait = round(wait + 0.01, 2)
        waits.append(wait)
        now += wait
        b.submitted()
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0, 2.0]
    b.note(again, now)  # the last read decided: the run ends
    assert b.streak == 0 and b.ready(now)
    again += 1
    b.note(again, now)
    assert b.streak == 1 and not b.ready(now) and b.ready(now + 0.05)


def test_a_long_run_is_reported_once() -> None:
    b = RetryBackoff()
    warned = [b.note(n, float(n)) for n in range(1, 3 * WARN_AFTER)]
    assert warned.count(True) == 1 and warned.index(True) == WARN_AFTER - 1
