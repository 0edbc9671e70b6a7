"""One micro-batch as Spark DataFrames: the events stay on the executors, the driver
plans and commits.

Per batch (``SparkBatch.of``): one small job summarises the packed payloads (per
payload its offset range and event count; per table its event count, offset range and
last truncate), which is all the driver collects. Everything else is a plan the sinks
run on the executors:

- ``events(since, cut)``: the payloads unpacked (``mapInArrow``), only row events
  (``c``/``u``/``d``/``r``) of offset ``>= since[table]`` and after the table's last
  truncate ``cut[table]``;
- ``reduced(since)``: those events shuffled by ``(schema, table, key)`` and reduced per
  Spark partition by ``reduce.reduce_events`` (every event of a key is in one
  partition, so the per-partition reduce is the batch's reduce restricted to the
  partition's keys): one row per ``(table, key)`` with the net op, the winning event's
  offset, the row as JSON text and the columns to keep from the target
  (``REDUCED_SCHEMA``);
- ``typed(q, schema)``: one table's reduced rows converted to the target's column types
  (``typemap.texts_to_arrow``, in the executors).

Truncates: a table's events up to its last truncate in the batch are dropped before the
shuffle (the cut travels in the plan), and the sinks empty the target first, so the
per-partition reduce never sees a truncate. A merged target's truncate (``merge``: its
``key`` names the part, one source table) is *scoped*: only that part's upserts before
it are dropped (``scoped_cuts``), and the sinks delete only that part's target rows
(``SparkBatch.scoped``); a delete before it may stay, it deletes a row the truncate
removes anyway.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pydblog.errors import ChangeLogError
from pydblog.ports import TableSchema
from pydblog.spark.decode import columns_schema, pack
from pydblog.spark.reduce import reduce_events
from pydblog.spark.typemap import infer_schema, merge_schemas, texts_to_arrow

ROW_OPS = ("c", "u", "d", "r")

STATS_SCHEMA = pa.schema(
    [
        # "p": one payload, "a": its events' offset range, "t": one table's row events
        # (and truncates) within a payload
        ("kind", pa.string()),
        ("schema", pa.string()),
        ("table", pa.string()),
        ("first", pa.int64()),  # payload: first_offset; table: its lowest offset
        ("end", pa.int64()),  # payload: end_offset; table: its highest offset + 1
        ("n", pa.int64()),
        ("truncate", pa.int64()),  # table: its last truncate's offset (null: none)
        ("unchanged", pa.bool_()),  # table: some event names unchanged columns
        ("note", pa.string()),  # "m": a repair's range-end marker (its ``after``; first: offset)
        ("ts", pa.int64()),  # payload: its newest source commit time (null: none known)
        ("bytes", pa.int64()),  # payload: its events' size decoded (Arrow buffers)
    ]
)
# "s" rows: a merged target's truncate of one part (first: its offset; note: its key,
# the part's identity)

REDUCED_SCHEMA = pa.schema(
    [
        ("schema", pa.string()),
        ("table", pa.string()),
        ("key", pa.string()),
        ("op", pa.string()),  # "u" upsert, "d" delete
        ("offset", pa.int64()),
        ("text", pa.string()),  # the row (upsert) or the key (delete) as JSON text
        ("unchanged", pa.list_(pa.string())),  # columns whose target value is kept
        ("part", pa.int32()),  # crc32(key) % parts (the PostgreSQL sink's partitions)
        # the key's first event of the reduced events is an insert ("c") and nothing is
        # left to keep from the target: the target had no row of this key before them
        ("fresh", pa.bool_()),
    ]
)


def spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def _payloads(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, int, pa.Table]]:
    for b in batches:
        firsts = b.column("first_offset").to_pylist()
        ends = b.column("end_offset").to_pylist()
        for first, end, payload in zip(firsts, ends, b.column("events"), strict=True):
            yield first, end, pa.ipc.open_stream(payload.as_buffer()).read_all()


def stats(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` over packed rows: ``STATS_SCHEMA`` rows (a few per payload)."""
    rows: dict[str, list[Any]] = {n: [] for n in STATS_SCHEMA.names}

    def add(**kw: Any) -> None:
        for n in STATS_SCHEMA.names:
            rows[n].append(kw.get(n))

    for first, end, t in _payloads(batches):
        newest = (pc.max(t["source_ts_ms"]).as_py()
                  if "source_ts_ms" in t.column_names and t.num_rows else None)
        add(kind="p", first=first, end=end, n=t.num_rows, ts=newest, bytes=t.nbytes)
        if t.num_rows == 0:
            continue
        add(kind="a", first=pc.min(t["offset"]).as_py(), end=pc.max(t["offset"]).as_py() + 1,
            n=t.num_rows)
        if "after" in t.column_names:
            notes = t.filter(pc.equal(t["op"], "n"))
            if notes.num_rows:
                for r in notes.select(["offset", "schema", "table", "after"]).to_pylist():
                    if r["after"] and '"repair"' in r["after"]:
                        add(kind="m", schema=r["schema"], table=r["table"], first=r["offset"],
                            end=r["offset"] + 1, n=1, note=r["after"])
        t = t.filter(pc.is_in(t["op"], value_set=pa.array([*ROW_OPS, "t"])))
        if t.num_rows == 0:
            continue
        is_t = pc.equal(t["op"], "t")
        if "key" in t.column_names:
            scoped = pc.and_(is_t, pc.is_valid(t["key"]))
            if pc.any(scoped).as_py():
                for r in t.filter(scoped).select(["offset", "schema", "table", "key"]).to_pylist():
                    add(kind="s", schema=r["schema"], table=r["table"], first=r["offset"],
                        end=r["offset"] + 1, n=1, note=r["key"])
                is_t = pc.and_(is_t, pc.is_null(t["key"]))
        has_unch = pc.fill_null(pc.greater(pc.list_value_length(t["unchanged"]), 0), False)
        g = pa.table({
            "schema": t["schema"], "table": t["table"], "offset": t["offset"],
            "t_off": pc.if_else(is_t, t["offset"], pa.scalar(None, pa.int64())),
            "unch": has_unch,
        }).group_by(["schema", "table"], use_threads=False).aggregate(
            [("offset", "min"), ("offset", "max"), ("offset", "count"), ("t_off", "max"),
             ("unch", "any")])
        for r in g.to_pylist():
            add(kind="t", schema=r["schema"], table=r["table"], first=r["offset_min"],
                end=r["offset_max"] + 1, n=r["offset_count"], truncate=r["t_off_max"],
                unchanged=r["unch_any"])
    yield pa.RecordBatch.from_pydict(rows, schema=STATS_SCHEMA)


