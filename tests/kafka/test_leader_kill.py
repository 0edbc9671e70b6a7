"""A three-broker Apache Kafka cluster (replication factor 3, ``min.insync.replicas = 2``)
loses partition leaders to ``kill -9`` while `dblog run` captures under load: nothing is
lost, nothing is logged twice, and the capture goes on (the same process: it never
exits, and it catches up with the source after the kills)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.chaos import pg_writer, writing
from tests.helpers import assert_materializes_to_source, start_run, stop_run, write_config
from tests.kafka.conftest import kafka_log_toml
from tests.kafka.test_capture import _check_events, _read_whole, _table, _wait_caught_up

pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")


def _count(config: Path) -> int:
    from pydblog.changelog.kafka.reader import KafkaChangeLogReader
    from pydblog.config import load_config

    reader = KafkaChangeLogReader(load_config(config).log)
    try:
        return reader.next_offset()
    finally:
        reader.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_partition_leaders_killed_under_load(pg_db: str, tmp_path: Path) -> None:
    """The leader of the checkpoint topic's partition (every commit writes it) is killed
    with SIGKILL under load and started again; then the leader of a data partition. Each
    time the capture must go on committing while the node is down (two in-sync replicas
    are left, so ``acks=all`` is met); once its saved position passed the source's, it is
    stopped and the log, read whole, must materialize to the source (every column), with
    every source position once and offsets dense."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("kills brokers of its own cluster")
    from pydblog.changelog.kafka.topics import checkpoint_topic, data_topic
    from pydblog.devtools.kafka import KafkaCluster

    _table(pg_db)
    with KafkaCluster(3, heap_mb=384) as cluster:
        prefix = "lk"
        config = write_config(tmp_path, pg_db, extra=kafka_log_toml(
            cluster.bootstrap, prefix, extra="partitions = 3\nreplication_factor = 3\nbatch_max_ms = 100"),
            heartbeat_s=5)
        proc = start_run(config, env={"PYTHONFAULTHANDLER": "1"}, drain=True)
        with writing(pg_writer(pg_db, 7, 1000.0)):
            deadline = time.monotonic() + 120
            while _count(config) < 500:  # the topics exist and commits flow
                assert proc.poll() is None, "the capture exited"
                assert time.monotonic() < deadline, "no commits before the kills"
                time.sleep(0.5)
            for topic in (checkpoint_topic(prefix), data_topic(prefix, "public.w")):
                victim = cluster.leader(topic, 0)
                before = _count(config)
                victim.kill()
                # commits go on while the node is down (two replicas left in sync)
                deadline = time.monotonic() + 120
                while _count(config) < before + 500:
                    assert proc.poll() is None, "the capture exited"
                    assert time.monotonic() < deadline, f"no commits after killing node {victim.node_id}"
                    time.sleep(0.5)
                victim.start()
                time.sleep(2.0)
        assert proc.poll() is None, "the capture exited"
        try:
            _wait_caught_up(config, pg_db, stall=120)
        except BaseException:
            proc.send_signal(signal.SIGABRT)  # every thread's stack into capture.log
            raise
        finally:
            code, out = stop_run(proc)
            (tmp_path / "capture.log").write_text(out)
        assert code == 0, out
        events = _read_whole(config, stall=120)
        assert_materializes_to_source(events, pg_db, {"public.w": ["id"]})
        _check_events(events)
