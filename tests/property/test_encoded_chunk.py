"""``EncodedChunk``: a chunk as two joined texts must behave exactly like the list of
``EncodedRow``s it stands for: as a sequence, in the window's drops, in the envelope
encoding (``EncodedBlock``s) and in the change log (offsets, bodies, meta).
"""

from __future__ import annotations

import random
import tempfile
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.changelog.sqlite import SqliteChangeLog, SqliteChangeLogReader
from pydblog.core.window import ChunkWindow
from pydblog.events import (
    TAIL_SEP,
    ChangeEvent,
    EncodedBlock,
    EncodedChunk,
    EncodedEvent,
    EncodedRow,
    Op,
    SnapshotKind,
    SnapshotRows,
    TailBlocks,
    encode_event,
    encode_snapshot_rows,
    join_tails,
)
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition

texts = st.text(st.characters(codec="utf-8"), max_size=8)
ints = st.integers(-(2**63), 2**63 - 1)


def _cut(tails: list[str], block: int) -> TailBlocks:
    return TailBlocks.cut(len(tails), ["\n".join(tails[a : a + block]) for a in range(0, len(tails), block)],
                          block)


@st.composite
def tail_forms(draw: st.DrawFn, tails: list[str]) -> str | TailBlocks:
    """The tails as the readers hand them over: joined (the SQL path), cut into blocks
    (the native encoder), or consecutive parts each cut (a read split into sub-ranges:
    a short block inside the chunk)."""
    form = draw(st.sampled_from(["text", "blocks", "parts"]))
    block = draw(st.integers(1, 4))
    if form == "text":
        return "\n".join(tails)
    if form == "blocks":
        return _cut(tails, block)
    bounds = sorted(draw(st.lists(st.integers(0, len(tails)), max_size=3)))
    parts = [tails[a:b] for a, b in zip([0, *bounds], [*bounds, len(tails)], strict=True)]
    return join_tails([_cut(p, block) for p in parts if p])


@st.composite
def chunks(draw: st.DrawFn) -> tuple[EncodedChunk, list[EncodedRow]]:
    """A chunk of rows with unique keys, as rows and as an ``EncodedChunk`` (key lines
    as the PostgreSQL bulk reader writes them)."""
    kind = draw(st.sampled_from(["int", "text", "pair"]))
    if kind == "int":
        keys: list[tuple[Any, ...]] = [(k,) for k in sorted(draw(st.sets(ints, max_size=30)))]
    elif kind == "text":
        keys = [(k,) for k in sorted(draw(st.sets(texts, max_size=30)))]
    else:
        keys = sorted(draw(st.sets(st.tuples(st.integers(0, 3), texts), max_size=30)))
    rows = []
    for k in keys:
        after = {"id": list(k) if kind == "pair" else k[0], "v": draw(st.one_of(st.none(), ints, texts))}
        rows.append(EncodedRow(k, orjson.dumps({"id": after["id"]}).decode(), orjson.dumps(after).decode()))
    lines = [orjson.dumps(list(k) if kind == "pair" else k[0]).decode() for k in keys]
    chunk = EncodedChunk(
        len(rows), draw(tail_forms([r.key_json + TAIL_SEP + r.after_json + "}" for r in rows])),
        "\n".join(lines),
        (lambda v: tuple(v)) if kind == "pair" else (lambda v: (v,)), 2 if kind == "pair" else 1,
        int_keys=kind == "int",
    )
    return chunk, rows


