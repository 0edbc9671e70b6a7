"""Throwaway Apache Kafka brokers for tests and benchmarks: Kafka in KRaft mode, from
Maven Central's ``org.apache.kafka:kafka_2.13`` (version ``KAFKA_VERSION``), on loopback.

Where the broker comes from: ``install()`` resolves the artifact and its dependencies with
Maven (a small pom, ``mvn dependency:copy-dependencies``) into ``home()``:

- ``$PYDBLOG_KAFKA_HOME`` if set;
- else ``maven/kafka-<version>`` in ``devtools.cache.cache_root()`` (``$PYDBLOG_CACHE_DIR``,
  else ``/var/cache/pydblog`` as root, else ``~/.cache/pydblog``).

It also formats one storage directory there (``kafka-storage format``, a JVM start of
several seconds): every node copies it and writes its own ``meta.properties`` (cluster
id, node id, directory id), which is all that formatting puts apart per node. Install is
idempotent and safe to run concurrently; ``python -m pydblog.devtools.kafka install``
does it (``.ci/run`` calls it); it needs Maven and a Java runtime (Java 17).

``KafkaCluster(nodes=1)``: one combined broker + controller (``KafkaBroker``); with
``nodes=3`` three combined nodes (a controller quorum of three, so one node may die),
replication factor 3 and ``min.insync.replicas = 2`` for every topic, internal ones too.
Data lives in a temporary directory that survives ``restart()`` of a node (a real log on
disk: a broker that was killed recovers it). Each node runs with ``heap_mb`` of heap
(``-Xmx``, 512 MB by default) and few threads: the machines this runs on are small.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

from pydblog.devtools.cache import maven_cache
from pydblog.devtools.pgcluster import free_port

KAFKA_VERSION = "4.4.0"
SLF4J_VERSION = "1.7.36"  # kafka_2.13's slf4j-api; slf4j-simple is the broker's logger

_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pydblog.devtools</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{KAFKA_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId>
      <version>{SLF4J_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""

_BASE_PROPERTIES = """\
process.roles=broker,controller
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
group.initial.rebalance.delay.ms=0
offsets.topic.num.partitions=3
transaction.state.log.num.partitions=3
share.coordinator.state.topic.num.partitions=1
num.network.threads=2
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
num.replica.fetchers=1
log.cleaner.threads=1
log.cleaner.backoff.ms=1000
log.retention.check.interval.ms=1000
"""


def home() -> Path:
    """Where the jars and the formatted storage template are kept (module docstring)."""
    env = os.environ.get("PYDBLOG_KAFKA_HOME")
    if env:
        return Path(env)
    return maven_cache() / f"kafka-{KAFKA_VERSION}"


def _jars_dir(root: Path) -> Path:
    return root / "jars"


def _template_dir(root: Path) -> Path:
    return root / "template"


def _classpath(root: Path) -> str:
    jars = sorted(_jars_dir(root).glob("*.jar"))
    return ":".join(str(j) for j in jars)


def unavailable() -> str | None:
    """None if a broker can start here, else why not (naming the fix)."""
    if shutil.which("java") is None:
        return "Apache Kafka needs a Java runtime (17 or later): apt-get install openjdk-17-jre-headless"
    root = home()
    if not (_template_dir(root) / "meta.properties").exists():
        return (f"Apache Kafka {KAFKA_VERSION} is not installed at {root}: run "
                "`python -m pydblog.devtools.kafka install` (needs Maven and Maven Central)")
    return None


def _replace_dir(staging: Path, final: Path) -> None:
    """Move ``staging`` to ``final`` atomically unless another install got there first."""
    if final.exists():
        shutil.rmtree(staging, ignore_errors=True)
        return
    try:
        staging.rename(final)
    except OSError:
        if not final.exists():
            raise
        shutil.rmtree(staging, ignore_errors=True)


def install(root: Path | None = None) -> Path:
    """Fetch the jars and format the storage template into ``root`` (default ``home()``)
    unless they are there; returns ``root``. Raises ``RuntimeError`` naming what failed."""
    root = root or home()
    root.mkdir(parents=True, exist_ok=True)
    jars = _jars_dir(root)
    if not jars.exists():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("Maven not found: apt-get install maven (it fetches Apache Kafka's jars)")
        with tempfile.TemporaryDirectory(prefix="kafka-jars-", dir=root) as tmp:
            (Path(tmp) / "pom.xml").write_text(_POM)
            out = Path(tmp) / "jars"
            res = subprocess.run(
                [mvn, "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime",
                 f"-DoutputDirectory={out}"],
                cwd=tmp, capture_output=True, text=True, check=False)
            if res.returncode != 0 or not any(out.glob("kafka_2.13-*.jar")):
                raise RuntimeError(
                    f"mvn could not resolve org.apache.kafka:kafka_2.13:{KAFKA_VERSION}: "
                    f"{(res.stdout + res.stderr)[-2000:]}")
            _replace_dir(out, jars)
    template = _template_dir(root)
    if not (template / "meta.properties").exists():
        if shutil.which("java") is None:
            raise RuntimeError("Apache Kafka needs a Java runtime: apt-get install openjdk-17-jre-headless")
        with tempfile.TemporaryDirectory(prefix="kafka-format-", dir=root) as tmp:
            data = Path(tmp) / "data"
            props = Path(tmp) / "server.properties"
            props.write_text(_BASE_PROPERTIES + "node.id=1\ncontroller.quorum.voters=1@127.0.0.1:9093\n"
                             "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093\n"
                             f"log.dirs={data}\n")
            res = subprocess.run(
                ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", _classpath(root),
                 "kafka.tools.StorageTool", "format", "-t", _random_id(), "-c", str(props)],
                capture_output=True, text=True, check=False)
            if res.returncode != 0 or not (data / "meta.properties").exists():
                raise RuntimeError(f"kafka-storage format failed: {(res.stdout + res.stderr)[-2000:]}")
            shutil.rmtree(template, ignore_errors=True)  # an incomplete earlier attempt
            _replace_dir(data, template)
    archive = _archive(root)
    if not archive.exists():
        _dump_archive(root)
    return root


def _archive(root: Path) -> Path:
    return root / "classes.jsa"


def _dump_archive(root: Path) -> None:
    """Start a broker once and stop it cleanly with ``-XX:ArchiveClassesAtExit``: the JVM
    writes the classes it loaded into a class-data-sharing archive, which halves the CPU
    of every later start (about 1.4 s instead of 2.6 s). Without it brokers still start."""
    with tempfile.TemporaryDirectory(prefix="kafka-cds-", dir=root) as tmp:
        cluster = KafkaCluster(1, heap_mb=256, install_root=root)
        node = cluster.nodes[0]
        node.java_options = [f"-XX:ArchiveClassesAtExit={tmp}/classes.jsa"]
        try:
            node.start()
            node.stop()
        finally:
            cluster.stop()
        dumped = Path(tmp) / "classes.jsa"
        if dumped.exists() and not _archive(root).exists():
            dumped.rename(_archive(root))


def _random_id() -> str:
    """A Kafka ``Uuid`` as Kafka prints it (URL-safe base64 of 16 bytes, no padding)."""
    while True:
        raw = uuid.uuid4().bytes
        text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        if not text.startswith("-"):  # Kafka's own rule: an id is never printed with a leading '-'
            return text


_LIVE: set[KafkaNode] = set()


def _kill_all() -> None:
    for node in list(_LIVE):
        node.kill()


atexit.register(_kill_all)


class KafkaNode:
    """One combined broker + controller process of a ``KafkaCluster``."""

    def __init__(self, cluster: KafkaCluster, node_id: int, port: int, controller_port: int) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.dir = cluster.root / f"node{node_id}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_mark = 0
        self.java_options: list[str] = []
        """More JVM options (before the class-data-sharing archive's)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.dir / "broker.log"

    def _prepare(self) -> None:
        data = self.dir / "data"
        if not data.exists():
            shutil.copytree(_template_dir(self.cluster.install_root), data)
            meta = data / "meta.properties"
            meta.chmod(0o644)
            meta.write_text(f"node.id={self.node_id}\ndirectory.id={_random_id()}\nversion=1\n"
                            f"cluster.id={self.cluster.cluster_id}\n")
        c = self.cluster
        rf = min(3, len(c.nodes))
        isr = 2 if rf >= 3 else 1
        advertised = c.advertised_by_node.get(self.node_id, self.address)
        (self.dir / "server.properties").write_text(
            _BASE_PROPERTIES
            + f"node.id={self.node_id}\ncontroller.quorum.voters={c.voters}\n"
            f"listeners=PLAINTEXT://{self.address},CONTROLLER://127.0.0.1:{self.controller_port}\n"
            f"advertised.listeners=PLAINTEXT://{advertised}\n"
            f"log.dirs={data}\n"
            f"default.replication.factor={rf}\nmin.insync.replicas={isr}\n"
            f"offsets.topic.replication.factor={rf}\n"
            f"transaction.state.log.replication.factor={rf}\ntransaction.state.log.min.isr={isr}\n"
            f"share.coordinator.state.topic.replication.factor={rf}\n"
            f"share.coordinator.state.topic.min.isr={isr}\n"
            + ("broker.session.timeout.ms=6000\nbroker.heartbeat.interval.ms=1000\n" if rf > 1 else "")
            + "".join(f"{k}={v}\n" for k, v in c.properties.items())
        )

    def launch(self) -> None:
        """Start the process (do not wait for it: a node of a cluster of three waits for
        a quorum of controllers)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self._prepare()
        self._log_mark = self.log_file.stat().st_size if self.log_file.exists() else 0
        root = self.cluster.install_root
        jvm = [*self.java_options]
        if not self.cluster.optimize:
            jvm.append("-XX:TieredStopAtLevel=1")
        if _archive(root).exists() and not any("ArchiveClassesAtExit" in o for o in jvm):
            jvm.append(f"-XX:SharedArchiveFile={_archive(root)}")
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(
                ["java", f"-Xmx{self.cluster.heap_mb}m", f"-Xms{min(64, self.cluster.heap_mb)}m",
                 *jvm, "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                 "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                 "-Dorg.slf4j.simpleLogger.showDateTime=true",
                 "-Dorg.slf4j.simpleLogger.log.kafka.server.KafkaRaftServer=info",
                 "-Dorg.slf4j.simpleLogger.log.kafka.server.BrokerServer=info",
                 "-cp", _classpath(root), "kafka.Kafka",
                 str(self.dir / "server.properties")],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        _LIVE.add(self)

    def wait_started(self, timeout_s: float = 180.0) -> None:
        """Until the node logs that it started (it has caught up with the metadata log
        and opens its listener to clients)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"Kafka node {self.node_id} exited:\n{self._log_tail()}")
            with self.log_file.open("rb") as f:
                f.seek(self._log_mark)
                if b"Kafka Server started" in f.read():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"Kafka node {self.node_id} did not start in {timeout_s} s:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return "(no log)"

    def start(self, timeout_s: float = 180.0) -> None:
        self.launch()
        self.wait_started(timeout_s)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def kill(self) -> None:
        """SIGKILL (``kill -9``): no controlled shutdown, the log is recovered at start."""
        self._stop(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM: a controlled shutdown (leadership moves away first)."""
        self._stop(signal.SIGTERM)

    def _stop(self, sig: int) -> None:
        _LIVE.discard(self)
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, kill: bool = False, timeout_s: float = 180.0) -> None:
        self._stop(signal.SIGKILL if kill else signal.SIGTERM)
        self.start(timeout_s)


class KafkaCluster:
    """``nodes`` combined broker + controller nodes; ``start()`` (or a context manager),
    ``bootstrap`` is every node's address. ``properties``: more broker settings.
    ``optimize``: the JVM's optimizing compiler too (for benchmarks); without it (tests)
    a node starts with about half the CPU and runs slower."""

    def __init__(self, nodes: int = 1, *, heap_mb: int = 512, optimize: bool = False,
                 properties: dict[str, str] | None = None, install_root: Path | None = None) -> None:
        if nodes < 1:
            raise ValueError("a Kafka cluster needs at least one node")
        if install_root is None:
            reason = unavailable()
            if reason is not None and "not installed" in reason:
                install()
                reason = unavailable()
            if reason is not None:
                raise RuntimeError(reason)
        self.install_root = install_root or home()
        self.heap_mb = heap_mb
        self.optimize = optimize
        self.properties = dict(properties or {})
        self.cluster_id = _random_id()
        self.root = Path(tempfile.mkdtemp(prefix="dblog-kafka-"))
        self.nodes = [KafkaNode(self, i + 1, free_port(), free_port()) for i in range(nodes)]
        self.advertised_by_node: dict[int, str] = {}
        """Node id -> the address the node tells clients to connect to (a proxy's, in a
        test that puts one in front of it); set before ``start()``."""

    @property
    def voters(self) -> str:
        return ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def start(self, timeout_s: float = 180.0) -> Self:
        for n in self.nodes:
            n.launch()
        try:
            for n in self.nodes:
                n.wait_started(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def leader(self, topic: str, partition: int = 0, timeout_s: float = 30.0) -> KafkaNode:
        """The node that leads ``topic``'s ``partition`` now (as the metadata says)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout_s
        while True:
            md = admin.list_topics(topic, timeout=10)
            t = md.topics.get(topic)
            if t is not None and t.error is None and partition in t.partitions:
                leader = t.partitions[partition].leader
                if leader >= 1:
                    return self.node(leader)
            if time.monotonic() > deadline:
                raise RuntimeError(f"no leader for {topic}[{partition}] after {timeout_s} s")
            time.sleep(0.2)

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()  # a throwaway cluster: its data goes with it
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class KafkaBroker(KafkaCluster):
    """A single node (``KafkaCluster(1)``) with the interface of the other test brokers:
    ``port``, ``advertised``, ``stop_broker(kill)``, ``restart(kill)``."""

    def __init__(self, *, heap_mb: int = 512, optimize: bool = False,
                 properties: dict[str, str] | None = None) -> None:
        super().__init__(1, heap_mb=heap_mb, optimize=optimize, properties=properties)
        self.port = self.nodes[0].port

    @property
    def advertised(self) -> str:
        """The address the broker tells clients to connect to (set before ``start()``)."""
        return self.advertised_by_node.get(1, self.nodes[0].address)

    @advertised.setter
    def advertised(self, address: str) -> None:
        self.advertised_by_node[1] = address

    @property
    def pid(self) -> int | None:
        return self.nodes[0].pid

    def stop_broker(self, kill: bool = False) -> None:
        """Stop the broker (``kill``: SIGKILL); its data directory stays."""
        if kill:
            self.nodes[0].kill()
        else:
            self.nodes[0].stop()

    def restart(self, kill: bool = False) -> None:
        self.nodes[0].restart(kill)


def main(argv: list[str]) -> int:
    usage = ("usage: python -m pydblog.devtools.kafka install\n"
             "       python -m pydblog.devtools.kafka run [NODES]   (a broker until Ctrl-C)")
    if argv[1:2] == ["install"] and len(argv) == 2:
        try:
            path = install()
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        reason = unavailable()
        print(f"Apache Kafka {KAFKA_VERSION}: {path}" + (f" (cannot run: {reason})" if reason else ""))
        return 0 if reason is None else 1
    if argv[1:2] == ["run"] and len(argv) <= 3:
        with KafkaCluster(int(argv[2]) if len(argv) == 3 else 1) as cluster:
            print(f"KAFKA_BOOTSTRAP_SERVERS={cluster.bootstrap}", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
