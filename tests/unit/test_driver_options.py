"""The sync's driver JVM options (``spark.session.driver_java_options``): C1 only unless
``DBLOG_SPARK_DRIVER_JAVA_OPTIONS`` says otherwise, and the JVM in UTC unless those
options name a zone themselves."""

from __future__ import annotations

import pytest

from pydblog.spark import session


def test_the_jvm_runs_in_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(session.DRIVER_JAVA_OPTIONS_ENV, raising=False)
    options = session.driver_java_options()[0].split()
    assert "-XX:TieredStopAtLevel=1" in options and "-Duser.timezone=UTC" in options

    monkeypatch.setenv(session.DRIVER_JAVA_OPTIONS_ENV, "-Xss4m")
    options = session.driver_java_options()[0].split()
    assert "-Xss4m" in options and "-Duser.timezone=UTC" in options
    assert "-XX:TieredStopAtLevel=1" not in options

    monkeypatch.setenv(session.DRIVER_JAVA_OPTIONS_ENV, "-Duser.timezone=Asia/Tokyo")
    options = session.driver_java_options()[0].split()
    assert "-Duser.timezone=Asia/Tokyo" in options and "-Duser.timezone=UTC" not in options


def _code_cache_bytes(options: list[str]) -> int:
    import re
    import shutil
    import subprocess

    java = shutil.which("java")
    if java is None:
        pytest.skip("no java on PATH")
    out = subprocess.run([java, *options, "-XX:+PrintFlagsFinal", "-version"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    found = re.search(r"\bReservedCodeCacheSize\s*=\s*(\d+)", out)
    assert found, out[-2000:]
    return int(found.group(1))


def test_the_default_options_keep_a_full_size_code_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """C1 alone sizes the code cache at 48 MiB: a running sync filled it within a
    minute and the JVM stopped compiling (every later batch ran interpreted). The
    default options keep the size a JVM with both compilers gets (240 MiB)."""
    monkeypatch.delenv(session.DRIVER_JAVA_OPTIONS_ENV, raising=False)
    options = [o for o in session.driver_java_options()[0].split()
               if not o.startswith(("-XX:SharedArchiveFile=", "-XX:ArchiveClassesAtExit="))]
    assert _code_cache_bytes(options) >= 240 * 1024 * 1024
