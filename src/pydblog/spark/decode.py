"""Decoding the change log's events into Arrow, for the ``dblog`` data source's
executors and the sync's driver.

Imported lazily by ``source.py`` (only the executors' ``read`` needs it), so that the
Python processes Spark starts to plan a query (``create_data_source``, the streaming
planner) do not pay for importing pyarrow and the decoder.

Invariants:
- ``ARROW_SCHEMA`` is the source's row schema (``source.EVENT_SCHEMA_DDL``, the names
  of ``source.EVENT_COLUMNS``).
- Offsets are dense, so a partition ``[a, b)`` must return exactly ``b - a`` rows:
  ``read_range`` fails loudly instead of skipping missing events.
- Deterministic: the same stored events always decode to the same Arrow batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pydblog.changelog.sqlite import SqliteChangeLogReader, block_parts
from pydblog.errors import ChangeLogError
from pydblog.ports import LogRecord
from pydblog.spark.source import EVENT_COLUMNS, OffsetRange

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
# "before":..,"after":..[,"unchanged":[..]]}``. ``_PREFIX_STRICT`` accepts exactly the
# bodies of that form whose source, key and before are flat objects (no nested object or
# array) and whose schema/table names need no unescaping; for those, anchored captures
# and cuts at fixed substrings take the fields out (``_split``). In a valid JSON text a
# string holds ``"`` only escaped, so no substring that contains an unescaped ``"``
# (``,"after":``, ``},"key":``) can start or end inside a string, and in a flat object
# the first ``}`` outside a string ends it: the first occurrence of each is the
# envelope's own. Everything else (notifications, nested keys, an unknown envelope) is
# decoded by ``decode_bodies``.
_S = r'"(?:[^"\\\x00-\x1f]|\\.)*"'
_FLAT = r"\{(?:[^{}\[\]\"]|" + _S + r")*\}"
_NAME = r'"[^"\\\x00-\x1f]*"'
_INT = r"-?(?:0|[1-9][0-9]{0,17})"
_AFTER_AT = ',"after":'
_PREFIX_STRICT = (
    r'^\{"op":"[cudrt]","ts_ms":' + _INT + r',"source":\{"connector":(?:' + _S + r'|null),'
    r'"db":(?:' + _S + r'|null),"schema":' + _NAME + r',"table":' + _NAME
    + r'(?:[^{}\[\]"]|' + _S + r')*\},"key":(?:' + _FLAT + r'|null),"before":(?:null|'
    + _FLAT + r')$'
)
_HEAD = (
    r'^\{"op":"(?P<op>[cudrt])","ts_ms":(?P<ts>-?[0-9]+),"source":\{"connector":(?:"[^"]*"|null),'
    r'"db":(?:"[^"]*"|null),"schema":"(?P<schema>[^"]*)","table":"(?P<table>[^"]*)"'
)
"""The envelope's fields up to the table name (anchored: the scan stops there)."""
_OWN_OFFSET = r'^\{"offset":(?P<offset>0|[1-9][0-9]{0,17}),'
"""The head of a body that carries its offset (a Kafka log's value): ``_HEAD`` and
``_PREFIX_STRICT`` start with it instead of their ``{`` in ``own_offsets`` mode."""
_KEY = r'^(?P<key>\{[^}]*\}|null),"before":'
"""The key, from the text after ``},"key":``."""
_TAIL_UNCHANGED = r'^\{.*\},"unchanged":\[(?:' + _S + r"(?:," + _S + r")*)?\]\}$"
_KEY_NAME = r'"[^"\\\x00-\x1f]*"'
_KEY_VALUE = r"(?:" + _INT + r'|"[^"\\\x00-\x1f]*")'
_CANONICAL_KEY = r"^\{" + _KEY_NAME + ":" + _KEY_VALUE + r"\}$"
"""Keys that are their own sorted orjson form: one field, an integer or plain string."""
_PAIR_KEY = (
    r"^\{(?P<a>" + _KEY_NAME + "):(?P<av>" + _KEY_VALUE + r"),(?P<b>" + _KEY_NAME + "):(?P<bv>"
    + _KEY_VALUE + r")\}$"
)
"""Two-field keys of such values: put in sorted form by swapping the fields."""
_UNCHANGED_AT = ',"unchanged":['
FAST_COLUMNS = frozenset({"offset", "op", "schema", "table", "key", "after", "unchanged", "ts_ms"})
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
    ``FAST_COLUMNS``, without a JSON parse per event: the fields are cut out of the
    bodies in Arrow (``_split``: a cut at ``"after":``, then two RE2 passes over the
    part before it, one validating, one capturing),
    ``after`` is kept as the stored text and only keys that are not already in sorted
    form are parsed. The stored text equals the full decode's re-serialization for
    bodies orjson wrote; a snapshot row whose JSON PostgreSQL wrote is equal in value
    only (a float's spelling, a ``json`` column's own spacing), which is all the
    reduce needs: it parses ``after``. Bodies of any other form are decoded by
    ``decode_bodies``. Same result, property-tested against it. ``own_offsets``: as
    ``decode_bodies`` (the offsets are captured with the head: no extra pass)."""
    n = len(bodies)
    if n == 0 or not set(schema.names) <= FAST_COLUMNS:
        texts = bodies.to_pylist() if isinstance(bodies, pa.Array) else bodies
        return decode_bodies(first, metas, texts, schema, own_offsets=own_offsets)
    arr = bodies if isinstance(bodies, pa.Array) else pa.array(bodies, type=pa.string())
    parts, ok = _split(arr, own_offsets)
    if own_offsets:  # (meaningless where not ``ok``: those rows come from the full decode)
        offsets = pc.cast(pc.if_else(ok, parts.field("offset"), "0"), pa.int64())
    else:
        offsets = pa.array(range(first, first + n), type=pa.int64())
    if not pc.all(ok).as_py():
        slow_idx = pc.indices_nonzero(pc.invert(ok)).to_pylist()
        fast_idx = pc.indices_nonzero(ok)
        slow_bodies = pc.take(arr, pa.array(slow_idx, pa.int64())).to_pylist()
        slow = decode_bodies(0, [metas[i] for i in slow_idx], slow_bodies, schema,
                             own_offsets=own_offsets)
        if "offset" in schema.names and not own_offsets:
            slow = slow.set_column(
                schema.get_field_index("offset"),
                "offset",
                pa.array([first + i for i in slow_idx], type=pa.int64()),
            )
        if len(fast_idx) == 0:
            return slow
        fast = _cut(pc.take(parts, fast_idx), pc.take(offsets, fast_idx), schema)
        order = pc.sort_indices(pa.concat_arrays([fast_idx, pa.array(slow_idx, pa.uint64())]))
        table = pa.Table.from_batches([fast, slow])
        return table.take(order).combine_chunks().to_batches()[0]
    return _cut(parts, offsets, schema)


def _cut_at(arr: pa.Array, pattern: str) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Every text cut at its first ``pattern``: (the part before, the part after, whether
    it had one). A text without it gives itself and an arbitrary text."""
    halves = pc.split_pattern(arr, pattern, max_splits=1)
    flat = pc.list_flatten(halves)
    starts = halves.offsets.slice(0, len(arr))
    after = pc.min_element_wise(pc.add(starts, 1), max(0, len(flat) - 1))
    found = pc.equal(pc.list_value_length(halves), 2)
    return pc.take(flat, starts), pc.take(flat, after), found


