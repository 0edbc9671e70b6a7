"""The Kafka signal channel (Debezium's): ``[snapshot] signal_topic``.

A message whose key is the ``[log] topic_prefix`` and whose value is
``{"type": "execute-snapshot" | "stop-snapshot" | "pause-snapshot" | "resume-snapshot",
"data": {...}}`` is a signal for this capture; other keys are ignored (another
capture's), as Debezium does. The listener (a thread of ``dblog run``) forwards each
signal into the source's signal table, so it reaches the snapshot core through the
log like any other signal: the same validation, the same notifications, a position in
the source's order, and nothing new to make exactly once in the core. Read-only
snapshots write nothing to the source: there the listener hands each signal straight to
the capture (``capture.inbox``), which applies a signal id at most once (the ids are
kept in its checkpoint), and commits the offset once the capture answered.

At least once in, exactly once through: the signal row's id is
``kafka-<partition>-<offset>-<timestamp>``, inserted only if absent, and the consumer
group ``dblog-signals.<prefix>`` commits a message's offset only after its row is in the
signal table. A crash in between forwards it again and the insert does nothing. The
listener assigns the topic's partitions itself (no group join) and starts at the group's
committed offsets, or at the topic's end the first time (signals sent before the first
start are not replayed). Malformed messages are logged and skipped.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import orjson

from pydblog.config import Config
from pydblog.errors import ConfigError, DblogError

log = logging.getLogger(__name__)

KINDS = ("execute-snapshot", "stop-snapshot", "pause-snapshot", "resume-snapshot")
GROUP = "dblog-signals.{prefix}"


def signal_prefix(cfg: Config) -> str:
    """Debezium's key: the topic prefix (the Kafka log's, or the signal topic's name
    when the change log is embedded and has no prefix)."""
    return cfg.log.topic_prefix or cfg.snapshot.signal_topic or ""


class KafkaSignalListener:
    """Forwards signals from ``[snapshot] signal_topic`` until ``close``."""

    def __init__(self, cfg: Config) -> None:
        if not cfg.log.bootstrap_servers:
            raise ConfigError(
                "[snapshot] signal_topic needs Kafka: set [log] bootstrap_servers",
                hint="the signal topic is read from the cluster in [log] bootstrap_servers",
            )
        from pydblog.changelog.kafka import _for_consumer, _kafka, client_config

        self.cfg = cfg
        self.k = _kafka()
        self.topic = str(cfg.snapshot.signal_topic)
        self.key = signal_prefix(cfg).encode()
        self.consumer = self.k.Consumer(_for_consumer(client_config(
            cfg.log, **{"group.id": GROUP.format(prefix=signal_prefix(cfg)),
                        "enable.auto.commit": False, "auto.offset.reset": "latest",
                        "isolation.level": "read_committed"})))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dblog-kafka-signals", daemon=True)
        self._assigned = False
        self._thread.start()

    def _assign(self) -> bool:
        k = self.k
        md = self.consumer.list_topics(timeout=10)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            return False
        tps = [k.TopicPartition(self.topic, p) for p in sorted(t.partitions)]
        committed = self.consumer.committed(tps, timeout=10)
        start = []
        for tp in committed:
            if tp.offset >= 0:
                start.append(k.TopicPartition(self.topic, tp.partition, tp.offset))
            else:
                _, hi = self.consumer.get_watermark_offsets(tp, timeout=10)
                start.append(k.TopicPartition(self.topic, tp.partition, max(hi, 0)))
        self.consumer.assign(start)
        log.info("listening for signals on Kafka topic %s", self.topic)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._assigned:
                    self._assigned = self._assign()
                    if not self._assigned:
                        self._stop.wait(2.0)
                        continue
                for m in self.consumer.consume(100, 0.5):
                    if m.error() is None:
                        self._forward(m)
            except (DblogError, self.k.KafkaException) as exc:
                log.warning("Kafka signal channel: %s; retrying", exc)
                self._assigned = False
                self._stop.wait(2.0)

    def _forward(self, m: Any) -> None:
        """One message: forward it (retrying until the source takes it), then commit."""
        from pydblog.capture.signals import send_signal, signals_go_direct

        signal_id = f"kafka-{m.partition()}-{m.offset()}-{m.timestamp()[1]}"
        parsed = self._parse(m, signal_id)
        if parsed is not None and signals_go_direct(self.cfg):
            if not self._hand_over(signal_id, *parsed):
                return  # not applied: not committed either
            parsed = None
        while parsed is not None and not self._stop.is_set():
            try:
                send_signal(self.cfg, signal_id, parsed[0], parsed[1], once=True)
                break
            except DblogError as exc:
                log.warning("cannot forward Kafka signal %s: %s; retrying", signal_id, exc)
                self._stop.wait(1.0)
        if self._stop.is_set() and parsed is not None:
            return  # not forwarded: not committed either
        self.consumer.commit(
            offsets=[self.k.TopicPartition(m.topic(), m.partition(), m.offset() + 1)],
            asynchronous=False,
        )

    def _hand_over(self, signal_id: str, kind: str, data: dict[str, Any]) -> bool:
        """Read-only snapshots: hand the signal to this process's capture and wait
        until its effect is durable (or it was a duplicate, or rejected); False if
        stopped first."""
        from pydblog.capture.inbox import deliver

        while not self._stop.is_set():
            item = deliver(signal_id, kind, data, 5.0, stop=self._stop)
            if item is not None and item.done.is_set():
                if item.outcome == "rejected":
                    log.warning("Kafka signal %s rejected: %s", signal_id, item.error)
                return True
            if not self._stop.is_set():
                log.info("Kafka signal %s: the capture has not taken it yet; retrying",
                         signal_id)
        return False

    def _parse(self, m: Any, signal_id: str) -> tuple[str, dict[str, Any]] | None:
        if m.key() != self.key:
            return None  # another capture's signal
        try:
            value = orjson.loads(m.value() or b"null")
            kind, data = value["type"], value.get("data") or {}
            if kind not in KINDS or not isinstance(data, dict):
                raise ValueError(f"type must be one of {', '.join(KINDS)} and data an object")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.warning("ignored Kafka signal %s (not {\"type\", \"data\"}): %s", signal_id, exc)
            return None
        return str(kind), data

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.consumer.close()
