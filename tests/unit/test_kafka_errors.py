"""How Kafka client failures read: confluent-kafka's garbled error when the broker
goes away mid-transaction (a ``SystemError`` whose text is about a ``str`` not being an
exception) becomes a plain "connection lost" naming the broker, and stays retriable."""

from __future__ import annotations

import pytest

from pydblog.config import LogConfig
from pydblog.errors import ChangeLogUnavailable

pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")


def test_garbled_client_error_reads_as_a_lost_connection() -> None:
    from pydblog.changelog.kafka.client import unavailable

    cfg = LogConfig(type="kafka", bootstrap_servers="10.0.0.7:9092", topic_prefix="app")
    err = unavailable("a commit", cfg, SystemError(
        "_PyErr_SetObject: exception <class 'str'> is not a BaseException subclass"))
    assert isinstance(err, ChangeLogUnavailable) and err.retriable
    assert "10.0.0.7:9092" in err.message and "connection lost" in err.message
    assert "_PyErr_SetObject" not in err.message and "BaseException" not in str(err)
