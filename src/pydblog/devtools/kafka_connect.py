"""Kafka Connect standalone for tests: Apache Kafka's ``connect-runtime`` (the broker
fixture's version, ``kafka.KAFKA_VERSION``) with Debezium's JDBC sink connector and
Apicurio's Avro converter as plugins, all from Maven Central, on loopback.

``install()`` resolves, with Maven (small poms, ``mvn dependency:copy-dependencies``), into
``home()`` (``$PYDBLOG_CONNECT_HOME``, else ``maven/connect-<version>`` in
``devtools.cache.cache_root()``):

- ``runtime/``: ``org.apache.kafka:connect-runtime`` and ``slf4j-simple`` (the worker's
  classpath, ``JsonConverter`` included);
- ``plugins/jdbc/``: ``io.debezium:debezium-connector-jdbc`` (``JDBC_VERSION``) and its
  dependencies, without Kafka's own jars and Jackson's core (the worker provides them:
  a second jackson-databind in the plugin finds the worker's Jackson modules through
  ``ServiceLoader`` and fails, "BlackbirdModule not a subtype"); Hibernate's
  ``hibernate-agroal`` comes from ``org.hibernate.orm`` (the version the connector names
  is not on Maven Central);
- ``plugins/apicurio/``: ``io.apicurio:apicurio-registry-utils-converter``.

Every repository is mirrored to Maven Central (Debezium's poms name Confluent's, which
is not reachable here). ``python -m pydblog.devtools.kafka_connect install`` does it.

``ConnectStandalone(bootstrap, connector, converters)`` writes the worker and connector
properties and runs ``org.apache.kafka.connect.cli.ConnectStandalone`` with a small heap
(``-Xmx512m``); ``status()`` asks its REST API.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from pydblog.devtools.cache import maven_cache
from pydblog.devtools.kafka import KAFKA_VERSION
from pydblog.devtools.pgcluster import free_port

JDBC_VERSION = "3.6.0.Final"
"""Debezium's JDBC sink (3.6.1.Final's jar is not on Maven Central)."""
AGROAL_VERSION = "7.2.0.Final"
APICURIO_VERSION = "2.6.13.Final"
SLF4J_VERSION = "1.7.36"

_SETTINGS = """<settings><mirrors><mirror><id>central</id><mirrorOf>*</mirrorOf>
<url>https://repo.maven.apache.org/maven2</url></mirror></mirrors></settings>
"""


def _pom(name: str, deps: str) -> str:
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>pydblog.devtools</groupId><artifactId>connect-{name}</artifactId><version>1</version>
<packaging>pom</packaging><dependencies>{deps}</dependencies></project>
"""


_NO_KAFKA = ("<exclusions><exclusion><groupId>org.apache.kafka</groupId><artifactId>*</artifactId>"
             "</exclusion>{more}</exclusions>")

_PARTS = {
    "runtime": _pom("runtime", f"""
<dependency><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId>
<version>{KAFKA_VERSION}</version></dependency>
<dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId>
<version>{SLF4J_VERSION}</version></dependency>"""),
    "plugins/jdbc": _pom("jdbc", f"""
<dependency><groupId>io.debezium</groupId><artifactId>debezium-connector-jdbc</artifactId>
<version>{JDBC_VERSION}</version>{_NO_KAFKA.format(more=
    "<exclusion><groupId>org.hibernate</groupId><artifactId>hibernate-agroal</artifactId></exclusion>"
    "<exclusion><groupId>com.fasterxml.jackson.core</groupId><artifactId>*</artifactId></exclusion>")}
</dependency>
<dependency><groupId>org.hibernate.orm</groupId><artifactId>hibernate-agroal</artifactId>
<version>{AGROAL_VERSION}</version><exclusions><exclusion><groupId>org.hibernate.orm</groupId>
<artifactId>hibernate-core</artifactId></exclusion></exclusions></dependency>"""),
    "plugins/apicurio": _pom("apicurio", f"""
<dependency><groupId>io.apicurio</groupId><artifactId>apicurio-registry-utils-converter</artifactId>
<version>{APICURIO_VERSION}</version>{_NO_KAFKA.format(more="")}</dependency>"""),
}


def home() -> Path:
    env = os.environ.get("PYDBLOG_CONNECT_HOME")
    if env:
        return Path(env)
    return maven_cache() / f"connect-{KAFKA_VERSION}"


def unavailable() -> str | None:
    """None if a worker can start here, else why not (naming the fix)."""
    if shutil.which("java") is None:
        return "Kafka Connect needs a Java runtime (17 or later): apt-get install openjdk-17-jre-headless"
    root = home()
    for part in _PARTS:
        if not (root / part).is_dir():
            return (f"Kafka Connect {KAFKA_VERSION} is not installed at {root}: run "
                    "`python -m pydblog.devtools.kafka_connect install` (Maven, Maven Central)")
    return None


