"""The Spark packages ``dblog sync`` needs beyond PySpark's own jars, fetched from Maven
Central on first use and cached.

- ``DELTA``: Delta Lake for Spark (``io.delta:delta-spark_2.13``, built for the Spark
  that ``pyproject.toml`` pins) and its dependencies that Spark does not ship.
- ``S3``: Hadoop's S3A file system (``org.apache.hadoop:hadoop-aws`` of the Hadoop that
  PySpark ships) for ``s3a://`` sink paths.

Each set is resolved once by Maven (``mvn dependency:copy-dependencies`` over a tiny
pom, so Maven's own settings, mirrors and proxies apply) into
``<cache>/<set>-<version>/`` and passed to Spark as ``spark.jars`` (Spark ships them to
the executors). ``<cache>`` is ``DBLOG_SPARK_JARS_DIR`` or ``~/.cache/pydblog/jars``. A
set is complete when its directory holds the ``jars.txt`` written after the copy:
an interrupted fetch is redone, never used.

Air-gapped clusters: copy a resolved set's directory (``dblog sync-jars`` prints it)
to the same place on the machine that runs ``dblog sync``, or point
``DBLOG_SPARK_JARS`` at a directory or comma-separated list of jar files: then
nothing is fetched and only those jars are used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydblog.errors import ConfigError

JARS_DIR_ENV = "DBLOG_SPARK_JARS_DIR"
JARS_ENV = "DBLOG_SPARK_JARS"

DELTA_VERSION = "4.4.0"
"""``io.delta:delta-spark_2.13`` on Maven Central, built for Spark 4.2 (the PyPI
``delta-spark`` of the same version is pinned with it)."""

HADOOP_VERSION = "3.5.0"
"""The Hadoop of PySpark 4.2's jars (``hadoop-client-api-3.5.0.jar``): ``hadoop-aws``
must match it."""


@dataclass(frozen=True)
class JarSet:
    name: str
    artifacts: tuple[str, ...]  # group:artifact:version


DELTA = JarSet(f"delta-{DELTA_VERSION}", (f"io.delta:delta-spark_2.13:{DELTA_VERSION}",))
S3 = JarSet(f"s3-{HADOOP_VERSION}", (f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",))

_COMPLETE = "jars.txt"


def cache_dir() -> Path:
    return Path(os.environ.get(JARS_DIR_ENV) or Path.home() / ".cache" / "pydblog" / "jars")


def _spark_jars() -> set[str]:
    """Artifact names PySpark already ships (``jackson-core`` for
    ``jackson-core-2.21.2.jar``): never put a second version of them on the class path."""
    from pyspark.find_spark_home import _find_spark_home

    names = set()
    for p in (Path(_find_spark_home()) / "jars").glob("*.jar"):
        names.add(_artifact(p.name))
    return names


def _artifact(filename: str) -> str:
    stem = filename[:-4] if filename.endswith(".jar") else filename
    parts = stem.split("-")
    for i in range(1, len(parts)):
        if parts[i][:1].isdigit():
            return "-".join(parts[:i])
    return stem


def _pom(artifacts: Sequence[str]) -> str:
    deps = "".join(
        "<dependency><groupId>{}</groupId><artifactId>{}</artifactId>"
        "<version>{}</version></dependency>".format(*a.split(":"))
        for a in artifacts
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>pydblog</groupId><artifactId>sync-jars</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{deps}</dependencies></project>"
    )


def _missing(js: JarSet, where: Path, why: str) -> ConfigError:
    return ConfigError(
        f"the Spark packages {', '.join(js.artifacts)} are not in {where} and could not be "
        f"fetched: {why}",
        hint=f"install Maven (`mvn`; `apt-get install maven`) so that `dblog sync` fetches them "
             f"from Maven Central, or, on a machine without access, copy {where} from a "
             f"machine that has it (`dblog sync-jars` fetches and prints it), or set "
             f"{JARS_ENV} to a directory or comma-separated list of the jar files",
    )


def resolve(js: JarSet) -> list[str]:
    """The jar files of ``js``: from the cache, else fetched by Maven into it."""
    where = cache_dir() / js.name
    done = where / _COMPLETE
    if done.exists():
        jars = [str(where / n) for n in done.read_text().split()]
        if all(Path(j).exists() for j in jars):
            return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise _missing(js, where, "Maven (`mvn`) is not installed")
    where.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where.parent, prefix=f".{js.name}-") as tmp:
        (Path(tmp) / "pom.xml").write_text(_pom(js.artifacts))
        out = Path(tmp) / "jars"
        proc = subprocess.run(
            [mvn, "-q", "-B", "-f", str(Path(tmp) / "pom.xml"), "dependency:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={out}"],
            capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            raise _missing(js, where, "Maven failed: " + " / ".join(tail))
        have = _spark_jars()
        keep = sorted(p.name for p in out.glob("*.jar") if _artifact(p.name) not in have)
        if where.exists():
            shutil.rmtree(where)
        out.rename(where)
        for p in where.glob("*.jar"):
            if p.name not in keep:
                p.unlink()
        (where / _COMPLETE).write_text("\n".join(keep) + "\n")
    return [str(where / n) for n in keep]


def given() -> list[str] | None:
    """The jars ``DBLOG_SPARK_JARS`` names (a directory: every ``*.jar`` in it), or None."""
    spec = os.environ.get(JARS_ENV)
    if not spec:
        return None
    jars: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        p = Path(item)
        if p.is_dir():
            jars.extend(sorted(str(j) for j in p.glob("*.jar")))
        elif p.is_file():
            jars.append(str(p))
        else:
            raise ConfigError(f"{JARS_ENV} names {item}, which does not exist",
                              hint=f"point {JARS_ENV} at jar files or a directory of them")
    return jars


def sync_jars(s3: bool = False) -> list[str]:
    """Every jar ``dblog sync`` passes to Spark (``spark.jars``)."""
    g = given()
    if g is not None:
        names = {_artifact(Path(j).name) for j in g}
        if "delta-spark_2.13" not in names:
            raise ConfigError(
                f"{JARS_ENV} has no delta-spark_2.13 jar",
                hint=f"add io.delta:delta-spark_2.13:{DELTA_VERSION} and its dependencies "
                     f"(`dblog sync-jars` on a machine with Maven prints the set)",
            )
        return g
    jars = resolve(DELTA)
    if s3:
        jars += resolve(S3)
    return jars