@given(chunks(), st.data())
@settings(deadline=None)  # (a loaded machine: never a timed assertion)
def test_sequence_like_the_rows(case: tuple[EncodedChunk, list[EncodedRow]], data: st.DataObject) -> None:
    chunk, rows = case
    assert len(chunk) == len(rows)
    assert list(chunk) == rows
    if rows:
        assert chunk[-1] == rows[-1] and chunk[0] == rows[0]
        assert chunk.key_at(-1) == rows[-1].chunk_key and chunk.key_at(0) == rows[0].chunk_key
        i = data.draw(st.integers(0, len(rows) - 1))
        assert chunk[i] == rows[i]
        assert chunk[i:] == rows[i:]
    assert chunk.key_list() == [r.chunk_key for r in rows]
    drop = set(data.draw(st.lists(st.integers(0, max(0, len(rows) - 1)), max_size=5))) if rows else set()
    kept = [r for i, r in enumerate(rows) if i not in drop]
    sub = chunk.without(drop)
    assert list(sub) == kept
    assert sub.key_list() == [r.chunk_key for r in kept]
    rebuilt = EncodedChunk(len(sub), sub.tails, sub.keys, sub.decode_key, sub.arity)  # texts
    assert list(rebuilt) == kept


@given(chunks())
@settings(deadline=None)
def test_first_and_last_rows_without_splitting(case: tuple[EncodedChunk, list[EncodedRow]]) -> None:
    """A fresh chunk's first and last rows (what a concurrent window measures a chunk
    by, ``core.flight``) come without splitting its tails into one string per row."""
    chunk, rows = case
    if not rows:
        return
    assert chunk[0] == rows[0] and chunk[-1] == rows[-1]
    assert chunk._tail_list is None


def _window(rows: Any, events: list[ChangeEvent]) -> list[Any]:
    w = ChunkWindow("s", "t", ("id",))
    w.set_rows(rows)
    for e in events:
        w.observe(e)
    return list(w.close().rows)


@given(chunks(), st.data())
@settings(max_examples=300, deadline=None)
def test_window_drops_like_the_rows(case: tuple[EncodedChunk, list[EncodedRow]], data: st.DataObject) -> None:
    chunk, rows = case
    if chunk.arity != 1:
        return
    touched = data.draw(st.lists(st.one_of(
        st.sampled_from([r.chunk_key[0] for r in rows]) if rows else st.nothing(),
        ints, texts,
    ), max_size=6))
    events = [
        ChangeEvent(Op.UPDATE, "s", "t", PgPosition(Lsn(9), i), 1, {"id": k}, None, {"id": k})
        for i, k in enumerate(touched)
    ]
    assert _window(chunk, events) == _window(rows, events)


@given(chunks(), st.data())
@settings(max_examples=300, deadline=None)
def test_slices_cover_the_chunk_once(case: tuple[EncodedChunk, list[EncodedRow]], data: st.DataObject) -> None:
    """``span``/``part`` (a window's slices): consecutive parts, each ending at a block
    boundary where the tails are cut into blocks (then not split into rows), cover the
    chunk's rows once, in order; a window's slices with events between them hand out
    what the same slices of the rows as a list do."""
    chunk, rows = case
    at, parts = 0, []
    while at < len(chunk):
        stop = chunk.span(at, data.draw(st.integers(1, 5)), data.draw(st.sampled_from([0, 1, 40])))
        assert at < stop <= len(chunk)
        part = chunk.part(at, stop)
        assert len(part) == stop - at
        parts.append(part)
        at = stop
    if chunk._tail_blocks is not None and len(parts) > 1:
        assert chunk._tail_list is None  # block-aligned parts: no split of the chunk
    assert [r for p in parts for r in p] == rows
    if chunk.arity != 1:
        return
    a, b = ChunkWindow("s", "t", ("id",)), ChunkWindow("s", "t", ("id",))
    a.set_rows(chunk)
    b.set_rows(rows)
    keys = [r.chunk_key[0] for r in rows]
    while a.taken < len(rows):
        for k in data.draw(st.lists(st.sampled_from(keys), max_size=2)):
            event = ChangeEvent(Op.UPDATE, "s", "t", PgPosition(Lsn(9), 0), 1, {"id": k}, None, {"id": k})
            a.observe(event)
            b.observe(event)
        sa = a.take(data.draw(st.integers(1, 5), label="slice"))
        sb = b.take(sa.read)  # the list's slice of the same rows
        assert list(sa.rows) == list(sb.rows)
        assert (sa.read, sa.last_key, sa.left) == (sb.read, sb.last_key, sb.left)