def _split(arr: pa.Array, own_offsets: bool = False) -> tuple[pa.StructArray, pa.Array]:
    """The mirror fields (``op, ts, schema, table, key`` and ``rest``: the body after
    ``"after":``) of every body, and which bodies have the strict form (the fields of the
    others are meaningless). The body is cut at its first ``,"after":``; the part before
    must match ``_PREFIX_STRICT`` up to its end, which also proves that this was the
    envelope's own ``after`` (a key, before or source field named ``after`` would end the
    part inside a flat object). The rest must be ``null}``, ``{..}}`` or
    ``{..},"unchanged":[..]}``: the envelope ends with ``after`` and the optional
    ``unchanged`` (notifications go to the full decode). The fields up to the table
    name come from an anchored capture (``_HEAD``: the scan ends there), the key from
    one on the text after the first ``},"key":`` (``_KEY``); a body either capture
    misses (an escaped quote in a name, a brace in a key's string) takes the full
    decode too. ``own_offsets``: the bodies start with ``_OWN_OFFSET`` (captured as
    ``offset``)."""
    head_re, strict_re = _HEAD, _PREFIX_STRICT
    if own_offsets:
        head_re, strict_re = (_OWN_OFFSET + r[3:] for r in (_HEAD, _PREFIX_STRICT))
    pre, rest, two = _cut_at(arr, _AFTER_AT)
    head = pc.extract_regex(pre, head_re)
    _, key_before, _ = _cut_at(pre, '},"key":')
    key_text = pc.extract_regex(key_before, _KEY)
    key = pc.struct_field(key_text, "key")
    key = pc.if_else(pc.equal(key, "null"), pa.scalar(None, pa.string()), key)
    with_unchanged = pc.ends_with(rest, "]}")
    tail_ok = pc.or_(
        pc.and_(pc.starts_with(rest, "{"), pc.ends_with(rest, "}}")),
        pc.equal(rest, "null}"),
    )
    if pc.any(with_unchanged).as_py():
        tail_ok = pc.or_(
            tail_ok,
            pc.and_(with_unchanged, pc.match_substring_regex(rest, _TAIL_UNCHANGED)),
        )
    ok = pc.and_kleene(
        pc.and_kleene(pc.and_kleene(two, tail_ok), pc.is_valid(head)),
        pc.and_kleene(pc.is_valid(key_text), pc.match_substring_regex(pre, strict_re)),
    )
    names = ["offset", "op", "ts", "schema", "table"] if own_offsets else ["op", "ts", "schema", "table"]
    fields = [pc.struct_field(head, f) for f in names]
    parts = pa.StructArray.from_arrays([*fields, key, rest], names=[*names, "key", "rest"])
    return parts, pc.fill_null(ok, False)


