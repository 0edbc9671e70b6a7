"""The ``dblog`` Spark data source: offsets, read limits, availableNow, exact re-reads,
reading while another process appends."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pydblog.changelog.sqlite import SqliteChangeLog, SqliteChangeLogReader
from pydblog.changelog.sqlite_spark import OffsetRange, plan_partitions
from pydblog.devtools.proc import end_process
from pydblog.devtools.synth import SyntheticLoad, append_events, write_load
from pydblog.errors import ChangeLogError
from pydblog.events import ChangeEvent, Op
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.decode import (
    ARROW_SCHEMA,
    PACKED_SCHEMA,
    decode_bodies,
    read_packed,
    read_range,
    unpack,
)
from pydblog.spark.source import DblogStreamReader


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    write_load(tmp_path / "log", SyntheticLoad(seed=7), 2_500, chunk=1_000)
    return tmp_path / "log"


def test_batch_read_typed_columns(spark: Any, log_dir: Path) -> None:
    df = spark.read.format("dblog").option("path", str(log_dir)).load()
    types = dict(df.dtypes)
    assert types["offset"] == "bigint" and types["lsn"] == "bigint"
    assert types["unchanged"] == "array<string>" and types["after"] == "string"
    rows = df.orderBy("offset").collect()
    assert [r["offset"] for r in rows] == list(range(2_500))
    first = rows[0]
    assert first["op"] == "c" and first["schema"] in ("public", "shop")
    assert first["connector"] == "postgresql" and first["db"] == "app"
    assert first["key"].startswith("{") and first["lsn"] > 0
    assert first["snapshot"] == "false" and '"lsn"' in first["position"]
    narrowed = (
        spark.read.format("dblog")
        .option("path", str(log_dir))
        .option("startOffset", "100")
        .option("endOffset", "250")
        .load()
    )
    assert narrowed.count() == 150


def test_stream_reader_offsets_and_limits(log_dir: Path) -> None:
    r = DblogStreamReader({"path": str(log_dir), "maxEventsPerTrigger": "1000"})
    start = r.initialOffset()
    assert start == {"offset": 0}
    assert r.getDefaultReadLimit() == ReadMaxRows(1000)
    assert r.latestOffset(start, ReadMaxRows(1000)) == {"offset": 1000}
    assert r.latestOffset({"offset": 2000}, ReadMaxRows(1000)) == {"offset": 2500}
    assert r.latestOffset(start, ReadAllAvailable()) == {"offset": 2500}
    assert r.latestOffset({"offset": 2500}, ReadMaxRows(1000)) == {"offset": 2500}
    latest = DblogStreamReader({"path": str(log_dir), "startingOffset": "latest"})
    assert latest.initialOffset() == {"offset": 2500}
    parts = [p.value for p in r.partitions({"offset": 10}, {"offset": 2500})]
    assert [(p.start, p.end) for p in parts if isinstance(p, OffsetRange)] == [(10, 2500)]
    assert len(parts) == 1
    assert [(p.start, p.end) for p in plan_partitions("x", 0, 25_001, 2)] == [
        (0, 12_501),
        (12_501, 25_001),
    ]
    assert len(plan_partitions("x", 0, 10**6, 3)) == 3
    assert r.partitions({"offset": 5}, {"offset": 5}) == []


def test_available_now_target_is_fixed_at_prepare(log_dir: Path) -> None:
    r = DblogStreamReader({"path": str(log_dir), "maxEventsPerTrigger": "1000"})
    r.prepareForTriggerAvailableNow()
    write_load(log_dir, SyntheticLoad(seed=8), 100, first=False)
    assert r.latestOffset({"offset": 2000}, ReadMaxRows(1000)) == {"offset": 2500}
    assert r.latestOffset({"offset": 2500}, ReadMaxRows(1000)) == {"offset": 2500}


def test_re_read_is_exact_and_missing_offsets_fail(log_dir: Path) -> None:
    part = OffsetRange(str(log_dir), 100, 1_700)
    first = [b.to_pylist() for b in read_range(part)]
    again = [b.to_pylist() for b in read_range(part)]
    assert first == again
    assert [r["offset"] for b in first for r in b] == list(range(100, 1_700))
    with pytest.raises(ChangeLogError, match="no longer holds offsets"):
        list(read_range(OffsetRange(str(log_dir), 2_400, 2_600)))
    log = SqliteChangeLog(log_dir)
    assert log.enforce_retention(None, 1) > 0  # keeps only the newest block
    log.close()
    with pytest.raises(ChangeLogError, match="retention"):
        list(read_range(OffsetRange(str(log_dir), 0, 100)))


def _collect_stream(spark: Any, log_dir: Path, cp: Path, **trigger: Any) -> tuple[Any, list[Any]]:
    seen: list[tuple[int, int, int, int]] = []

    def on_batch(df: Any, batch_id: int) -> None:
        offs = df.select("offset").toArrow()["offset"].to_pylist()
        if offs:
            seen.append((batch_id, min(offs), max(offs), len(offs)))
            assert len(set(offs)) == len(offs)

    q = (
        spark.readStream.format("dblog")
        .option("path", str(log_dir))
        .option("maxEventsPerTrigger", "1000")
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(cp))
        .trigger(**trigger)
        .start()
    )
    return q, seen


def test_stream_available_now_honours_max_events(spark: Any, log_dir: Path, tmp_path: Path) -> None:
    q, seen = _collect_stream(spark, log_dir, tmp_path / "cp", availableNow=True)
    q.awaitTermination(120)
    assert not q.isActive
    assert [(lo, hi, n) for _, lo, hi, n in seen] == [
        (0, 999, 1000),
        (1000, 1999, 1000),
        (2000, 2499, 500),
    ]
    # A restart resumes after the committed batches: nothing new, nothing repeated.
    write_load(log_dir, SyntheticLoad(seed=9), 300, first=False)
    q2, seen2 = _collect_stream(spark, log_dir, tmp_path / "cp", availableNow=True)
    q2.awaitTermination(120)
    assert [(lo, hi) for _, lo, hi, _ in seen2] == [(2500, 2799)]


WRITER = """
import sys, time
from pydblog.devtools.synth import SyntheticLoad, write_load
load = SyntheticLoad(seed=11)
for i in range(12):
    write_load(sys.argv[1], load, 250, chunk=250, first=False)
    time.sleep(0.15)
