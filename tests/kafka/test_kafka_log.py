"""The Kafka change log against the embedded one: the same appends read back the same
(offsets, tables, ops, envelopes); crashes at each step of a commit lose nothing and
show nothing twice; the checkpoint is recovered from Kafka alone."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from pydblog.changelog import kafka_spark
from pydblog.changelog.kafka.reader import KafkaChangeLogReader
from pydblog.changelog.kafka.topics import data_topic
from pydblog.changelog.kafka.writer import KafkaChangeLog
from pydblog.changelog.sqlite import SqliteChangeLog, SqliteChangeLogReader
from pydblog.config import LogConfig
from pydblog.events import (
    TAIL_SEP,
    ChangeEvent,
    Encoded,
    EncodedChunk,
    Op,
    SnapshotKind,
    SnapshotRows,
    encode_event,
    encode_snapshot_rows,
)
from pydblog.ports import Checkpoint, ColumnSchema, LogRecord, TableSchema
from pydblog.positions import Lsn, PgPosition


def pos(lsn: int, i: int = 0) -> PgPosition:
    return PgPosition(Lsn(lsn), i, Lsn(lsn), 700 + lsn)


def row_event(op: Op, table: str, lsn: int, key: dict[str, Any], after: dict[str, Any] | None,
              schema: str = "public") -> Encoded:
    before = None if op is not Op.DELETE else key
    ev = ChangeEvent(op, schema, table, pos(lsn), 1_700_000_000_000 + lsn, key, before, after)
    return encode_event(ev, "postgresql", "app", 1_700_000_000_500)


def chunk_block(table: str, lsn: int, ids: range) -> list[Encoded]:
    tails = "\n".join(
        f'{{"id":{i}}}{TAIL_SEP}{{"id":{i},"v":"s{i}"}}}}' for i in ids
    )
    keys = "\n".join(f"[{i}]" for i in ids)
    chunk = EncodedChunk(len(ids), tails, keys, tuple, 1, int_keys=True)
    rows = SnapshotRows("public", table, SnapshotKind.INCREMENTAL, pos(lsn), 1, 1_700_000_000_000,
                        chunk, ("id",))
    out = encode_snapshot_rows(rows, "postgresql", "app", 1_700_000_000_500)
    return list(out)


def batches() -> list[list[Encoded]]:
    """A mix: plain events of two tables (one keyed by a column named ``before``), a
    snapshot chunk as a template block, a truncate, notifications with and without a
    table, deletes."""
    n = ChangeEvent(Op.NOTIFICATION, "public", "a", pos(30), 1, notification={"type": "STARTED"})
    g = ChangeEvent(Op.NOTIFICATION, "", "", pos(31), 1, notification={"type": "COMPLETED"})
    return [
        [row_event(Op.CREATE, "a", 10 + i, {"id": i}, {"id": i, "v": f"x{i}"}) for i in range(50)],
        [row_event(Op.UPDATE, "b", 20, {"before": 1, "k": "z"}, {"before": 1, "k": "z", "j": {"before": 2}}),
         *chunk_block("a", 25, range(100, 400))],
        [encode_event(n, "postgresql", "app", 5), row_event(Op.DELETE, "a", 32, {"id": 3}, None),
         encode_event(ChangeEvent(Op.TRUNCATE, "public", "b", pos(33), 1), "postgresql", "app", 5),
         encode_event(g, "postgresql", "app", 5)],
        [],
        [row_event(Op.CREATE, "a", 40 + i, {"id": 1000 + i}, {"id": 1000 + i}) for i in range(20)],
    ]


SCHEMA = TableSchema("public", "a", (ColumnSchema("id", "integer", "int32", False),), ("id",))


def cp(n: int) -> Checkpoint:
    return Checkpoint(pos(n), {"tables": {"public.a": n}}, {"initial_started": True})


def records(reader: Any) -> list[LogRecord]:
    out: list[LogRecord] = reader.read(0, 10**9)
    return out


def test_same_reads_as_the_embedded_log(kafka_log: LogConfig, tmp_path: Path) -> None:
    sq = SqliteChangeLog(tmp_path / "sq")
    kf = KafkaChangeLog(kafka_log)
    assert kf.last_checkpoint() is None and kf.next_offset == 0
    for i, b in enumerate(batches()):
        schemas = [SCHEMA] if i == 1 else []
        assert kf.append(b, cp(i), schemas) == sq.append(b, cp(i), schemas)
    kf.close()
    want = records(SqliteChangeLogReader(tmp_path / "sq"))
    reader = KafkaChangeLogReader(kafka_log)
    got = records(reader)
    assert [(r.offset, r.table, r.op, r.ts_ms) for r in got] == [
        (r.offset, r.table, r.op, r.ts_ms) for r in want]
    assert [orjson.loads(r.body) for r in got] == [orjson.loads(r.body) for r in want]
    assert reader.next_offset() == len(want) == sq.next_offset
    assert reader.schemas() == [(50, SCHEMA)]
    assert reader.last_checkpoint() == cp(4)
    assert [r.offset for r in reader.read(60, 5, ["public.a"])] == [60, 61, 62, 63, 64]
    # A new session (another host: nothing local) continues where the log ends.
    again = KafkaChangeLog(kafka_log)
    assert again.last_checkpoint() == cp(4) and again.next_offset == len(want)
    assert again.schemas() == [(50, SCHEMA)]
    again.close()
    reader.close()


def partition_messages(cfg: LogConfig, topic: str, parts: int) -> dict[int, list[Any]]:
    """Every message of each partition of ``topic`` (a plain consumer)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": cfg.bootstrap_servers, "group.id": "x",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    out: dict[int, list[Any]] = {}
    for p in range(parts):
        c.assign([TopicPartition(topic, p, 0)])
        msgs: list[Any] = []
        eof = False
        while not eof:
            for m in c.consume(100, 1.0):
                if m.error() is None:
                    msgs.append(m)
                else:
                    eof = True
        out[p] = msgs
        c.unassign()
    c.close()
    return out


