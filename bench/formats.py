"""What a Kafka Connect ``[log] value_format`` costs the writer per event: the encode
(``formats.Formatter.encode``: the envelope parsed, the payload converted, serialized)
against the baseline of parsing the same envelope once with orjson, measured in
alternating rounds in one process (a shared machine's load moves both alike), and the
record sizes.

    .venv/bin/python bench/formats.py [rounds]
"""

from __future__ import annotations

import io
import json
import statistics
import sys
import time
from typing import Any

import orjson

import results
from pydblog.changelog.formats import AvroEncoder, Formatter, Registry
from pydblog.ports import ColumnSchema, TableSchema

TABLE = TableSchema("public", "items", (
    ColumnSchema("id", "integer", "int32", False),
    ColumnSchema("name", "text", "string"),
    ColumnSchema("qty", "bigint", "int64"),
    ColumnSchema("price", "numeric(10,2)", "decimal"),
    ColumnSchema("born", "date", "date"),
    ColumnSchema("at", "timestamp with time zone", "timestamptz"),
    ColumnSchema("ok", "boolean", "bool"),
), ("id",))
ROW = {"id": 7, "name": "a name", "qty": 123456789, "price": "12.50", "born": "2001-02-03",
       "at": "2024-01-02T01:04:05.123000Z", "ok": True}
ENV = {"op": "u", "ts_ms": 1700000000123,
       "source": {"connector": "postgresql", "db": "app", "schema": "public", "table": "items",
                  "lsn": 123456, "txId": 77, "index": 2, "ts_ms": 1700000000000, "snapshot": "false"},
       "key": {"id": 7}, "before": ROW, "after": {**ROW, "qty": 5}}


class _Memory:
    """A registry answering every registration with id 1 (no HTTP in the loop)."""

    def __call__(self, req: Any, timeout: float = 0) -> Any:
        return io.BytesIO(json.dumps({"id": 1}).encode())


def per_event_us(fn: Any, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    text = orjson.dumps(ENV).decode()
    js = Formatter("json-schema", "app")
    av = Formatter("json-schema", "app")
    av._encoder = AvroEncoder(Registry("http://registry.invalid", opener=_Memory()))
    topic = "app.public.items"
    n = 20_000
    out: dict[str, list[float]] = {"parse": [], "json-schema": [], "avro": []}
    for _ in range(rounds):
        out["parse"].append(per_event_us(lambda: orjson.loads(text), n))
        out["json-schema"].append(per_event_us(lambda: js.encode(topic, TABLE, orjson.loads(text)), n))
        out["avro"].append(per_event_us(lambda: av.encode(topic, TABLE, orjson.loads(text)), n))
    base = statistics.median(out["parse"])
    sizes = {"json": len(text) + 20, "json-schema": len(js.encode(topic, TABLE, ENV)[0]),
             "avro": len(av.encode(topic, TABLE, ENV)[0])}
    result = {k: {"median_us": round(statistics.median(v), 2), "ratio_to_parse":
                  round(statistics.median(v) / base, 1)} for k, v in out.items()}
    figures = {"rounds": rounds, "events_per_round": n, "per_event": result, "value_bytes": sizes}
    print(json.dumps(figures, indent=1))
    print(results.write("formats", figures))


if __name__ == "__main__":
    main()