def _sorted_keys(key: pa.Array) -> pa.Array:
    """Key texts in sorted orjson form (``_norm_key``): one-field keys of plain values
    as they are, two-field ones by swapping their fields in Arrow, the rest parsed.
    Only the keys that are not already in that form are worked on."""
    canon = pc.match_substring_regex(key, _CANONICAL_KEY)
    if pc.all(canon).as_py():
        return key
    todo = pc.invert(pc.fill_null(canon, True))  # null keys stay null
    sub = key.filter(todo)
    pair = pc.extract_regex(sub, _PAIR_KEY)
    # (a null struct's children hold empty strings: take fields with the struct's nulls)
    a, av, b, bv = (pc.struct_field(pair, f) for f in ("a", "av", "b", "bv"))
    swap = pc.greater(a, b)
    lo, hi = pc.if_else(swap, b, a), pc.if_else(swap, a, b)
    lov, hiv = pc.if_else(swap, bv, av), pc.if_else(swap, av, bv)
    fixed = pc.binary_join_element_wise(
        "{", lo, ":", lov, ",", hi, ":", hiv, "}", "", null_handling="emit_null"
    )
    if fixed.null_count:  # not a pair of plain values: parsed
        fixed = pa.array(
            [f if f is not None else _norm_key(t) for t, f in zip(sub.to_pylist(), fixed.to_pylist(), strict=True)],
            type=pa.string(),
        )
    return pc.replace_with_mask(key, todo, fixed)


def _cut(parts: pa.StructArray, offsets: pa.Array, schema: pa.Schema) -> pa.RecordBatch:
    """The columns of ``schema`` from ``_SPLIT``'s captures of validated bodies."""
    names = set(schema.names)
    cols: dict[str, pa.Array] = {"offset": offsets}
    for col in ("op", "schema", "table"):
        if col in names:
            cols[col] = parts.field(col)
    if "ts_ms" in names:
        cols["ts_ms"] = pc.cast(parts.field("ts"), pa.int64())
    if "key" in names:
        cols["key"] = _sorted_keys(parts.field("key"))
    if "after" in names or "unchanged" in names:
        rest = parts.field("rest")
        tail = pc.ends_with(rest, "]}")
        after = pc.binary_slice(rest.cast(pa.binary()), 0, -1).cast(pa.string())
        unchanged: pa.Array = pa.nulls(len(rest), type=pa.list_(pa.string()))
        if pc.any(tail).as_py():
            afters: list[str | None] = after.to_pylist()
            lists: list[list[str] | None] = [None] * len(afters)
            for i in pc.indices_nonzero(tail).to_pylist():
                r = rest[i].as_py()
                at = r.rfind(_UNCHANGED_AT)
                afters[i] = r[:at]
                lists[i] = orjson.loads(r[at + len(_UNCHANGED_AT) - 1 : -1])
            after = pa.array(afters, type=pa.string())
            unchanged = pa.array(lists, type=pa.list_(pa.string()))
        cols["after"] = pc.if_else(pc.equal(after, "null"), pa.scalar(None, pa.string()), after)
        cols["unchanged"] = unchanged
    return pa.RecordBatch.from_arrays([cols[f.name] for f in schema], schema=schema)


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


