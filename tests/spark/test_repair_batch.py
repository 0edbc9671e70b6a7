"""Range-end markers inside one Spark batch (``spark.repairs.spark_purges``), through the
Delta, PostgreSQL and MySQL sinks, against the rule applied event by event (``core.repair``: a
marker deletes the keys of its ranges outside ``keep``, later events still apply): random
events and markers over a random initial mirror, both sinks compared whole."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pydblog.events import ChangeEvent, Op
from pydblog.ports import ColumnSchema, TableSchema
from pydblog.positions import Lsn, PgPosition
from pydblog.spark.job import packed_frame
from pydblog.spark.plan import SparkBatch
from pydblog.spark.sinks.delta import DeltaSink
from pydblog.spark.sinks.mysql import MySqlSink
from pydblog.spark.sinks.postgres import PostgresSink
from tests.spark.test_reduce import batch, ev

SCHEMA = TableSchema("public", "t", (ColumnSchema("id", "int4", "int32", False),
                                     ColumnSchema("v", "int4", "int32", True)), ("id",))

NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
"""Each example applies Spark batches (seconds each): a failure is reported as drawn,
not shrunk through dozens more of them (past the test's time limit)."""


def marker(lo: int | None, hi: int | None, keep: list[int]) -> ChangeEvent:
    return ChangeEvent(
        Op.NOTIFICATION, "public", "t", PgPosition(Lsn(1)), 0,
        after={"repair": {"key": ["id"], "ranges": [{"lo": None if lo is None else [lo],
                                                     "hi": None if hi is None else [hi]}],
                          "keep": [[k] for k in keep]}},
        notification={"repair": True},
    )


def spark_batch(spark: Any, batch_id: int, t: pa.Table, first: int) -> SparkBatch:
    t = t.set_column(t.schema.get_field_index("offset"), "offset",
                     pa.array(range(first, first + t.num_rows), type=pa.int64()))
    b = SparkBatch.of(batch_id, packed_frame(spark, t), t.column_names, [(0, SCHEMA)],
                      dense=False, parts=2)
    assert b is not None
    return b


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=NO_SHRINK)
@given(st.data())
def test_markers_in_a_batch_follow_the_rule(spark: Any, pg_db: str, mariadb: Any,
                                            tmp_path: Path, data: st.DataObject) -> None:
    keys = st.integers(0, 9)
    initial = data.draw(st.sets(keys, min_size=1))
    bound = st.one_of(st.none(), keys)
    events = data.draw(st.lists(st.one_of(
        st.builds(lambda k, v: ("u", k, v), keys, st.integers(0, 99)),
        st.builds(lambda k: ("d", k, None), keys),
        st.builds(lambda lo, hi, keep: ("m", lo, hi, sorted(keep)), bound, bound,
                  st.sets(keys, max_size=4)),
    ), min_size=1, max_size=14))
    # the oracle: the rule event by event
    want = {k: k for k in initial}
    for e in events:
        if e[0] == "u":
            want[e[1]] = e[2]
        elif e[0] == "d":
            want.pop(e[1], None)
        else:
            _, lo, hi, keep = e
            for k in [k for k in want if (lo is None or k > lo) and (hi is None or k <= hi)
                      and k not in keep]:
                del want[k]
    evs = [ev(Op.CREATE, e[1], {"id": e[1], "v": e[2]}) if e[0] == "u"
           else ev(Op.DELETE, e[1]) if e[0] == "d" else marker(*e[1:]) for e in events]
    schema = f"m_{uuid.uuid4().hex[:8]}"
    lake = tmp_path / uuid.uuid4().hex[:8]
    sinks: list[Any] = [DeltaSink(str(lake)), PostgresSink(pg_db, schema),
                        MySqlSink(mariadb.dsn(""), schema)]
    first = batch(*[ev(Op.READ, k, {"id": k, "v": k}) for k in sorted(initial)])
    b0 = spark_batch(spark, 0, first, 0)
    b1 = spark_batch(spark, 1, batch(*evs), first.num_rows)
    try:
        for b in (b0, b1, b1):  # the second b1: a replay applies nothing
            for s in sinks:
                s.apply(b)
    finally:
        b0.release()
        b1.release()
        for s in sinks:
            s.close()
    got = {r["id"]: r["v"] for r in spark.read.format("delta").load(str(lake / "public" / "t"))
           .collect()}
    assert got == want, ("delta", events)
    with psycopg.connect(pg_db) as conn:
        pg: dict[int, int] = dict(conn.execute(f'SELECT id, v FROM "{schema}".t').fetchall())
    assert pg == want, ("postgres", events)
    my = dict(mariadb.execute("SELECT id, v FROM t", schema))
    mariadb.execute(f"DROP DATABASE `{schema}`")
    assert my == want, ("mysql", events)
