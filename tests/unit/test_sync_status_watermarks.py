"""`dblog status` shows what the sync published of its sources' progress and T."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from pydblog.capture.service import collect_status, sync_watermarks
from pydblog.config import parse_config


def test_status_of_a_sync_only_config(tmp_path: Path) -> None:
    cfg = parse_config(tomllib.loads(
        f'[log]\npath = "{tmp_path}"\n[[sync.sources]]\nname = "a"\n'
        f'log = {{ path = "{tmp_path / "a"}" }}\n'
        f'[[sync.sources]]\nname = "b"\nlog = {{ path = "{tmp_path / "b"}" }}\n'))
    out = collect_status(cfg)
    assert set(out) == {"source a", "source b", "sync watermarks"}
    assert "no sync has run" in out["sync watermarks"]
    (tmp_path / "sync-watermarks.json").write_text(json.dumps({
        "sources": {"a": 1_700_000_000_000, "b": None}, "low_ms": None, "lag_ms": None,
        "holding_back": ["b"], "updated_ms": 1_700_000_001_000}))
    marks = sync_watermarks(cfg)
    assert marks is not None
    assert marks["source a"] == "2023-11-14T22:13:20.000+00:00"
    assert marks["source b"] == "unknown" and marks["holding_back"] == "b"
    assert marks["complete_up_to"] is None
    assert collect_status(cfg)["sync watermarks"] == marks