def install(root: Path | None = None) -> Path:
    """Resolve every part into ``root`` unless it is there. Raises ``RuntimeError``."""
    root = root or home()
    root.mkdir(parents=True, exist_ok=True)
    mvn = shutil.which("mvn")
    for part, pom in _PARTS.items():
        final = root / part
        if final.is_dir():
            continue
        if mvn is None:
            raise RuntimeError("Maven not found: apt-get install maven")
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="connect-", dir=root) as tmp:
            (Path(tmp) / "pom.xml").write_text(pom)
            (Path(tmp) / "settings.xml").write_text(_SETTINGS)
            out = Path(tmp) / "jars"
            res = subprocess.run(
                [mvn, "-q", "-B", "-s", "settings.xml", "dependency:copy-dependencies",
                 "-DincludeScope=runtime", f"-DoutputDirectory={out}"],
                cwd=tmp, capture_output=True, text=True, check=False)
            if res.returncode != 0 or not any(out.glob("*.jar")):
                raise RuntimeError(f"mvn could not resolve Kafka Connect's {part}: "
                                   f"{(res.stdout + res.stderr)[-2000:]}")
            try:
                out.rename(final)
            except OSError:
                if not final.is_dir():
                    raise
    return root


def _properties(values: Mapping[str, Any]) -> str:
    def esc(v: Any) -> str:
        text = str(v).lower() if isinstance(v, bool) else str(v)
        return text.replace("\\", "\\\\")
    return "".join(f"{k}={esc(v)}\n" for k, v in values.items())


def json_converters() -> dict[str, Any]:
    """``JsonConverter`` with schemas (the ``json-schema`` format), keys and values."""
    out: dict[str, Any] = {}
    for side in ("key", "value"):
        out[f"{side}.converter"] = "org.apache.kafka.connect.json.JsonConverter"
        out[f"{side}.converter.schemas.enable"] = True
    return out


def apicurio_converters(registry_url: str) -> dict[str, Any]:
    """Apicurio's ``AvroConverter`` reading Confluent's wire format (a 4-byte id)."""
    out: dict[str, Any] = {}
    for side in ("key", "value"):
        p = f"{side}.converter"
        out[p] = "io.apicurio.registry.utils.converter.AvroConverter"
        out[f"{p}.apicurio.registry.url"] = registry_url
        out[f"{p}.apicurio.registry.as-confluent"] = True
        out[f"{p}.apicurio.registry.use-id"] = "contentId"
        out[f"{p}.apicurio.registry.headers.enabled"] = False
    return out


class ConnectStandalone:
    """One ``ConnectStandalone`` worker running ``connector`` (its properties) with the
    given converters; offsets in a file of its own directory."""

    def __init__(self, bootstrap: str, connector: Mapping[str, Any],
                 converters: Mapping[str, Any], *, heap_mb: int = 512) -> None:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        self.root = home()
        self.dir = Path(tempfile.mkdtemp(prefix="dblog-connect-"))
        self.port = free_port()
        self.name = str(connector["name"])
        worker = {
            "bootstrap.servers": bootstrap,
            **converters,
            # pydblog's headers are JSON text: SimpleHeaderConverter (the default) makes
            # schemaless maps of them, which Debezium's JDBC sink refuses
            "header.converter": "org.apache.kafka.connect.storage.StringConverter",
            "offset.storage.file.filename": self.dir / "offsets",
            "offset.flush.interval.ms": 1000,
            "plugin.path": self.root / "plugins",  # one plugin per directory in it
            "plugin.discovery": "only_scan",
            "listeners": f"http://127.0.0.1:{self.port}",
            "consumer.auto.offset.reset": "earliest",
            "consumer.isolation.level": "read_committed",
            "consumer.max.poll.records": 500,
            "task.shutdown.graceful.timeout.ms": 2000,
        }
        (self.dir / "worker.properties").write_text(_properties(worker))
        (self.dir / "connector.properties").write_text(_properties(connector))
        self.heap_mb = heap_mb
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_file(self) -> Path:
        return self.dir / "connect.log"

    def log_tail(self, n: int = 6000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return "(no log)"

    def start(self, timeout_s: float = 180.0) -> ConnectStandalone:
        cp = ":".join(str(j) for j in sorted((self.root / "runtime").glob("*.jar")))
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(
                ["java", f"-Xmx{self.heap_mb}m", "-Xms64m", "-XX:+UseSerialGC",
                 "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
                 "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                 "-Dorg.slf4j.simpleLogger.showDateTime=true",
                 "-cp", cp, "org.apache.kafka.connect.cli.ConnectStandalone",
                 str(self.dir / "worker.properties"), str(self.dir / "connector.properties")],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Kafka Connect exited:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError, KeyError):
                if self.status()["tasks"]:
                    return self
            time.sleep(0.5)
        raise RuntimeError(f"Kafka Connect did not run its task in {timeout_s} s:\n{self.log_tail()}")

    def status(self) -> dict[str, Any]:
        """``GET /connectors/<name>/status``."""
        with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/connectors/{self.name}/status", timeout=5) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
            return answer

    def failure(self) -> str | None:
        """The trace of a failed task or connector, if one failed."""
        try:
            st = self.status()
        except (OSError, ValueError):
            return None
        for part in [st.get("connector", {}), *st.get("tasks", [])]:
            if part.get("state") == "FAILED":
                return str(part.get("trace") or part)
        return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ConnectStandalone:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    if argv[1:] == ["install"]:
        print(install())
        return 0
    print("usage: python -m pydblog.devtools.kafka_connect install", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
