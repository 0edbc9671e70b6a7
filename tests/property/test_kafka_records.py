"""The wire producer's ``Accumulator`` (``_kafkarecords.c``) against a decoder of Kafka's
record format written here from the protocol's description: every record comes back
from ``take`` as added (key, value, headers; null and empty kept apart), per partition in
the order added, offset deltas 0, 1, ... within each batch, no batch over
``batch_bytes`` unless one record alone is, keyed records where Kafka's murmur2 puts
them; and ``take``'s views survive until the next change, as documented. The record's
key, cut from the envelope in C or in Python, is the envelope's key text."""

from __future__ import annotations

import importlib
import time
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kafka.test_kafka_log import murmur2

try:
    _kafkawrite: Any = importlib.import_module("pydblog.changelog._kafkawrite")
except ImportError:
    pytest.skip("pydblog.changelog._kafkawrite is not built", allow_module_level=True)


def varint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    shift = z = 0
    while True:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos


def blob(buf: memoryview | bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = varint(buf, pos)
    if n < 0:
        return None, pos
    return bytes(buf[pos:pos + n]), pos + n


def decode(records: memoryview | bytes, count: int) -> list[tuple[int, Any, Any, Any]]:
    """(offset delta, key, value, headers) of each record."""
    out = []
    pos = 0
    for _ in range(count):
        length, pos = varint(records, pos)
        end = pos + length
        assert records[pos] == 0  # attributes
        pos += 1
        ts_delta, pos = varint(records, pos)
        assert ts_delta >= 0
        delta, pos = varint(records, pos)
        key, pos = blob(records, pos)
        value, pos = blob(records, pos)
        nh, pos = varint(records, pos)
        headers = []
        for _ in range(nh):
            name, pos = blob(records, pos)
            hval, pos = blob(records, pos)
            assert name is not None
            headers.append((name.decode(), hval))
        assert pos == end
        out.append((delta, key, value, headers or None))
    assert pos == len(records)
    return out


blobs = st.one_of(st.none(), st.binary(max_size=300))
header_lists = st.one_of(st.none(), st.lists(
    st.tuples(st.sampled_from(["dblog.writer", "dblog.event", "é"]), blobs), max_size=3))
record_lists = st.lists(st.tuples(st.integers(-1, 2), blobs, blobs, header_lists), max_size=60)


@settings(max_examples=150, deadline=None)
@given(record_lists, st.sampled_from([1024, 2000, 1_000_000]), st.lists(st.booleans(), max_size=60))
def test_records_come_back_as_added(recs: list[Any], batch_bytes: int, early: list[bool]) -> None:
    """Every record comes back once, in its partition's order, in batches of at most
    ``batch_bytes``, whether the cut batches are taken while records are still added
    (``take(sealed_only=True)`` after the i-th add where ``early[i]``) or all at the end."""
    acc = _kafkawrite.Accumulator(batch_bytes)
    acc.topic("t", 3)
    want: dict[int, list[Any]] = {0: [], 1: [], 2: []}
    have: dict[int, list[Any]] = {0: [], 1: [], 2: []}

    def taken(batches: list[Any]) -> None:
        for topic, part, count, base_ts, max_ts, records in batches:
            assert topic == "t" and count >= 1 and max_ts >= base_ts
            assert len(records) <= batch_bytes or count == 1
            decoded = decode(records, count)  # (the views hold until the next change)
            assert [d for d, *_ in decoded] == list(range(count))
            have[part] += [(k, v, h) for _, k, v, h in decoded]

    for i, (part, key, value, headers) in enumerate(recs):
        if part < 0 and key is None:
            part = 0  # (a keyless record goes to any partition: placed by the test)
        got = acc.add("t", part, key, value, headers)
        if part < 0:
            assert got == (murmur2(key) & 0x7FFFFFFF) % 3
        else:
            assert got == part
        want[got].append((key, value, [tuple(h) for h in headers] if headers else None))
        if i < len(early) and early[i]:
            ready, pending = acc.ready, acc.pending
            cut = acc.take(sealed_only=True)
            assert len(cut) == ready
            assert acc.pending == pending - sum(b[2] for b in cut) and acc.ready == 0
            taken(cut)
    assert acc.pending == sum(map(len, want.values())) - sum(map(len, have.values()))
    taken(acc.take())
    assert acc.pending == 0
    assert have == want
    acc.release()
    assert acc.take() == []


def test_views_hold_until_the_next_change() -> None:
    """A taken batch's view reads its records until the accumulator changes; the buffer
    is then reused by the partition's next records (no fresh allocation)."""
    acc = _kafkawrite.Accumulator()
    acc.topic("t", 1)
    acc.add("t", 0, b"k1", b"v1", None)
    (batch,) = acc.take()
    first = bytes(batch[5])
    assert decode(batch[5], 1) == [(0, b"k1", b"v1", None)]
    acc.add("t", 0, b"k2", b"v2", [("h", b"")])  # releases the first take
    (batch2,) = acc.take()
    assert decode(batch2[5], 1) == [(0, b"k2", b"v2", [("h", b"")])]
    assert bytes(batch2[5]) != first
    acc.clear()
    assert acc.take() == []
    with pytest.raises(ValueError, match="not known"):
        acc.add("u", 0, None, b"x", None)
    with pytest.raises(ValueError, match="1 partitions, not partition 1"):
        acc.add("t", 1, None, b"x", None)
    acc.topic("t", 2)  # partitions added
    acc.add("t", 1, None, b"x", None)
    with pytest.raises(ValueError, match="never removed"):
        acc.topic("t", 1)


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                         st.text(alphabet=st.sampled_from('ab"\\,:{}[]é before'), max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["id", "before", "after", "k", "é"]), inner, max_size=3)),
    max_leaves=8)