def _body_array(texts: str | list[str]) -> pa.Array:
    """A block's bodies as an Arrow string array: a plain block's stored text is split
    in Arrow (no Python string per event)."""
    if isinstance(texts, list):
        return pa.array(texts, type=pa.string())
    return pc.list_flatten(pc.split_pattern(pa.array([texts], type=pa.string()), "\n"))


def read_range(part: OffsetRange, schema: pa.Schema = ARROW_SCHEMA) -> Iterator[pa.RecordBatch]:
    """Exactly the events of ``part``, in offset order, as Arrow batches (columns of
    ``schema``) of at most ``ARROW_BATCH_EVENTS`` events; raises ``ChangeLogError`` if
    any offset of the range is missing from the log."""
    reader = SqliteChangeLogReader(part.path)
    try:
        pos = part.start
        while pos < part.end:
            stop = min(part.end, pos + ARROW_BATCH_EVENTS)
            metas: list[str] = []
            arrays: list[pa.Array] = []
            expect = pos
            for first, meta, stored in reader.read_range_stored(pos, stop):
                entries, texts = block_parts(meta, stored)
                lo, hi = max(0, pos - first), min(len(entries), stop - first)
                if lo >= hi:
                    continue
                if first + lo != expect:
                    break
                bodies = _body_array(texts)
                if len(bodies) != len(entries):
                    raise ChangeLogError(
                        f"change log {part.path}: the block at offset {first} holds "
                        f"{len(entries)} meta entries but {len(bodies)} bodies"
                    )
                metas.extend(entries[lo:hi])
                arrays.append(bodies.slice(lo, hi - lo))
                expect += hi - lo
            if expect != stop:
                first_now = reader.first_offset()
                raise ChangeLogError(
                    f"change log {part.path} no longer holds offsets [{pos}, {stop}) "
                    f"(first offset now {first_now}, got {expect - pos} events): retention "
                    "removed events the sync had not applied",
                    hint="raise [log] retention_hours/retention_bytes and re-sync the "
                    "targets from a fresh snapshot",
                )
            yield decode_fast(pos, metas, pa.concat_arrays(arrays), schema)
            pos = stop
    finally:
        reader.close()


PACK_COMPRESSION = "lz4"
"""Packed payloads are LZ4-compressed Arrow IPC: the JSON texts shrink ~4x, and the
JVM moves every payload twice (from the Python worker into a row, from the row into
the collected Arrow batch): a 1M-event drain spent ~1 s less JVM CPU and ~0.4 s less
driver CPU for ~0.3 s more on the executors (docs/benchmarks.md)."""


def pack(batch: pa.RecordBatch) -> bytes:
    """One decoded batch as an Arrow IPC stream (the payload of a packed row)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=PACK_COMPRESSION)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def read_packed(part: OffsetRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``read_range(part, schema)`` with every Arrow batch packed into one row of
    ``PACKED_SCHEMA``: ``(first_offset, end_offset, events)``, the payload holding exactly
    the events ``first_offset <= offset < end_offset``. One row per ~20k events spares
    Spark converting every event to a JVM row and back when the batch is collected."""
    pos = part.start
    for batch in read_range(part, schema):
        end = pos + batch.num_rows
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([pos], type=pa.int64()),
                pa.array([end], type=pa.int64()),
                pa.array([pack(batch)], type=pa.binary()),
            ],
            schema=PACKED_SCHEMA,
        )
        pos = end


def unpack(packed: pa.Table, schema: pa.Schema = ARROW_SCHEMA, *, dense: bool = True) -> pa.Table:
    """The events of packed rows (any order; ``schema`` = the packed columns) as one
    table in offset order. Raises ``ChangeLogError`` if the rows are not one dense
    range (each payload must hold exactly ``end_offset - first_offset`` events). With
    ``dense = False`` (Kafka: one payload per partition range) the payloads are only
    concatenated (``Batch.of`` sorts by offset)."""
    if packed.num_rows == 0:
        return schema.empty_table()
    if not dense:  # the Kafka source: each payload is one partition's events, in order
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


def pass_through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The identity ``mapInArrow`` function of the job's start-up warm-up
    (``job.warm_up_workers``): running it makes an executor start its Python workers
    and, unpickling it, import this module, before the first batch needs them."""
    yield from batches
