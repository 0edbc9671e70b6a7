"""Helpers for the failover tests: several `dblog run` members on one config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydblog.devtools.hamembers import Members
from tests.helpers import write_config


def ha_config(directory: Path, dsn: str, zk_hosts: str | None, timeout_s: float = 2.0,
              extra: str = "", tail: str = "") -> Path:
    if zk_hosts is not None:
        ha = f'backend = "zookeeper"\nhosts = "{zk_hosts}"\npath = "/dblog-test/{directory.name}"'
    else:
        ha = f'backend = "postgres"\npath = "/dblog-test/{directory.name}"'
    return write_config(
        directory, dsn, extra=f"{extra}\n{tail}\n[ha]\n{ha}\nsession_timeout_s = {timeout_s}\n"
    )


def members(config: Path) -> Members:
    return Members(config, config.parent / "data")


def duplicates(events: list[dict[str, Any]]) -> int:
    """Events logged twice: the same source position, op and key."""
    seen: set[tuple[Any, ...]] = set()
    dup = 0
    for e in events:
        if e["op"] == "n":
            continue
        src = e["source"]
        pos = (src.get("lsn"), src.get("index"), e["op"], str(e.get("key")))
        if pos in seen:
            dup += 1
        seen.add(pos)
    return dup
