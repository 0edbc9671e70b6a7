"""Loading the native encoder: it binds psycopg's own libpq however the venv is reached
(a symlink too), never loads a second copy of libpq, and a stale build (an interface
version other than native.ABI_VERSION) is not used: the SQL path, and a log line
saying to reinstall. In subprocesses where loading state matters."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pydblog.sources.postgres import native

needs_encoder = pytest.mark.skipif(native.encoder() is None, reason="native encoder not built")


def _run(python: str, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != native.DISABLE_ENV}
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, env=env)


@needs_encoder
def test_a_venv_reached_through_a_symlink_binds_the_encoder(tmp_path: Path) -> None:
    link = tmp_path / "venvlink"
    link.symlink_to(Path(sys.prefix))
    python = link / "bin" / "python"
    assert python.exists(), f"no python at {python}"
    proc = _run(str(python), "from pydblog.sources.postgres import native; "
                "print(native.encoder() is not None)")
    assert proc.stdout.strip() == "True", proc.stderr


SYSTEM_LIBPQ = "/usr/lib/x86_64-linux-gnu/libpq.so.5"


@needs_encoder
@pytest.mark.skipif(psycopg.pq.__impl__ != "binary" or not os.path.exists(SYSTEM_LIBPQ),
                    reason="needs psycopg's binary wheel and a system libpq beside it")
def test_init_never_loads_a_second_libpq() -> None:
    code = f"""
from pydblog.sources.postgres import native, _copyenc
assert native.encoder() is not None
try:
    _copyenc.init({SYSTEM_LIBPQ!r})
    print("bound")
except OSError as e:
    print("refused", e)
real = __import__("os").path.realpath({SYSTEM_LIBPQ!r})
print("loaded" if real in open("/proc/self/maps").read() else "not loaded")
"""
    proc = _run(sys.executable, code)
    lines = proc.stdout.split("\n")
    assert lines[0].startswith("refused") and "not loaded in this process" in lines[0], proc
    assert lines[1] == "not loaded", proc


@needs_encoder
def test_a_stale_build_takes_the_sql_path_and_says_to_reinstall(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(native, "ABI_VERSION", native.ABI_VERSION + 1)
    monkeypatch.setattr(native, "_state", "unloaded")
    monkeypatch.setattr(native, "_module", None)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.encoder() is None
    assert "stale" in caplog.text and "reinstall" in caplog.text
