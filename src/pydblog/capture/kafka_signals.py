"""The Kafka signal channel (Debezium's): ``[snapshot] signal_topic``.

A message whose key is the ``[log] topic_prefix`` and whose value is
``{"type": "execute-snapshot" | "stop-snapshot" | "pause-snapshot" | "resume-snapshot",
"data": {...}}`` is a signal for this capture. Messages with another key (or none) are
another capture's and are ignored, as Debezium does; so are tombstones (a null value:
a compacted signal topic dropping old signals). Every other message is a signal, valid
or not, and gets exactly the signal table's answer:

- a valid one goes to the source's signal table, so it reaches the snapshot core
  through the log like any other signal (a position in the source's order; STARTED,
  SKIPPED for unknown tables, a table REJECTED later for a bad filter, ...);
  read-only snapshots write nothing to the source: there it is handed straight to the
  capture (``capture.inbox``);
- an invalid one (its value not JSON, not ``{"type", "data"}``, or a signal
  ``core.signals.parse_signal`` refuses: unknown type, bad ``data``) is handed to the
  capture as a rejection (``Offer.problem``), in any watermark mode: the capture logs
  a REJECTED notification whose reason names the problem and the fix (for a bad signal
  the very text a bad signal row gets). Nothing is written to the source for it.

At least once in, exactly once through: the signal's id is
``kafka-<partition>-<offset>-<timestamp>``; a signal row is inserted only if absent,
and the capture applies a handed-over id at most once (it keeps the ids in its
checkpoint). The consumer group ``dblog-signals.<prefix>`` commits a message's offset
only after the signal row is in, or the capture answered the hand-over (its effect is
then in the change log), and never past a message that was not: a crash in between
forwards it again, without effect. The listener assigns the topic's partitions itself
(no group join).

Where the listener starts (``Handled``, ``KafkaSignalListener._starts``): the capture's
checkpoint (in the change log, so recoverable from Kafka alone) holds, under
``extra["kafka_signals"]``, the signal topic's name, ``since_ms`` (when the capture was
first run with this signal topic; noted in the log directory before the listener
starts, ``first_run_ms``, for a restart before the first checkpoint) and, per
partition, the offset after the last signal the capture handled (from the ids of the signal rows it reads and of the signals handed
to it). Each partition starts at the larger of that offset and the group's committed
one. A partition with neither starts at the first message with a timestamp at or after
``since_ms - SKEW_MS`` (``offsets_for_times``; older messages met before the first newer
one are skipped, each with a warning, since Tansu answers 0 when no message is that new;
a message at or past the partition's end at the assignment was sent after this start and
is never skipped, whatever its producer's clock says): every signal sent after the
capture was first configured with the topic is handled, whether ``dblog run`` was
running, down, or the topic did not exist yet; older ones are not replayed. A topic that
did not exist at the listener's first look is read from its start when it appears
(everything in it is newer; no clock involved). Partitions added while the listener
runs are found by a metadata refresh every ``REFRESH_S`` seconds and read from their
start. An offset below the partition's start (retention deleted signals never read)
starts at the partition's start, with a warning. The group's offsets are committed
again at every refresh: Kafka expires a memberless group's offsets
``offsets.retention.minutes`` after its last commit (the checkpoint's offsets would
still hold, but other captures' messages after our last signal would be read again).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from pydblog.capture.inbox import deliver
from pydblog.capture.signals import send_signal, signals_go_direct
from pydblog.config import Config
from pydblog.core.signals import SignalType, parse_signal
from pydblog.errors import ConfigError, DblogError, SignalError

log = logging.getLogger(__name__)

KINDS = tuple(t.value for t in SignalType)
GROUP = "dblog-signals.{prefix}"
EXAMPLE = '{"type": "execute-snapshot", "data": {"data-collections": ["public\\\\.orders"]}}'
REFRESH_S = 30.0
"""How often a running listener looks for partitions added to the signal topic."""
SKEW_MS = 60_000
"""Clock skew tolerated between a signal's producer and the capture's host: a partition
positioned by time starts at ``since_ms - SKEW_MS``. (A signal replayed is extra work, a
signal skipped a lost request: the margin errs on the side of replaying.)"""
FIRST_RUN_FILE = "kafka-signals.json"
"""In the log directory: the signal topic and ``since_ms`` of the first run with it,
written before the listener starts (``first_run_ms``)."""


def signal_prefix(cfg: Config) -> str:
    """Debezium's key: the topic prefix (the Kafka log's, or the signal topic's name
    when the change log is embedded and has no prefix)."""
    return cfg.log.topic_prefix or cfg.snapshot.signal_topic or ""


def decode_message(signal_id: str, value: bytes) -> tuple[str, str | None]:
    """A message's value as the signal table's ``(type, data)`` columns: ``data`` is
    the JSON text of the value's ``data`` (a string there is taken as that text, as
    the table's column is), None when absent or null.

    Raises ``SignalError`` naming the problem when the value is no ``{"type", "data"}``
    object; what the type and data hold is ``parse_signal``'s to judge."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise SignalError(
            f"signal {signal_id!r}: the Kafka message's value is not JSON ({exc})",
            hint=f"send a JSON object as the value, e.g. {EXAMPLE}",
        ) from None
    if not isinstance(doc, dict):
        raise SignalError(
            f"signal {signal_id!r}: the Kafka message's value must be a JSON object "
            f'{{"type": ..., "data": {{...}}}}, not {type(doc).__name__}',
            hint=f"e.g. {EXAMPLE}",
        )
    extra = sorted(set(doc) - {"type", "data"})
    if extra:
        raise SignalError(
            f"signal {signal_id!r}: unknown field(s) {', '.join(extra)} in the Kafka "
            "message's value",
            hint=f'the value has only "type" and "data" (the signal\'s fields go in "data"), '
                 f"e.g. {EXAMPLE}",
        )
    kind = doc.get("type")
    if not isinstance(kind, str):
        raise SignalError(
            f"signal {signal_id!r}: the Kafka message's value needs \"type\", a string "
            f"(got {orjson.dumps(kind).decode()})",
            hint=f"use one of: {', '.join(KINDS)}",
        )
    data = doc.get("data")
    if data is None:
        return kind, None
    return kind, data if isinstance(data, str) else orjson.dumps(data).decode()


