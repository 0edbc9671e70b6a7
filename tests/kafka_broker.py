"""The Kafka broker fixture shared by the suites: ``KAFKA_BOOTSTRAP_SERVERS`` (any Kafka)
when set, else one Apache Kafka node (``pydblog.devtools.kafka``, KRaft) started once per
session (per pytest-xdist worker)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    from pydblog.devtools.kafka import KafkaBroker

    with KafkaBroker() as broker:
        yield broker.bootstrap
