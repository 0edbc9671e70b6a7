"""``/metrics`` of a capture on a Kafka change log: a scrape reads only the checkpoint
messages written since the last one (it read the whole checkpoint topic every time,
and one bench run's scrape timed out after 10 s), and a broker that does not answer
makes a scrape serve the last figures instead of holding it."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from pydblog.api.capture import CaptureApi
from pydblog.api.live import LiveCapture
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.config import parse_config
from pydblog.devtools.kafka import KafkaBroker
from pydblog.events import Op
from pydblog.metrics import CaptureMetrics
from tests.kafka.test_kafka_log import cp, row_event


def _append(kf: KafkaChangeLog, commits: int) -> None:
    for _ in range(commits):
        n = kf.next_offset
        kf.append([row_event(Op.CREATE, "a", 10 + n + j, {"id": n + j}, {"id": n + j})
                   for j in range(3)], cp(n))


def test_scrapes_read_only_new_commits_and_never_hang(tmp_path: Path) -> None:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("freezes a broker of its own")
    with KafkaBroker() as broker:
        cfg = parse_config({
            "source": {"dsn": "postgresql://unused@127.0.0.1/x"},
            "log": {"type": "kafka", "path": str(tmp_path / "data"),
                    "bootstrap_servers": broker.bootstrap, "topic_prefix": f"m{uuid.uuid4().hex[:8]}"},
        })
        metrics = CaptureMetrics()
        api = CaptureApi(cfg, LiveCapture(), metrics)
        api.figures.wait_s = 15.0  # a loaded machine: the first read must finish in time

        def next_offset() -> float | None:
            api._scrape()
            return metrics.registry.get_sample_value("dblog_changelog_next_offset")

        kf = KafkaChangeLog(cfg.log)
        try:
            _append(kf, 200)
            assert next_offset() == 600
            figures = api.figures._kafka
            read = figures.client.fetched
            _append(kf, 5)
            assert next_offset() == 615
            assert figures.client.fetched - read <= 5 + 1, "only the new checkpoint messages"
            assert api.figures._kafka is figures, "one client for every scrape"
            # A frozen broker: the scrape serves the last figures within its bound.
            pid = broker.pid
            assert pid is not None
            api.figures.wait_s = 0.5
            os.kill(pid, signal.SIGSTOP)
            try:
                assert next_offset() == 615
                assert next_offset() == 615
            finally:
                os.kill(pid, signal.SIGCONT)
            _append(kf, 1)
            api.figures.wait_s = 15.0
            api.figures.get()  # (the refresh begun while frozen may end first)
            assert next_offset() == 618
            assert metrics.registry.get_sample_value("dblog_changelog_first_offset") == 0
        finally:
            kf.close()
            api.close()
