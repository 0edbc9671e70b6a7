"""Decoding the change log's events into Arrow, for the ``dblog`` data source's
executors and the sync's driver.

Imported lazily by ``source.py`` (only the executors' ``read`` needs it), so that the
Python processes Spark starts to plan a query (``create_data_source``, the streaming
planner) do not pay for importing pyarrow and the decoder.

Invariants:
- ``ARROW_SCHEMA`` is the source's row schema (``eventschema.EVENT_SCHEMA_DDL``, the names
  of ``eventschema.EVENT_COLUMNS``).
- A partition (``ports.LogPartition``) gives exactly its events or raises (a dense
  log's range ``[a, b)``: exactly ``b - a``); ``read_range`` decodes what it gives,
  backend-blind (``ports.EncodedValues``).
- Deterministic: the same stored events always decode to the same Arrow batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pydblog.errors import ChangeLogError
from pydblog.ports import EncodedValues, LogPartition, LogRecord
from pydblog.spark import scan
from pydblog.spark.eventschema import EVENT_COLUMNS

ARROW_SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("op", pa.string()),
        ("schema", pa.string()),
        ("table", pa.string()),
        ("key", pa.string()),
        ("before", pa.string()),
        ("after", pa.string()),
        ("unchanged", pa.list_(pa.string())),
        ("ts_ms", pa.int64()),
        ("source_ts_ms", pa.int64()),
        ("snapshot", pa.string()),
        ("connector", pa.string()),
        ("db", pa.string()),
        ("lsn", pa.int64()),
        ("tx_id", pa.int64()),
        ("tx_index", pa.int64()),
        ("position", pa.string()),
    ]
)
assert tuple(ARROW_SCHEMA.names) == EVENT_COLUMNS

ARROW_BATCH_EVENTS = 20_000

_SOURCE_NON_POSITION = frozenset({"connector", "db", "schema", "table", "ts_ms", "snapshot"})


def _meta(entry: str, field: int) -> str:
    return entry.split("\x1f")[field]


def decode_bodies(
    first: int,
    metas: Sequence[str],
    bodies: Sequence[str],
    schema: pa.Schema = ARROW_SCHEMA,
    *,
    own_offsets: bool = False,
) -> pa.RecordBatch:
    """Events ``first, first + 1, ...`` (change-log meta entries and JSON bodies) as one
    Arrow batch with the columns of ``schema`` (a subset of ``ARROW_SCHEMA``, any order).
    With ``own_offsets`` each body is a whole envelope with its ``offset`` field (a Kafka
    log's message value) and ``offset`` comes from there (``first`` is unused).

    Every body is parsed once; ``key`` is re-serialized with sorted fields (the
    grouping key of the reduce), ``before``/``after`` re-serialized compactly; only the
    requested columns are built. Deterministic: the same stored events always give the
    same batch."""
    loads, dumps = orjson.loads, orjson.dumps
    envs = [loads(b) for b in bodies]
    n = len(envs)
    names = set(schema.names)
    srcs = [e.get("source") or {} for e in envs]
    cols: dict[str, list[Any]] = {}
    if "offset" in names:
        cols["offset"] = [e["offset"] for e in envs] if own_offsets else list(range(first, first + n))
    if "op" in names:
        cols["op"] = [
            e["op"] if "op" in e else _meta(m, 1) for e, m in zip(envs, metas, strict=True)
        ]
    if "ts_ms" in names:
        cols["ts_ms"] = [
            e["ts_ms"] if "ts_ms" in e else int(_meta(m, 2))
            for e, m in zip(envs, metas, strict=True)
        ]
    for col, field in (
        ("schema", "schema"),
        ("table", "table"),
        ("source_ts_ms", "ts_ms"),
        ("snapshot", "snapshot"),
        ("connector", "connector"),
        ("db", "db"),
        ("lsn", "lsn"),
        ("tx_id", "txId"),
        ("tx_index", "index"),
    ):
        if col in names:
            cols[col] = [s.get(field) for s in srcs]
    if "key" in names:
        sort = orjson.OPT_SORT_KEYS
        cols["key"] = [
            None if (k := e.get("key")) is None else dumps(k, option=sort).decode() for e in envs
        ]
    for col in ("before", "after"):
        if col in names:
            cols[col] = [None if (v := e.get(col)) is None else dumps(v).decode() for e in envs]
    if "unchanged" in names:
        cols["unchanged"] = [e.get("unchanged") for e in envs]
    if "position" in names:
        cols["position"] = [
            dumps({k: v for k, v in s.items() if k not in _SOURCE_NON_POSITION}).decode()
            for s in srcs
        ]
    return pa.RecordBatch.from_arrays(
        [pa.array(cols[f.name], type=f.type) for f in schema], schema=schema
    )


# -- the fast decode of the mirror columns ------------------------------------------------
# The change log's bodies are orjson's compact envelopes: ``{"op":..,"ts_ms":..,"source":
# {"connector":..,"db":..,"schema":..,"table":..,<flat position fields>},"key":..,
# "before":..,"after":..[,"unchanged":[..]]}`` (a Kafka log's values start with their
# ``"offset":N``). ``scan`` (compiled) finds the fields of every body of that strict form
# in one pass over the batch's buffer and copies them out; everything else
# (notifications, nested keys, an unknown envelope) is decoded by ``decode_bodies``.
FAST_COLUMNS = frozenset({"offset", "op", "schema", "table", "key", "after", "unchanged", "ts_ms",
                          "source_ts_ms"})
"""The columns ``decode_fast`` builds without parsing every body (the sync's mirrors
need only these)."""


def _norm_key(text: str | None) -> str | None:
    if text is None or text == "null":
        return None
    return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS).decode()


def decode_fast(
    first: int, metas: Sequence[str], bodies: Sequence[str] | pa.Array, schema: pa.Schema,
    *, own_offsets: bool = False,
) -> pa.RecordBatch:
    """``decode_bodies(first, metas, bodies, schema)`` for ``schema`` within
    ``FAST_COLUMNS``, without a JSON parse per event: ``scan`` validates the strict form
    (its module docstring) and cuts the fields out of the bodies in one compiled pass,
    ``after`` is kept as the stored text, keys are put in sorted form by ``scan.keys``
    (only keys that are neither one field nor two of plain values are parsed). The
    stored text equals the full decode's re-serialization for bodies orjson wrote; a snapshot row whose JSON PostgreSQL wrote is equal in value
    only (a float's spelling, a ``json`` column's own spacing), which is all the
    reduce needs: it parses ``after``. Bodies of any other form are decoded by
    ``decode_bodies``. Same result, property-tested against it. ``own_offsets``: as
    ``decode_bodies`` (the scanner reads the ``offset`` field)."""
    n = len(bodies)
    if n == 0 or not set(schema.names) <= FAST_COLUMNS:
        texts = bodies.to_pylist() if isinstance(bodies, pa.Array) else bodies
        return decode_bodies(first, metas, texts, schema, own_offsets=own_offsets)
    arr = bodies if isinstance(bodies, pa.Array) else pa.array(bodies, type=pa.string())
    if arr.null_count:
        texts = arr.to_pylist()
        return decode_bodies(first, metas, texts, schema, own_offsets=own_offsets)
    data, fields = scan.scan(arr, own_offsets)
    ok = fields[scan.OK].astype(np.bool_)
    if ok.all():
        return _cut(data, fields, first, own_offsets, schema, arr)
    slow_idx = np.flatnonzero(~ok)
    fast_idx = np.flatnonzero(ok)
    slow_bodies = pc.take(arr, pa.array(slow_idx)).to_pylist()
    slow = decode_bodies(0, [metas[i] for i in slow_idx.tolist()], slow_bodies, schema,
                         own_offsets=own_offsets)
    if "offset" in schema.names and not own_offsets:
        slow = slow.set_column(
            schema.get_field_index("offset"), "offset", pa.array(first + slow_idx, pa.int64()))
    if len(fast_idx) == 0:
        return slow
    fast = _cut(data, fields[:, fast_idx], first, own_offsets, schema, arr, rows=fast_idx)
    order = pc.sort_indices(pa.array(np.concatenate([fast_idx, slow_idx])))
    table = pa.Table.from_batches([fast, slow])
    return table.take(order).combine_chunks().to_batches()[0]


def _cut(data: np.ndarray, f: np.ndarray, first: int, own_offsets: bool, schema: pa.Schema,
         bodies: pa.Array, rows: np.ndarray | None = None) -> pa.RecordBatch:
    """The columns of ``schema`` from the scanner's fields ``f`` of strict bodies (``rows``:
    their indexes in ``bodies``, for offsets counted from ``first``; all rows if None)."""
    n = f.shape[1]
    names = set(schema.names)
    cols: dict[str, pa.Array] = {}
    if "offset" in names:
        if own_offsets:
            cols["offset"] = pa.array(f[scan.OFFSET])
        else:
            cols["offset"] = pa.array(first + (np.arange(n) if rows is None else rows), pa.int64())
    if "op" in names:
        ops = f[scan.OP].astype(np.uint8)
        cols["op"] = pa.StringArray.from_buffers(
            n, pa.py_buffer(np.arange(n + 1, dtype=np.int32)), pa.py_buffer(ops))
    if "ts_ms" in names:
        cols["ts_ms"] = pa.array(f[scan.TS])
    if "source_ts_ms" in names:
        cols["source_ts_ms"] = _source_ts(f, bodies, rows)
    every = np.ones(n, np.bool_)
    for col, a, b in (("schema", scan.SCHEMA_A, scan.SCHEMA_B), ("table", scan.TABLE_A, scan.TABLE_B)):
        if col in names:
            cols[col] = scan.strings(data, f[a], f[b], every)
    if "key" in names:
        key, todo = scan.keys(data, f[scan.KEY_A], f[scan.KEY_B])
        if len(todo):
            texts = [data[f[scan.KEY_A, i]:f[scan.KEY_B, i]].tobytes().decode() for i in todo]
            mask = np.zeros(n, np.bool_)
            mask[todo] = True
            key = pc.replace_with_mask(key, pa.array(mask), pa.array([_norm_key(t) for t in texts], pa.string()))
        cols["key"] = key
    if "after" in names:
        has = f[scan.AFTER_A] >= 0
        cols["after"] = scan.strings(data, f[scan.AFTER_A], f[scan.AFTER_B], has)
    if "unchanged" in names:
        unchanged: pa.Array = pa.nulls(n, type=pa.list_(pa.string()))
        listed = np.flatnonzero(f[scan.UNCH_A] > 0)
        if len(listed):
            values: list[str] = []
            offs = np.zeros(n + 1, np.int32)
            for i in listed:
                values.extend(orjson.loads(data[f[scan.UNCH_A, i]:f[scan.UNCH_B, i]].tobytes()))
                offs[i + 1] = len(values)
            offs[1:] = np.maximum.accumulate(offs[1:])
            has = np.zeros(n, np.bool_)
            has[listed] = True
            unchanged = pa.ListArray.from_arrays(
                pa.array(offs), pa.array(values, pa.string()), mask=pa.array(~has))
        cols["unchanged"] = unchanged
    return pa.RecordBatch.from_arrays([cols[f_.name] for f_ in schema], schema=schema)


def _source_ts(f: np.ndarray, bodies: pa.Array, rows: np.ndarray | None) -> pa.Array:
    """``source.ts_ms`` of strict bodies: the scanner's where it read one, else from the
    parsed body (as ``decode_bodies``: null if absent)."""
    has = f[scan.SRC_TS_OK] == 1
    if has.all():
        return pa.array(f[scan.SRC_TS])
    values: list[Any] = f[scan.SRC_TS].tolist()
    for i in np.flatnonzero(~has).tolist():
        body = bodies[int(rows[i]) if rows is not None else i].as_py()
        values[i] = (orjson.loads(body).get("source") or {}).get("ts_ms")
    return pa.array(values, pa.int64())


def records_to_arrow(records: Sequence[LogRecord]) -> pa.RecordBatch:
    """Decode change-log records (consecutive offsets) into one Arrow batch of
    ``ARROW_SCHEMA``."""
    if not records:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    first = records[0].offset
    assert all(r.offset == first + i for i, r in enumerate(records)), "offsets must be dense"
    metas = [f"{r.table}\x1f{r.op}\x1f{r.ts_ms}" for r in records]
    bodies = [r.body.decode() if isinstance(r.body, bytes) else r.body for r in records]
    return decode_bodies(first, metas, bodies)


_NO_META = "\x1f\x1f0"
"""The meta entry of a body that carries its own ``op`` and ``ts_ms``."""


def decode_values(values: EncodedValues, schema: pa.Schema = ARROW_SCHEMA) -> tuple[pa.RecordBatch, int, int]:
    """One chunk of a partition as an Arrow batch of ``schema``'s columns, and the
    offsets it spans, ``first <= offset < end`` (every offset between for a dense
    chunk; the lowest and one past the highest when the bodies carry their offsets)."""
    bodies, first = values.bodies, values.first
    metas = values.metas if values.metas is not None else [_NO_META] * len(bodies)
    if first is not None:
        batch = decode_fast(first, metas, bodies, schema)
        return batch, first, first + batch.num_rows
    with_offset = schema if "offset" in schema.names else columns_schema(["offset", *schema.names])
    batch = decode_fast(0, metas, bodies, with_offset, own_offsets=True)
    offsets = batch.column("offset")
    lo, hi = pc.min(offsets).as_py(), pc.max(offsets).as_py()
    if with_offset is not schema:
        batch = batch.select(schema.names)
    return batch, int(lo), int(hi) + 1


def read_range(part: LogPartition, schema: pa.Schema = ARROW_SCHEMA) -> Iterator[pa.RecordBatch]:
    """Exactly the events of ``part`` as Arrow batches (columns of ``schema``) of about
    ``ARROW_BATCH_EVENTS`` events (in offset order within a dense partition); raises
    ``ChangeLogError`` if the log no longer holds events of the partition (and the
    backend was not told to accept that)."""
    for values in part.read(ARROW_BATCH_EVENTS):
        yield decode_values(values, schema)[0]


PACK_COMPRESSION = "lz4"
"""Packed payloads are LZ4-compressed Arrow IPC: the JSON texts shrink ~4x, and the
JVM moves every payload twice (from the Python worker into a row, from the row into
the collected Arrow batch): a 1M-event drain spent ~1 s less JVM CPU and ~0.4 s less
driver CPU for ~0.3 s more on the executors (docs/performance.md)."""


def pack(batch: pa.RecordBatch | pa.Table) -> bytes:
    """Decoded rows as an Arrow IPC stream (the payload of a packed row)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=PACK_COMPRESSION)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write(batch)
    return bytes(sink.getvalue().to_pybytes())


