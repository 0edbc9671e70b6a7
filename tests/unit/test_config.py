"""Config validation: unknown keys and wrong types name the key; secrets never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from pydblog.config import load_config, parse_config, redact_dsn
from pydblog.errors import ConfigError


def test_defaults_and_relative_log_path(tmp_path: Path) -> None:
    f = tmp_path / "dblog.toml"
    f.write_text(
        '[source]\ndsn = "postgresql://u:pw@h/db"\n[log]\npath = "data"\n'
        '[sync]\ncheckpoint = "cp"\n[[sync.sinks]]\ntype = "delta"\npath = "lake"\n'
    )
    cfg = load_config(f)
    assert cfg.sync.checkpoint == str(tmp_path / "cp")
    assert cfg.sync.sinks[0].path == str(tmp_path / "lake")
    assert cfg.source.slot == "dblog" and cfg.snapshot.chunk_size == 1024
    assert cfg.log_dir == tmp_path / "data"
    assert "pw" not in repr(cfg.source)


@pytest.mark.parametrize(
    ("snapshot", "adaptive"),
    [
        ({}, True),  # the fast default
        ({"chunk_size": 64}, False),  # a fixed chunk size stays fixed
        ({"chunk_size": 64, "adaptive": True}, True),
        ({"adaptive": False}, False),
    ],
)
def test_adaptive_unless_a_chunk_size_is_fixed(snapshot: dict[str, object], adaptive: bool) -> None:
    cfg = parse_config({"source": {"dsn": "x"}, "snapshot": snapshot})
    assert cfg.snapshot.effective_adaptive is adaptive


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"source": {"dsn": "x", "nope": 1}}, "source.nope: unknown key"),
        ({"source": {"dsn": "x"}, "log": {"batch_max_events": "many"}}, "log.batch_max_events"),
        ({"source": {"dsn": "x", "slot": "Bad-Name"}}, "source.slot"),
        ({"source": {"dsn": "x", "tables": ["("]}}, "invalid regex"),
        ({"log": {}}, "source: required key is missing"),
        ({"source": {"dsn": "x"}, "snapshot": {"watermark": "carrier-pigeon"}}, "snapshot.watermark"),
        ({"source": {"dsn": "x"}, "snapshot": {"read_dsn": "y"}}, 'needs watermark = "read-only"'),
    ],
)
def test_rejections_name_the_key(data: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert expected in str(err.value)


def test_table_matcher_full_match_and_exclude() -> None:
    cfg = parse_config({"source": {"dsn": "x", "tables": ["public\\.order.*"],
                                   "exclude_tables": ["public\\.orders_tmp"]}})
    m = cfg.source.table_matcher()
    assert m("public.orders") and not m("public.orders_tmp") and not m("xpublic.orders")


def test_redact_dsn() -> None:
    assert redact_dsn("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"
    assert "secret" not in redact_dsn("host=h password=secret user=u")
    assert redact_dsn("postgresql://u@h/db") == "postgresql://u@h/db"


def test_unqualified_own_tables_are_normalised_for_postgres() -> None:
    """An unqualified signal/watermark table is PostgreSQL's ``public.<name>`` (the
    capture compares them with events' ``schema.table``: unqualified, signals were logged
    as data and never acted on); MySQL keeps the name (resolved in the DSN's database)."""
    cfg = parse_config({"source": {"dsn": "x"},
                        "snapshot": {"signal_table": "sig", "watermark_table": "app.wm"}})
    assert cfg.snapshot.signal_table == "public.sig"
    assert cfg.snapshot.watermark_table == "app.wm"
    my = parse_config({"source": {"dsn": "mysql://u@h/db", "type": "mysql"},
                       "snapshot": {"signal_table": "sig"}})
    assert my.snapshot.signal_table == "sig"


def test_default_parallelism_rule() -> None:
    from pydblog.core.sizing import default_parallelism

    assert default_parallelism(2, 100) == 2
    assert default_parallelism(16, 100) == 4
    assert default_parallelism(None, 100) == 2
    assert default_parallelism(8, 25) == 2
    assert default_parallelism(8, 5) == 1
