"""``capture.inbox``: offers are answered, withdrawn when no capture takes them, and put
back (first in line) when a capture fails after taking them."""

from __future__ import annotations

import threading

from pydblog.capture.inbox import SignalInbox, deliver


def test_an_untaken_offer_is_withdrawn_and_never_applies() -> None:
    inbox = SignalInbox()
    assert deliver("a", "execute-snapshot", {}, 0.2, inbox=inbox) is None
    assert inbox.take() == [] and not inbox.waiting


def test_a_taken_offer_is_answered() -> None:
    inbox = SignalInbox()

    def capture() -> None:
        while not inbox.waiting:
            threading.Event().wait(0.01)
        for item in inbox.take():
            item.answer("applied", notification={"type": "STARTED"})

    th = threading.Thread(target=capture)
    th.start()
    item = deliver("b", "execute-snapshot", {}, 5, inbox=inbox)
    th.join()
    assert item is not None and item.done.is_set()
    assert item.outcome == "applied" and item.notification == {"type": "STARTED"}


def test_put_back_goes_first_and_can_be_withdrawn() -> None:
    inbox = SignalInbox()
    first = inbox.offer("1", "pause-snapshot", {})
    second = inbox.offer("2", "resume-snapshot", {})
    taken = inbox.take()
    assert taken == [first, second] and not inbox.waiting
    third = inbox.offer("3", "stop-snapshot", {})
    inbox.put_back(taken)
    assert inbox.waiting
    assert inbox.withdraw(second) and not inbox.withdraw(second)
    assert inbox.take() == [first, third]


def test_wake_is_called_on_offer() -> None:
    inbox = SignalInbox()
    woken: list[int] = []
    inbox.wake = lambda: woken.append(1)
    inbox.offer("x", "execute-snapshot", {})
    assert woken == [1]
