"""A throwaway MariaDB server: a datadir in a temporary directory, row-based binlog.

Used by the MySQL source's tests and benchmark. When running as root the server runs as
the ``mysql`` user through ``runuser`` (as Debian's packages set it up). It listens on a
random port on 127.0.0.1 and on a socket in its own directory; ``stop()`` kills it and
removes the directory. ``mariadb-install-db`` runs once per process into a template
datadir that every server copies (it took ~2-4 s a server; a copy ~0.1 s).

Settings: ``log_bin``, ``binlog_format=ROW``, ``binlog_row_image=FULL``,
``binlog_row_metadata=FULL``, a ``server_id``, GTIDs (MariaDB always writes them) and
durability turned down for speed (this is a test server). The superuser is ``root`` with
password ``root`` on TCP.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

SUPERUSER = "root"
PASSWORD = "root"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_binaries() -> tuple[Path, Path]:
    """``(mariadbd, mariadb-install-db)``; ``RuntimeError`` naming the package if missing."""
    server = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/local/sbin")
    install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    if not server or not install:
        raise RuntimeError(
            "MariaDB server binaries (mariadbd, mariadb-install-db) not found: "
            "install Debian's `mariadb-server` package (.ci/install-mariadb.sh)"
        )
    return Path(server), Path(install)


def _as_mysql(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "mysql", "--", *cmd]
    return cmd


class _Client:
    """Connections to a private server as its superuser, shared by the MariaDB and
    MySQL 5.7 test servers (both set ``port`` and ``socket``)."""

    port: int
    socket: Path

    def dsn(
        self, database: str = "", user: str = SUPERUSER, password: str | None = PASSWORD
    ) -> str:
        auth = f"{user}:{password}" if password is not None else user
        return f"mysql://{auth}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str | None = None, *, via_socket: bool = False) -> Any:
        """A pymysql connection as the superuser (autocommit)."""
        import pymysql

        if via_socket:
            return pymysql.connect(
                unix_socket=str(self.socket), user="root", database=database, autocommit=True
            )
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user=SUPERUSER,
            password=PASSWORD,
            database=database,
            autocommit=True,
            charset="utf8mb4",
        )

    def admin(self, database: str | None = None, *, via_socket: bool = False) -> _Cursor:
        return _Cursor(self.connect(database, via_socket=via_socket))

    def execute(self, sql: str, database: str | None = None) -> list[tuple[Any, ...]]:
        with self.admin(database) as cur:
            cur.execute(sql)
            return list(cur.fetchall())

    def create_database(self, name: str) -> str:
        self.execute(f"CREATE DATABASE `{name}`")
        return self.dsn(name)


_TEMPLATE: Path | None = None
_TEMPLATE_LOCK = threading.Lock()
_INSTALL_OPTIONS = (
    "--auth-root-authentication-method=normal",
    "--skip-test-db",
    "--skip-name-resolve",
    "--innodb-log-file-size=16M",
    "--innodb-buffer-pool-size=32M",
)


def _template(install_db: Path) -> Path:
    """A freshly installed datadir (once per process), copied by every server. It holds
    nothing of a particular server: ``mariadb-install-db`` runs without a binlog, port,
    server id or socket, which are the server's options at start."""
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        if _TEMPLATE is not None and _TEMPLATE.exists():
            return _TEMPLATE
        base = Path(tempfile.mkdtemp(prefix="dblog-maria-template-"))
        os.chmod(base, 0o755)
        if os.geteuid() == 0:
            shutil.chown(base, "mysql", "mysql")
        datadir = base / "data"
        # Its own temporary directory: once in a loaded run the bootstrap in the shared
        # /tmp failed ("Could not remove temporary table: '/tmp/#sql-temptable-...'",
        # "Unknown table 'mysql.tmp_user_sys'").
        tmp = base / "tmp"
        tmp.mkdir()
        if os.geteuid() == 0:
            shutil.chown(tmp, "mysql", "mysql")
        cmd = [str(install_db), "--no-defaults", f"--datadir={datadir}", *_INSTALL_OPTIONS,
               f"--tmpdir={tmp}"]
        res = subprocess.run(_as_mysql(cmd), capture_output=True, text=True, check=False)
        if res.returncode != 0:
            shutil.rmtree(base, ignore_errors=True)
            raise RuntimeError(f"{' '.join(cmd)} failed: {res.stdout[-2000:]}{res.stderr[-2000:]}")
        _TEMPLATE = datadir
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        return datadir


