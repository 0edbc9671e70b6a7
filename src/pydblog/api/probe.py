"""The API's source probe: a thread that asks the source, on its own connection, every
``interval_s``: is it reachable, how much log does it retain for us (slot lag), and a
change marker (has anything been written since our last logged event?).

The change marker is what DBLog's idle rule needs ("nothing captured for N minutes is
only a problem when the source has changed meanwhile"); positions alone cannot say it,
since the capture's own heartbeats move the WAL. PostgreSQL: the next transaction id
(``txid_snapshot_xmax``; heartbeats are non-transactional messages and take none).
MySQL/MariaDB: the binary log's ``(file, position)`` (its heartbeats write nothing).

Invariant: the probe never touches the capture's connections, except MySQL's lag,
which the binlog source computes under its own lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import Any

from pydblog.api.live import LiveCapture
from pydblog.config import Config, redact_dsn
from pydblog.metrics import CaptureMetrics
from pydblog.sources.postgres.connect import connect

log = logging.getLogger(__name__)

HISTORY_POINTS = 180


class SourceProbe:
    def __init__(self, cfg: Config, live: LiveCapture, metrics: CaptureMetrics,
                 interval_s: float) -> None:
        self.cfg = cfg
        self.live = live
        self.metrics = metrics
        self.interval_s = interval_s
        self.reachable: bool | None = None
        self.error: str | None = None
        self.checked_at: float | None = None
        self.lag_bytes: int | None = None
        self.marker: Any = None
        self._baseline: Any = None
        self._seen_event: float | None = None
        self.history: deque[tuple[float, int | None, float | None, float]] = deque(
            maxlen=HISTORY_POINTS)
        self._conn: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dblog-probe", daemon=True)

    def start(self) -> SourceProbe:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._drop()

    def source_moved(self) -> bool | None:
        """Whether the source's change marker moved since the last logged event (since
        the probe's first look when nothing was logged yet); None when unknown."""
        if self.marker is None or self._baseline is None:
            return None
        return bool(self.marker != self._baseline)

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self.probe_once()
            self._stop.wait(self.interval_s)

    def probe_once(self) -> None:
        try:
            marker, lag = self._ask()
        except Exception as exc:
            self._drop()
            self.reachable = False
            self.error = redact_dsn(str(exc).strip().splitlines()[0] if str(exc).strip() else
                                    type(exc).__name__)
            self.checked_at = time.time()
            return
        self.reachable, self.error, self.checked_at = True, None, time.time()
        self.lag_bytes = lag
        if lag is not None:
            self.metrics.source_lag_bytes.set(lag)
        self.marker = marker
        last = self.metrics.last_event_time
        runner = self.live.runner
        if runner is None or not runner.opened:
            self._baseline = None  # the capture's own set-up (tables, publication) writes
        elif self._baseline is None or last != self._seen_event:
            self._seen_event = last
            self._baseline = marker
        status = self.live.status() or {}
        self.history.append((round(time.time(), 1), lag, self.metrics.lag_seconds,
                             float(status.get("events_per_second") or 0.0)))

    def _ask(self) -> tuple[Any, int | None]:
        if self.cfg.source.type == "postgres":
            return self._ask_postgres()
        return self._ask_mysql()

    def _ask_postgres(self) -> tuple[Any, int | None]:
        if self._conn is None:
            self._conn = connect(self.cfg.source.dsn, timeout_s=min(5.0, self.interval_s * 2))
        row = self._conn.execute(
            "SELECT txid_snapshot_xmax(txid_current_snapshot())::text, "
            # (a hot standby's capture: its WAL position is what it has replayed)
            "(SELECT ((CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
            "ELSE pg_current_wal_lsn() END) - confirmed_flush_lsn)::bigint "
            " FROM pg_replication_slots WHERE slot_name = %s)",
            (self.cfg.source.slot,),
        ).fetchone()
        assert row is not None
        return row[0], None if row[1] is None else int(row[1])

    def _ask_mysql(self) -> tuple[Any, int | None]:
        from pydblog.sources.mysql.connect import MySqlDsn, connect

        if self._conn is None:
            self._conn = connect(MySqlDsn.parse(self.cfg.source.dsn),
                                 timeout_s=min(5.0, self.interval_s * 2))
        with self._conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        marker = None if row is None else (str(row[0]), int(row[1]))
        lag = None
        runner = self.live.runner
        if runner is not None and runner.opened:
            with contextlib.suppress(Exception):
                lag = runner.source.lag_bytes()
        return marker, lag

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
