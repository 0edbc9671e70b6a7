"""A merged target's truncate of one part (``spark/merge.py``, ``spark/plan.py``): the
truncate names its part, and only that part's upserts before it leave the batch."""

from __future__ import annotations

import orjson
import pyarrow as pa

from pydblog.spark.merge import after_prefix, route_batch, route_spec, scope_of
from pydblog.spark.plan import _before_scoped


def _batch(events: list[tuple[int, str, str, str | None, str | None]], db: str) -> tuple[pa.RecordBatch, pa.Array]:
    offset, op, table, key, after = (list(c) for c in zip(*events, strict=True))
    batch = pa.RecordBatch.from_pydict({
        "offset": pa.array(offset, pa.int64()), "op": op, "schema": ["public"] * len(op),
        "table": table, "key": pa.array(key, pa.string()), "after": pa.array(after, pa.string()),
    })
    bodies = pa.array([orjson.dumps({"source": {"connector": "postgresql", "db": db, "ts_ms": 1}}
                                    ).decode()] * len(op))
    return batch, bodies


def test_only_the_truncated_parts_upserts_before_it_are_dropped() -> None:
    spec = route_spec("a", [{"tables": r"public\.orders", "target": "m.orders"}])
    events = [
        (1, "c", "orders", '{"id":1}', '{"id":1,"v":"x"}'),
        (2, "d", "orders", '{"id":2}', None),
        (3, "t", "orders", None, None),
        (4, "c", "orders", '{"id":1}', '{"id":1,"v":"y"}'),
        (5, "c", "other", '{"id":1}', '{"id":1}'),
    ]
    routed = route_batch(*_batch(events, "shard_1"), spec)
    rows = routed.to_pylist()
    scope = scope_of(rows[2]["key"])
    assert scope == {"_dblog_source": "a", "_dblog_db": "shard_1", "_dblog_schema": "public"}
    assert rows[2]["table"] == "orders" and rows[2]["schema"] == "m"
    prefix = after_prefix(scope)
    assert rows[0]["after"].startswith(prefix + ",") and rows[3]["after"].startswith(prefix + ",")
    assert scope_of(rows[0]["key"]) is None  # a row's key is never taken for a part

    t = pa.Table.from_batches([routed])
    dropped = _before_scoped(t, {"m.orders": [(3, prefix)]}).to_pylist()
    # the upsert before the truncate goes; its delete, the truncate, the row after it
    # and another table's row stay
    assert dropped == [True, False, False, False, False]
    other = after_prefix({**scope, "_dblog_db": "shard_2"})
    assert _before_scoped(t, {"m.orders": [(3, other)]}).to_pylist() == [False] * 5


def test_a_repair_marker_of_a_merged_table_keeps_its_part_as_scope() -> None:
    """A range-end marker routed into a merged target keeps its repair with the part's
    identity (``key = "source"``); other notifications lose their payload, and with
    ``key = "row"`` (a row's part cannot be told from its key) so does the marker."""
    from pydblog.spark.repairs import plan_table, range_ends

    marker = orjson.dumps({"repair": {"key": ["id"], "ranges": [{"lo": None, "hi": None}],
                                      "keep": [[1]]}}).decode()
    events: list[tuple[int, str, str, str | None, str | None]] = [
        (1, "c", "orders", '{"id":2}', '{"id":2}'), (2, "n", "orders", None, marker),
        (3, "n", "orders", None, '{"other":1}')]
    spec = route_spec("a", [{"tables": r"public\.orders", "target": "m.orders"}])
    rows = route_batch(*_batch(events, "shard_1"), spec).to_pylist()
    rep = orjson.loads(rows[1]["after"])["repair"]
    assert rep["scope"] == {"_dblog_source": "a", "_dblog_db": "shard_1", "_dblog_schema": "public"}
    assert rows[2]["after"] is None
    row_spec = route_spec("a", [{"tables": r"public\.orders", "target": "m.orders", "key": "row"}])
    assert route_batch(*_batch(events, "shard_1"), row_spec).to_pylist()[1]["after"] is None

    # the purge of that marker: only its part's keys take part, its deletes are scoped
    [(key, ends)] = range_ends([(2, "m", "orders", rows[1]["after"])]).values()
    net = [(rows[0]["key"], 1, "mine"),
           ('{"_dblog_db":"shard_2","_dblog_schema":"public","_dblog_source":"a","id":2}', 1, "theirs")]
    deletes, dropped = plan_table(key, ends, net)
    assert dropped == ["mine"]  # its upsert before the marker, not kept: a delete
    [d] = deletes
    assert dict(d.scope) == rep["scope"] and d.spare == frozenset({(1,)})
