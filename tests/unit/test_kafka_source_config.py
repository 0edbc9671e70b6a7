"""The Spark source's ``log`` option: ``LogConfig.model_dump_json()`` of a Kafka log is
read without importing the config models (each planning and reading process would pay
~0.2 s of CPU for them); anything else is validated as a ``LogConfig``. And the
processes that plan a query import no heavy module for any backend."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from pydblog.changelog.kafka_spark import _config
from pydblog.config import LogConfig

LOG = LogConfig(type="kafka", path="/tmp/x", bootstrap_servers="127.0.0.1:9", topic_prefix="app",
                partitions=4, kafka={"security.protocol": "SSL"})


def test_a_dumped_config_is_read_as_it_is() -> None:
    cfg = _config(LOG.model_dump_json())
    assert not isinstance(cfg, LogConfig)
    for name in LogConfig.model_fields:
        assert getattr(cfg, name) == getattr(LOG, name), name


def test_anything_else_is_validated() -> None:
    partial = {"type": "kafka", "bootstrap_servers": "h:1", "topic_prefix": "p"}
    cfg = _config(json.dumps(partial))
    assert isinstance(cfg, LogConfig) and cfg.partitions == 1
    with pytest.raises(ValidationError):
        _config(json.dumps({**partial, "partitions": 0}))
    with pytest.raises(ValidationError):
        _config(json.dumps({**json.loads(LOG.model_dump_json()), "type": "embedded?"}))


@pytest.mark.parametrize("log", [LOG, LogConfig(path="/tmp/x")], ids=["kafka", "embedded"])
def test_the_planner_imports_nothing_heavy(log: LogConfig) -> None:
    """A stream reader made as the job makes it (Spark's planning processes) loads
    neither the config models nor pyarrow, the decoder or the backend's client."""
    pytest.importorskip("pyspark")
    code = (
        "import sys\n"
        "from pydblog.changelog.kafka_spark import _config\n"
        "from pydblog.spark.source import DblogStreamReader\n"
        f"r = DblogStreamReader({{'log': {log.model_dump_json()!r}, 'packed': 'true',\n"
        "                         'allowGaps': 'true', 'numPartitions': '2'})\n"
        f"_config({LOG.model_dump_json()!r})\n"
        "heavy = {'pydblog.config', 'pyarrow', 'pydblog.spark.decode', 'numba',\n"
        "         'pydblog.changelog.kafka', 'confluent_kafka', 'pydblog.changelog.sqlite'}\n"
        "sys.exit(str(sorted(heavy & set(sys.modules))) if heavy & set(sys.modules) else 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], timeout=120, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
