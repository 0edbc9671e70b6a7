"""The change log's figures for ``/metrics`` and the status page: size (when the
backend knows it), first and next offset.

A scrape never waits long for them: a refresh runs in its own thread, one at a time,
and a caller waits at most ``wait_s`` for it, else it gets the last figures (None before
the first). A Kafka log keeps one ``KafkaLogFigures`` across refreshes (it reads only
the checkpoint messages that are new), so a refresh costs the same after an hour as
after a minute; an embedded log is read afresh each time (a few SQLite queries).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pydblog.api.events import open_log_reader
from pydblog.config import LogConfig

log = logging.getLogger(__name__)

WAIT_S = 2.0


class LogFigures:
    def __init__(self, cfg: LogConfig, wait_s: float = WAIT_S) -> None:
        self.cfg = cfg
        self.wait_s = wait_s
        self._last: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._running: threading.Thread | None = None
        self._kafka: Any = None  # KafkaLogFigures, made on first use
        self._closed = False

    def get(self) -> dict[str, Any] | None:
        """``{"size_bytes", "first_offset", "next_offset"}`` as fresh as ``wait_s``
        allows, or None while the log does not exist (or before a first refresh
        finished)."""
        with self._lock:
            if self._running is None or not self._running.is_alive():
                self._running = threading.Thread(target=self._refresh, name="dblog-log-figures",
                                                 daemon=True)
                self._running.start()
            running = self._running
        running.join(self.wait_s)
        if running.is_alive():
            log.debug("change-log figures not refreshed within %.1f s: serving the last ones",
                      self.wait_s)
        return self._last

    def _refresh(self) -> None:
        try:
            self._last = self._read()
        except Exception as exc:  # figures for metrics: the last ones stay
            log.debug("refreshing the change-log figures failed: %s", exc)
            self._drop_kafka()

    def _read(self) -> dict[str, Any] | None:
        if self.cfg.type == "kafka":
            from pydblog.changelog.kafka.reader import KafkaLogFigures

            with self._lock:
                if self._closed:
                    return self._last
                if self._kafka is None:
                    self._kafka = KafkaLogFigures(self.cfg)
                figures = self._kafka
            got = figures.figures()
            if got is None:
                return None
            return {"size_bytes": None, "first_offset": got[0], "next_offset": got[1]}
        reader = open_log_reader(self.cfg)
        if reader is None:
            return None
        try:
            size = reader.describe().get("size_bytes")
            return {"size_bytes": size, "first_offset": reader.first_offset(),
                    "next_offset": reader.next_offset()}
        finally:
            reader.close()

    def _drop_kafka(self) -> None:
        with self._lock:
            figures, self._kafka = self._kafka, None
        if figures is not None:
            figures.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            running = self._running
        if running is None or not running.is_alive():
            self._drop_kafka()
        # (a refresh still running keeps its client; the daemon thread ends with it)
