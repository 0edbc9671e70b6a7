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


class _FailsOnce:
    """An admin client whose first ``list_offsets`` answers with one broker error."""

    def __init__(self, admin: object, code: int) -> None:
        self.admin, self.code, self.failed = admin, code, False

    def list_offsets(self, *args: object, **kw: object) -> object:
        import confluent_kafka as k
        if not self.failed:
            self.failed = True
            raise k.KafkaException(k.KafkaError(self.code))
        return self.admin.list_offsets(*args, **kw)  # type: ignore[attr-defined]


def test_leader_epoch_and_offset_not_available_errors_are_asked_again(kafka_log: LogConfig) -> None:
    """A partition whose leadership just moved answers list-offsets with "unknown leader
    epoch", "fenced leader epoch" or "offset not available" for a moment (Kafka's protocol
    calls them retriable; librdkafka's admin client reports them as final)."""
    import confluent_kafka as k
    client = Client(kafka_log)
    try:
        topic = f"{kafka_log.topic_prefix}.t{uuid.uuid4().hex[:6]}"
        client.ensure_topics([topic], 1)
        real = client.admin
        for code in (k.KafkaError.UNKNOWN_LEADER_EPOCH, k.KafkaError.FENCED_LEADER_EPOCH,
                     k.KafkaError.OFFSET_NOT_AVAILABLE, k.KafkaError.NOT_LEADER_FOR_PARTITION):
            flaky = _FailsOnce(real, code)
            client._admin = flaky
            assert client.last_stable([(topic, 0)]) == {(topic, 0): 0}
            assert flaky.failed
        client._admin = real
    finally:
        client.close()
