"""The layout pydblog's Kafka writer used before notifications had their own topic, to
write logs of that layout in tests: a table's notifications and truncates in every
partition of its topic (the copies in partitions other than 0 marked ``dblog.fanout``),
notifications of no table as envelopes in the notification topic. Readers must still
read such logs."""

from __future__ import annotations

from typing import Any

from pydblog.changelog.kafka.topics import HEADER_FANOUT
from pydblog.changelog.kafka.writer import KafkaChangeLog


class LegacyKafkaChangeLog(KafkaChangeLog):
    def _table_event(self, op: str, topic: str, text: str, value: str,
                     headers: list[tuple[str, Any]]) -> None:
        for part in range(self.client.partitions(topic, refresh=True)):
            if part == 0:
                self._send(topic, value, None, headers, part)
            else:
                self._send(topic, value, None, [*headers, (HEADER_FANOUT, b"1")], part)
                self._no_run.add((topic, part))
