"""A Kafka change log as the source of ``dblog sync``'s Spark stream (``ports.ChangeLogStream``).

Spark's own Kafka source would need Maven jars; this needs only confluent-kafka on the
driver and the executors (docs/kafka.md says how Spark's source could take its place).

Offsets (what Spark's checkpoint stores):
``{"cp": n, "seq": s, "owner": [epoch, gen, writer], "ends": {"topic:partition": o}}``:
everything the valid commits of the checkpoint topic below Kafka offset ``n`` wrote,
i.e. the events with global offset ``< s``, which lie below ``ends`` in each data
partition. A micro-batch ``(start, end]`` reads, per partition, the Kafka offsets
``[start.ends, end.ends)`` and keeps the records the commits between ``start.cp`` and
``end.cp`` made valid (``changelog.kafka``'s rules): exactly the events
``start.seq <= offset < end.seq``, one each. The planning is a pure function of the
checkpoint topic (append-only) and the start offset, so a replayed batch re-reads the
same records; checked: a replay's plan must reach the logged end, and the valid commits
a plan reads must be contiguous in global offsets (commits that retention removed from
the checkpoint topic would otherwise be skipped: ``_not_contiguous``). Sinks record the global offset they applied (as with the embedded log),
so a replayed batch applies nothing twice.

An offset may also carry ``"at": a`` (``consistent = true``'s cut inside a commit): the
events below global offset ``a`` are applied too, the rest of the commit that holds
``a`` is not. A batch from or to such an offset reads whole commits and keeps, by each
value's ``offset``, only the events between the two positions (``KafkaRange.seq``).
The cut reads the commits' source commit times (``CommitRecord.times``).

``maxEventsPerTrigger`` bounds a batch at commit granularity (at least one commit);
with ``Trigger.AvailableNow`` the stream stops at the checkpoint topic's end at start.
After each batch the offsets are also committed to the consumer group
``dblog-sync.<prefix>`` (monitoring: ``dblog status`` shows the lag; best effort).

Light to import (Spark's planning processes): ``changelog.kafka``, confluent-kafka,
numpy and pyarrow are imported where a function needs them, and the ``[log]`` option is
read without the config models (``_config``).
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydblog.errors import ChangeLogError
from pydblog.ports import ChangeLogStream, EncodedValues, LogPartition, SyncOffset

log = logging.getLogger(__name__)

Offset = SyncOffset


@dataclass(frozen=True)
class KafkaPiece:
    """Kafka offsets ``start <= o < end`` of one partition, and the spans
    ``(end offset, first, writer tag)`` of the valid commits there (``changelog.kafka.protocol.Span``:
    ``first >= 0``: exactly the offsets ``first..end-1`` of the span are valid; ``-1``:
    the records whose writer header is the tag) that cover the range."""

    topic: str
    partition: int
    start: int
    end: int
    spans: tuple[tuple[int, int, str], ...]


@dataclass(frozen=True)
class KafkaRange(LogPartition):
    """One Spark task: pieces of partitions, read one after another by one consumer
    (``allow_gaps``: see ``_RunCheck``)."""

    log: str  # the LogConfig as JSON
    pieces: tuple[KafkaPiece, ...]
    allow_gaps: bool = False
    seq: tuple[int, int] | None = None
    """Keep only the events with global offsets ``lo <= offset < hi`` (a batch that
    starts or ends inside a commit: ``consistent = true``); None: every valid record."""

    def read(self, batch_events: int) -> Iterator[EncodedValues]:
        """The values of the valid records (envelopes with their ``offset``), at least
        ``batch_events`` a chunk (the last one smaller): each gathered while the readers
        fetch the next records (``stream_values``), so the caller decodes one chunk while
        the next arrives."""
        values = _Values()
        for data, lengths in stream_values(self, self.allow_gaps):
            values.add(data, lengths)
            if values.count >= batch_events:
                kept = in_seq(values.array(), self.seq)
                if len(kept):
                    yield EncodedValues(kept)
                values = _Values()
        if values.count:
            kept = in_seq(values.array(), self.seq)
            if len(kept):
                yield EncodedValues(kept)


def in_seq(values: Any, seq: tuple[int, int] | None) -> Any:
    """The values (envelopes, ``{"offset":n,...}``) whose global offset is in
    ``[lo, hi)`` (all of them when ``seq`` is None)."""
    if seq is None or len(values) == 0:
        return values
    import pyarrow as pa
    import pyarrow.compute as pc

    found = pc.extract_regex(values, r'^\{"offset":(?P<o>[0-9]+)[,}]')
    offsets = pc.struct_field(found, [0]).cast(pa.int64())
    if offsets.null_count:
        raise ChangeLogError("a change-log record's value does not start with its offset "
                             '({"offset":n,...}): the batch cannot be cut by offset')
    return values.filter(pc.and_(pc.greater_equal(offsets, seq[0]), pc.less(offsets, seq[1])))


_CLIENT_FIELDS = frozenset({"type", "bootstrap_servers", "topic_prefix", "kafka", "partitions",
                            "replication_factor", "tombstones", "transactional_id"})


def _config(log_json: str) -> Any:
    """The ``[log]`` config the Kafka clients read (``LogConfig``'s fields). The option
    is normally ``LogConfig.model_dump_json()`` (validated, every field present): then
    its fields as attributes, without importing the config models (pydantic: ~0.2 s of
    CPU in each Python process that plans a query or reads a task); anything else is
    validated as a ``LogConfig``."""
    raw = json.loads(log_json)
    if isinstance(raw, dict) and raw.keys() >= _CLIENT_FIELDS and raw["type"] == "kafka" \
            and isinstance(raw["kafka"], dict):
        return types.SimpleNamespace(**raw)
    from pydblog.config import LogConfig

    return LogConfig.model_validate(raw)


def _tp_key(tp: tuple[str, int]) -> str:
    return f"{tp[0]}:{tp[1]}"


def _tp(key: str) -> tuple[str, int]:
    topic, _, p = key.rpartition(":")
    return topic, int(p)


def _commit_log(offset: Offset) -> Any:
    """A ``CommitLog`` positioned at ``offset`` (owner and cumulative ends, no
    spans: those of the commits applied next describe the next batch)."""
    from pydblog.changelog.kafka.protocol import CommitLog

    log = CommitLog()
    owner = offset.get("owner")
    log.owner = (int(owner[0]), int(owner[1]), str(owner[2])) if owner else None
    log.ends = {_tp(k): int(v) for k, v in offset.get("ends", {}).items()}
    log.read_to = int(offset.get("cp", 0))
    return log


@dataclass(frozen=True)
class PlannedCommit:
    """A valid commit a plan applied: its global offsets ``[start, end)``, their commit
    times (``CommitRecord.times``; a commit written without them: all at the writer's
    clock when it wrote it) and the stream offset right after it."""

    start: int
    end: int
    times: tuple[tuple[int, int], ...]
    after: dict[str, Any]


def position(offset: Offset) -> int:
    """The global offset a stream offset stands for (``at`` inside a commit, else ``seq``)."""
    return int(offset.get("at", offset.get("seq")) or 0)


def boundary(offset: Offset) -> Offset:
    """The commit boundary an offset is at or after (``at`` dropped)."""
    return {k: v for k, v in offset.items() if k != "at"}


def plan(log_json: str, start: Offset, stop_cp: int | None, max_events: int | None,
         client: Any = None, commits: list[PlannedCommit] | None = None) -> tuple[Offset, Any]:
    """Apply the checkpoint topic's messages from ``start["cp"]`` (up to Kafka offset
    ``stop_cp``, or the topic's end), stopping after the commit that reaches
    ``max_events`` events; returns the end offset and the ``CommitLog`` (its spans
    are the new commits'). ``client``: a ``changelog.kafka.client.Client`` to use (kept
    open), else one made and closed here. ``commits``: gets each valid commit applied
    (``PlannedCommit``). A ``start`` inside a commit (``at``) plans from the boundary
    before it (that commit is read again); ``max_events`` counts from ``at``."""
    from pydblog.changelog.kafka.client import Client
    from pydblog.changelog.kafka.protocol import CommitRecord
    from pydblog.changelog.kafka.topics import checkpoint_topic

    own = client is None
    if own:
        client = Client(_config(log_json))
    try:
        log = _commit_log(start)
        seq = int(start.get("seq", 0))
        base = position(start)
        cp = int(start.get("cp", 0))
        topic = checkpoint_topic(client.prefix)
        if client.partitions(topic):
            lo, _ = client.watermarks([(topic, 0)])[(topic, 0)]
            # ``seq`` is known (a planned offset's, or 0 with the topic whole): the valid
            # commits go on from it without a gap. A first plan of a topic whose start
            # retention removed begins at the first kept commit.
            known = cp > 0 or lo == 0
            cp = max(cp, lo)
            # without stop_cp: to the end as it is now (``read_range``'s ``to_now``: a
            # plan chasing commits that come within every fetch wait never ended)
            for m in client.read_range({(topic, 0): (cp, stop_cp)}, to_now=True):
                cp = m.offset() + 1
                if m.value() is None:
                    continue
                rec = CommitRecord.from_bytes(m.value(), m.offset())
                if log.apply(rec):
                    if known and rec.start != seq:
                        raise _not_contiguous(topic, seq, rec, lo)
                    seq, known = rec.end, True
                    if commits is not None and not rec.fence and rec.end > rec.start:
                        times = rec.times or [(rec.start, rec.ts or 0)]
                        commits.append(PlannedCommit(rec.start, rec.end, tuple(times), {
                            "cp": cp, "seq": seq,
                            "owner": list(log.owner) if log.owner is not None else None,
                            "ends": {_tp_key(tp): o for tp, o in sorted(log.ends.items())}}))
                if max_events is not None and seq - base >= max_events:
                    break
            else:  # read all of [cp, stop_cp): what follows the last message is markers
                cp = max(cp, stop_cp) if stop_cp is not None else cp
        owner = list(log.owner) if log.owner is not None else None
        end = {"cp": cp, "seq": seq, "owner": owner,
               "ends": {_tp_key(tp): o for tp, o in sorted(log.ends.items())}}
        return end, log
    finally:
        if own:
            client.close()


def _not_contiguous(topic: str, seq: int, rec: Any, low: int) -> ChangeLogError:
    """A valid commit that does not start where the planned ones end (``seq``): the
    commits between are gone from the checkpoint topic (retention), and with them what
    tells their records from aborted ones; a plan that went on would skip their events
    (or, overlapping, apply some twice) while the sinks record the later end."""
    if rec.start > seq:
        what = (f"has no commit of the change log's offsets {seq}..{rec.start - 1} (its next "
                f"commit, at Kafka offset {rec.kafka_offset}, holds {rec.start}..{rec.end - 1}; "
                f"the topic's first kept offset is {low}): retention removed commits "
                f"the sync has not applied")
    else:
        what = (f"holds a commit of offsets {rec.start}..{rec.end - 1} (Kafka offset "
                f"{rec.kafka_offset}) after the commits up to {seq - 1}: the change log's "
                f"commits overlap")
    return ChangeLogError(
        f"the checkpoint topic {topic} {what}; the sync cannot plan its next batch "
        f"without skipping or repeating events",
        hint=f"keep {topic} whole (retention.ms=-1, as pydblog creates it: `kafka-configs "
             f"--alter --entity-type topics --entity-name {topic} --add-config "
             f"retention.ms=-1`), then re-sync the targets from a snapshot with a new "
             f"[sync] checkpoint",
    )


def _checkpoint_end(log_json: str, client: Any = None) -> int:
    from pydblog.changelog.kafka.client import Client
    from pydblog.changelog.kafka.topics import checkpoint_topic

    own = client is None
    if own:
        client = Client(_config(log_json))
    try:
        topic = checkpoint_topic(client.prefix)
        if not client.partitions(topic):
            return 0
        end = int(client.watermarks([(topic, 0)])[(topic, 0)][1])  # may lag: read on
        for m in client.read_range({(topic, 0): (end, None)}):
            end = m.offset() + 1
        return end
    finally:
        if own:
            client.close()


READ_THREADS = 2
"""Consumers that read one task's pieces at once (each piece is read by one of them,
in its own thread: a read mostly waits for the broker's fetches, with the GIL released
in librdkafka and ``kafka_native``)."""
READ_QUEUE = 16
"""``consume`` batches (up to 10,000 values each) read ahead of the decode, per task:
readers wait when the decode is this far behind (bounded memory)."""


def read_events(part: KafkaRange, allow_gaps: bool = False) -> Any:
    """The values of the valid records of ``part`` (envelopes with their ``offset``,
    Arrow strings): ``stream_values`` gathered into one array."""
    values = _Values()
    for data, lengths in stream_values(part, allow_gaps):
        values.add(data, lengths)
    return in_seq(values.array(), part.seq)


def stream_values(part: KafkaRange, allow_gaps: bool = False,
                  threads: int | None = None) -> Iterator[tuple[bytes, Any]]:
    """The values of the valid records of ``part`` as chunks ``(data, lengths)`` (the
    values joined, numpy int64 lengths), each piece's in Kafka offset order; pieces are
    read concurrently by up to ``READ_THREADS`` consumers, one thread each, so chunks of
    different pieces interleave. Where a span has a run the records are taken by offset
    (``_read_runs``: no Python code per record); elsewhere each record's headers decide
    (``changelog.kafka``'s rules: the writer header names the span's writer; older logs'
    fan-out copies are skipped; a notification's envelope is its ``dblog.event`` header). Run records that are missing (``_RunCheck``) raise
    ``ChangeLogError`` unless ``allow_gaps``.

    The readers stop when the consumer of this generator stops (closed early, or an
    error): at most ``READ_QUEUE`` chunks wait between them and the caller."""
    import queue
    import threading

    from pydblog.changelog import kafka_native

    kafka_native.available()  # decided once, before the threads
    pieces = list(part.pieces)
    n = max(1, min(threads or READ_THREADS, len(pieces)))
    chunks: queue.Queue[Any] = queue.Queue(READ_QUEUE)
    stop = threading.Event()
    lock = threading.Lock()
    done = object()

    def put(item: Any) -> None:
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stopped

    def reader() -> None:
        from pydblog.changelog.kafka.client import Client

        try:
            client = Client(_config(part.log), native=True, bulk=True)
            try:
                while not stop.is_set():
                    with lock:
                        if not pieces:
                            break
                        piece = pieces.pop(0)
                    _read_piece(client, piece, _Sink(put), _RunCheck(piece, allow_gaps))
            finally:
                client.close()
            put(done)
        except _Stopped:
            return
        except BaseException as exc:  # handed to the caller, which raises it
            try:
                put(exc)
            except _Stopped:
                return

    workers = [threading.Thread(target=reader, name=f"dblog-kafka-read-{i}", daemon=True)
               for i in range(n)]
    for w in workers:
        w.start()
    try:
        finished = 0
        while finished < n:
            item = chunks.get()
            if item is done:
                finished += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()
        for w in workers:
            w.join()


class _Stopped(Exception):
    """The caller stopped reading: a reader thread ends."""


class _Sink:
    """Where ``_read_piece`` puts a ``consume`` batch's kept values: one chunk
    ``(data, lengths)`` each, null values (tombstones) left out."""

    def __init__(self, put: Any) -> None:
        self.put = put

    def extend(self, values: Sequence[bytes | None] | Iterator[bytes | None]) -> None:
        import numpy as np

        vals = list(values)
        if None in vals:
            vals = [v for v in vals if v is not None]
        if vals:
            self.put((b"".join(vals),  # type: ignore[arg-type]
                      np.fromiter(map(len, vals), np.int64, len(vals))))  # type: ignore[arg-type]

    def extend_raw(self, data: bytes, lengths: Any, keep: Any) -> None:
        """The values of a ``kafka_native.RawBatch`` (``data``, ``lengths``) whose
        ``keep`` is true (a numpy mask), null values left out."""
        import numpy as np

        keep = keep & (lengths >= 0)
        if keep.all():
            self.put((data, lengths))
        elif keep.any():
            sizes = lengths.clip(min=0)
            self.put((np.frombuffer(data, np.uint8)[np.repeat(keep, sizes)].tobytes(), lengths[keep]))


class _Values:
    """Chunks of values gathered into one Arrow string array (one join instead of an
    Arrow conversion per value)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.lengths: list[Any] = []
        self.count = 0

    def add(self, data: bytes, lengths: Any) -> None:
        self.chunks.append(data)
        self.lengths.append(lengths)
        self.count += len(lengths)

    def array(self) -> Any:
        import numpy as np
        import pyarrow as pa

        if not self.chunks:
            return pa.array([], pa.string())
        lengths = np.concatenate(self.lengths)
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] < 2**31:
            arr = pa.StringArray.from_buffers(
                len(lengths), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(self.chunks)))
        else:  # more than 2 GiB of values in one task
            arr = pa.LargeStringArray.from_buffers(
                len(lengths), pa.py_buffer(offsets), pa.py_buffer(b"".join(self.chunks)))
        arr.validate(full=True)  # UTF-8, as pa.array would have checked
        return arr


