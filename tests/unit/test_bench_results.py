"""bench/results.py: a run's figures land in one JSON file with its command, machine and head."""

from __future__ import annotations

import json
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _write() -> Callable[..., Path]:
    """``bench/results.py``'s ``write`` (bench/ is not a package: run it as a script)."""
    write: Callable[..., Path] = runpy.run_path(str(BENCH / "results.py"))["write"]
    return write


def test_write_records_figures_command_machine_and_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", [str(BENCH / "stream.py"), "--rows", "1000"])
    path = _write()("stream", {"dblog_events_per_s": 1234.5}, directory=tmp_path)
    assert path.parent == tmp_path
    assert path.name.startswith("stream-") and path.name.endswith("Z.json")
    record: dict[str, Any] = json.loads(path.read_text())
    assert record["figures"] == {"dblog_events_per_s": 1234.5}
    assert record["command"] == "python bench/stream.py --rows 1000"
    assert record["machine"]["cores"] >= 1
    assert len(record["machine"]["loadavg"]) == 3
    head = record["git_head"]
    assert head is None or len(head.removesuffix("-dirty")) == 40


@pytest.mark.parametrize("name", ["", "a/b", ".hidden"])
def test_write_refuses_a_name_that_is_not_a_file_stem(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="plain file name stem"):
        _write()(name, {}, directory=tmp_path)
