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