def _limits(t: pa.Table, limits: Mapping[str, int], default: int) -> pa.Array:
    """Per row of ``t``, ``limits[schema.table]`` (else ``default``)."""
    q = pc.binary_join_element_wise(t["schema"], t["table"], ".")
    names = list(limits)
    vals = pa.array([*(limits[n] for n in names), default], type=pa.int64())
    idx = pc.fill_null(pc.index_in(q, value_set=pa.array(names, type=pa.string())), len(names))
    return pc.take(vals, idx)


def events_fn(
    schema: pa.Schema,
    since: Mapping[str, int] | None = None,
    cut: Mapping[str, int] | None = None,
    parts: int | None = None,
    rows: bool = False,
    scoped: Mapping[str, Sequence[tuple[int, str]]] | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` over packed rows: their events (``schema``'s columns). With
    ``rows``, ``since``/``cut`` or ``parts`` only row events of offset ``>=
    since[table]`` and ``> cut[table]`` (the mirrors' input), without the upserts of a
    part before its scoped truncate (``scoped[table]``: ``(offset, after prefix)``);
    with ``parts`` a column ``part`` = ``crc32(key) % parts``."""
    since = dict(since or {})
    cut = dict(cut or {})
    parts_cut = {q: list(v) for q, v in (scoped or {}).items() if v}
    rows_only = rows or bool(since or cut or parts_cut) or parts is not None

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _first, _end, t in _payloads(batches):
            if rows_only and t.num_rows:
                keep = pc.is_in(t["op"], value_set=pa.array(ROW_OPS))
                if since:
                    keep = pc.and_(keep, pc.greater_equal(t["offset"], _limits(t, since, -1)))
                if cut:
                    keep = pc.and_(keep, pc.greater(t["offset"], _limits(t, cut, -1)))
                if parts_cut and "after" in t.column_names:
                    keep = pc.and_(keep, pc.invert(_before_scoped(t, parts_cut)))
                t = t.filter(keep)
            if parts is not None:
                keys = t["key"].to_pylist()
                t = t.append_column("part", pa.array(
                    [zlib.crc32((k or "").encode()) % parts for k in keys], type=pa.int32()))
            yield from t.to_batches()

    return run


def _before_scoped(t: pa.Table, scoped: Mapping[str, Sequence[tuple[int, str]]]) -> pa.Array:
    """Per event of ``t``: an upsert of a part before that part's scoped truncate."""
    q = pc.binary_join_element_wise(t["schema"], t["table"], ".")
    upsert = pc.is_in(t["op"], value_set=pa.array(["c", "u", "r"]))
    out = pa.array([False] * t.num_rows)
    for table, cuts in scoped.items():
        mine = pc.and_(pc.equal(q, table), upsert)
        for offset, prefix in cuts:
            hit = pc.and_(pc.and_(mine, pc.less(t["offset"], offset)),
                          pc.starts_with(pc.fill_null(t["after"], ""), prefix + ","))
            out = pc.or_(out, pc.fill_null(hit, False))
    return out


REDUCED_PACKED_SCHEMA = pa.schema(
    [
        ("schema", pa.string()),
        ("table", pa.string()),
        ("n", pa.int64()),
        ("fresh", pa.bool_()),  # every row of the payload is ``fresh``
        ("rows", pa.binary()),  # an Arrow IPC stream of REDUCED_SCHEMA rows of the table
    ]
)
"""``SparkBatch.reduced_packed``: one row per table, shuffle partition and chunk of at
most ``REDUCED_CHUNK_ROWS`` rows (and about ``REDUCED_CHUNK_BYTES``)."""

REDUCED_CHUNK_ROWS = 65_536
REDUCED_CHUNK_BYTES = 64 << 20

SPLIT_SCHEMA = pa.schema([("bucket", pa.int32()), ("events", pa.binary())])
"""The events of one packed payload bound for one shuffle partition (``bucket``, a
value Spark's hash partitioning sends to the partition ``crc32(key) % parts``)."""


def _unpack_table(payload: pa.BinaryScalar) -> pa.Table:
    return pa.ipc.open_stream(payload.as_buffer()).read_all()


def _chunks(t: pa.Table) -> Iterator[pa.Table]:
    """``t`` in slices of at most ``REDUCED_CHUNK_ROWS`` rows and about
    ``REDUCED_CHUNK_BYTES`` (a payload is one binary value: bounded well below 2 GiB)."""
    n = t.num_rows
    if n == 0:
        return
    per_row = max(1, t.nbytes // n)
    step = max(1, min(REDUCED_CHUNK_ROWS, REDUCED_CHUNK_BYTES // per_row))
    for i in range(0, n, step):
        yield t.slice(i, step)


def split_fn(
    inner: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    parts: int,
    buckets: Sequence[int],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` over packed rows: ``inner``'s events (with their ``part``,
    ``crc32(key) % parts``), packed per part as ``SPLIT_SCHEMA`` rows whose ``bucket``
    (``buckets[part]``) Spark's hash partitioning sends to partition ``part``: the
    shuffle moves a few payloads, not every event as a row."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in inner(batches):
            if not b.num_rows:
                continue
            t = pa.Table.from_batches([b])
            part = t["part"]
            t = t.drop_columns(["part"])
            for p in pc.unique(part).to_pylist():
                mine = t.filter(pc.equal(part, p))
                yield pa.RecordBatch.from_arrays(
                    [pa.array([buckets[p]], pa.int32()), pa.array([pack(mine)], pa.binary())],
                    schema=SPLIT_SCHEMA)

    return run