class _RunCheck:
    """Every offset of a run is a record of its commit (``changelog.kafka.protocol.commit_ends``:
    the delivery reports filled it), so a read of a piece must see each offset its
    spans' runs cover, ``[max(first, start), min(end, piece end))``, and nothing else
    takes those offsets: transaction markers and aborted records lie outside runs. A
    missing one was removed from the partition after it was written: compaction
    (``cleanup.policy=compact``) keeps only the newest record of each key.

    ``see(offsets, nulls, upto)`` takes the run offsets a ``consume`` batch returned
    (ascending; ``nulls``: which of them are tombstones) once every offset below
    ``upto`` has been read, ``finish()`` after the piece's last batch. An offset seen
    twice, or below one seen before, raises ``ChangeLogError`` (a broken read: the sinks
    would get the event twice); a gap raises
    ``ChangeLogError`` unless ``allow``; with ``allow`` (a sync with mirror sinks only: the
    newest event of each key is what they apply) a tombstone whose delete event (the
    record just before it, written with it) is missing still raises: a mirror would
    keep the deleted row."""

    def __init__(self, piece: KafkaPiece, allow: bool) -> None:
        self.piece = piece
        self.allow = allow
        self.runs = [(max(first, piece.start), min(end, piece.end))
                     for end, first, _ in piece.spans if first >= 0]
        self.runs = [(a, b) for a, b in self.runs if b > a]
        self.pos = piece.start
        self.gaps = 0  # records found missing (allowed)

    def covered(self, lo: int, hi: int) -> int:
        return sum(max(0, min(b, hi) - max(a, lo)) for a, b in self.runs)

    def see(self, offsets: Any, nulls: Any, upto: int) -> None:
        if len(offsets) and (int(offsets[0]) < self.pos or bool((offsets[1:] <= offsets[:-1]).any())):
            p = self.piece
            prev = [self.pos - 1, *offsets[:-1].tolist()]
            bad = next(i for i, o in enumerate(offsets.tolist()) if o <= prev[i])
            raise ChangeLogError(
                f"topic {p.topic} partition {p.partition}: the read returned offset "
                f"{int(offsets[bad])} after offset {prev[bad]} (a record twice or out of "
                f"order): the batch fails rather than give its sinks an event twice",
                hint="a bug of the Kafka read (pydblog.changelog.kafka): report it with the "
                     "log of this task; running the sync again re-reads the batch",
            )
        if not self.runs:
            return
        want = self.covered(self.pos, upto)
        if want != len(offsets):
            self._gap(offsets, nulls, upto)
        self.pos = max(self.pos, upto)

    def finish(self) -> None:
        import numpy as np

        self.see(np.zeros(0, np.int64), np.zeros(0, np.bool_), self.piece.end)

    def _gap(self, offsets: Any, nulls: Any, upto: int) -> None:
        import numpy as np

        expected = np.concatenate(
            [np.arange(max(a, self.pos), min(b, upto), dtype=np.int64) for a, b in self.runs
             if min(b, upto) > max(a, self.pos)] or [np.zeros(0, np.int64)])
        missing = np.setdiff1d(expected, offsets, assume_unique=True)
        if not len(missing):
            return
        p = self.piece
        where = f"topic {p.topic} partition {p.partition}"
        first, last = int(missing[0]), int(missing[-1])
        if not self.allow:
            raise ChangeLogError(
                f"{len(missing)} record(s) of the change log are missing from {where} "
                f"(offsets {first}..{last}, written by committed transactions): the topic "
                f"was compacted (cleanup.policy=compact keeps only each key's newest "
                f"record), or records were deleted; a history sink needs every event",
                hint=f"use cleanup.policy=delete on the change log's topics for a history "
                     f"sink (kafka-configs --alter --entity-type topics --entity-name "
                     f"{p.topic} --add-config cleanup.policy=delete), and rebuild the "
                     f"history from a complete log; mirror sinks alone accept compacted "
                     f"topics",
            )
        dropped = set(missing.tolist())
        for off in offsets[nulls].tolist() if len(nulls) else ():
            if off - 1 in dropped:
                raise ChangeLogError(
                    f"{where}: compaction removed the delete event at offset {off - 1} "
                    f"and kept only its tombstone (offset {off}): a mirror cannot apply "
                    f"a delete it never sees",
                    hint="with cleanup.policy=compact set [log] tombstones = false (the "
                         "delete event is then each deleted key's newest record and "
                         "compaction keeps it), or use cleanup.policy=delete",
                )
        self.gaps += len(missing)


