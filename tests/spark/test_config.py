"""[sync] and [[sync.sinks]] validation."""

from __future__ import annotations

from typing import Any

import pytest

from pydblog.config import parse_config
from pydblog.errors import ConfigError


def cfg(sync: dict[str, Any]) -> Any:
    return parse_config({"source": {"dsn": "postgresql://u@h/db"}, "sync": sync})


def test_valid_sync_section() -> None:
    c = cfg(
        {
            "trigger": "500 ms",
            "sink_retry_backoff_s": 0.5,
            "sinks": [
                {"type": "delta", "path": "./lake"},
                {"type": "postgres", "dsn": "postgresql://a:secret@h/replica", "schema": "public"},
                {"type": "history", "path": "./lake/_changes"},
            ],
        }
    ).sync
    assert c.trigger_interval() == "500 milliseconds"
    assert [s.type for s in c.sinks] == ["delta", "postgres", "history"]
    assert "secret" not in repr(c)
    assert cfg({"trigger": "1 second"}).sync.trigger_interval() == "1 seconds"
    assert cfg({"trigger": "2 minutes"}).sync.trigger_interval() == "2 minutes"
    assert cfg({"trigger": "available-now"}).sync.trigger_interval() is None


@pytest.mark.parametrize(
    ("sync", "message"),
    [
        ({"sinks": [{"type": "delta"}]}, 'a "delta" sink needs path'),
        ({"sinks": [{"type": "history", "dsn": "x", "path": "p"}]}, "takes path, not dsn"),
        ({"sinks": [{"type": "postgres"}]}, 'a "postgres" sink needs dsn'),
        ({"sinks": [{"type": "postgres", "dsn": "x", "schema": "a b"}]}, "not a valid schema"),
        ({"sinks": [{"type": "kafka", "path": "x"}]}, "sync.sinks.0.type"),
        ({"trigger": "soon"}, "is not a trigger"),
        ({"max_events_per_trigger": 0}, "max_events_per_trigger"),
        ({"sinks": [{"type": "delta", "path": "x", "paht": "y"}]}, "unknown key"),
    ],
)
def test_invalid_sync_section(sync: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cfg(sync)


def test_sink_uris_are_not_made_relative_to_the_config(tmp_path: Any) -> None:
    from pydblog.config import load_config

    path = tmp_path / "dblog.toml"
    path.write_text('[source]\ndsn = "postgresql://u@h/db"\n[[sync.sinks]]\ntype = "delta"\n'
                    'path = "s3a://lake/mirror"\n[[sync.sinks]]\ntype = "history"\n'
                    'path = "lake/_changes"\n')
    sinks = load_config(str(path)).sync.sinks
    assert [s.path for s in sinks] == ["s3a://lake/mirror", str(tmp_path / "lake" / "_changes")]
