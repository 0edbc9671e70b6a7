"""The Kafka-protocol broker fixture shared by the suites: ``KAFKA_BOOTSTRAP_SERVERS``
(a real Kafka) when set, else a Tansu broker (in memory) started once per session."""

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
    from pydblog.devtools.tansu import TansuBroker

    with TansuBroker() as broker:
        yield broker.bootstrap