json_keys = st.one_of(st.none(), st.dictionaries(
    st.sampled_from(["id", "before", "k", "é"]), json_values, min_size=1, max_size=3))


@settings(max_examples=300, deadline=None)
@given(json_keys, json_values, json_values)
def test_the_record_key_is_the_envelopes_key(key: Any, before: Any, after: Any) -> None:
    """The C path (``produce_events``) and the Python path (``_key_of``) both key a
    record by its envelope's ``key`` text, columns or JSON values named ``before``
    anywhere in the key or the rows included."""
    from pydblog.changelog import kafka_native
    from pydblog.changelog.kafka.writer import _key_of
    from pydblog.events import EncodedEvent

    if not kafka_native.writer_available():
        pytest.skip("the native Kafka write is not built")
    source = orjson.dumps({"db": "d", "table": "t", "before": 1}).decode()
    key_text = orjson.dumps(key).decode()
    body = (f'{{"op":"u","ts_ms":1,"source":{source},"key":{key_text},'
            f'"before":{orjson.dumps(before).decode()},"after":{orjson.dumps(after).decode()}}}')
    want = None if key is None else key_text.encode()
    start = body.index(',"key":') + 7
    py_key = _key_of(body, start)
    assert (None if py_key is None else py_key.encode()) == want
    acc = _kafkawrite.Accumulator()
    acc.topic("t", 1)
    event = EncodedEvent("d.t", "u", 1, body)
    index, _, status, _, _ = kafka_native.produce_events(
        acc, "c", [event], 0, 0, {"d.t": "t"}, b"tag", False, EncodedEvent, False)
    assert (index, status) == (1, 0)  # cut in C
    ((_, _, count, _, _, records),) = acc.take()
    ((_, got_key, value, _),) = decode(records, count)
    assert got_key == want
    assert value == f'{{"offset":0,{body[1:]}'.encode()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**63 - 2**20), st.integers(0, 2**63 - 2**20),
       st.lists(st.integers(-10**15, 10**15), min_size=1, max_size=5))
def test_template_rows_carry_their_offset_and_index(seq: int, first_index: int, ids: list[int]) -> None:
    """``produce_template`` writes each row's value as ``{"offset":<seq + i>,`` + the
    template's envelope with ``first_index + i`` (the digits Python's ``str`` writes, any
    magnitude), keyed by the tail's key; and no record of a run takes a timestamp from
    before the run, though the accumulator was used just before it."""
    from pydblog.changelog import kafka_native

    if not kafka_native.writer_available():
        pytest.skip("the native Kafka write is not built")
    head, mid = '{"op":"c","source":{"db":"d","row":', '},"key":'
    tails = [f'{{"id":{i}}},"before":null,"after":{{"id":{i}}}}}' for i in ids]
    acc = _kafkawrite.Accumulator()
    acc.topic("t", 1)
    args = ("c", "t", head, mid, "\n".join(tails), first_index, seq, b"w", 0, False, False, False)
    assert kafka_native.produce_template(acc, *args)[:3] == (len(ids), seq + len(ids), 0)
    acc.take()
    time.sleep(0.002)
    before_ms = time.time_ns() // 1_000_000
    assert kafka_native.produce_template(acc, *args)[:3] == (len(ids), seq + len(ids), 0)
    ((_, _, count, base_ts, max_ts, records),) = acc.take()
    assert count == len(ids)
    assert before_ms <= base_ts <= max_ts <= time.time_ns() // 1_000_000
    got = [(k, v) for _, k, v, _ in decode(records, count)]
    assert got == [(f'{{"id":{i}}}'.encode(),
                    f'{{"offset":{seq + n},{head[1:]}{first_index + n}{mid}{tail}'.encode())
                   for n, (i, tail) in enumerate(zip(ids, tails, strict=True))]
