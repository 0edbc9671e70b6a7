"""Readers of a Kafka change log: ``KafkaChangeLogReader`` (``ports.ChangeLogReader``:
``dblog tail``, the API, ``dblog status``), ``KafkaLogFigures`` (``/metrics``) and the
``dblog sync`` consumer group's lag (``sync_lag``). They read the checkpoint topic in
order and take a data record only where the valid commits' spans vouch for it
(``protocol.CommitLog``), so what they return does not rest on the broker's transaction
filtering."""

from __future__ import annotations

import bisect
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from pydblog.changelog.kafka import client as kafka_client
from pydblog.changelog.kafka.client import Client, client_config, for_consumer
from pydblog.changelog.kafka.protocol import CommitLog, CommitRecord
from pydblog.changelog.kafka.topics import (
    HEADER_EVENT,
    HEADER_FANOUT,
    HEADER_WRITER,
    checkpoint_topic,
    event_value,
    header,
    parse_value,
)
from pydblog.ports import ChangeLogReader, Checkpoint, LogRecord, TableSchema

if TYPE_CHECKING:
    from pydblog.config import LogConfig

log = logging.getLogger(__name__)


class KafkaChangeLogReader(ChangeLogReader):
    """Reads a Kafka change log in global-offset order: every valid checkpoint is a
    consistent cut of all partitions, so records are merged by their offset up to the
    last valid checkpoint's end (``next_offset``).

    ``read(from_offset)`` seeks: it reads one window of commits around ``from_offset``
    (``CommitLog.window``), each partition from ``cut(lo)`` to ``cut(hi)``, never from the
    partition's start; memory holds one window (about ``limit`` events). A partition
    that only later commits wrote is read from its start once, as part of their window.
    A window that needs records retention already deleted raises ``ChangeLogError``
    (``first_offset`` is the first offset whose events are all still there).

    Memory stays bounded while a reader moves forward (``follow``, ``dblog tail -f``,
    the API's event stream): once more than ``KEEP_COMMITS`` commits lie before the
    current window, the commit log forgets them (``CommitLog.forget``). A read that
    goes back below what was forgotten re-reads the checkpoint topic from its start;
    ``first_offset`` and ``describe``, which need the whole history, read it into a
    throwaway commit log.

    ``read`` and ``next_offset`` read the checkpoint topic to its end as of the call
    (list-offsets requests, then a fetch to that end): what any writer committed before
    the call is seen. ``follow`` does that once, then waits for new commit messages on a
    consumer that stays assigned to the checkpoint topic (the "tail": librdkafka fetches
    in the background, one fetch wait at a time) and reads each new window of data once
    its commit came: no list-offsets request and no re-assignment per poll, so a follower
    costs the broker about what a plain consumer does. If the tail brings nothing for
    ``TAIL_EXACT_S`` the follower reads to the end the exact way again (a storage stall,
    a consumer that lost its place: the exact read handles both), so the tail is never
    the only way a commit is seen."""

    WINDOW_MIN = 1_000
    WINDOW_MAX = 100_000
    KEEP_COMMITS = 1_000
    TAIL_EXACT_S = 1.0

    def __init__(self, cfg: LogConfig) -> None:
        self.client = Client(cfg)
        # The data windows' reads: below a valid commit's end, of records the commit
        # spans vouch for (aborted ones are skipped by them, not by the broker); read
        # uncommitted, so that the next transaction, open on the partition already,
        # does not hold them back (Tansu's last stable offset is 0 while one is open: a
        # read_committed fetch then gets nothing at all until it commits).
        self._data = Client(cfg, uncommitted=True)
        self._bulk: Client | None = None  # reads of the checkpoint topic from its start
        self.prefix = self.client.prefix
        self.cfg = cfg
        self._tail_c: Any = None  # the follower's checkpoint-topic consumer (``_tail``)
        self._tail_wait = 0  # the fetch wait it was made with
        self._tail_at = -1  # the offset it is positioned at (-1: to be assigned)
        self._reset()

    def _reset(self) -> None:
        self._commits = CommitLog()
        self._cp_next = 0
        self._window: tuple[int, int, list[LogRecord]] = (0, 0, [])

    def _refresh(self) -> None:
        self._cp_next = self._commit_reader().read_commits(self._commits, self._cp_next, to_now=True)

    def _commit_reader(self) -> Client:
        """The client for reading the checkpoint topic from ``_cp_next``: from its start, a
        bulk client (``compat.BULK_FETCH_WAIT_MS``: Tansu answers a 5 ms fetch of thousands of
        messages with nothing, and the stall that follows would teach the whole process
        a longer fetch wait, the follower's too); near the end, ``client``."""
        return self.client if self._cp_next else self._bulk_client()

    def _bulk_client(self) -> Client:
        if self._bulk is None:
            self._bulk = Client(self.cfg, bulk=True)
        return self._bulk

    def _read_window(self, lo: int, hi: int) -> list[LogRecord]:
        """The events ``lo <= offset < hi`` (commit boundaries), in offset order."""
        commits = self._commits
        start, stop = commits.cut(lo), commits.cut(hi)
        ranges = {tp: (start.get(tp, 0), end) for tp, end in stop.items() if end > start.get(tp, 0)}
        out: list[LogRecord] = []
        seen: dict[tuple[str, int], int] = {}  # each partition's offset after the last record
        for m in self._data.read_range(ranges):
            value = event_value(m)
            if value is None:
                continue
            off = m.offset()
            tp = (m.topic(), m.partition())
            if off < seen.get(tp, -1):  # never two copies of one record
                continue
            seen[tp] = off + 1
            span = commits.span(tp, off)
            if span is None:
                continue
            if span.first < 0:  # no run: the headers decide
                headers = m.headers()
                tag = header(headers, HEADER_WRITER)
                if not span.valid(off, tag.decode() if tag else None):
                    continue
                if header(headers, HEADER_FANOUT) is not None:
                    continue
                value = header(headers, HEADER_EVENT) or value  # a notification's envelope
            elif not span.valid(off, None):
                continue
            seq, body = parse_value(value)
            if not lo <= seq < hi:
                continue
            env = orjson.loads(body)
            src = env["source"]
            table = f"{src['schema']}.{src['table']}"
            out.append(LogRecord(seq, table, env["op"], int(src.get("ts_ms") or 0), body))
        out.sort(key=lambda r: r.offset)
        return out

    def read(
        self, from_offset: int, limit: int, tables: Sequence[str] | None = None
    ) -> list[LogRecord]:
        self._refresh()
        return self._read(from_offset, limit, tables)

    def _read(self, from_offset: int, limit: int, tables: Sequence[str] | None) -> list[LogRecord]:
        """``read`` up to the commits known now (no read of the checkpoint topic, unless
        ``from_offset`` lies below what was forgotten)."""
        offset = max(from_offset, 0)
        if offset < self._commits.floor:  # forgotten: the whole checkpoint topic again
            self._reset()
            self._refresh()
        end = self._commits.next_offset
        wanted = set(tables) if tables else None
        size = min(max(limit, self.WINDOW_MIN), self.WINDOW_MAX)
        out: list[LogRecord] = []
        while offset < end and len(out) < limit:
            lo, hi, recs = self._window
            if not lo <= offset < hi:
                lo, hi = self._commits.window(offset, size)
                self._window = (lo, hi, self._read_window(lo, hi))
                recs = self._window[2]
                if bisect.bisect_left(self._commits.bounds, lo) > self.KEEP_COMMITS:
                    self._commits.forget(lo)
            i = bisect.bisect_left(recs, offset, key=lambda r: r.offset)
            for r in recs[i:]:
                if wanted is None or r.table in wanted:
                    out.append(r)
                    if len(out) >= limit:
                        break
            offset = hi
        return out

    def _whole(self) -> CommitLog:
        """The commit log with its whole history (read afresh if some was forgotten)."""
        self._refresh()
        if not self._commits.floor:
            return self._commits
        whole = CommitLog()
        self._bulk_client().read_commits(whole, 0, to_now=True)
        return whole

    def first_offset(self) -> int:
        commits = self._whole()
        if not commits.ends:
            return 0
        marks = self.client.watermarks(list(commits.ends))
        return commits.first_complete({tp: lo for tp, (lo, _) in marks.items()})

    def next_offset(self) -> int:
        self._refresh()
        return self._commits.next_offset

    def last_checkpoint(self) -> Checkpoint | None:
        self._refresh()
        return self._commits.last.checkpoint if self._commits.last is not None else None

    def schemas(self, table: str | None = None) -> list[tuple[int, TableSchema]]:
        return [(o, s) for o, s in self.client.read_schemas() if table is None or s.qualified == table]

    def follow(
        self, from_offset: int, poll_s: float = 0.2, tables: Sequence[str] | None = None
    ) -> Iterator[LogRecord]:
        """See the class docstring: one exact read to the end, then the tail; ``poll_s``
        is the longest a wait for the tail's next commit message lasts."""
        offset = from_offset
        wanted = set(tables) if tables else None
        heard = -float("inf")  # when the tail last brought a commit message (or an exact read ran)
        while True:
            if time.monotonic() - heard >= self.TAIL_EXACT_S:
                self._refresh()
                heard = time.monotonic()
            batch = self._read(offset, 100_000, None)
            for r in batch:
                if wanted is None or r.table in wanted:
                    yield r
            if batch:
                offset = batch[-1].offset + 1
            elif self._await_commits(poll_s):
                heard = time.monotonic()

    def _tail(self) -> Any:
        """The follower's consumer, positioned at ``_cp_next`` (None: no checkpoint topic
        yet). Re-made when the client learned a longer fetch wait (``_storage_stall``),
        re-assigned when an exact read moved ``_cp_next``."""
        topic = checkpoint_topic(self.prefix)
        wait = self.client.fetch_wait_ms
        if self._tail_c is not None and self._tail_wait < wait:
            self._close_tail()
        if self._tail_c is None:
            if not self.client.partitions(topic):
                return None
            conf = for_consumer(client_config(
                self.cfg,
                **{"group.id": f"dblog-follower-{uuid.uuid4().hex[:8]}",
                   "enable.auto.commit": False, "isolation.level": "read_committed",
                   "auto.offset.reset": "error", "fetch.wait.max.ms": wait},
            ))
            self._tail_c = kafka_client.make_client(self.client.k.Consumer, conf, self.cfg)
            self._tail_wait = wait
            self._tail_at = -1
        if self._tail_at != self._cp_next:
            self._tail_c.assign([self.client.k.TopicPartition(topic, 0, self._cp_next)])
            self._tail_at = self._cp_next
        return self._tail_c

    def _await_commits(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the tail's next checkpoint messages and apply them
        (as ``Client.read_commits`` does, in offset order); whether any came. An error
        of the tail's read leaves the tail to be re-assigned and the commits to the next
        exact read."""
        c = self._tail()
        if c is None:
            time.sleep(timeout)
            return False
        first = c.poll(timeout)
        if first is None:
            return False
        k = self.client.k
        came = False
        for m in [first, *c.consume(10_000, 0)]:
            if m.error() is not None:
                if m.error().code() == k.KafkaError._PARTITION_EOF:
                    continue
                log.debug("the follower's checkpoint-topic read: %s; reading to the end instead",
                          m.error().str())
                self._tail_at = -1
                time.sleep(min(timeout, 0.1))  # (not a busy loop until the exact read)
                return False
            off = m.offset()
            if off < self._cp_next:  # read already (by an exact read)
                continue
            self._cp_next = off + 1
            came = True
            if m.value() is not None:
                self._commits.apply(CommitRecord.from_bytes(m.value(), off))
        self._tail_at = self._cp_next
        return came

    def _close_tail(self) -> None:
        if self._tail_c is not None:
            self._tail_c.close()
            self._tail_c = None
            self._tail_at = -1

    def describe(self) -> dict[str, Any]:
        commits = self._whole()
        topics: dict[str, dict[str, Any]] = {}
        # every partition of each topic the log wrote (one no commit wrote yet too: a
        # table's topic gets no copy of anything in every partition)
        names = sorted({t for t, _ in commits.ends})
        marks = self.client.watermarks(sorted(
            {*commits.ends, *((t, p) for t in names for p in range(self.client.partitions(t)))}))
        for (t, _p), (lo, hi) in sorted(marks.items()):
            info = topics.setdefault(t, {"partitions": 0, "end_offsets": [], "messages": 0})
            info["partitions"] += 1
            info["end_offsets"].append(hi)
            info["messages"] += hi - lo
        last = commits.last
        out: dict[str, Any] = {
            "type": "kafka",
            "bootstrap_servers": self.cfg.bootstrap_servers,
            "checkpoint_topic": checkpoint_topic(self.prefix),
            "last_offset": commits.next_offset - 1 if commits.next_offset > 0 else None,
            "writer": last.writer_tag if last is not None else None,
            "topics": topics,
        }
        lag = sync_lag(self.client, commits)
        if lag is not None:
            out["sync_lag_messages"] = lag
        return out

    def close(self) -> None:
        self._close_tail()
        self._data.close()
        if self._bulk is not None:
            self._bulk.close()
        self.client.close()


class KafkaLogFigures:
    """The first and next offset of a Kafka change log, cheap to ask again and again
    (``/metrics``): one client kept open, and each call reads only the checkpoint
    messages written since the last (``CommitLog(track=False)``: memory does not grow
    with the log). The first offset is 0 while no data partition lost records to
    retention; after that it is worked out by a full reader (the whole checkpoint topic)
    at most every ``FIRST_EVERY_S`` seconds, the last answer served in between."""

    FIRST_EVERY_S = 60.0

    def __init__(self, cfg: LogConfig) -> None:
        self.cfg = cfg
        self.client = Client(cfg)
        self.commits = CommitLog(track=False)
        self._cp_next = 0
        self._first: tuple[float, int] | None = None  # (when, first offset)

    def figures(self) -> tuple[int, int] | None:
        """``(first offset, next offset)``, or None while the log does not exist."""
        if not self.client.partitions(checkpoint_topic(self.client.prefix)):
            return None
        self._cp_next = self.client.read_commits(self.commits, self._cp_next, to_now=True)
        marks = self.client.watermarks(sorted(self.commits.ends))
        first = 0
        if any(lo > 0 for lo, _ in marks.values()):
            now = time.monotonic()
            if self._first is None or now - self._first[0] > self.FIRST_EVERY_S:
                reader = KafkaChangeLogReader(self.cfg)
                try:
                    self._first = (now, reader.first_offset())
                finally:
                    reader.close()
            first = self._first[1]
        return first, self.commits.next_offset

    def close(self) -> None:
        self.client.close()


SYNC_GROUP = "dblog-sync.{prefix}"
"""The consumer group ``dblog sync`` commits its applied offsets to (for monitoring:
the sink commits are what make the sync exactly once)."""


def sync_lag(client: Client, commits: CommitLog) -> int | None:
    """Data messages (one per event) not yet applied by
    ``dblog sync``, from the offsets it commits to its consumer group, or None. A
    partition's offsets also count one transaction marker per commit that wrote it
    (each at that commit's end offset): those are not messages and are left out."""
    k = client.k
    group = SYNC_GROUP.format(prefix=client.prefix)
    try:
        futs = client.admin.list_consumer_group_offsets(
            [k.ConsumerGroupTopicPartitions(group)], request_timeout=10)
        res = futs[group].result()
    except k.KafkaException:
        return None
    parts = [tp for tp in res.topic_partitions if tp.offset >= 0]
    if not parts:
        return None
    lag = 0
    for tp in parts:
        key = (tp.topic, tp.partition)
        end = commits.ends.get(key)
        if end is not None:
            ends = commits.history.get(key, ([], []))[1]
            markers = len(ends) - bisect.bisect_right(ends, tp.offset)
            lag += max(0, end - tp.offset - markers)
    return lag
