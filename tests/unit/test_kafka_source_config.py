"""The ``dblog-kafka`` source's ``log`` option: ``LogConfig.model_dump_json()`` is read
without importing the config models (each planning and reading process would pay ~0.2 s
of CPU for them); anything else is validated as a ``LogConfig``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

pytest.importorskip("pyspark")

from pydblog.config import LogConfig
from pydblog.spark.kafka_source import _config

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


def test_the_planner_does_not_import_the_config_models() -> None:
    code = (
        "import sys\n"
        "from pydblog.spark.kafka_source import _config\n"
        f"_config({LOG.model_dump_json()!r})\n"
        "sys.exit('pydblog.config' in sys.modules)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