def _read_piece(client: Any, piece: KafkaPiece, values: _Sink, check: _RunCheck) -> None:
    if client.native and all(first >= 0 for _, first, _ in piece.spans):
        _read_runs(client, piece, values, check)
    else:
        _read_messages(client, piece, values, check)
    check.finish()
    if check.gaps:
        log.warning("%s partition %d, offsets %d..%d: %d record(s) missing (compacted "
                    "topic): accepted, the sync has mirror sinks only", piece.topic,
                    piece.partition, piece.start, piece.end - 1, check.gaps)


def _read_messages(client: Any, piece: KafkaPiece, values: _Sink, check: _RunCheck) -> None:
    """A piece read through confluent-kafka's ``Message`` objects (the headers of the
    records in spans without a run decide)."""
    import confluent_kafka
    import numpy as np

    from pydblog.changelog.kafka.topics import event_value

    value = event_value if client.formatted else confluent_kafka.Message.value
    spans = piece.spans
    k = 0
    for batch in client.read_batches({(piece.topic, piece.partition): (piece.start, piece.end)}):
        n = len(batch)
        if k < len(spans) and spans[k][1] >= 0 and spans[k][1] <= batch[0].offset() \
                and batch[-1].offset() < spans[k][0]:
            vals = list(map(value, batch))  # the whole batch lies in one run
            values.extend(vals)
            check.see(np.fromiter((m.offset() for m in batch), np.int64, n),
                      np.array([v is None for v in vals], np.bool_), batch[-1].offset() + 1)
            continue
        offsets = [m.offset() for m in batch]
        in_runs: list[int] = []
        i = 0
        while i < n and k < len(spans):
            end, first, tag = spans[k]
            if offsets[i] >= end:  # offsets only grow: the next span
                k += 1
                continue
            j = bisect.bisect_left(offsets, end, i)  # batch[i:j] lies in this span
            if first >= 0:
                a = bisect.bisect_left(offsets, first, i, j)
                values.extend(map(value, batch[a:j]))
                in_runs.extend(range(a, j))
            else:
                values.extend(_checked(batch[i:j], tag.encode()))
            i = j
        check.see(np.array([offsets[x] for x in in_runs], np.int64),
                  np.array([batch[x].value() is None for x in in_runs], np.bool_),
                  offsets[-1] + 1)


