"""A topic just created: Kafka elects its partitions' leaders a moment after the topic
shows in the metadata, and a broker asked for a partition it does not lead yet answers
"not leader" (a retriable error). Reads of a topic the capture has just created (the
first checkpoint a follower waits for, ``dblog tail`` started with the capture) must
wait for the leader, not fail."""

from __future__ import annotations

import uuid

from pydblog.changelog.kafka.client import Client
from pydblog.config import LogConfig


def test_offsets_of_a_topic_created_a_moment_ago(kafka_log: LogConfig) -> None:
    client = Client(kafka_log)
    try:
        for _ in range(5):
            topic = f"{kafka_log.topic_prefix}.t{uuid.uuid4().hex[:6]}"
            client.ensure_topics([topic], 3)
            tps = [(topic, p) for p in range(3)]
            assert client.watermarks(tps) == dict.fromkeys(tps, (0, 0))
            assert client.last_stable(tps) == dict.fromkeys(tps, 0)
    finally:
        client.close()
