"""The driver JVM's class-data-sharing archive (pydblog.spark.cds)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from pydblog.spark import cds
from pydblog.spark.job import spark_home

pytestmark = pytest.mark.skipif(cds._java() is None, reason="no java")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(cds.ENV_DISABLE, raising=False)
    return tmp_path / "pydblog" / "cds"


def _dump(target: Path) -> dict[str, object]:
    """A real (small) dynamic archive written by a JVM that exits, and its context."""
    home = spark_home()
    classpath = f"{home}/jars/*"
    java = cds._java()
    assert java is not None
    subprocess.run(
        [
            str(java),
            f"-XX:ArchiveClassesAtExit={target}",
            "-cp",
            classpath,
            "org.apache.spark.launcher.Main",
            "org.apache.spark.deploy.SparkSubmit",
            "--version",
        ],
        env={**os.environ, "SPARK_HOME": home},
        capture_output=True,
        check=False,  # (its exit status does not matter: the JVM dumps either way)
        timeout=120,
    )
    assert target.stat().st_size > 0
    return {"classpath": classpath, "jvm_args": [f"-XX:ArchiveClassesAtExit={target}"]}


def test_disabled(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cds.ENV_DISABLE, "0")
    assert cds.driver_java_options(spark_home()) == ("", None)


def test_first_session_dumps_next_one_checks_and_uses_it(cache: Path) -> None:
    option, tmp = cds.driver_java_options(spark_home())
    assert tmp is not None and tmp.parent == cache
    assert option == f"-XX:ArchiveClassesAtExit={tmp}"
    context = _dump(tmp)
    tmp.with_suffix(".json").write_text(json.dumps(context))
    option, again = cds.driver_java_options(spark_home())
    assert again is None
    finals = list(cache.glob("spark-*.jsa"))
    assert option == f"-XX:SharedArchiveFile={finals[0]}"
    assert [p.name for p in cache.iterdir()] == [finals[0].name]  # tmp and context gone
    assert cds.driver_java_options(spark_home()) == (option, None)


def test_damaged_dump_is_never_used(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(cache.parent.parent)  # a crash report would land here
    _, tmp = cds.driver_java_options(spark_home())
    assert tmp is not None
    context = _dump(tmp)
    tmp.with_suffix(".json").write_text(json.dumps(context))
    # header intact, regions cut off: a JVM mapping this crashes, so it must not pass
    data = tmp.read_bytes()
    tmp.chmod(0o644)
    tmp.write_bytes(data[: len(data) // 3])
    option, again = cds.driver_java_options(spark_home())
    assert (option, again) == ("", None)  # kept for now: it might still be being written
    assert not list(cache.glob("spark-*.jsa"))
    old = time.time() - 2 * cds.STALE_S
    os.utime(tmp, (old, old))
    option, again = cds.driver_java_options(spark_home())
    assert again is not None and option == f"-XX:ArchiveClassesAtExit={again}"
    assert not tmp.exists() and not tmp.with_suffix(".json").exists()
    assert not list(cache.parent.parent.glob("hs_err*")) and not list(Path().glob("hs_err*"))


def test_archive_is_per_java_and_jars(tmp_path: Path) -> None:
    java = cds._java()
    assert java is not None
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "a.jar").write_bytes(b"x")
    before = cds.fingerprint(java, str(tmp_path))
    (tmp_path / "jars" / "a.jar").write_bytes(b"xy")
    assert cds.fingerprint(java, str(tmp_path)) != before


def test_archives_of_other_builds_unused_for_long_are_pruned(tmp_path: Path) -> None:
    now = time.time()
    current, recent, old = (tmp_path / f"spark-{n}.jsa" for n in ("cur", "recent", "old"))
    for f, age in ((current, 90 * 86400), (recent, 86400), (old, cds.UNUSED_S + 60)):
        f.write_bytes(b"x")
        os.utime(f, (now - age, now - age))
    other = tmp_path / "spark-old.jsa.1234.tmp"  # a dump in progress is not an archive
    other.write_bytes(b"x")
    assert cds.prune(tmp_path, keep=current, now=now) == [old]
    assert current.exists() and recent.exists() and other.exists() and not old.exists()
