"""Test helpers: a capture's commit held open on the broker, and a watch for the
end-of-partition events a ``client.Client``'s reads get.

``HeldCommit`` runs one ``append`` of a real ``KafkaChangeLog`` in a thread and stops it
between its checkpoint message (acknowledged) and ``commit_transaction``: where a
``kill -9`` of the capture leaves the broker with an open transaction whose records
(data and the checkpoint message) lie below the partitions' high watermarks, until it
commits (``finish``), or the broker aborts it. Tansu (0.6) hides the open transaction's
records from ``read_committed`` consumers (their end of partition is its first offset),
reports a last stable offset of 0 for a partition that holds one, and never aborts it
after ``transaction.timeout.ms`` (docs/kafka.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from pydblog.changelog.kafka import client as kafka_client
from pydblog.changelog.kafka.writer import KafkaChangeLog

EOF = confluent_kafka.KafkaError._PARTITION_EOF


class HeldCommit:
    """``append()`` (a call that appends one commit to ``writer``) run in a thread and
    held before its ``commit_transaction`` until ``finish``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, writer: KafkaChangeLog,
                 append: Callable[[], object]) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None
        real = writer._fault

        def fault(point: str) -> None:
            if point == "kafka-before-commit" and not self.reached.is_set():
                self.reached.set()
                self.release.wait(120)
            real(point)

        monkeypatch.setattr(writer, "_fault", fault)

        def run() -> None:
            try:
                append()
            except BaseException as exc:  # handed to finish()
                self.error = exc

        self.thread = threading.Thread(target=run, name="held-commit", daemon=True)
        self.thread.start()
        assert self.reached.wait(60), "the commit did not reach its checkpoint message"

    def finish(self) -> None:
        """Let the commit land and wait for it."""
        self.release.set()
        self.thread.join(60)
        if self.error is not None:
            raise self.error


def watch_eof(monkeypatch: pytest.MonkeyPatch, seen: threading.Event) -> None:
    """Every consumer a ``client.Client`` makes for ``read_batches`` sets ``seen`` when a
    ``consume`` returns an end-of-partition event (a native client's are left as they
    are: ``kafka_native.consume`` reads only a real consumer)."""
    real_consumer = kafka_client.Client.consumer

    class Watched:
        def __init__(self, real: Any) -> None:
            self.real = real

        def consume(self, n: int, timeout: float) -> list[Any]:
            msgs = list(self.real.consume(n, timeout))
            if any(m.error() is not None and m.error().code() == EOF for m in msgs):
                seen.set()
            return msgs

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

    def consumer(self: Any) -> Any:
        if self._consumer is None:
            real = real_consumer(self)
            self._consumer = real if self.native else Watched(real)
        return self._consumer

    monkeypatch.setattr(kafka_client.Client, "consumer", consumer)
