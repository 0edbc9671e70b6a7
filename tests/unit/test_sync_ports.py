"""``dblog sync``'s Spark source knows the change log only through the ports
(``ports.ChangeLogStream``/``LogPartition``) and ``changelog.open_stream``: no module of
``pydblog.spark`` imports a backend, a toy backend plugs in without a change there, and
``open_stream`` names the problem in a bad ``[log]`` option."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

import pydblog
from pydblog.changelog import LOG_TYPES, open_stream
from pydblog.errors import ChangeLogError
from pydblog.ports import ChangeLogStream, EncodedValues, LogPartition, SyncOffset

SPARK = Path(pydblog.__file__).parent / "spark"
# what pydblog.spark may take from the changelog package: the registry, not a backend
REGISTRY = {"open_stream", "open_reader", "open_writer", "log_exists", "describe", "LOG_TYPES",
            "complete_ms", "cut_end"}


def test_no_module_of_the_spark_package_imports_a_backend() -> None:
    found = []
    for path in sorted(SPARK.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                         if node.module == "pydblog.changelog"]
            else:
                continue
            for name in names:
                if name.startswith("pydblog.changelog.") and name.rsplit(".", 1)[1] not in REGISTRY:
                    found.append(f"{path.relative_to(SPARK)}:{node.lineno} {name}")
    assert SPARK.joinpath("source.py").exists() and not found, found


def test_open_stream_by_type() -> None:
    assert open_stream(json.dumps({"path": "/tmp/x"})).dense
    assert LOG_TYPES[0] == "embedded" and open_stream('{"type": "embedded"}').dense
    kafka = '{"type": "kafka", "bootstrap_servers": "h:1", "topic_prefix": "p"}'
    assert not open_stream(kafka, allow_gaps=True).dense
    with pytest.raises(ChangeLogError, match="not JSON"):
        open_stream("./dblog-data")
    with pytest.raises(ChangeLogError, match="'nats'") as exc:
        open_stream('{"type": "nats"}')
    assert exc.value.hint is not None and '"kafka"' in exc.value.hint
    with pytest.raises(ChangeLogError, match="starting offset"):
        open_stream(kafka).initial_offset("17")
    with pytest.raises(ChangeLogError, match="starting offset"):
        open_stream("{}").initial_offset("soon")


def test_a_planned_stream_pickles_without_its_clients() -> None:
    """A reader is pickled to the executors; a Kafka stream that planned holds open
    clients (a batch read plans in ``__init__``): they stay behind."""
    import pickle

    kafka = open_stream('{"type": "kafka", "bootstrap_servers": "h:1", "topic_prefix": "p"}')
    kafka._client = kafka._group = lambda: None  # type: ignore[attr-defined]  # unpicklable
    copy = pickle.loads(pickle.dumps(kafka))
    assert copy._client is None and copy._group is None and copy.log == kafka.log  # type: ignore[attr-defined]
    embedded = open_stream('{"path": "/tmp/x"}')
    embedded.close()
    assert pickle.loads(pickle.dumps(embedded)).dense


def envelope(offset: int, op: str = "c") -> str:
    return orjson.dumps({
        "offset": offset, "op": op, "ts_ms": 7,
        "source": {"connector": "c", "db": "d", "schema": "s", "table": "t"},
        "key": {"id": offset % 3}, "before": None, "after": {"id": offset % 3, "v": offset},
    }).decode()


@dataclass(frozen=True)
class Slice(LogPartition):
    offsets: tuple[int, ...]

    def read(self, batch_events: int) -> Iterator[EncodedValues]:
        import pyarrow as pa

        for i in range(0, len(self.offsets), batch_events):
            chunk = self.offsets[i:i + batch_events]
            yield EncodedValues(pa.array([envelope(o) for o in chunk], pa.string()))


class Memory(ChangeLogStream):
    """A toy backend: events 0..n-1 kept in two interleaved 'partitions' (odd, even)."""

    dense = False

    def __init__(self, n: int) -> None:
        self.n = n

    def initial_offset(self, starting: str) -> SyncOffset:
        return {"seq": 0 if starting == "earliest" else self.n}

    def prepare_available_now(self) -> None:
        pass

    def latest_offset(self, start: SyncOffset, max_events: int | None) -> SyncOffset:
        end = self.n if max_events is None else min(self.n, start["seq"] + max_events)
        return {"seq": end}

    def report_latest_offset(self) -> SyncOffset | None:
        return {"seq": self.n}

    def events_end(self) -> int:
        return self.n

    def partitions(self, start: SyncOffset, end: SyncOffset, parts: int) -> Sequence[LogPartition]:
        r = range(start["seq"], end["seq"])
        return [Slice(tuple(o for o in r if o % 2 == k)) for k in (1, 0)]

    def commit(self, end: SyncOffset) -> None:
        pass

    def warm_up(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_new_backend_needs_no_change_in_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    import pyarrow as pa
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from pydblog.spark import decode, source

    monkeypatch.setattr(source, "open_stream", lambda log_json, allow_gaps=False: Memory(50))
    columns = ["offset", "op", "table", "key", "after"]
    reader = source.DblogStreamReader({"log": '{"type": "memory"}', "packed": "true",
                                       "columns": ",".join(columns)})
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(30))
    assert (start, end, reader.reportLatestOffset()) == ({"seq": 0}, {"seq": 30}, {"seq": 50})
    packed = pa.Table.from_batches([b for p in reader.partitions(start, end) for b in reader.read(p)])
    assert packed.select(["first_offset", "end_offset"]).to_pylist() == [
        {"first_offset": 1, "end_offset": 30}, {"first_offset": 0, "end_offset": 29}]
    events = decode.unpack(packed, decode.columns_schema(columns), dense=Memory.dense)
    assert sorted(events["offset"].to_pylist()) == list(range(30))
    row = next(r for r in events.to_pylist() if r["offset"] == 4)
    assert row == {"offset": 4, "op": "c", "table": "t", "key": '{"id":1}', "after": '{"id":1,"v":4}'}