class MariaDB(_Client):
    """Start with ``start()`` (or as a context manager); ``stop()`` removes everything.

    ``settings`` are extra ``--name=value`` server options (e.g.
    ``{"binlog_format": "STATEMENT"}`` for a deliberately misconfigured server);
    ``binlog_name`` is the binlog files' base name (``<name>.000001``, …).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        server_id: int = 1,
        settings: dict[str, str] | None = None,
        base_dir: str | None = None,
        binlog_name: str = "mariadb-bin",
    ) -> None:
        self.server, self.install_db = find_binaries()
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dblog-maria-", dir=base_dir))
        self.datadir = self.root / "data"
        self.socket = self.root / "mysqld.sock"
        self.settings = {
            "log_bin": str(self.root / "binlog" / binlog_name),
            "binlog_format": "ROW",
            "binlog_row_image": "FULL",
            "binlog_row_metadata": "FULL",
            "server_id": str(server_id),
            "gtid_domain_id": "0",
            "log_slave_updates": "ON",
            "bind_address": "127.0.0.1",
            "port": str(self.port),
            "socket": str(self.socket),
            "pid_file": str(self.root / "mysqld.pid"),
            "log_error": str(self.root / "error.log"),
            "skip_name_resolve": "ON",
            "max_connections": "300",
            "innodb_buffer_pool_size": "128M",
            "innodb_log_file_size": "64M",
            "innodb_flush_log_at_trx_commit": "2",
            "sync_binlog": "0",
            "innodb_doublewrite": "0",
            "character_set_server": "utf8mb4",
            "collation_server": "utf8mb4_general_ci",
            "default_time_zone": "+00:00",
            "max_binlog_size": "256M",
            # Its own temporary files: in the shared /tmp another process's cleanup took
            # a server's temporary table away ("Could not remove temporary table").
            "tmpdir": str(self.root / "tmp"),
            **(settings or {}),
        }
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> MariaDB:
        shutil.copytree(_template(self.install_db), self.datadir, symlinks=True)
        (self.root / "binlog").mkdir()
        (self.root / "tmp").mkdir()
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
        # runuser forks the server: make sure it is gone too.
        pidfile = self.root / "mysqld.pid"
        if pidfile.exists():
            with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
                os.kill(int(pidfile.read_text().strip()), 9)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> MariaDB:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _error_log(self) -> str:
        log = self.root / "error.log"
        return log.read_text(errors="replace")[-3000:] if log.exists() else ""

    def _wait_socket(self, timeout: float) -> None:
        """Until the server accepts on its socket (probed with plain sockets: a failed
        pymysql connect leaks its socket)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited at start:\n{self._error_log()}")
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(self.socket))
                    if probe.recv(1):  # the server's greeting
                        return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mariadbd did not accept connections:\n{self._error_log()}")
            time.sleep(0.1)

    def _bootstrap_users(self) -> None:
        with self.admin(via_socket=True) as cur:
            cur.execute(
                f"CREATE OR REPLACE USER '{SUPERUSER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'"
            )
            cur.execute(f"GRANT ALL ON *.* TO '{SUPERUSER}'@'127.0.0.1' WITH GRANT OPTION")

    # -- replication (failover tests) ------------------------------------------------
    def replicate_from(self, primary: Any) -> None:
        """Become a GTID replica of ``primary`` (``MASTER_USE_GTID=slave_pos``, from the
        start of its binlog). Keep ``log_slave_updates`` on (the default here) so that
        this server's own binlog holds the primary's transactions, under their GTIDs."""
        self.execute(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={primary.port}, "
            f"MASTER_USER='{SUPERUSER}', MASTER_PASSWORD='{PASSWORD}', "
            "MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1"
        )
        self.execute("START SLAVE")

    def wait_caught_up(self, primary: Any, timeout: float = 60.0) -> None:
        """Until this replica has applied everything in ``primary``'s binlog so far."""
        pos = str(primary.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
        got = self.execute(f"SELECT MASTER_GTID_WAIT('{pos}', {timeout})")[0][0]
        if got != 0:
            status = self.execute("SHOW SLAVE STATUS")
            raise RuntimeError(f"replica did not reach {pos} in {timeout} s: {status}")

    def promote(self) -> None:
        """Stop replicating and forget the primary: this server takes the writes now."""
        self.execute("STOP SLAVE")
        self.execute("RESET SLAVE ALL")


class _Cursor:
    """A cursor whose connection closes with it (``with mdb.admin() as cur:``)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __enter__(self) -> Any:
        self.cur = self.conn.cursor()
        return self.cur

    def __exit__(self, *exc: object) -> None:
        self.cur.close()
        self.conn.close()