def _reduced_table(tc: Any, parts: int) -> pa.Table:
    return pa.table({
        "schema": pa.array([tc.schema] * len(tc), pa.string()),
        "table": pa.array([tc.table] * len(tc), pa.string()),
        "key": pa.array(tc.keys, pa.string()),
        "op": pa.array(tc.ops, pa.string()),
        "offset": pa.array(tc.offsets, pa.int64()),
        "text": pa.array(tc.texts, pa.string()),
        "unchanged": pa.array([list(u) for u in tc.unchanged], pa.list_(pa.string())),
        "part": pa.array([zlib.crc32((k or "").encode()) % parts for k in tc.keys], pa.int32()),
        "fresh": pa.array([f and not u for f, u in zip(tc.fresh, tc.unchanged, strict=True)],
                          pa.bool_()),
    }, schema=REDUCED_SCHEMA)


def reduce_packed_fn(parts: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` over one shuffle partition of ``SPLIT_SCHEMA`` rows (every event
    of its keys): their net change per ``(table, key)`` as ``REDUCED_PACKED_SCHEMA``
    rows."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tables = [_unpack_table(p) for b in batches for p in b.column("events")]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return
        for tc in reduce_events(pa.concat_tables(tables)).values():
            t = _reduced_table(tc, parts)
            for chunk in _chunks(t):
                yield pa.RecordBatch.from_arrays([
                    pa.array([tc.schema], pa.string()), pa.array([tc.table], pa.string()),
                    pa.array([chunk.num_rows], pa.int64()),
                    pa.array([bool(pc.all(chunk["fresh"]).as_py())], pa.bool_()),
                    pa.array([pack(chunk)], pa.binary()),
                ], schema=REDUCED_PACKED_SCHEMA)

    return run


def unpack_reduced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` over ``REDUCED_PACKED_SCHEMA`` rows: their ``REDUCED_SCHEMA`` rows."""
    for b in batches:
        for p in b.column("rows"):
            yield from _unpack_table(p).to_batches()


class _Rows:
    """The rows of JSON texts, parsed on first use."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.rows: list[dict[str, Any]] | None = None

    def __call__(self) -> list[dict[str, Any]]:
        if self.rows is None:
            self.rows = [orjson.loads(t) for t in self.texts]
        return self.rows


def typed_fn(
    qualified: str, schema: pa.Schema, any_json: Sequence[str]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` over one table's reduced rows (``REDUCED_SCHEMA``, or packed:
    ``REDUCED_PACKED_SCHEMA``): the rows typed as ``schema`` plus ``_dblog_op`` and
    ``_dblog_unchanged`` (the MERGE source)."""

    def rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            if "rows" in b.schema.names:  # REDUCED_PACKED_SCHEMA
                yield from unpack_reduced(iter([b]))
            else:
                yield b

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in rows(batches):
            if not b.num_rows:
                continue
            texts = b.column("text").to_pylist()
            ops = b.column("op").to_pylist()
            # a delete's text is its key: the other columns are null
            data = texts_to_arrow(qualified, texts, schema, _Rows(texts), any_json)
            data = data.append_column("_dblog_op", pa.array(ops, type=pa.string()))
            data = data.append_column("_dblog_unchanged", b.column("unchanged"))
            yield from data.to_batches()

    return run


def infer_fn(qualified: Sequence[str]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` over reduced rows: per table of ``qualified`` (those without a
    recorded schema) the schema inferred from this partition's rows, as JSON text."""
    wanted = set(qualified)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        by: dict[str, tuple[list[dict[str, Any]], list[str], list[str]]] = {}
        for b in batches:
            for s, t, k, op, text in zip(*(b.column(n).to_pylist() for n in
                                           ("schema", "table", "key", "op", "text")), strict=True):
                q = f"{s}.{t}"
                if q not in wanted:
                    continue
                rows, dkeys, keys = by.setdefault(q, ([], [], []))
                if op == "u":
                    rows.append(orjson.loads(text))
                elif not dkeys:
                    dkeys.extend(sorted(orjson.loads(text)))
                if not keys and k:
                    keys.extend(orjson.loads(k))
        out = []
        for q, (rows, dkeys, keys) in by.items():
            s, _, t = q.partition(".")
            sch = infer_schema(s, t, rows, dkeys or keys)
            out.append(orjson.dumps({"q": q, "key": list(sch.key), "columns": [
                [c.name, c.type, c.logical, c.nullable] for c in sch.columns]}).decode())
        yield pa.RecordBatch.from_pydict({"schema": out}, schema=pa.schema([("schema", pa.string())]))

    return run


_BUCKETS: dict[int, list[int]] = {}


REDUCE_PART_EVENTS = 500_000
REDUCE_PART_BYTES = 192 << 20
"""What one reduce partition holds at most on average (its Python worker holds it whole,
with a copy while it reduces): a batch of more events or bytes is reduced in more
partitions than the cores, a few at a time, so a worker's memory follows these bounds,
not ``max_events_per_trigger`` (one partition's share of a skewed key set may exceed
them)."""


def reduce_parts(cores: int, events: int, size: int) -> int:
    """The reduce's partitions for a batch of ``events`` events of ``size`` bytes
    (decoded) on ``cores`` cores: at least ``cores``, enough that each holds at most
    ``REDUCE_PART_EVENTS`` events and ``REDUCE_PART_BYTES`` bytes on average, rounded up
    to a multiple of ``cores`` (no wave of tasks leaves a core idle)."""
    cores = max(1, cores)
    need = max(1, -(-events // REDUCE_PART_EVENTS), -(-size // REDUCE_PART_BYTES))
    return cores * -(-need // cores)


def hash_buckets(spark: Any, parts: int) -> list[int]:
    """Per partition ``p < parts``, an integer that ``repartition(parts, col)`` (Spark's
    hash partitioning: ``pmod(hash(col), parts)``) sends to partition ``p``."""
    found = _BUCKETS.get(parts)
    if found is None:
        from pyspark.sql import functions as F

        rows = (spark.range(0, 64 * parts)
                .select(F.col("id").cast("int").alias("v"),
                        F.pmod(F.hash(F.col("id").cast("int")), F.lit(parts)).alias("p"))
                .collect())
        first: dict[int, int] = {}
        for r in rows:
            first.setdefault(int(r["p"]), int(r["v"]))
        if len(first) < parts:
            raise RuntimeError(f"no hash bucket for some of {parts} partitions")
        found = _BUCKETS[parts] = [first[p] for p in range(parts)]
    return found


@dataclass
class TableStats:
    schema: str
    table: str
    n: int = 0
    first: int = 0
    end: int = 0
    truncate: int | None = None
    unchanged: bool = False

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass
class SparkBatch:
    """A micro-batch ``[start, end)`` whose events stay in Spark (``packed``: the
    source's packed rows, persisted for the batch's jobs)."""

    batch_id: int
    start: int
    end: int
    n: int
    packed: Any  # DataFrame of decode.PACKED_SCHEMA
    columns: tuple[str, ...]
    tables: dict[str, TableStats]
    recorded: dict[str, TableSchema] = field(default_factory=dict)
    parts: int = 2  # the reduce's partitions (``reduce_parts``), ``part``'s modulus
    dense: bool = True  # the payloads were checked to tile [start, end) (no duplicate)
    # the repairs' range-end markers (offset, schema, table, after), in offset order
    markers: list[tuple[int, str, str, str]] = field(default_factory=list)
    newest_ms: int | None = None  # the newest source commit time of the batch's events
    source: str = "default"  # the [[sync.sources]] entry the batch is of (its progress key)
    # targets that union several sources' tables (they hold other sources' rows)
    merged: set[str] = field(default_factory=set)
    # scoped truncates of merged targets (offset, schema, table, the part's identity as
    # JSON), in offset order
    scoped: list[tuple[int, str, str, str]] = field(default_factory=list)
    # every source's progress time (ms; None: not known yet) once this batch is applied
    watermarks: dict[str, int | None] = field(default_factory=dict)
    # consistent = true: the time of the last round every source finished (None: none)
    cut_ms: int | None = None
    _reduced: dict[tuple[tuple[str, int], ...], Any] = field(default_factory=dict, repr=False)
    _inferred: dict[str, TableSchema] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls,
        batch_id: int,
        packed: Any,
        columns: Sequence[str],
        schemas: Sequence[tuple[int, TableSchema]],
        *,
        dense: bool = True,
        parts: int = 2,
    ) -> SparkBatch | None:
        """The batch of ``packed`` (``None`` if it has no event). ``dense``: the payloads
        must tile one offset range (checked, ``ChangeLogError`` otherwise). ``parts``:
        the cores; the reduce takes ``reduce_parts`` of them and the batch's size."""
        rows = packed.mapInArrow(stats, spark_schema(STATS_SCHEMA)).collect()
        payloads = sorted((r["first"], r["end"], r["n"]) for r in rows if r["kind"] == "p")
        tables: dict[str, TableStats] = {}
        for r in rows:
            if r["kind"] != "t" or r["schema"] is None or r["table"] is None:
                continue
            q = f"{r['schema']}.{r['table']}"
            ts = tables.get(q)
            if ts is None:
                ts = tables[q] = TableStats(r["schema"], r["table"], 0, r["first"], r["end"])
            ts.n += r["n"]
            ts.first, ts.end = min(ts.first, r["first"]), max(ts.end, r["end"])
            if r["truncate"] is not None:
                ts.truncate = max(ts.truncate if ts.truncate is not None else -1, r["truncate"])
            ts.unchanged = ts.unchanged or bool(r["unchanged"])
        n = sum(p[2] for p in payloads)
        if n == 0:
            return None
        firsts = [r["first"] for r in rows if r["kind"] == "a"]
        ends = [r["end"] for r in rows if r["kind"] == "a"]
        start, end = min(firsts), max(ends)
        if dense:
            expect = payloads[0][0]
            for first, p_end, k in payloads:
                if first != expect or k != p_end - first:
                    raise ChangeLogError(
                        f"packed events are not one dense range at offset {first} "
                        f"(expected {expect}, payload of {k} events)")
                expect = p_end
            start, end = payloads[0][0], payloads[-1][1]
        recorded: dict[str, TableSchema] = {}
        for from_offset, s in schemas:
            if from_offset < end:
                recorded[s.qualified] = merge_schemas(recorded.get(s.qualified), s)
        markers = sorted({(int(r["first"]), str(r["schema"]), str(r["table"]), str(r["note"]))
                          for r in rows if r["kind"] == "m"})
        scoped = sorted({(int(r["first"]), str(r["schema"]), str(r["table"]), str(r["note"]))
                         for r in rows if r["kind"] == "s"})
        times = [int(r["ts"]) for r in rows if r["kind"] == "p" and r["ts"] is not None]
        size = sum(int(r["bytes"] or 0) for r in rows if r["kind"] == "p")
        parts = reduce_parts(parts, n, size)
        return cls(batch_id, start, end, n, packed, tuple(columns), tables, recorded, parts,
                   dense, markers, newest_ms=max(times) if times else None, scoped=scoped)

    def duplicates(self) -> int:
        """How many offsets the batch holds more than once (0 when ``dense``: checked)."""
        if self.dense:
            return 0
        from pyspark.sql import functions as F

        ev = self.events(["offset"])
        return int(ev.groupBy("offset").count().where(F.col("count") > 1)
                   .agg(F.coalesce(F.sum(F.col("count") - 1), F.lit(0))).collect()[0][0])

    # -- plans -------------------------------------------------------------------------
    def events(self, columns: Sequence[str] | None = None, since: int | None = None) -> Any:
        """Every event (``columns``, default all the batch has) of offset ``>= since``."""
        schema = columns_schema(self.columns)
        df = self.packed.mapInArrow(events_fn(schema), spark_schema(schema))
        if columns is not None:
            df = df.select(*columns)
        if since is not None and since > self.start:
            df = df.where(df["offset"] >= since)
        return df

    def cuts(self, since: Mapping[str, int]) -> dict[str, int]:
        """The tables truncated at or after their ``since``: their last truncate."""
        return {q: ts.truncate for q, ts in self.tables.items()
                if ts.truncate is not None and ts.truncate >= since.get(q, -1)}

    def scoped_truncates(self, since: Mapping[str, int]) -> dict[str, list[tuple[int, dict[str, str]]]]:
        """Per merged target, its scoped truncates at or after its ``since``: ``(offset,
        the part's identity)``, in offset order."""
        from pydblog.spark.merge import scope_of

        out: dict[str, list[tuple[int, dict[str, str]]]] = {}
        for offset, schema, table, key in self.scoped:
            q = f"{schema}.{table}"
            scope = scope_of(key)
            if scope is not None and offset >= since.get(q, -1):
                out.setdefault(q, []).append((offset, scope))
        return out

    def scoped_cuts(self, since: Mapping[str, int]) -> dict[str, list[tuple[int, str]]]:
        """``scoped_truncates`` as ``(offset, after prefix)`` (``events_fn``'s cut)."""
        from pydblog.spark.merge import after_prefix

        return {q: [(o, after_prefix(sc)) for o, sc in v]
                for q, v in self.scoped_truncates(since).items()}

    def row_events(self, since: Mapping[str, int], parts: int | None = None,
                   part: bool = True) -> Any:
        """The mirrors' input: row events of offset ``>= since[table]``, after each
        table's last truncate, with their ``part`` (``crc32(key) % parts``, default
        the batch's ``parts``; without it when not ``part``)."""
        cols = [c for c in ("offset", "op", "schema", "table", "key", "after", "unchanged")
                if c in self.columns]
        full = columns_schema(self.columns)
        out = columns_schema(cols)
        if part:
            out = out.append(pa.field("part", pa.int32()))
        inner = events_fn(full, since, self.cuts(since),
                          (parts or self.parts) if part else None, rows=True,
                          scoped=self.scoped_cuts(since))
        names = out.names

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for b in inner(batches):
                yield b.select(names)

        return self.packed.mapInArrow(run, spark_schema(out))

    def reduced(self, since: Mapping[str, int] | None = None) -> Any:
        """The net change per ``(table, key)`` of the row events ``>= since[table]``
        (``REDUCED_SCHEMA``), unpacked from ``reduced_packed``."""
        return self.reduced_packed(since).mapInArrow(unpack_reduced, spark_schema(REDUCED_SCHEMA))

    def reduced_packed(self, since: Mapping[str, int] | None = None) -> Any:
        """``reduced(since)`` packed (``REDUCED_PACKED_SCHEMA``: a few rows per table),
        computed on the executors and persisted for the batch. The events travel the
        shuffle packed per partition (``split_fn``): Spark moves and caches a few
        payloads per partition instead of every event and net row as a row of its own."""
        since = {q: v for q, v in (since or {}).items() if v > self.start}
        k = tuple(sorted(since.items()))
        df = self._reduced.get(k)
        if df is None:
            from pyspark import StorageLevel

            spark = self.packed.sparkSession
            cols = [c for c in ("offset", "op", "schema", "table", "key", "after", "unchanged")
                    if c in self.columns]
            inner = events_fn(columns_schema(self.columns), since, self.cuts(since), self.parts,
                              rows=True, scoped=self.scoped_cuts(since))

            def events(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for b in inner(batches):
                    yield b.select([*cols, "part"])

            df = (self.packed
                  .mapInArrow(split_fn(events, self.parts, hash_buckets(spark, self.parts)),
                              spark_schema(SPLIT_SCHEMA))
                  .repartition(self.parts, "bucket")
                  .mapInArrow(reduce_packed_fn(self.parts), spark_schema(REDUCED_PACKED_SCHEMA))
                  .persist(StorageLevel.MEMORY_AND_DISK))
            self._reduced[k] = df
        return df

    def schema_for(self, qualified: str) -> TableSchema:
        """The table's recorded schema, or one inferred (on the executors) from the
        batch's reduced rows."""
        found = self.recorded.get(qualified)
        if found is not None and found.columns:
            return found
        if qualified not in self._inferred:
            missing = [q for q, ts in self.tables.items()
                       if not (q in self.recorded and self.recorded[q].columns)
                       and q not in self._inferred]
            red = self.reduced()
            got: dict[str, TableSchema] = {}
            for r in red.mapInArrow(infer_fn(missing), "schema string").collect():
                d = orjson.loads(r["schema"])
                s, _, t = d["q"].partition(".")
                from pydblog.ports import ColumnSchema

                sch = TableSchema(s, t, tuple(ColumnSchema(*c) for c in d["columns"]),
                                  tuple(d["key"]))
                got[d["q"]] = merge_schemas(got.get(d["q"]), sch) if d["q"] in got else sch
            for q in missing:
                s, _, t = q.partition(".")
                self._inferred[q] = got.get(q) or TableSchema(s, t, (), ())
        return self._inferred[qualified]

    def release(self) -> None:
        for df in self._reduced.values():
            df.unpersist()
        self._reduced.clear()

