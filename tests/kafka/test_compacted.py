"""Records missing inside a partition (a compacted topic): the Kafka source's gap rule.

Tansu does not compact, so the gaps here are real offsets without a record that a
commit's run claims: a transaction's commit marker takes an offset that no consumer
sees, exactly as a record compaction removed. A run never covers a marker in a log the
capture wrote (``commit_ends``: the delivery reports fill it), so these runs are forged:
by hand over a bare transactional producer's records, and by a capture whose runs start
one offset early (at the previous commit's marker)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from pydblog.changelog import kafka_native, kafka_spark
from pydblog.changelog.kafka import writer as kafka_writer
from pydblog.changelog.kafka.protocol import commit_ends
from pydblog.config import LogConfig, load_config
from pydblog.devtools.synth import SyntheticLoad
from pydblog.errors import ChangeLogError
from pydblog.spark.job import run_sync
from tests.kafka.test_sync import copy_to_kafka
from tests.spark.conftest import spark  # noqa: F401 - fixture
from tests.spark.helpers import assert_mirrors
from tests.spark.test_sync import build_scenario

pytestmark = pytest.mark.timeout(600)


def produce(bootstrap: str, topic: str, transactions: list[list[bytes | None]]) -> None:
    """Each list one committed transaction of ``topic`` partition 0 (None: a tombstone):
    each commit marker takes the offset after the transaction's records."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions(10)
    for i, values in enumerate(transactions):
        p.begin_transaction()
        for j, v in enumerate(values):
            p.produce(topic, v, f"k{i}.{j}".encode(), partition=0)
        p.commit_transaction(10)


def read(bootstrap: str, topic: str, spans: tuple[tuple[int, int, str], ...], end: int,
         allow_gaps: bool) -> list[str]:
    cfg = LogConfig(type="kafka", path="/unused", bootstrap_servers=bootstrap, topic_prefix="p")
    part = kafka_spark.KafkaRange(cfg.model_dump_json(),
                                   (kafka_spark.KafkaPiece(topic, 0, 0, end, spans),))
    out: list[str] = kafka_spark.read_events(part, allow_gaps).to_pylist()
    return out


@pytest.mark.parametrize("native", [True, False])
def test_a_run_with_a_missing_record(kafka_bootstrap: str, native: bool,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if not native:
        monkeypatch.setattr(kafka_native, "_state", "unavailable")
    elif not kafka_native.available():
        pytest.skip("the native Kafka read is not built")
    topic = f"gap{uuid.uuid4().hex[:10]}"
    # offsets 0-4, marker 5, offsets 6-8, marker 9
    produce(kafka_bootstrap, topic, [[f"v{i}".encode() for i in range(5)],
                                     [f"w{i}".encode() for i in range(3)]])
    values = ["v0", "v1", "v2", "v3", "v4", "w0", "w1", "w2"]
    # What the capture writes: one run per commit, the marker between them: no gap.
    honest = ((5, 0, "x"), (9, 6, "x"))
    assert read(kafka_bootstrap, topic, honest, 9, allow_gaps=False) == values
    # A run over offset 5, which holds no record: a history sink's read fails ...
    forged = ((9, 0, "x"),)
    with pytest.raises(ChangeLogError) as err:
        read(kafka_bootstrap, topic, forged, 9, allow_gaps=False)
    text = str(err.value)
    assert f"topic {topic} partition 0 (offsets 5..5" in text, text
    assert "cleanup.policy=delete" in text and "compact" in text, text
    # ... a mirror's does not (each key's newest record is all it applies).
    assert read(kafka_bootstrap, topic, forged, 9, allow_gaps=True) == values
    # A gap at a piece's end (the records up to its end are gone) is a gap too.
    with pytest.raises(ChangeLogError, match=r"offsets 9\.\.9"):
        read(kafka_bootstrap, topic, ((10, 6, "x"),), 10, allow_gaps=False)


@pytest.mark.parametrize("native", [True, False])
def test_a_tombstone_whose_delete_is_missing(kafka_bootstrap: str, native: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction keeps a deleted key's tombstone and drops the delete event just before
    it: a mirror would keep the row, so even a mirror's read fails."""
    if not native:
        monkeypatch.setattr(kafka_native, "_state", "unavailable")
    elif not kafka_native.available():
        pytest.skip("the native Kafka read is not built")
    topic = f"gap{uuid.uuid4().hex[:10]}"
    # offsets 0-2, marker 3, a tombstone at 4, offset 5, marker 6
    produce(kafka_bootstrap, topic, [[b"a", b"b", b"c"], [None, b"d"]])
    with pytest.raises(ChangeLogError, match=r"removed the delete event at offset 3 .*tombstone "
                                             r"\(offset 4\)") as err:
        read(kafka_bootstrap, topic, ((6, 0, "x"),), 6, allow_gaps=True)
    assert "tombstones = false" in str(err.value)
    # a tombstone after its delete event: nothing missing, nothing to say
    assert read(kafka_bootstrap, topic, ((3, 0, "x"), (6, 4, "x")), 6, allow_gaps=False) == \
        ["a", "b", "c", "d"]


def config(tmp: Path, log: LogConfig, sinks: str) -> Path:
    path = tmp / f"dblog-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(f"""
[source]
dsn = "postgresql://unused@127.0.0.1/x"
[log]
path = "{tmp / "data"}"
type = "kafka"
bootstrap_servers = "{log.bootstrap_servers}"
topic_prefix = "{log.topic_prefix}"
[sync]
checkpoint = "{tmp / ("cp-" + uuid.uuid4().hex[:6])}"
trigger = "available-now"
master = "local[1]"
sink_retries = 0
{sinks}
""")
    return path


@pytest.mark.slow  # ~55 s; the rule itself is covered above in ~2 s
@pytest.mark.usefixtures("spark")
def test_sync_of_a_log_with_gaps(tmp_path: Path, kafka_log: LogConfig,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`dblog sync` of a log whose runs claim one offset more than they hold (each
    partition's commit marker before them): with a history sink it stops with the error
    and its fix; with mirror sinks only it applies everything."""
    real = commit_ends

    def early_runs(*args: Any) -> Any:
        ends, runs = real(*args)
        return ends, {t: {p: max(0, f - 1) for p, f in parts.items()} for t, parts in runs.items()}

    end = build_scenario(tmp_path / "log", SyntheticLoad(seed=5))
    monkeypatch.setattr(kafka_writer, "commit_ends", early_runs)
    assert copy_to_kafka(tmp_path / "log", kafka_log) == end
    monkeypatch.undo()
    history = config(tmp_path, kafka_log, f'[[sync.sinks]]\ntype = "history"\npath = "{tmp_path / "h"}"')
    with pytest.raises(ChangeLogError) as err:
        run_sync(load_config(history), available_now=True)
    assert "missing from topic" in err.value.message and err.value.hint is not None
    assert "cleanup.policy=delete" in err.value.hint
    mirror = config(tmp_path, kafka_log, f'[[sync.sinks]]\ntype = "delta"\npath = "{tmp_path / "lake"}"')
    assert run_sync(load_config(mirror), available_now=True) == 0
    assert_mirrors(tmp_path / "log", lake=tmp_path / "lake")