def _read_runs(client: Any, piece: KafkaPiece, values: _Sink, check: _RunCheck) -> None:
    """A piece whose spans all have runs (the valid records of span ``(end, first, _)``
    are exactly the offsets ``first <= o < end``): by offset alone, a
    ``kafka_native.RawBatch`` at a time (no Python object per record)."""
    import numpy as np

    for b in client.read_values((piece.topic, piece.partition), piece.start, piece.end):
        offsets = b.offsets
        lo, hi = int(offsets[0]), int(offsets[-1])
        keep: Any = None
        for end, first, _ in piece.spans:
            if first <= lo and hi < end:  # the whole batch lies in one run
                keep = np.ones(len(offsets), np.bool_)
                break
        if keep is None:
            keep = np.zeros(len(offsets), np.bool_)
            for end, first, _ in piece.spans:
                keep |= (offsets >= first) & (offsets < end)
        values.extend_raw(b.data, b.lengths, keep)
        if keep.all():
            check.see(offsets, b.lengths < 0, hi + 1)
        else:
            check.see(offsets[keep], b.lengths[keep] < 0, hi + 1)


def _checked(msgs: Sequence[Any], tag: bytes) -> Iterator[bytes | None]:
    """The values of the messages whose writer header is ``tag`` (not fan-out copies of
    older logs); a notification's is its envelope, from its ``dblog.event`` header."""
    from pydblog.changelog.kafka.topics import HEADER_EVENT, HEADER_FANOUT, HEADER_WRITER, header

    for m in msgs:
        headers = m.headers()
        if not headers:  # not written by a capture
            continue
        event = None
        if len(headers) > 1:  # (the session tag alone: a data record of the json format)
            if header(headers, HEADER_FANOUT) is not None:
                continue
            event = header(headers, HEADER_EVENT)
        got = headers[0][1] if headers[0][0] == HEADER_WRITER else header(headers, HEADER_WRITER)
        if got == tag:
            yield m.value() if event is None else event


