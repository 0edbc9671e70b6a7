"""A truncate of a table the change log has no schema and no rows for (a table dropped
before any row of it was logged) must not stop the Delta sink (a zero-column table
cannot be created)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pydblog.config import LogConfig
from pydblog.events import ChangeEvent, Op, encode_event
from pydblog.ports import LogRecord
from pydblog.sources.mysql.position import BinlogPosition
from pydblog.spark.decode import records_to_arrow
from pydblog.spark.job import BatchApplier
from pydblog.spark.sinks.delta import DeltaSink


@pytest.mark.slow
def test_truncate_of_unknown_table_is_a_no_op(spark: Any, tmp_path: Path) -> None:
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
    events = pa.Table.from_batches([records_to_arrow(recs)])
    sink = DeltaSink(str(tmp_path / "lake"), parallelism=1)
    (tmp_path / "log").mkdir()
    applier = BatchApplier(LogConfig(path=str(tmp_path / "log")), [sink], retries=0, backoff_s=0)
    applier._read_schemas = lambda: []  # type: ignore[method-assign]  # no log: no schemas
    applier.apply(events, 0)
    applier.apply(events, 0)  # a replay: still fine
    orders = DeltaTable(sink.table_path("app", "orders"))
    assert orders.to_pyarrow_table().num_rows == 1
    assert not DeltaTable.is_deltatable(sink.table_path("app", "staging"))
