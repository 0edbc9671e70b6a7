"""High availability: one leader captures, standbys wait (``[ha]``; docs/ha.md)."""

from __future__ import annotations

from pydblog.config import Config
from pydblog.ports import Election


def default_path(cfg: Config) -> str:
    return f"/pydblog/{cfg.source.slot}"


def create_election(cfg: Config, member: str) -> Election:
    ha = cfg.ha
    assert ha is not None
    path = ha.path or default_path(cfg)
    if ha.backend == "zookeeper":
        from pydblog.ha.zookeeper import ZkElection

        assert ha.hosts is not None
        return ZkElection(ha.hosts, path, ha.session_timeout_s, member)
    from pydblog.ha.pglock import PgLockElection

    return PgLockElection(ha.dsn or cfg.source.dsn, path, ha.table, ha.session_timeout_s, member)