TASKS_PER_CORE = 2
"""``split_ranges`` cuts a batch into this many tasks per core."""
MIN_RANGE_RECORDS = 20_000
"""``split_ranges`` makes no task smaller than this (unless the batch is)."""


def split_ranges(
    log: str, ranges: Sequence[tuple[tuple[str, int], int, int, Sequence[tuple[int, int, str]]]],
    parts: int, allow_gaps: bool = False, seq: tuple[int, int] | None = None,
) -> list[KafkaRange]:
    """The input partitions of a batch: ``2 * parts`` tasks of nearly equal record
    counts (``size`` each; fewer tasks where that would make them smaller than
    ``MIN_RANGE_RECORDS``), so that ``parts`` cores share the work evenly whatever the
    topics' partition counts. The partitions' ranges ``[lo, hi)`` (with their spans, in
    offset order) are laid end to end and cut at the tasks' boundaries, a boundary
    moved to a partition's edge if one is within ``size / 8`` (no tiny pieces); a task
    reads its pieces one after another with one consumer (which costs ~0.1 s before its
    first record). Each piece carries the spans that cover it (a record's validity
    depends only on the span it lies in).

    Filling each task up to ``size`` in turn left, e.g., 75k + 75k + 75k + 50k + 25k
    records for 12 partitions of ~25k: three rounds of tasks on two cores, not two."""
    total = sum(hi - lo for _, lo, hi, _ in ranges)
    tasks = max(1, min(TASKS_PER_CORE * parts, total // MIN_RANGE_RECORDS))
    size = -(-total // tasks)
    edges = list(itertools.accumulate((hi - lo for _, lo, hi, _ in ranges), initial=0))
    bounds: list[int] = []
    for k in range(1, tasks):
        b = total * k // tasks
        i = bisect.bisect_left(edges, b)
        near = min(edges[max(0, i - 1):i + 1], key=lambda e: abs(e - b))
        b = near if abs(near - b) <= size // 8 else b
        if 0 < b < total and (not bounds or b > bounds[-1]):
            bounds.append(b)
    groups: list[list[KafkaPiece]] = [[] for _ in range(len(bounds) + 1)]
    for ((topic, p), lo, hi, spans), at in zip(ranges, edges, strict=False):
        ends = [s[0] for s in spans]
        inner = [lo + b - at for b in bounds if at < b < at + hi - lo]
        for a, b in itertools.pairwise([lo, *inner, hi]):
            i = bisect.bisect_right(ends, a)  # the first span ending above a
            j = bisect.bisect_left(ends, b, i)  # ... up to the first ending at or above b
            if b > a and i < len(spans):
                task = bisect.bisect_right(bounds, at + a - lo)
                groups[task].append(KafkaPiece(topic, p, a, b, tuple(spans[i:j + 1])))
    return [KafkaRange(log, tuple(g), allow_gaps, seq) for g in groups if g]


class KafkaStream(ChangeLogStream):
    """A Kafka change log (``log_json``: the ``[log]`` config as JSON) as a Spark
    stream's source. ``allow_gaps``: records missing from a partition (a compacted
    topic) are accepted, for readers that need only each key's newest event (a sync
    with mirror sinks only); otherwise they fail the read (``_RunCheck``)."""

    dense = False

    def __init__(self, log_json: str, allow_gaps: bool = False) -> None:
        self.log = log_json
        self.allow_gaps = allow_gaps
        self.target: int | None = None
        self._planned: tuple[Offset, Offset, Any] | None = None  # start, end, CommitLog
        self._published: Offset | None = None  # the offsets last committed to the group
        self._client: Any = None
        self._bulk: Any = None  # ``_planning(bulk=True)``
        self._group: Any = None  # the consumer of ``commit``

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (an executor's copy of the reader, planned or not) without the open
        clients and the kept plan: a copy plans afresh."""
        state = dict(self.__dict__)
        state.update(_client=None, _bulk=None, _group=None, _planned=None)
        return state

    def _planning(self, bulk: bool = False) -> Any:
        """The planner's Kafka clients, kept for the stream's life (Spark plans a query's
        batches in one process): each plan made and closed a client before, ~0.03-0.1 s
        of connecting and metadata a call, two on a query's start. ``bulk``: the client
        of plans that end at a known checkpoint-topic offset (``_bulk_plans``)."""
        from pydblog.changelog.kafka.client import Client

        if bulk:
            if self._bulk is None:
                self._bulk = Client(_config(self.log), bulk=True)
            return self._bulk
        if self._client is None:
            self._client = Client(_config(self.log))
        return self._client

    def _forget_client(self) -> None:
        """After an error: the next call connects afresh."""
        for client in (self._client, self._bulk):
            if client is not None:
                try:
                    client.close()
                except Exception:
                    log.debug("closing the planner's Kafka client failed", exc_info=True)
        self._client = self._bulk = None

    def _plan(self, start: Offset, stop_cp: int | None, max_events: int | None) -> tuple[Offset, Any]:
        try:
            return plan(self.log, start, stop_cp, max_events,
                        self._planning(bulk=stop_cp is not None))
        except BaseException:
            self._forget_client()
            raise

    def initial_offset(self, starting: str) -> Offset:
        start: Offset = {"cp": 0, "seq": 0, "owner": None, "ends": {}}
        if starting == "latest":
            return self._plan(start, None, None)[0]
        if starting != "earliest":
            raise ChangeLogError(
                f"a Kafka change log's starting offset must be earliest or latest, got {starting!r}")
        return start

    def prepare_available_now(self) -> None:
        try:
            self.target = _checkpoint_end(self.log, self._planning())
        except BaseException:
            self._forget_client()
            raise

    def latest_offset(self, start: Offset, max_events: int | None) -> Offset:
        end, log = self._plan(start, self.target, max_events)
        if end["seq"] == int(start.get("seq", 0)) and end["ends"] == start.get("ends", {}):
            # Nothing new to apply (transaction markers, begin messages, empty commits):
            # no new data, not an empty micro-batch. The next plan reads them again from
            # start["cp"] (planning is a pure function of the topic from there). Spark
            # calls ``commit`` for a batch only when it plans the next one: publish the
            # last batch's offsets here (everything below ``start`` is applied: Spark
            # re-runs an uncommitted batch before it asks for new offsets).
            if self._published != start:
                self.commit(start)
            return start
        # ``partitions(start, end)`` usually follows in this process: the same commits
        # (those of the checkpoint topic from start["cp"] to end["cp"]) need not be read
        # again. A restarted query plans afresh (``partitions`` alone).
        self._planned = (start, end, log)
        return end

    def report_latest_offset(self) -> Offset | None:
        return None  # the checkpoint topic would have to be read to its end

    def events_end(self) -> int:
        """The valid commits' end: the checkpoint topic read to its end (``plan``) with
        a bulk client of its own (``KafkaChangeLogReader.next_offset`` read the 3,700
        commits of a 1.2M-event log in 14 s on Tansu, this in 0.3 s)."""
        from pydblog.changelog.kafka.client import Client

        cfg = _config(self.log)
        client, bulk = Client(cfg), Client(cfg, bulk=True)
        try:
            stop = _checkpoint_end(self.log, client)
            start: Offset = {"cp": 0, "seq": 0, "owner": None, "ends": {}}
            return int(plan(self.log, start, stop, None, bulk)[0]["seq"])
        finally:
            bulk.close()
            client.close()

    def partitions(self, start: Offset, end: Offset, parts: int) -> Sequence[LogPartition]:
        planned, self._planned = self._planned, None
        seq = (position(start), position(end)) if "at" in start or "at" in end else None
        if "at" in end:  # the commits up to the one holding ``at``, read whole
            again, log = self._plan(start, None, position(end) - position(start))
            if int(again["seq"]) < position(end):
                raise ChangeLogError(
                    f"the batch Spark logged (change-log offsets {position(start)}.."
                    f"{position(end) - 1}) plans differently now (the commits reach offset "
                    f"{int(again['seq']) - 1}): the checkpoint topic changed under the sync",
                    hint="re-sync the targets from a snapshot with a new [sync] checkpoint")
            end = again
        elif planned is not None and planned[0] == start and planned[1] == end:
            log = planned[2]
        else:  # a restarted query replays the batch Spark logged: planned again, the same
            again, log = self._plan(start, int(end["cp"]), None)
            if [again.get(k) for k in ("seq", "owner", "ends")] != [end.get(k) for k in ("seq", "owner", "ends")]:
                raise ChangeLogError(
                    f"the batch Spark logged (change-log offsets {start.get('seq', 0)}.."
                    f"{int(end['seq']) - 1}, checkpoint topic up to Kafka offset {end['cp']}) "
                    f"plans differently now (up to offset {int(again['seq']) - 1}): the "
                    f"checkpoint topic changed under the sync (re-created, or its commits "
                    f"removed); replaying it would skip or repeat events",
                    hint="re-sync the targets from a snapshot with a new [sync] checkpoint",
                )
        begin = {_tp(k): int(v) for k, v in start.get("ends", {}).items()}
        ranges = []
        for key, hi in sorted(end.get("ends", {}).items()):
            tp = _tp(key)
            lo = begin.get(tp, 0)
            spans = [(s.end, s.first, s.tag) for s in log.spans.get(tp, ())]
            if int(hi) > lo and spans:
                ranges.append((tp, lo, int(hi), spans))
        return split_ranges(self.log, ranges, parts, self.allow_gaps, seq)

    def commit(self, end: Offset) -> None:
        """Publish the applied offsets to ``dblog-sync.<prefix>`` (monitoring only; its
        consumer kept for the stream's life, as the planner's client)."""
        try:
            client = self._planning()
            k = client.k
            if self._group is None:
                from pydblog.changelog.kafka.client import client_config, for_consumer
                from pydblog.changelog.kafka.reader import SYNC_GROUP

                self._group = k.Consumer(for_consumer(client_config(
                    client.cfg, **{"group.id": SYNC_GROUP.format(prefix=client.prefix),
                                   "enable.auto.commit": False})))
            offsets = [k.TopicPartition(t, p, int(o))
                       for (t, p), o in ((_tp(key), v) for key, v in end.get("ends", {}).items())]
            if offsets:
                self._group.commit(offsets=offsets, asynchronous=False)
            self._published = end
        except Exception:  # monitoring only: the sinks' commits make the sync exactly once
            self._close_group()
            return

    def _close_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            try:
                group.close()
            except Exception:
                log.debug("closing the sync group's consumer failed", exc_info=True)

    def close(self) -> None:
        """Close the planner's clients (Spark stops the stream)."""
        self._close_group()
        self._forget_client()

    def warm_up(self) -> None:
        """Loads confluent-kafka and the native read (``kafka_native``: ~0.1 s of CPU that
        the first task of each Python worker paid otherwise)."""
        from pydblog.changelog import kafka_native

        kafka_native.available()


def consistent_end(log_json: str, start: Offset, end: Offset, low: int) -> Offset:
    """``consistent = true``: ``end`` (planned from ``start`` by ``latest_offset``) cut
    back to the first event after ``start`` whose commit time is past ``low``
    (``core.drainer.consistent_cut`` on the commits' times: whole transactions); an
    offset inside a commit gets ``at``. ``start`` when nothing is at or below ``low``."""
    if end == start:
        return start
    commits: list[PlannedCommit] = []
    plan(log_json, start, int(end["cp"]), None, commits=commits)
    first, stop = position(start), position(end)
    cut = cut_position(commits, first, stop, low)
    if cut >= stop:
        return end
    if cut <= first:
        return start
    at_or_before: Offset = boundary(start)
    for c in commits:
        if c.end <= cut:
            at_or_before = c.after
    return at_or_before if int(at_or_before["seq"]) == cut else {**at_or_before, "at": cut}


def cut_position(commits: Sequence[PlannedCommit], first: int, stop: int, low: int) -> int:
    """The global offset of the first event in ``[first, stop)`` of ``commits`` whose
    commit time is past ``low`` (``stop`` when none is): ``consistent_cut`` on the
    commits' times, without expanding them to one per event."""
    for c in commits:
        times = list(c.times)
        for i, (at, ts) in enumerate(times):
            hi = times[i + 1][0] if i + 1 < len(times) else c.end
            lo, hi = max(at, first, c.start), min(hi, stop)
            if lo < hi and ts > low:
                return lo
    return stop


TAIL_MESSAGES = 256
"""``log_complete_ms`` reads at most this many of the checkpoint topic's last messages."""


def log_complete_ms(log_json: str) -> int | None:
    """How far a Kafka change log is complete in source time: the newest commit time
    of its last commit with events minus one, or the writer's clock when it wrote the
    last commit (a heartbeat: the capture commits its checkpoint while idle) if that
    checkpoint is outside a transaction and later; None without either. Reads the
    checkpoint topic's last ``TAIL_MESSAGES`` messages (the newest valid owner's)."""
    from pydblog.changelog.kafka.client import Client
    from pydblog.changelog.kafka.protocol import CommitLog, CommitRecord
    from pydblog.changelog.kafka.topics import checkpoint_topic

    client = Client(_config(log_json))
    try:
        topic = checkpoint_topic(client.prefix)
        if not client.partitions(topic):
            return None
        lo, hi = client.watermarks([(topic, 0)])[(topic, 0)]
        recs: list[Any] = []
        for m in client.read_range({(topic, 0): (max(int(lo), int(hi) - TAIL_MESSAGES), None)},
                                   to_now=True):
            if m.value() is not None:
                recs.append(CommitRecord.from_bytes(m.value(), m.offset()))
    finally:
        client.close()
    log = CommitLog(track=False)
    valid = [r for r in recs if log.apply(r) and not r.fence and not r.begin]
    owner = log.owner
    valid = [r for r in valid if (r.epoch or 0, r.gen, r.writer) == owner]
    newest = next((r.times[-1][1] - 1 if r.times else (r.ts or 0) - 1
                   for r in reversed(valid) if r.end > r.start), None)
    last = valid[-1] if valid else None
    beat = None
    if last is not None and last.ts is not None and not (
            last.checkpoint is not None and last.checkpoint.extra.get("mid_tx")):
        beat = last.ts if last.checkpoint is None else last.checkpoint.complete_ms(last.ts)
    if newest is None:
        return beat
    return newest if beat is None else max(newest, beat)
