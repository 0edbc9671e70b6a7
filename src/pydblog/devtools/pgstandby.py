"""A throwaway hot standby of a ``PgCluster``: ``pg_basebackup -R``, streaming replication.

Used by the tests of read-only snapshots (chunk reads on the standby, the stream from
the primary). It shares the primary's superuser and password; ``stop()`` removes it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg

from pydblog.devtools.pgcluster import PASSWORD, SUPERUSER, PgCluster, _as_postgres, free_port


class PgStandby:
    def __init__(self, primary: PgCluster, *, apply_delay_ms: int = 0) -> None:
        """``apply_delay_ms``: ``recovery_min_apply_delay`` (the standby replays each
        commit that much later than the primary made it: a lagging standby)."""
        self.primary = primary
        self.apply_delay_ms = apply_delay_ms
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dblog-pgstandby-"))
        self.datadir = self.root / "data"

    def start(self, timeout: float = 60.0) -> PgStandby:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        os.chmod(self.root, 0o755)
        bindir = self.primary.bindir
        source = f"postgresql://{SUPERUSER}:{PASSWORD}@127.0.0.1:{self.primary.port}/postgres"
        self._run(
            [str(bindir / "pg_basebackup"), "-d", source, "-D", str(self.datadir), "-R",
             "-X", "stream", "--checkpoint=fast", "--no-sync"]
        )
        with open(self.datadir / "postgresql.conf", "a") as f:
            f.write(f"port = {self.port}\nunix_socket_directories = '{self.root}'\n"
                    "hot_standby = on\nhot_standby_feedback = on\n"
                    f"recovery_min_apply_delay = '{self.apply_delay_ms}ms'\n")
        self._run(
            [str(bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(self.root / "server.log"),
             "-w", "-t", "60", "start"]
        )
        self._wait_streaming(timeout)
        return self

    def _run(self, cmd: list[str]) -> None:
        res = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, check=False)
        if res.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed: {res.stdout}{res.stderr}{tail}")

    def _wait_streaming(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2) as conn:
                    row = conn.execute(
                        "SELECT pg_is_in_recovery(), pg_last_wal_receive_lsn() IS NOT NULL"
                    ).fetchone()
                    if row == (True, True):
                        return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby did not start streaming (see {self.root}/server.log)")
            time.sleep(0.1)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{PASSWORD}@127.0.0.1:{self.port}/{dbname}"

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary.dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        assert row is not None
        target = row[0]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            while True:
                done = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(target),)
                ).fetchone()
                if done and done[0]:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby did not catch up")
                time.sleep(0.05)

    def halt(self) -> None:
        """Shut the standby down but keep it (``resume()`` starts it again): a
        synchronous standby that stops acknowledging commits."""
        subprocess.run(
            _as_postgres([str(self.primary.bindir / "pg_ctl"), "-D", str(self.datadir),
                          "-m", "fast", "-w", "stop"]),
            capture_output=True, check=True,
        )

    def resume(self, timeout: float = 60.0) -> None:
        self._run(
            [str(self.primary.bindir / "pg_ctl"), "-D", str(self.datadir), "-l",
             str(self.root / "server.log"), "-w", "-t", "60", "start"]
        )
        self._wait_streaming(timeout)

    def stop(self) -> None:
        if self.datadir.exists():
            subprocess.run(
                _as_postgres([str(self.primary.bindir / "pg_ctl"), "-D", str(self.datadir),
                              "-m", "immediate", "-w", "stop"]),
                capture_output=True, check=False,
            )
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgStandby:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
