"""A throwaway ZooKeeper server (Debian's ``zookeeper`` package) for tests and benchmarks:
standalone, in the foreground, on a free loopback port, data in a temporary directory.

``restart()`` keeps the data directory, so sessions survive a restart that is shorter
than their timeout (as with a real ensemble member coming back).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from pydblog.devtools.pgcluster import free_port

JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/zookeeper-jute.jar",
        "/usr/share/java/slf4j-api.jar", "/usr/share/java/slf4j-simple.jar")


def available() -> bool:
    return Path(JARS[0]).exists() and shutil.which("java") is not None


class ZkServer:
    def __init__(self, *, tick_ms: int = 500, port: int | None = None) -> None:
        if not available():
            raise RuntimeError("ZooKeeper not found: apt-get install zookeeper (and a Java runtime)")
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dblog-zk-"))
        (self.root / "data").mkdir()
        (self.root / "zoo.cfg").write_text(
            f"tickTime={tick_ms}\nclientPortAddress=127.0.0.1\nclientPort={self.port}\n"
            f"dataDir={self.root / 'data'}\nadmin.enableServer=false\nmaxClientCnxns=200\n"
            f"minSessionTimeout={2 * tick_ms}\nmaxSessionTimeout={60 * tick_ms}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ZkServer:
        cp = ":".join(j for j in JARS if Path(j).exists())
        with open(self.root / "zk.log", "ab") as out:
            self.proc = subprocess.Popen(
                ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", cp,
                 "org.apache.zookeeper.server.ZooKeeperServerMain", str(self.root / "zoo.cfg")],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.root,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"ZooKeeper exited: {(self.root / 'zk.log').read_text()[-2000:]}")
            if self._ruok():
                return self
            time.sleep(0.05)
        self.kill()  # not left running
        raise RuntimeError("ZooKeeper did not start in time: "
                           f"{(self.root / 'zk.log').read_text()[-2000:]}")

    def _ruok(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"srvr")
                return b"Mode" in s.recv(4096)
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self, down_s: float = 0.0) -> None:
        self.kill()
        if down_s:
            time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ZkServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
