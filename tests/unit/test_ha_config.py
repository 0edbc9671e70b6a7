"""[ha] configuration: validated at load with messages naming the key and the fix."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from pydblog.config import parse_config
from pydblog.errors import ConfigError

PG = {"dsn": "postgresql://u:secret@h/db"}


def cfg(ha: dict[str, Any], source: dict[str, Any] | None = None) -> Any:
    return parse_config({"source": source or PG, "ha": ha})


def test_zookeeper_needs_hosts() -> None:
    with pytest.raises(ConfigError, match="needs hosts"):
        cfg({"backend": "zookeeper"})
    with pytest.raises(ConfigError, match="absolute znode path"):
        cfg({"backend": "zookeeper", "hosts": "h:2181", "path": "x"})
    c = cfg({"backend": "zookeeper", "hosts": "h:2181"})
    assert c.ha.session_timeout_s == 5.0
    assert c.source.exclude_tables == []


def test_postgres_backend() -> None:
    with pytest.raises(ConfigError, match="takes dsn"):
        cfg({"backend": "postgres", "hosts": "h:2181"})
    with pytest.raises(ConfigError, match="needs dsn"):
        cfg({"backend": "postgres"}, {"type": "mysql", "dsn": "mysql://u:p@h/db"})
    with pytest.raises(ConfigError, match=r"schema\.table"):
        cfg({"backend": "postgres", "table": "x;drop"})
    c = cfg({"backend": "postgres", "dsn": "postgresql://u:hidden@h/db"})
    assert "hidden" not in repr(c.ha)
    # the epoch table lives in the source database: it is never captured
    c = cfg({"backend": "postgres"})
    assert not c.source.table_matcher()("public.dblog_ha")
    assert c.source.table_matcher()("public.orders")


def test_session_timeout_bounds() -> None:
    with pytest.raises(ConfigError, match="session_timeout_s"):
        cfg({"backend": "zookeeper", "hosts": "h:1", "session_timeout_s": 0.1})
    with pytest.raises(ConfigError, match="unknown key"):
        cfg({"backend": "zookeeper", "hosts": "h:1", "ttl": 3})


def test_missing_kazoo_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydblog.ha import create_election

    monkeypatch.setitem(sys.modules, "kazoo", None)
    monkeypatch.setitem(sys.modules, "kazoo.client", None)
    with pytest.raises(ConfigError, match=r"pydblog\[ha\]"):
        create_election(cfg({"backend": "zookeeper", "hosts": "h:1"}), "m")
