"""A Kafka broker for the tests: ``KAFKA_BOOTSTRAP_SERVERS`` (any Kafka) when set, else
one Apache Kafka node started for the session (``tests/kafka_broker.py``). Every test uses its own
random topic prefix, so tests never see each other's topics."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from pydblog.config import LogConfig

pytest.importorskip("confluent_kafka", reason="pip install 'pydblog[kafka]'")


def kafka_log_toml(bootstrap: str, prefix: str | None = None, extra: str = "") -> str:
    """``[log]`` keys (without the header) of a Kafka log with a fresh topic prefix."""
    prefix = prefix or f"t{uuid.uuid4().hex[:10]}"
    return f'type = "kafka"\nbootstrap_servers = "{bootstrap}"\ntopic_prefix = "{prefix}"\n{extra}'


@pytest.fixture
def kafka_log(request: pytest.FixtureRequest, tmp_path: Path) -> LogConfig:
    """A Kafka log with a fresh topic prefix and three partitions per table."""
    return LogConfig(type="kafka", path=str(tmp_path / "data"),
                     bootstrap_servers=request.getfixturevalue("kafka_bootstrap"),
                     topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=3)
