"""The capture service's retries (``capture.service._capture``) against a real
PostgreSQL whose walsender is terminated under a running capture."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import psycopg
import pytest

from pydblog.capture import service
from pydblog.config import load_config
from tests.helpers import wait_for, write_config


def _walsender(dsn: str, slot: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                           (slot,)).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def test_the_retry_delay_starts_over_after_a_healthy_run(
    pg_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The delay before a retry doubles while errors come close together, up to 30 s;
    once a runner captured ``HEALTHY_S`` (here 1 s) before its error, the next retry
    waits the first delay again (it never started over: a capture that lost its server
    now and then waited 30 s at every reconnection after the fifth)."""
    monkeypatch.setattr(service, "HEALTHY_S", 1.0)
    slot = "retry_" + Path(tmp_path).name[-8:].replace("-", "_").lower()
    cfg = load_config(write_config(tmp_path, pg_db, source_extra=f'slot = "{slot}"\n'))
    stop = threading.Event()
    failed: list[BaseException] = []

    def capture() -> None:
        try:
            service._capture(cfg, stop, None)
        except BaseException as exc:  # (reported by the test)
            failed.append(exc)

    caplog.set_level(logging.WARNING, logger="pydblog.capture.service")
    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    try:
        for n in range(1, 3):
            wait_for(lambda: bool(failed) or _walsender(pg_db, slot) is not None, 60,
                     "the capture's walsender")
            assert not failed, failed
            time.sleep(1.2)  # a healthy run: longer than HEALTHY_S
            pid = _walsender(pg_db, slot)
            with psycopg.connect(pg_db, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            def retried(n: int = n) -> bool:
                return bool(failed) or len(re.findall(r"retrying in", caplog.text)) >= n

            wait_for(retried, 60, "the capture's retry")
            assert not failed, failed
    finally:
        stop.set()
        thread.join(60)
    delays = re.findall(r"retrying in ([\d.]+) s", caplog.text)
    assert delays == ["1.0", "1.0"], caplog.text[-3000:]
