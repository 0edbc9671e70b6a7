"""A ZooKeeper server for the high-availability tests (Debian's package, started here)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pydblog.devtools.zookeeper import ZkServer, available


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZkServer]:
    if not available():
        pytest.fail("ZooKeeper is not installed: apt-get install zookeeper (bash .ci/run does)")
    pytest.importorskip("kazoo", reason="the [ha] extra: pip install -e '.[ha]'")
    server = ZkServer().start()
    try:
        yield server
    finally:
        server.stop()
