"""Review s11 (F0c): a truncate of a table the change log has no schema and no rows for (a
table dropped before any row of it was logged) must not stop the Delta sink: before, it
tried to create a zero-column table ("At least one column must be defined") on every retry."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from pydblog.events import ChangeEvent, Op, encode_event
from pydblog.ports import LogRecord
from pydblog.sources.mysql.position import BinlogPosition
from pydblog.spark.batch import Batch
from pydblog.spark.decode import records_to_arrow
from pydblog.spark.sinks.delta import DeltaSink, open_table


def test_truncate_of_unknown_table_is_a_no_op(tmp_path: Path) -> None:
    at = BinlogPosition("b.000001", 400, 0, "0-1-5")
    evs = [
        ChangeEvent(Op.CREATE, "app", "orders", at.with_index(0), 0, {"id": 1}, None,
                    {"id": 1, "v": "a"}),
        ChangeEvent(Op.TRUNCATE, "app", "staging", at.with_index(1), 0),
    ]
    recs = []
    for i, e in enumerate(evs):
        enc = encode_event(e, "mysql", "app", 0)
        body = enc.body if isinstance(enc.body, bytes) else enc.body.encode()
        recs.append(LogRecord(i, enc.table, enc.op, enc.ts_ms, body))
    batch = Batch.of(0, pa.Table.from_batches([records_to_arrow(recs)]), [])
    assert batch is not None
    sink = DeltaSink(str(tmp_path), parallelism=1)
    sink.apply(batch)
    sink.apply(batch)  # a retry: still fine
    orders = open_table(sink.table_path("app", "orders"))
    assert orders is not None and orders.to_pyarrow_table().num_rows == 1
    assert open_table(sink.table_path("app", "staging")) is None
