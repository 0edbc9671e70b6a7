"""A missing optional dependency is a clear error naming the extra, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pydblog import positions
from pydblog.config import parse_config
from pydblog.errors import ConfigError
from pydblog.extras import MissingExtra, needs_extra
from pydblog.sources.registry import create_source


def test_mysql_source_without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # Re-importing the package registers a second BinlogPosition class: keep the
    # registry as it was, or later tests decode positions of another class.
    monkeypatch.setattr(positions, "_KINDS", dict(positions._KINDS))
    for name in [m for m in sys.modules if m.startswith(("pymysqlreplication", "pydblog.sources.mysql"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pymysqlreplication", None)  # import fails
    cfg = parse_config({"source": {"type": "mysql", "dsn": "mysql://u:pw@127.0.0.1:1/db"}})
    with pytest.raises(MissingExtra) as err:
        create_source(cfg)
    assert "pip install 'pydblog[mysql]'" in str(err.value)
    assert "pymysqlreplication" in str(err.value)
    assert isinstance(err.value, ConfigError)


def test_other_import_errors_propagate() -> None:
    with pytest.raises(ModuleNotFoundError), needs_extra("mysql", "x"):
        import pydblog_no_such_module  # type: ignore[import-not-found]  # noqa: F401


_HIDE = """
import sys
for name in {names!r}:
    sys.modules[name] = None
from pydblog.cli import main
sys.argv = ["dblog", *{argv!r}]
main()
"""


@pytest.mark.parametrize(("hidden", "argv_tail", "extra"), [
    (["pymysqlreplication"], ["run"], "mysql"),
    (["pyspark"], ["sync", "--available-now"], "spark"),
])
def test_cli_names_the_extra(tmp_path: Path, hidden: list[str], argv_tail: list[str],
                             extra: str) -> None:
    config = tmp_path / "dblog.toml"
    config.write_text(
        '[source]\ntype = "mysql"\ndsn = "mysql://u:pw@127.0.0.1:1/db"\n'
        f'[log]\npath = "{tmp_path / "data"}"\n[api]\nlisten = ""\n'
        f'[[sync.sinks]]\ntype = "delta"\npath = "{tmp_path / "lake"}"\n'
    )
    argv = [argv_tail[0], "--config", str(config), *argv_tail[1:]]
    res = subprocess.run([sys.executable, "-c", _HIDE.format(names=hidden, argv=argv)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"pip install 'pydblog[{extra}]'" in res.stderr
    assert "Traceback" not in res.stderr and "ModuleNotFoundError" not in res.stderr