@given(chunks(), st.integers(1, 7), st.integers(0, 200))
@settings(max_examples=80, deadline=None)
def test_blocks_encode_like_single_events(
    case: tuple[EncodedChunk, list[EncodedRow]], block: int, first: int
) -> None:
    chunk, rows = case
    base = PgPosition(Lsn(77), 2, tx_id=5)
    fast = SnapshotRows("s", 't"x', SnapshotKind.INCREMENTAL, base, first, 1234, chunk, ("id",))
    slow = fast._replace(rows=rows)
    blocks = [b for b in encode_snapshot_rows(fast, "postgresql", "db", 99, block) if type(b) is EncodedBlock]
    singles = encode_snapshot_rows(slow, "postgresql", "db", 99)
    assert all(0 < b.size <= block for b in blocks)
    assert sum(b.size for b in blocks) == len(rows)
    assert all(b.head and b.body.count("\n") == b.size - 1 for b in blocks)  # stored compact
    bodies = [body for b in blocks for body in b.bodies()]
    assert bodies == [e.body for e in singles]
    assert singles == [encode_event(e, "postgresql", "db", 99) for e in slow.events()]
    assert {(b.table, b.op, b.ts_ms) for b in blocks} <= {('s.t"x', "r", 1234)}


def test_change_log_stores_blocks_like_events() -> None:
    """Random mixes of single events and blocks: dense offsets, and the records read
    back equal those of the same events appended one by one."""
    rng = random.Random(7)
    cp = Checkpoint(PgPosition(Lsn(1), 0), None, {})
    for _ in range(20):
        items: list[EncodedEvent | EncodedBlock] = []
        for _ in range(rng.randrange(1, 8)):
            if rng.random() < 0.5:
                n = rng.randrange(0, 2500)
                if rng.random() < 0.5:
                    items.append(EncodedBlock("s.t", "r", 5, n, "\n".join(f'{{"i":{j}}}' for j in range(n))))
                else:  # a template block
                    items.append(EncodedBlock("s.t", "r", 5, n, "\n".join(f'{j}}}' for j in range(n)),
                                              '{"h":1,"index":', ',"k":', rng.randrange(0, 99)))
            else:
                items.extend(EncodedEvent("s.u", "c", 6, f'{{"e":{rng.random()}}}')
                             for _ in range(rng.randrange(1, 1500)))
        flat: list[EncodedEvent | EncodedBlock] = []
        for it in items:
            if type(it) is EncodedBlock:
                flat.extend(EncodedEvent(it.table, it.op, it.ts_ms, b) for b in it.bodies())
            else:
                flat.append(it)
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            fast, slow = SqliteChangeLog(a), SqliteChangeLog(b)
            assert fast.append(items, cp) == slow.append(flat, cp) == len(flat)
            fast.close()
            slow.close()
            ra, rb = SqliteChangeLogReader(a), SqliteChangeLogReader(b)
            assert ra.read_range(0, len(flat)) == rb.read_range(0, len(flat))
            assert ra.next_offset() == len(flat)
            lo = rng.randrange(0, len(flat) + 1)
            assert [r.offset for r in ra.read(lo, 10**6)] == list(range(lo, len(flat)))
            hi = rng.randrange(lo, len(flat) + 1)
            got = [(f + i, m, b) for f, ms, bs in ra.read_range_blocks(lo, hi)
                   for i, (m, b) in enumerate(zip(ms, bs, strict=True))]
            assert got == [(r.offset, f"{r.table}\x1f{r.op}\x1f{r.ts_ms}", r.body.decode())
                           for r in rb.read_range(lo, hi)]
            ra.close()
            rb.close()
