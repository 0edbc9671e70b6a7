"""A throwaway PostgreSQL cluster: ``initdb`` in a temporary directory, ``wal_level=logical``.

Used by the demo, the tests and the benchmarks. When running as root, the server runs
as the ``postgres`` user through ``runuser`` (PostgreSQL refuses to run as root).
The superuser is ``postgres`` with password ``postgres``; TCP connections on
127.0.0.1 use scram-sha-256, the Unix socket in the cluster directory is trusted.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

SUPERUSER = "postgres"
PASSWORD = "postgres"


def find_bindir() -> Path:
    """The newest PostgreSQL server binaries on this machine."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError(
        "PostgreSQL server binaries (initdb) not found: install Debian's `postgresql` package"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


class PgCluster:
    """Start with ``start()`` (or as a context manager); ``stop()`` removes everything."""

    def __init__(self, *, port: int | None = None, settings: dict[str, str] | None = None,
                 base_dir: str | None = None) -> None:
        self.bindir = find_bindir()
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dblog-pg-", dir=base_dir))
        self.datadir = self.root / "data"
        self.sockdir = self.root
        self.settings = {
            "wal_level": "logical",
            "max_replication_slots": "40",
            "max_wal_senders": "40",
            "max_connections": "200",
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.sockdir}'",
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "128MB",
            "wal_sender_timeout": "60s",
            "logging_collector": "off",
            **(settings or {}),
        }

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> PgCluster:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        os.chmod(self.root, 0o755)
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(
            [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", SUPERUSER,
             f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
             "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"]
        )
        with open(self.datadir / "postgresql.conf", "a") as f:
            for k, v in self.settings.items():
                f.write(f"{k} = {v}\n")
        with open(self.datadir / "pg_hba.conf", "a") as f:
            f.write("host replication all 127.0.0.1/32 scram-sha-256\n")
        self._run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l",
             str(self.root / "server.log"), "-w", "-t", "60", "start"]
        )
        return self

    def stop(self) -> None:
        if self.datadir.exists():
            subprocess.run(
                _as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m",
                              "immediate", "-w", "stop"]),
                capture_output=True, check=False,
            )
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self, cmd: list[str]) -> None:
        res = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, check=False)
        if res.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed: {res.stdout}{res.stderr}{tail}")

    # -- connections -----------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER,
            password: str | None = PASSWORD) -> str:
        auth = f"{user}:{password}" if password is not None else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def wait_ready(self, timeout: float = 30.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