"""


def test_stream_while_another_process_appends(spark: Any, log_dir: Path, tmp_path: Path) -> None:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log_dir)])
    q, seen = _collect_stream(spark, log_dir, tmp_path / "cp", processingTime="300 milliseconds")
    try:
        assert writer.wait(timeout=120) == 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if seen and seen[-1][2] == 2_500 + 12 * 250 - 1:
                break
            time.sleep(0.3)
    finally:
        q.stop()
        end_process(writer, kill=True)
    ranges = [(lo, hi) for _, lo, hi, _ in seen]
    assert ranges[0][0] == 0 and ranges[-1][1] == 5_499
    for (_, hi), (lo, _) in itertools.pairwise(ranges):
        assert lo == hi + 1
    assert all(n <= 1000 for *_, n in seen)


def _reference_decode(log_dir: Path, start: int, end: int) -> list[dict[str, Any]]:
    """The plain decode every fast path must equal: one ``LogRecord`` and one full
    parse per event, every JSON column re-serialized (key with sorted fields)."""
    reader = SqliteChangeLogReader(log_dir)
    try:
        records = reader.read_range(start, end)
    finally:
        reader.close()
    out = []
    for rec in records:
        env = orjson.loads(rec.body)
        src = env.get("source") or {}

        def dump(v: Any, sort: bool = False) -> str | None:
            opt = orjson.OPT_SORT_KEYS if sort else 0
            return None if v is None else orjson.dumps(v, option=opt).decode()

        out.append(
            {
                "offset": rec.offset,
                "op": env.get("op", rec.op),
                "schema": src.get("schema"),
                "table": src.get("table"),
                "key": dump(env.get("key"), sort=True),
                "before": dump(env.get("before")),
                "after": dump(env.get("after")),
                "unchanged": env.get("unchanged"),
                "ts_ms": env.get("ts_ms", rec.ts_ms),
                "source_ts_ms": src.get("ts_ms"),
                "snapshot": src.get("snapshot"),
                "connector": src.get("connector"),
                "db": src.get("db"),
                "lsn": src.get("lsn"),
                "tx_id": src.get("txId"),
                "tx_index": src.get("index"),
                "position": dump({k: v for k, v in src.items() if k not in _NON_POSITION}),
            }
        )
    return out


_NON_POSITION = {"connector", "db", "schema", "table", "ts_ms", "snapshot"}


def _mixed_log(path: Path) -> int:
    """Snapshot rows, toast updates, a truncate, a notification, composite keys, and
    blocks of uneven size (chunks of 700 and 1500 events)."""
    load = SyntheticLoad(seed=21, toast_share=0.3)
    log = SqliteChangeLog(path)
    try:
        append_events(log, [load.next_event(snapshot=True) for _ in range(700)],
                      list(load.schemas.values()))
        append_events(log, [*load.events(1_200), load.truncate("public.order_lines")])
        note = ChangeEvent(Op.NOTIFICATION, "public", "orders", PgPosition(Lsn(5)), 0,
                           notification={"kind": "x"})
        append_events(log, [note, *load.events(1_499)])
        return log.next_offset
    finally:
        log.close()


@pytest.mark.parametrize(("start", "end"), [(0, 3_400), (5, 1_029), (1_023, 1_025), (700, 3_399)])
def test_read_range_equals_the_plain_decode(tmp_path: Path, start: int, end: int) -> None:
    end_all = _mixed_log(tmp_path / "log")
    assert end_all == 3_401
    got = pa.Table.from_batches(list(read_range(OffsetRange(str(tmp_path / "log"), start, end))))
    assert got.schema == ARROW_SCHEMA
    assert got.to_pylist() == _reference_decode(tmp_path / "log", start, end)
    some = pa.schema([ARROW_SCHEMA.field(n) for n in ("key", "offset", "unchanged", "after")])
    part = pa.Table.from_batches(
        list(read_range(OffsetRange(str(tmp_path / "log"), start, end), some))
    )
    assert part.to_pylist() == got.select(some.names).to_pylist()


def test_read_range_blocks_clips_to_the_range(tmp_path: Path) -> None:
    _mixed_log(tmp_path / "log")
    reader = SqliteChangeLogReader(tmp_path / "log")
    try:
        for start, end in [(0, 3_401), (3, 4), (1_023, 2_049), (3_000, 9_000), (50, 50)]:
            blocks = reader.read_range_blocks(start, end)
            offsets = [f + i for f, _, b in blocks for i in range(len(b))]
            assert offsets == list(range(start, min(end, 3_401)))
            recs = reader.read_range(start, end)
            metas = [m for _, ms, _ in blocks for m in ms]
            bodies = [b for _, _, bs in blocks for b in bs]
            assert [f"{r.table}\x1f{r.op}\x1f{r.ts_ms}" for r in recs] == metas
            assert [r.body.decode() for r in recs] == bodies
    finally:
        reader.close()


def test_packed_read_through_spark_equals_the_rows(spark: Any, log_dir: Path) -> None:
    cols = "offset,op,schema,table,key,after,unchanged,ts_ms"
    packed = (
        spark.read.format("dblog")
        .option("path", str(log_dir))
        .option("packed", "true")
        .option("columns", cols)
        .load()
    )
    assert [f.name for f in packed.schema.fields] == ["first_offset", "end_offset", "events"]
    schema = pa.schema([ARROW_SCHEMA.field(n) for n in cols.split(",")])
    events = unpack(packed.toArrow(), schema)
    rows = spark.read.format("dblog").option("path", str(log_dir)).load()
    expected = rows.select(*cols.split(",")).orderBy("offset").toArrow()
    assert events.to_pylist() == expected.cast(schema).to_pylist()
    assert unpack(PACKED_SCHEMA.empty_table(), schema).num_rows == 0


def test_packed_rows_must_form_one_dense_range(log_dir: Path) -> None:
    schema = pa.schema([ARROW_SCHEMA.field("offset")])
    rows = list(read_packed(OffsetRange(str(log_dir), 0, 2_500), schema))
    whole = pa.Table.from_batches(rows)
    assert unpack(whole, schema)["offset"].to_pylist() == list(range(2_500))
    assert unpack(whole.take([0]), schema).num_rows == 2_500  # one payload of <= 20k events
    gap = pa.Table.from_batches(list(read_packed(OffsetRange(str(log_dir), 0, 10), schema)) +
                                list(read_packed(OffsetRange(str(log_dir), 20, 30), schema)))
    with pytest.raises(ChangeLogError, match="dense"):
        unpack(gap, schema)
    with pytest.raises(ChangeLogError, match="columns"):
        DblogStreamReader({"path": str(log_dir), "packed": "true", "columns": "offset,nope"})


def test_read_range_splits_every_kind_of_block(tmp_path: Path) -> None:
    """Plain, compressed and template blocks (bodies split in Arrow, or expanded) read
    back as the events they stand for, over ranges that cut blocks anywhere."""
    from pydblog.events import EncodedBlock, EncodedEvent
    from pydblog.ports import Checkpoint

    head = ('{"op":"r","ts_ms":9,"source":{"connector":"postgresql","db":"d","schema":"s",'
            '"table":"t","lsn":1,"txId":null,"index":')
    mid = ',"ts_ms":8,"snapshot":"true"},"key":{"id":'
    tails = [f'{i}}},"before":null,"after":{{"id":{i},"v":"a\\nb"}}}}' for i in range(1_500)]
    singles = [
        EncodedEvent("s.u", "c", 6, orjson.dumps(
            {"op": "c", "ts_ms": 7, "source": {"connector": "postgresql", "db": "d",
             "schema": "s", "table": "u", "lsn": i}, "key": {"k": i}, "before": None,
             "after": {"k": i, "w": "x\ny"}}).decode())
        for i in range(1_300)
    ]
    plain = "\n".join(orjson.dumps({"op": "c", "ts_ms": 3, "k": i}).decode() for i in range(900))
    items: list[Any] = [
        *singles[:700],
        EncodedBlock("s.t", "r", 5, len(tails), "\n".join(tails), head, mid, 40),
        EncodedBlock("s.v", "c", 4, 900, plain),  # compressed, not an envelope
        *singles[700:],
    ]
    log = SqliteChangeLog(tmp_path / "log")
    total = log.append(items, Checkpoint(PgPosition(Lsn(1), 0), None, {}))
    log.close()
    assert total == 3_700
    reader = SqliteChangeLogReader(tmp_path / "log")
    try:
        for start, end in [(0, 3_700), (699, 701), (650, 2_300), (2_199, 3_101), (3_100, 3_699)]:
            got = pa.Table.from_batches(
                list(read_range(OffsetRange(str(tmp_path / "log"), start, end)))
            )
            recs = reader.read_range(start, end)
            want = decode_bodies(start, [f"{r.table}\x1f{r.op}\x1f{r.ts_ms}" for r in recs],
                                 [r.body.decode() for r in recs])
            assert got.to_pylist() == want.to_pylist()
    finally:
        reader.close()


def test_the_warm_up_source_reads_nothing(spark: Any) -> None:
    """``job.warm_up_workers`` reads it once to start Spark's Python read planner before
    the stream's first batch (``source.WarmUpDataSource``): a read of no rows."""
    from pydblog.spark.source import WARM_UP_NAME, WarmUpDataSource

    spark.dataSource.register(WarmUpDataSource)
    assert spark.read.format(WARM_UP_NAME).load().collect() == []