CHECKPOINT_KEY = "kafka_signals"
"""The capture checkpoint's ``extra`` entry of the signal topic (``Handled``)."""

_ID = re.compile(r"kafka-(\d+)-(\d+)-(-?\d+)")


def first_run_ms(log_dir: str | Path, topic: str, now_ms: int) -> int:
    """``since_ms`` for a capture whose checkpoint has no entry for ``topic`` yet: the
    one noted in ``log_dir`` by an earlier process with this topic (one killed before
    its first checkpoint), else ``now_ms``, noted there durably (fsync) first, so that a
    restart before the first checkpoint does not move it past signals already sent."""
    path = Path(log_dir) / FIRST_RUN_FILE
    try:
        doc = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        doc = None
    if isinstance(doc, dict) and doc.get("topic") == topic and isinstance(doc.get("since_ms"), int):
        return int(doc["since_ms"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, orjson.dumps({"topic": topic, "since_ms": now_ms}))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return now_ms


class Handled:
    """The signal topic's positions in the capture's checkpoint, shared by the capture
    (which loads them at recovery and marks the signals it handles) and the listener
    (which starts from them).

    The entry: ``{"topic": name, "since_ms": when the capture was first run with this
    signal topic, "next": {"<partition>": offset after the last signal handled}}``; an
    entry of another topic is replaced by a new one (``since_ms`` = ``start_ms``)."""

    def __init__(self, topic: str, start_ms: int) -> None:
        self.topic = topic
        self.start_ms = start_ms
        self.since_ms = start_ms
        self._next: dict[int, int] = {}
        self._lock = threading.Lock()
        self.ready = threading.Event()
        """Set once ``load`` has run (the listener waits for it: the capture's recovery)."""

    def load(self, entry: Any) -> dict[str, Any]:
        """Take the recovered checkpoint's entry (None: there is none); the entry to
        keep in the checkpoint from now on."""
        since, nxt = self.start_ms, {}
        if isinstance(entry, dict) and entry.get("topic") == self.topic \
                and isinstance(entry.get("since_ms"), int):
            since = entry["since_ms"]
            raw = entry.get("next")
            nxt = {int(p): int(o) for p, o in raw.items()} if isinstance(raw, dict) else {}
        with self._lock:
            self.since_ms, self._next = since, nxt
        self.ready.set()
        return self.entry()

    def mark(self, signal_id: str) -> bool:
        """A signal the capture handled: True if its id moved a partition's offset."""
        m = _ID.fullmatch(signal_id)
        if m is None:
            return False
        p, after = int(m.group(1)), int(m.group(2)) + 1
        with self._lock:
            if self._next.get(p, -1) >= after:
                return False
            self._next[p] = after
            return True

    def entry(self) -> dict[str, Any]:
        with self._lock:
            return {"topic": self.topic, "since_ms": self.since_ms,
                    "next": {str(p): o for p, o in sorted(self._next.items())}}

    def next_offsets(self) -> dict[int, int]:
        with self._lock:
            return dict(self._next)


class KafkaSignalListener:
    """Forwards signals from ``[snapshot] signal_topic`` until ``close``. ``handled``:
    the capture's positions (``Handled``), loaded by its recovery; without one (a
    listener on its own) there are none, and ``since_ms`` is now."""

    def __init__(self, cfg: Config, handled: Handled | None = None) -> None:
        if not cfg.log.bootstrap_servers:
            raise ConfigError(
                "[snapshot] signal_topic needs Kafka: set [log] bootstrap_servers",
                hint="the signal topic is read from the cluster in [log] bootstrap_servers",
            )
        from pydblog.changelog.kafka.client import (
            client_config,
            for_consumer,
            kafka_module,
            make_client,
        )

        self.cfg = cfg
        self.k = kafka_module()
        self.topic = str(cfg.snapshot.signal_topic)
        self.key = signal_prefix(cfg).encode()
        if handled is None:
            handled = Handled(self.topic, int(time.time() * 1000))
            handled.load(None)
        self.handled = handled
        # (earliest: used only for an offset below the partition's start, which
        # _starts avoids; everything kept there is newer than what was handled)
        self.consumer = make_client(self.k.Consumer, for_consumer(client_config(
            cfg.log, **{"group.id": GROUP.format(prefix=signal_prefix(cfg)),
                        "enable.auto.commit": False, "auto.offset.reset": "earliest",
                        "isolation.level": "read_committed"})), cfg.log)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dblog-kafka-signals", daemon=True)
        self._assigned = False
        self._looked = False  # the topic was looked for once
        self._absent = False  # ... and did not exist then: read it from its start
        # partition -> (skip messages older than this, below this offset: the end at the
        # assignment; until one is not older)
        self._since: dict[int, tuple[int, int]] = {}
        self.assigned = threading.Event()  # set once the partitions are assigned (tests)
        self._thread.start()

    def _assign(self) -> bool:
        k = self.k
        md = self.consumer.list_topics(timeout=10)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            if not self._looked:
                self._absent = True
                log.info("Kafka signal topic %s does not exist yet: it is read from its start "
                         "once it does", self.topic)
            self._looked = True
            return False
        self._looked = True
        tps = [k.TopicPartition(self.topic, p) for p in sorted(t.partitions)]
        committed = self.consumer.committed(tps, timeout=10)
        start = self._starts(committed, from_start=self._absent)
        self.consumer.assign(start)
        log.info("listening for signals on Kafka topic %s", self.topic)
        self.assigned.set()
        return True

    def _grow(self) -> None:
        """Assign the signal topic's partitions added since ``_assign`` (read from their
        committed offset, else their start: everything in them is newer)."""
        k = self.k
        md = self.consumer.list_topics(self.topic, timeout=10)  # by name: creates no topic
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            return
        have = {tp.partition for tp in self.consumer.assignment() if tp.topic == self.topic}
        new = sorted(set(t.partitions) - have)
        if not new:
            return
        committed = self.consumer.committed([k.TopicPartition(self.topic, p) for p in new], timeout=10)
        start = self._starts(committed, from_start=True)
        self.consumer.incremental_assign(start)
        log.info("Kafka signal topic %s: reading partition(s) %s, added while running",
                 self.topic, ", ".join(str(p) for p in new))

    def _starts(self, committed: list[Any], from_start: bool) -> list[Any]:
        """Where to read each partition: the larger of its committed offset and the
        capture's checkpoint's; else its start (``from_start``: a topic or partition
        that appeared while the listener ran), else the first message at or after
        ``since_ms``. Never below the partition's start. The positions that differ from
        the committed ones are committed now, but for a first message at or after
        ``since_ms`` that may not be one (the partition's start, where Tansu answers 0
        for "no message that new"): the timestamp filter commits what it skips, and a
        restart starts from ``since_ms`` again."""
        k = self.k
        handled = self.handled.next_offsets()
        start, fresh = [], []
        for tp in committed:
            p = tp.partition
            unsure = False
            known = [o for o in (tp.offset, handled.get(p, -1)) if o >= 0]
            lo, hi = self.consumer.get_watermark_offsets(k.TopicPartition(self.topic, p), timeout=10)
            lo, hi = max(lo, 0), max(hi, 0)
            if known:
                offset = max(known)
                if offset < lo:
                    log.warning("Kafka signal topic %s partition %d: signals at offsets %d to %d "
                                "were deleted (retention) before they were handled; reading from "
                                "%d", self.topic, p, offset, lo - 1, lo)
                    offset = lo
            elif from_start:
                offset = lo
            else:  # the first message sent since the capture was first run with this topic
                since = self.handled.since_ms - SKEW_MS
                [at] = self.consumer.offsets_for_times(
                    [k.TopicPartition(self.topic, p, since)], timeout=10)
                offset = at.offset if at.error is None and at.offset >= 0 else hi
                offset = min(max(offset, lo), hi)
                self._since[p] = (since, hi)  # (from hi on: sent after this start)
                unsure = lo < hi and offset == lo
            tp_start = k.TopicPartition(self.topic, p, offset)
            start.append(tp_start)
            if offset != tp.offset and not unsure:
                fresh.append(tp_start)
        if fresh:  # so that a restart goes on from here, not from a later end
            self.consumer.commit(offsets=fresh, asynchronous=False)
        return start

    def _recommit(self) -> None:
        """Commit the positions again (Kafka expires a memberless group's offsets
        ``offsets.retention.minutes`` after its last commit). Between batches: every
        message before a position was handled."""
        done = [tp for tp in self.consumer.position(self.consumer.assignment()) if tp.offset >= 0]
        if done:
            self.consumer.commit(offsets=done, asynchronous=False)

    def _run(self) -> None:
        refresh_at = time.monotonic() + REFRESH_S
        while not self._stop.is_set():
            try:
                if not self.handled.ready.is_set():  # (the capture's recovery)
                    self.handled.ready.wait(0.5)
                    continue
                if not self._assigned:
                    self._assigned = self._assign()
                    if not self._assigned:
                        self._stop.wait(2.0)
                        continue
                    refresh_at = time.monotonic() + REFRESH_S
                if time.monotonic() > refresh_at:
                    self._grow()
                    self._recommit()
                    refresh_at = time.monotonic() + REFRESH_S
                for m in self.consumer.consume(100, 0.5):
                    if m.error() is None and not self._forward(m):
                        # Not forwarded (closing): nothing after it may be committed;
                        # the next listener reads from the committed offset.
                        return
            except Exception as exc:  # (a dead listener would take no signal until a restart)
                known = isinstance(exc, DblogError | self.k.KafkaException)
                log.warning("Kafka signal channel: %s; retrying", exc, exc_info=not known)
                self._assigned = False  # again from the committed offsets
                self._stop.wait(2.0)

    def _forward(self, m: Any) -> bool:
        """One message: forward it (retrying until the source or the capture takes it),
        then commit its offset. False if closed before it was forwarded (not
        committed)."""
        signal_id = f"kafka-{m.partition()}-{m.offset()}-{m.timestamp()[1]}"
        since = self._since.get(m.partition())
        older = since is not None and m.offset() < since[1] and 0 <= m.timestamp()[1] < since[0]
        if older:
            done = True  # sent before the capture was first run with this topic
            log.warning(
                "Kafka signal topic %s partition %d: the message at offset %d (timestamp "
                "%d ms) is older than the capture's first run with this topic (%d ms, less "
                "%d s for clock skew); skipped. If it is a signal sent for this capture "
                "(its producer's clock behind), send it again", self.topic, m.partition(),
                m.offset(), m.timestamp()[1], self.handled.since_ms, SKEW_MS // 1000)
        elif m.key() != self.key or m.value() is None:
            done = True  # another capture's signal, or a tombstone
        else:
            try:
                kind, data = decode_message(signal_id, m.value())
                parse_signal(signal_id, kind, data)  # the signal table's own validation
            except SignalError as exc:
                log.warning("Kafka signal %s rejected: %s", signal_id, exc)
                done = self._hand_over(signal_id, "", {}, problem=str(exc))
            else:
                # (parse_signal took it: an object, or empty / null)
                fields: dict[str, Any] = (json.loads(data) if data and data.strip() else None) or {}
                if signals_go_direct(self.cfg):
                    done = self._hand_over(signal_id, kind, fields)
                else:
                    done = self._insert(signal_id, kind, fields)
        if not done:
            return False
        if since is not None and not older:
            del self._since[m.partition()]  # the rest is newer
        self.consumer.commit(
            offsets=[self.k.TopicPartition(m.topic(), m.partition(), m.offset() + 1)],
            asynchronous=False,
        )
        return True

    def _insert(self, signal_id: str, kind: str, data: dict[str, Any]) -> bool:
        """The signal row, inserted if absent; False if closed first."""
        while not self._stop.is_set():
            try:
                send_signal(self.cfg, signal_id, kind, data, once=True)
                return True
            except DblogError as exc:
                log.warning("cannot forward Kafka signal %s: %s; retrying", signal_id, exc)
                self._stop.wait(1.0)
        return False

    def _hand_over(self, signal_id: str, kind: str, data: dict[str, Any],
                   problem: str | None = None) -> bool:
        """Hand the signal (or, with ``problem``, its rejection) to this process's
        capture and wait until its effect is durable (or it was a duplicate, or
        rejected); False if closed first."""
        while not self._stop.is_set():
            item = deliver(signal_id, kind, data, 5.0, stop=self._stop, problem=problem)
            if item is not None and item.done.is_set():
                if item.outcome == "rejected" and problem is None:
                    log.warning("Kafka signal %s rejected: %s", signal_id, item.error)
                return True
            if not self._stop.is_set():
                log.info("Kafka signal %s: the capture has not taken it yet; retrying",
                         signal_id)
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            # Still inside a forward (a source or capture that does not answer): it
            # commits nothing once it sees the stop; its consumer is left to it.
            log.warning("the Kafka signal listener did not stop within 10 s")
            return
        self.consumer.close()