def read_packed(part: LogPartition, schema: pa.Schema,
                route: str | None = None) -> Iterator[pa.RecordBatch]:
    """``read_range(part, schema)`` with every Arrow batch packed into one row of
    ``PACKED_SCHEMA``: ``(first_offset, end_offset, events)``, the payload holding the
    events of ``first_offset <= offset < end_offset`` that the batch has (all of them
    for a dense partition). One row per ~20k events spares Spark converting every event
    to a JVM row and back when the batch is collected. ``route``
    (``merge.route_spec``): the events are routed to their targets first
    (``merge.route_batch``)."""
    for values in part.read(ARROW_BATCH_EVENTS):
        batch, first, end = decode_values(values, schema)
        if route is not None:
            from pydblog.spark import merge

            bodies = values.bodies if isinstance(values.bodies, pa.Array) \
                else pa.array(values.bodies, pa.string())
            batch = merge.route_batch(batch, bodies, route)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([first], type=pa.int64()),
                pa.array([end], type=pa.int64()),
                pa.array([pack(batch)], type=pa.binary()),
            ],
            schema=PACKED_SCHEMA,
        )


def unpack(packed: pa.Table, schema: pa.Schema = ARROW_SCHEMA, *, dense: bool = True) -> pa.Table:
    """The events of packed rows (any order; ``schema`` = the packed columns) as one
    table in offset order. Raises ``ChangeLogError`` if the rows are not one dense
    range (each payload must hold exactly ``end_offset - first_offset`` events). With
    ``dense = False`` (``ChangeLogStream.dense``: payloads whose events carry their own
    offsets, e.g. a Kafka log's partition ranges) the payloads are only concatenated
    (``Batch.of`` sorts by offset where a sink needs it)."""
    if packed.num_rows == 0:
        return schema.empty_table()
    if not dense:  # each payload holds its part of the batch, offsets its own
        return pa.concat_tables(
            [pa.ipc.open_stream(p.as_buffer()).read_all() for p in packed["events"]])
    order = pc.sort_indices(packed["first_offset"]).to_pylist()
    firsts = packed["first_offset"].to_pylist()
    ends = packed["end_offset"].to_pylist()
    payloads = packed["events"]
    tables = []
    expect = firsts[order[0]]
    for i in order:
        t = pa.ipc.open_stream(payloads[i].as_buffer()).read_all()
        if firsts[i] != expect or t.num_rows != ends[i] - firsts[i]:
            raise ChangeLogError(
                f"packed events are not one dense range at offset {firsts[i]} "
                f"(expected {expect}, payload of {t.num_rows} events)"
            )
        expect = ends[i]
        tables.append(t)
    return pa.concat_tables(tables)