def test_a_log_of_the_older_layout_reads_the_same(kafka_log: LogConfig, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A log written before notifications had their own topic (truncates and a table's
    notifications in every partition of its topic, copies marked ``dblog.fanout``),
    continued by the current writer: ``dblog tail``'s reader and the Spark source read
    every event once, as the embedded log holds them."""
    from tests.kafka.legacy import LegacyKafkaChangeLog

    old, sq = LegacyKafkaChangeLog(kafka_log), SqliteChangeLog(tmp_path / "sq")
    bs = batches()
    for i, b in enumerate(bs[:3]):
        old.append(b, cp(i))
        sq.append(b, cp(i))
    old.close()
    assert kafka_log.topic_prefix is not None
    per_partition = partition_messages(kafka_log, data_topic(kafka_log.topic_prefix, "public.b"), 3)
    assert [sum(orjson.loads(m.value())["op"] == "t" for m in ms) for ms in per_partition.values()] \
        == [1, 1, 1], "the older layout: a truncate in every partition"
    new = KafkaChangeLog(kafka_log)
    for i, b in enumerate(bs[3:], 3):
        new.append(b + bs[2], cp(i))  # the new layout's truncates and notifications too
        sq.append(b + bs[2], cp(i))
    new.close()
    want = records(SqliteChangeLogReader(tmp_path / "sq"))
    got = records(KafkaChangeLogReader(kafka_log))
    assert [(r.offset, orjson.loads(r.body)) for r in got] == [
        (r.offset, orjson.loads(r.body)) for r in want]
    monkeypatch.setattr(kafka_spark, "MIN_RANGE_RECORDS", 7)
    for columns in (None, ["offset", "op", "table", "key", "after", "unchanged", "ts_ms"]):
        assert source_rows(kafka_log, columns) == embedded_rows(tmp_path / "sq", columns)


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_topics([topic]).values():
        fut.result()
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result()


@pytest.mark.parametrize("when", ["in the same session", "before a session that recovers no end there",
                                  "before a session whose recovery window lists every end"])
def test_a_recreated_topic_is_refused(tmp_path: Path, kafka_bootstrap: str, when: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A table's topic deleted and created again (an operator 'resetting' it) restarts
    its partitions' offsets at 0. Readers take a partition's records only at or above
    the last valid commit's end there (``CommitLog.apply``), so a commit of the lower
    offsets would never be read by `dblog tail -f`, the API's stream or `dblog sync`
    (committing it anyway, `read(5, 100)` would give []). The commit is
    refused, non-retriable, naming the topic, partition and offsets, and nothing is
    committed. Also in a later writer process whose recovery window does not cover the
    partition: the writer then reads the whole checkpoint topic for its end there,
    unless a commit in the window listed every partition's end (``KNOWN_EVERY``)."""
    import uuid

    from pydblog.changelog.kafka import writer as kafka_writer
    from pydblog.errors import ChangeLogError

    cfg = LogConfig(type="kafka", path=str(tmp_path / "k"), bootstrap_servers=kafka_bootstrap,
                    topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=1)
    assert cfg.topic_prefix is not None
    topic = data_topic(cfg.topic_prefix, "public.b")
    if when.endswith("lists every end"):
        monkeypatch.setattr(kafka_writer, "KNOWN_EVERY", 1)
    kf = KafkaChangeLog(cfg)
    kf.append([row_event(Op.CREATE, "b", 10 + i, {"id": i}, {"id": i}) for i in range(5)], cp(0))
    if when != "in the same session":
        kf.append([row_event(Op.CREATE, "c", 20, {"id": 1}, {"id": 1})], cp(1))
        kf.append([row_event(Op.CREATE, "c", 21, {"id": 2}, {"id": 2})], cp(2))
        kf.close()
        monkeypatch.setattr(kafka_writer, "RECOVERY_WINDOW", 2)  # the last two commits: table c's
    recreate_topic(kafka_bootstrap, topic, 1)
    if when != "in the same session":
        kf = KafkaChangeLog(cfg)
        if when.endswith("lists every end"):  # (no read of the whole topic needed)
            assert kf._all_ends_read and kf._valid_ends[(topic, 0)] == 5
        else:  # (so the writer reads the whole topic)
            assert not kf._all_ends_read and (topic, 0) not in kf._valid_ends
    nxt = kf.next_offset
    try:
        with pytest.raises(ChangeLogError) as err:
            kf.append([row_event(Op.CREATE, "b", 30 + i, {"id": 100 + i}, {"id": 100 + i})
                       for i in range(2)], cp(3))
    finally:
        kf.close()
    assert not err.value.retriable, err.value
    assert f"{topic} partition 0: Kafka acknowledged this commit's records at offsets 0 to 1" \
        in err.value.message
    assert "below 5, the end of the last valid commit there" in err.value.message
    assert "deleted and created again" in err.value.message
    assert "topic_prefix" in (err.value.hint or "")
    reader = KafkaChangeLogReader(cfg)
    try:
        assert reader.next_offset() == nxt  # nothing committed
    finally:
        reader.close()


@pytest.mark.parametrize("truncates", ["skip", "include"])
def test_table_topics_hold_what_debeziums_hold(kafka_log: LogConfig, truncates: str) -> None:
    """A table's topic holds its row events, and its truncates only with ``truncates =
    "include"`` (one keyless message, as Debezium's); notifications go to the
    notification topic in the shape of Debezium's Kafka notification channel, with the
    envelope in a header; skipped truncates to the truncates topic. A record's headers:
    the session tag, and its ``source`` block only with ``source_header = true``."""
    from pydblog.changelog.kafka.topics import notifications_topic, truncates_topic

    cfg = kafka_log.model_copy(update={"truncates": truncates,
                                       "source_header": truncates == "include"})
    kf = KafkaChangeLog(cfg)
    for i, b in enumerate(batches()):
        kf.append(b, cp(i))
    kf.close()
    assert cfg.topic_prefix is not None
    topic = data_topic(cfg.topic_prefix, "public.b")
    per_partition = partition_messages(cfg, topic, 3)
    msgs = [m for ms in per_partition.values() for m in ms]
    ops = sorted(orjson.loads(m.value())["op"] for m in msgs)
    assert ops == (["t", "u"] if truncates == "include" else ["u"]), ops
    a_ops = {orjson.loads(m.value())["op"]
             for ms in partition_messages(cfg, data_topic(cfg.topic_prefix, "public.a"), 3).values()
             for m in ms if m.value() is not None}
    assert a_ops == {"c", "d", "r"}, a_ops  # (the table's notification is not there)
    (update,) = [m for m in msgs if orjson.loads(m.value())["op"] == "u"]
    assert update.key() == b'{"before":1,"k":"z"}'
    headers = dict(update.headers())
    if truncates == "include":  # (and source_header = true)
        src = orjson.loads(headers["dblog.source"])
        assert src["lsn"] == 20 and src["table"] == "b" and src["txId"] == 720
    else:
        assert set(headers) == {"dblog.writer"}, headers
    assert orjson.loads(update.value())["offset"] == 50
    (trunc,) = [m for m in (msgs if truncates == "include"
                            else partition_messages(cfg, truncates_topic(cfg.topic_prefix), 1)[0])
                if orjson.loads(m.value())["op"] == "t"]
    assert trunc.partition() == 0 and trunc.key() is None
    assert orjson.loads(trunc.value())["source"]["table"] == "b"
    notes = partition_messages(cfg, notifications_topic(cfg.topic_prefix), 1)[0]
    assert [orjson.loads(m.value()) for m in notes] == [
        {"id": "", "aggregate_type": None, "type": "STARTED", "additional_data": {}, "timestamp": 5},
        {"id": "", "aggregate_type": None, "type": "COMPLETED", "additional_data": {}, "timestamp": 5}]
    assert [m.key() for m in notes] == [b'{"id":""}'] * 2
    envelopes = [orjson.loads(dict(m.headers())["dblog.event"]) for m in notes]
    assert [(e["op"], e["source"]["table"], e["notification"]["type"]) for e in envelopes] == [
        ("n", "a", "STARTED"), ("n", "", "COMPLETED")]


def test_notification_value_is_debeziums_shape() -> None:
    """Debezium's notification channel sends ``additional_data`` as a map of strings."""
    from pydblog.changelog.kafka.topics import notification_value
    from pydblog.core.notices import Notice, NotificationType

    note = Notice(NotificationType.IN_PROGRESS, "sig-1", SnapshotKind.INCREMENTAL, "public.a",
                  {"data_collections": ["public.a", "public.b"], "rows_scanned": 10,
                   "maximum_key": [5], "last_processed_key": None, "percent": 12.5})
    text = orjson.dumps(note.event(pos(3), 7).envelope("postgresql", "app", 99)).decode()
    key, value = notification_value(text)
    assert orjson.loads(key) == {"id": "sig-1"}
    assert orjson.loads(value) == {
        "id": "sig-1", "aggregate_type": "Incremental Snapshot", "type": "IN_PROGRESS",
        "additional_data": {"data_collections": "public.a, public.b", "rows_scanned": "10",
                            "maximum_key": "[5]", "percent": "12.5"},
        "timestamp": 99}


def murmur2(key: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (Java's producer; librdkafka's ``murmur2_random``), as an
    unsigned 32-bit value."""
    m, h = 0x5BD1E995, (0x9747B28C ^ len(key)) & 0xFFFFFFFF
    whole = len(key) & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(key[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = key[whole:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h ^= rest[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Java's default partitioner gives a keyed record."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_murmur2_matches_kafkas_test_vectors() -> None:
    vectors = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
               b"a-little-bit-longer-string": -1486304829,
               b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
               b"abc": 479470107}  # Kafka's UtilsTest.testMurmur2
    for key, java in vectors.items():
        assert murmur2(key) == java & 0xFFFFFFFF, key


def test_every_event_of_a_key_in_one_partition_in_order(
    pg_db: str, tmp_path: Path, kafka_bootstrap: str
) -> None:
    """A capture into four partitions: snapshot rows, creates, updates, deletes, a
    key-changing update whose new key is re-read (unchanged TOAST), a truncate, then
    the keys again. Every event of a key lands in the partition Java's partitioner
    gives its message key, and in log order (each partition's ``offset`` values rise);
    the topic holds no truncate or notification (``truncates = "skip"``, the default);
    the merged log materializes to the table."""
    import uuid

    from tests.contract.capture import Capture
    from tests.contract.harness import PgHarness

    parts = 4
    h = PgHarness(pg_db)
    big = "(SELECT string_agg(md5(g::text || {i}::text), '') FROM generate_series(1, 100) g)"
    h.execute("CREATE TABLE k (id int PRIMARY KEY, n int, big text)",
              "ALTER TABLE k ALTER big SET STORAGE EXTERNAL",
              *[f"INSERT INTO k VALUES ({i}, 0, {big.format(i=i)})" for i in range(1, 31)])
    prefix = f"p{uuid.uuid4().hex[:8]}"
    cfg = f'type = "kafka"\nbootstrap_servers = "{kafka_bootstrap}"\ntopic_prefix = "{prefix}"\n' \
          f"partitions = {parts}\n[snapshot]\nchunk_size = 4\n"
    with Capture(h, tmp_path, cfg) as cap:
        h.signal("snap", "execute-snapshot", {"data-collections": ["public\\.k"]})
        for i in range(1, 31, 3):  # during the snapshot, too
            h.execute(f"UPDATE k SET n = n + 1 WHERE id = {i}")
        cap.wait_notification("COMPLETED", signal_id="snap")
        h.execute(*[f"INSERT INTO k VALUES ({i}, 0, 'small')" for i in range(31, 41)])
        h.execute(*[f"UPDATE k SET n = n + 10 WHERE id IN ({i}, {i + 30})" for i in range(1, 11)])
        h.execute("DELETE FROM k WHERE id IN (5, 35)")
        h.execute("UPDATE k SET id = 100 WHERE id = 7")  # big unchanged: the new key is re-read
        h.execute("UPDATE k SET id = 101, n = 3 WHERE id = 8")
        h.execute("UPDATE k SET n = n + 1 WHERE id IN (100, 101)")
        cap.caught_up()
        cap.rereads_done()
        h.execute("TRUNCATE k")
        h.execute(*[f"INSERT INTO k VALUES ({i}, 1, 'again')" for i in (1, 2, 3, 100)])
        h.execute("UPDATE k SET n = 2 WHERE id IN (1, 100)")
        events = cap.assert_oracle({"k": ["id"]})
    log_keys: dict[bytes, list[int]] = {}
    fanned = []
    for e in events:
        if e["source"]["table"] != "k":
            continue
        if e["op"] in ("t", "n"):
            fanned.append(e["offset"])
        else:
            log_keys.setdefault(orjson.dumps(e["key"]), []).append(e["offset"])
    assert len(fanned) >= 3  # STARTED, COMPLETED (TABLE_SCAN_COMPLETED), the truncate
    reread = [e for e in events if e["op"] == "r" and e["key"] == {"id": 100}]
    assert len(reread) == 1 and len(reread[0]["after"]["big"]) == 3200  # the re-read row
    per_part = partition_messages(LogConfig(type="kafka", bootstrap_servers=kafka_bootstrap,
                                            topic_prefix=prefix), f"{prefix}.public.k", parts)
    seen: dict[bytes, list[int]] = {}
    for p, msgs in per_part.items():
        offsets = [orjson.loads(m.value())["offset"] for m in msgs if m.value() is not None]
        assert offsets == sorted(set(offsets)), f"partition {p} is out of log order"
        assert not set(fanned) & set(offsets), f"partition {p} holds a truncate or notification"
        for m in msgs:
            v = orjson.loads(m.value())
            assert m.key() == orjson.dumps(v["key"])
            assert murmur2_partition(m.key(), parts) == p, (m.key(), p)
            seen.setdefault(m.key(), []).append(v["offset"])
    assert seen == log_keys  # every event of every key, once, in the key's partition, in order
    assert {murmur2_partition(k, parts) for k in seen} == set(range(parts))  # all partitions used


def _crashing_writer(cfg_json: str, point: str) -> None:
    os.environ["DBLOG_CRASH_AT"] = point
    cfg = LogConfig.model_validate_json(cfg_json)
    kf = KafkaChangeLog(cfg)
    for i, b in enumerate(batches()):
        kf.append(b, cp(i))


@pytest.mark.parametrize("point", ["kafka-after-data:3", "kafka-before-commit:2", "kafka-after-data:1"])
def test_crash_inside_a_commit(kafka_log: LogConfig, tmp_path: Path, point: str,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer dies inside its n-th commit; the next session recovers the last
    checkpoint it can see, appends the rest again, and readers see every event once."""
    proc = multiprocessing.get_context("spawn").Process(
        target=_crashing_writer, args=(kafka_log.model_dump_json(), point))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 137
    kf = KafkaChangeLog(kafka_log)
    last = kf.last_checkpoint()
    done = 0 if last is None else int(last.snapshot["tables"]["public.a"]) + 1  # type: ignore[index]
    # Tansu shows the checkpoint of an uncommitted transaction; a real Kafka does not:
    # either way the session resumes right after what readers see.
    n = int(point.split(":")[1])
    assert done in (n - 1, n)
    for i, b in enumerate(batches()[done:], done):
        kf.append(b, cp(i))
    kf.close()
    sq = SqliteChangeLog(tmp_path / "sq")
    for i, b in enumerate(batches()):
        sq.append(b, cp(i))
    want = records(SqliteChangeLogReader(tmp_path / "sq"))
    got = records(KafkaChangeLogReader(kafka_log))
    assert [(r.offset, orjson.loads(r.body)) for r in got] == [
        (r.offset, orjson.loads(r.body)) for r in want]
    # The Spark source reads the same, by runs where a commit listed them (the aborted
    # records lie before the next session's run) and by headers where not (the
    # truncate's fan-out copies), in pieces cut anywhere.
    monkeypatch.setattr(kafka_spark, "MIN_RANGE_RECORDS", 7)
    for columns in (None, ["offset", "op", "table", "key", "after", "unchanged", "ts_ms"]):
        assert source_rows(kafka_log, columns) == embedded_rows(tmp_path / "sq", columns)


def source_rows(cfg: LogConfig, columns: list[str] | None) -> list[dict[str, Any]]:
    """Every row the dblog source gives for the whole log (one batch, its input
    partitions read one after another), in offset order; ``columns``: packed."""
    import pyarrow as pa
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from pydblog.spark import decode
    from pydblog.spark.source import DblogStreamReader

    opts = {"log": cfg.model_dump_json(), "numpartitions": "3"}
    if columns:
        opts.update(packed="true", columns=",".join(columns))
    reader = DblogStreamReader(opts)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    pieces = [p.value.pieces for p in parts if isinstance(p.value, kafka_spark.KafkaRange)]
    assert len(pieces) == len(parts) and sum(map(len, pieces)) > 3, "pieces of partitions"
    assert any(len(p) > 1 for p in pieces), "small pieces grouped into one task"
    rows: list[dict[str, Any]] = []
    for part in parts:
        for batch in reader.read(part):
            if columns:
                table = pa.Table.from_batches([batch])
                rows += decode.unpack(table, decode.columns_schema(columns), dense=False).to_pylist()
            else:
                rows += batch.to_pylist()
    return sorted(rows, key=lambda r: int(r["offset"]))


def embedded_rows(path: Path, columns: list[str] | None) -> list[dict[str, Any]]:
    from pydblog.changelog.sqlite_spark import OffsetRange
    from pydblog.spark import decode

    end = SqliteChangeLogReader(path).next_offset()
    schema = decode.columns_schema(columns) if columns else decode.ARROW_SCHEMA
    return [r for b in decode.read_range(OffsetRange(str(path), 0, end), schema) for r in b.to_pylist()]


@pytest.mark.parametrize("race", ["before-the-fence", "after-the-recovery-read"])
def test_claim_races_an_older_leaders_commit(kafka_log: LogConfig, race: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """HA: the epoch-1 leader commits once more while the epoch-2 leader claims the log
    (a frozen leader waking up just then), with a ``transactional.id`` of its own (with
    the shared default the broker fences it at the new leader's ``init_transactions``,
    Tansu too). ``claim`` writes a fence message, then reads the checkpoint topic, then
    its begin message: a commit landing before the fence is recovered (the new leader
    continues after it, at its checkpoint: the source was acknowledged up to there);
    one landing after it (here: after the recovery read, before the begin message) is
    refused (``Fenced``) and ignored by readers. Either way every global offset is read
    once and no acknowledged event is lost. Before the fence (recovery first), the
    second case made the new leader begin at offset 50 again, overlapping the old
    leader's acknowledged commit 50..351: readers then lost both sessions' events past
    offset 49."""
    from pydblog.changelog.kafka import writer as kafka_writer
    from pydblog.errors import Fenced

    old = KafkaChangeLog(kafka_log)
    old.claim(1)
    b = batches()
    old.append(b[0], cp(0))
    new = KafkaChangeLog(kafka_log.model_copy(update={"transactional_id": "other-host"}))
    raced: list[int | str] = []

    def old_commits() -> None:
        if not raced:
            try:
                raced.append(old.append(b[1], cp(1)))
            except Fenced:
                raced.append("fenced")

    if race == "before-the-fence":
        real_commit = new._commit

        def commit_after_race(*args: Any, **kwargs: Any) -> None:
            old_commits()  # lands right before the claim's first message
            real_commit(*args, **kwargs)

        monkeypatch.setattr(new, "_commit", commit_after_race)
    else:
        real_recover = kafka_writer.recover_commits

        def recover_then_race(client: Any) -> Any:
            commits = real_recover(client)
            old_commits()  # lands right after the claim's read, before its begin message
            return commits

        monkeypatch.setattr(kafka_writer, "recover_commits", recover_then_race)
    new.claim(2)
    monkeypatch.undo()
    if race == "before-the-fence":
        assert raced == [351]
        assert new.next_offset == 351 and new.last_checkpoint() == cp(1)
    else:
        assert raced == ["fenced"]
        assert new.next_offset == 50 and new.last_checkpoint() == cp(0)
    start = new.next_offset
    new.append(b[0][:20], cp(2))
    reader = KafkaChangeLogReader(kafka_log)
    got = records(reader)
    assert [r.offset for r in got] == list(range(start + 20))
    assert reader.last_checkpoint() == cp(2)
    for log_ in (old, new):
        log_.close()
    reader.close()


def test_read_seeks_instead_of_scanning(kafka_log: LogConfig) -> None:
    """``read(from_offset)`` (``dblog tail --from-offset``) fetches the commits around
    ``from_offset`` only, and windowed reads give each event once, in offset order."""
    kf = KafkaChangeLog(kafka_log)
    for i in range(40):
        kf.append([row_event(Op.CREATE, "a", 1000 + 50 * i + j, {"id": 50 * i + j}, {"id": 50 * i + j})
                   for j in range(50)], cp(i))
    kf.close()
    reader = KafkaChangeLogReader(kafka_log)
    data = data_topic(kafka_log.topic_prefix or "", "public.a")
    checkpoints = reader.client.fetched
    got = reader.read(1_975, 10)
    assert [r.offset for r in got] == list(range(1_975, 1_985))
    assert reader.client.fetched - checkpoints <= 1_000 + 50, "one window, not the log from 0"
    assert orjson.loads(got[0].body)["after"] == {"id": 1_975}
    # Small windows from anywhere: every event once, in order; nothing from other tables.
    reader.WINDOW_MIN = 7
    offset, seen = 333, list[int]()
    while batch := reader.read(offset, 7):
        seen.extend(r.offset for r in batch)
        offset = batch[-1].offset + 1
    assert seen == list(range(333, 2_000))
    assert reader.read(0, 5, ["public.b"]) == []
    assert reader.first_offset() == 0
    assert data in {t for t, _ in reader._commits.ends}
    reader.close()


def test_no_empty_batch_after_the_last_commit(kafka_log: LogConfig) -> None:
    """A batch that ends at the last commit (``maxEventsPerTrigger``) leaves only
    transaction markers behind it in the checkpoint topic: the next ``latestOffset`` is
    no new data (the same offset), not an empty micro-batch that moves past them."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from pydblog.spark.source import DblogStreamReader

    kf = KafkaChangeLog(kafka_log)
    for i in range(3):
        kf.append([row_event(Op.CREATE, "a", 1000 + 10 * i + j, {"id": 10 * i + j}, {"id": 10 * i + j})
                   for j in range(10)], cp(i))
    kf.close()
    reader = DblogStreamReader({"log": kafka_log.model_dump_json()})
    reader.prepareForTriggerAvailableNow()
    offset = reader.initialOffset()
    seqs = []
    for _ in range(5):
        end = reader.latestOffset(offset, ReadMaxRows(10))
        if end == offset:
            break
        seqs.append(end["seq"])
        offset = end
    assert seqs == [10, 20, 30]


def test_a_follower_forgets_the_commits_behind_it(kafka_log: LogConfig) -> None:
    """A reader that keeps following the log (``dblog tail -f``, the API's event stream)
    holds the commits around its window, not every commit since the log began; going
    back re-reads the checkpoint topic and still gives every event once."""
    kf = KafkaChangeLog(kafka_log)

    def commit(i: int) -> None:
        kf.append([row_event(Op.CREATE, "a", 1000 + 5 * i + j, {"id": 5 * i + j}, {"id": 5 * i + j})
                   for j in range(5)], cp(i))

    reader = KafkaChangeLogReader(kafka_log)
    reader.WINDOW_MIN = 1
    reader.KEEP_COMMITS = 4
    offset, seen, held = 0, list[int](), list[int]()
    for i in range(60):  # the capture commits, the follower reads what is new
        commit(i)
        while batch := reader.read(offset, 5):
            seen.extend(r.offset for r in batch)
            offset = batch[-1].offset + 1
        held.append(max(len(reader._commits.bounds), *map(len, reader._commits.spans.values())))
    kf.close()
    assert seen == list(range(300))
    assert max(held) <= 4 + 3, held  # commits: KEEP_COMMITS and the window's, of 60
    assert reader._commits.floor > 0
    assert [r.offset for r in reader.read(7, 3)] == [7, 8, 9]  # below the floor: re-read
    assert reader.first_offset() == 0
    assert reader.describe()["last_offset"] == 299
    reader.close()


def test_records_deleted_before_read_are_reported(kafka_log: LogConfig) -> None:
    """Records gone from the topics (retention, DeleteRecords) before a reader got to
    them: the log's first offset moves past them, and a read from below it says so."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from pydblog.errors import ChangeLogError

    kf = KafkaChangeLog(kafka_log)
    for i in range(10):
        kf.append([row_event(Op.CREATE, "a", 100 * i + j, {"id": 100 * i + j}, {"id": j})
                   for j in range(30)], cp(i))
    kf.close()
    topic = data_topic(kafka_log.topic_prefix or "", "public.a")
    admin = AdminClient({"bootstrap.servers": kafka_log.bootstrap_servers or ""})
    for fut in admin.delete_records([TopicPartition(topic, p, 20) for p in range(3)]).values():
        fut.result()
    reader = KafkaChangeLogReader(kafka_log)
    first = reader.first_offset()
    assert 0 < first < 300
    with pytest.raises(ChangeLogError, match="retention"):
        reader.read(0, 10)
    assert [r.offset for r in reader.read(first, 10**6)] == list(range(first, 300))
    reader.close()


@pytest.mark.tansu
def test_a_storage_stall_is_paid_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Tansu on S3 storage answers a 5 ms fetch of records written in transactions with
    nothing, for good (docs/kafka.md): the first reader waits out the stall and finds a
    fetch wait that works. Every later reader of the process (the other reader thread of a
    ``dblog sync`` task, the next task of the same Python worker: each makes its own
    client) starts with it: one stall per process and broker, not one per reader.

    The readers start at a 0 ms fetch wait: at 5 ms whether Tansu stalls depends on the
    storage's latency of the moment (often it does not), and a reader that did not stall
    learned nothing for the next one to start with. A
    later reader's own longer step (the storage slower than 100 ms for a moment: its
    client's, not the process's) is not the shortest wait paid again."""
    from pydblog.changelog.kafka import client as kafka_client
    from pydblog.changelog.kafka import compat as kafka_compat
    from pydblog.devtools.tansu import TansuBroker

    monkeypatch.setattr(kafka_client, "STALL_S", 0.5)
    monkeypatch.setattr(kafka_compat, "_LEARNED_WAITS", {})  # this test's broker only
    with TansuBroker(s3=True) as broker:
        cfg = LogConfig(type="kafka", path=str(tmp_path / "data"), bootstrap_servers=broker.bootstrap,
                        topic_prefix="stall", partitions=1)
        kf = KafkaChangeLog(cfg)
        for i in range(3):
            kf.append([row_event(Op.CREATE, "a", 1000 + 10 * i + j, {"id": 10 * i + j}, {"id": 10 * i + j})
                       for j in range(10)], cp(i))
        kf.close()
        monkeypatch.setattr(kafka_compat, "FETCH_WAITS_MS", (0, *kafka_compat.FETCH_WAITS_MS[1:]))
        tp = (data_topic("stall", "public.a"), 0)
        with caplog.at_level("WARNING", logger="pydblog.changelog.kafka"):
            caplog.clear()
            seen = []
            starts = []  # the fetch wait each reader starts with
            for native in (False, True, False):
                client = kafka_client.Client(cfg, native=native)
                starts.append(client.fetch_wait_ms)
                try:
                    if client.native:
                        seen.append(sum(len(b) for b in client.read_values(tp, 0, 21)))
                    else:
                        seen.append(len(list(client.read_range({tp: (0, 21)}))))  # 10: a marker
                finally:
                    client.close()
        broker.stop_broker(kill=True)  # SIGTERM: Tansu takes ~6 s to stop
    assert seen == [20, 20, 20]
    stalls = [r.getMessage() for r in caplog.records if "sends no records" in r.getMessage()]
    shortest = [m for m in stalls if "a fetch wait of 0 ms is too short" in m]
    assert len(shortest) == 1, stalls  # the first reader's, and only its
    assert starts == [0, 100, 100], (starts, stalls)


def test_describe_reports_each_topics_partitions_and_end_offsets(kafka_log: LogConfig) -> None:
    """``dblog status``'s topics (``describe``): every table's topic, its partition count,
    each partition's end offset in partition order and its messages, as a plain consumer
    asks the broker for them."""
    from confluent_kafka import Consumer, TopicPartition

    kf = KafkaChangeLog(kafka_log)
    for i, b in enumerate(batches()):
        kf.append(b, cp(i))
    kf.close()
    assert kafka_log.topic_prefix is not None
    reader = KafkaChangeLogReader(kafka_log)
    try:
        topics = reader.describe()["topics"]
    finally:
        reader.close()
    wanted = {data_topic(kafka_log.topic_prefix, t) for t in ("public.a", "public.b")}
    assert wanted <= set(topics), topics
    c = Consumer({"bootstrap.servers": kafka_log.bootstrap_servers, "group.id": "x"})
    try:
        for topic in wanted:
            parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
            marks = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in parts]
            info = topics[topic]
            assert info["partitions"] == len(parts) == 3
            assert info["end_offsets"] == [hi for _lo, hi in marks]
            assert info["messages"] == sum(hi - lo for lo, hi in marks)
            data = sum(len(ms) for ms in partition_messages(kafka_log, topic, 3).values())
            assert info["messages"] >= data > 0  # plus the transactions' control records
    finally:
        c.close()
