"""The seam for brokers weaker than Apache Kafka (``changelog.kafka.compat``): a client's
fetch wait starts at the shortest (a bulk client's at ``BULK_FETCH_WAIT_MS``), steps up
only when a read stalls, never goes down, and only the first step is shared with the
process's other clients of the same broker. The stalls themselves are tested on Tansu
(``tests/kafka/test_kafka_stall_reread.py``, marker ``tansu``)."""

from __future__ import annotations

import pytest

from pydblog.changelog.kafka import compat


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "_LEARNED_WAITS", {})


def test_a_client_starts_at_the_shortest_wait_and_steps_up_the_ladder() -> None:
    waits = compat.FetchWaits("b:9092")
    assert waits.current == compat.FETCH_WAITS_MS[0]
    assert compat.FetchWaits("b:9092", bulk=True).current == compat.BULK_FETCH_WAIT_MS
    consumer_wait = waits.current
    seen = []
    while (nxt := waits.next_wait(consumer_wait)) != 0:
        waits.step(nxt, consumer_wait, [("t", 0)])
        assert waits.current == nxt > consumer_wait  # never down, one step at a time
        seen.append(nxt)
        consumer_wait = nxt
    assert seen == list(compat.FETCH_WAITS_MS[1:])


def test_only_the_first_step_is_shared_and_only_for_the_same_broker(
        caplog: pytest.LogCaptureFixture) -> None:
    a, b, other = (compat.FetchWaits("b:9092"), compat.FetchWaits("b:9092"),
                   compat.FetchWaits("c:9092"))
    with caplog.at_level("WARNING", logger=compat.__name__):
        a.step(compat.FETCH_WAITS_MS[3], compat.FETCH_WAITS_MS[0], [("t", 1)])
    assert "too short for its storage" in caplog.text and "('t', 1)" in caplog.text
    assert a.current == compat.FETCH_WAITS_MS[3]
    assert b.current == compat.FETCH_WAITS_MS[1]  # learned by the process: the first step
    assert other.current == compat.FETCH_WAITS_MS[0]
    # a client made with a shorter wait reads on with what the process learned
    assert b.next_wait(compat.FETCH_WAITS_MS[0]) == compat.FETCH_WAITS_MS[1]
    caplog.clear()
    b.step(compat.FETCH_WAITS_MS[1], compat.FETCH_WAITS_MS[0], [("t", 1)])
    assert not caplog.text  # nothing new learned: not said again


def test_a_bounded_first_read_looks_for_a_stall_sooner() -> None:
    waits = compat.FetchWaits("b:9092")
    assert waits.first_stall_s(True, compat.FETCH_WAITS_MS[0], 5.0) == compat.FIRST_STALL_S
    assert waits.first_stall_s(False, compat.FETCH_WAITS_MS[0], 5.0) == 5.0
    assert waits.first_stall_s(True, compat.FETCH_WAITS_MS[1], 5.0) == 5.0


def test_topics_are_listed_all_at_once() -> None:
    class Topic:
        def __init__(self, parts: int, error: object = None) -> None:
            self.partitions = dict.fromkeys(range(parts))
            self.error = error

    class Admin:
        def __init__(self) -> None:
            self.asked: list[object] = []

        def list_topics(self, topic: object = None, timeout: float = 0) -> object:
            self.asked.append(topic)
            return type("Md", (), {"topics": {"a": Topic(3), "b": Topic(0), "c": Topic(1, "err")}})

    admin = Admin()
    assert compat.topic_partitions(admin, 1.0) == {"a": 3}
    assert admin.asked == [None]  # never one topic by name (some brokers create it)