PACKED_SCHEMA = pa.schema(
    [("first_offset", pa.int64()), ("end_offset", pa.int64()), ("events", pa.binary())]
)
"""Schema with option ``packed = true``: one row per decoded Arrow batch (at most
``ARROW_BATCH_EVENTS`` events), ``events`` an Arrow IPC stream of the ``columns``
option's columns of ``ARROW_SCHEMA`` (all by default); ``unpack`` restores the rows."""


def columns_schema(columns: Sequence[str]) -> pa.Schema:
    """The Arrow schema of some of the source's columns (``ARROW_SCHEMA``'s fields)."""
    return pa.schema([ARROW_SCHEMA.field(n) for n in columns])


_WARM_BODY = (
    '{"offset":0,"op":"u","ts_ms":0,"source":{"connector":"c","db":"d","schema":"s",'
    '"table":"t"},"key":{"b":1,"a":"x"},"before":null,"after":{"a":"x","b":1},'
    '"unchanged":["c"]}'
)


def warm_up() -> None:
    """Load the compiled scanner (``scan``) into this process: one body through every
    kernel."""
    decode_fast(0, [""], [_WARM_BODY], columns_schema(sorted(FAST_COLUMNS)), own_offsets=True)


def pass_through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The identity ``mapInArrow`` function of the job's start-up warm-up
    (``job.warm_up_workers``): running it makes an executor start its Python workers
    and, unpickling it, import this module and load the compiled scanner, before the
    first batch needs them."""
    warm_up()
    yield from batches


def pass_through_for(log_json: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``pass_through`` that also loads what reading the change log ``log_json`` (the
    ``[log]`` config as JSON) needs: ``ChangeLogStream.warm_up`` (Kafka: confluent-kafka
    and the native read)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pydblog.changelog import open_stream

        open_stream(log_json).warm_up()
        yield from pass_through(batches)

    return run
