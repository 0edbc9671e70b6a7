"""A `dblog run` process driven by a contract scenario, with the oracle built in."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from pydblog.capture.status import STATUS_FILE
from pydblog.changelog import log_exists, open_reader
from pydblog.config import load_config
from pydblog.devtools.proc import end_process
from pydblog.events import decode_envelope
from pydblog.ports import ChangeLogReader
from tests.contract.harness import Harness
from tests.helpers import materialize, start_run, stop_run, wait_for

Event = dict[str, Any]


class Capture:
    def __init__(self, harness: Harness, directory: Path, extra: str = "") -> None:
        self.h = harness
        self.config = harness.config(directory, extra)
        self.log_cfg = load_config(self.config).log
        self.log_dir = load_config(self.config).log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: ChangeLogReader | None = None
        self._events: list[Event] = []  # the log read so far (see ``events``)
        self._next = 0  # the offset after the last one read
        self._err = b""  # the running capture's stderr read so far (``_stderr_so_far``)

    def start(self) -> Capture:
        self.proc = start_run(self.config)
        return self

    def stop(self) -> str:
        assert self.proc is not None
        code, err = stop_run(self.proc)
        self.proc = None
        assert code == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        return err

    def kill(self) -> None:
        assert self.proc is not None
        _, _, err = end_process(self.proc, kill=True)
        self._end_log(err.decode(errors="replace"))
        self.proc = None

    def _end_log(self, rest: str) -> None:
        """The ended run's log (what was read of it so far, then ``rest``), kept under
        ``DBLOG_TEST_LOG_DIR`` (with DBLOG_TEST_VERBOSE=1: -v) for a look."""
        err, self._err = self._err.decode(errors="replace") + rest, b""
        keep = os.environ.get("DBLOG_TEST_LOG_DIR")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / f"{self.log_dir.parent.name}-{os.getpid()}-{time.time_ns()}.log").write_text(err)

    def _stderr_so_far(self) -> str:
        """What the running capture has logged so far, read without blocking (kept for
        ``kill`` and ``__exit__``, which read the rest)."""
        if self.proc is None or self.proc.stderr is None:
            return ""
        fd = self.proc.stderr.fileno()
        os.set_blocking(fd, False)
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self._err += chunk
        except BlockingIOError:
            pass
        finally:
            os.set_blocking(fd, True)
        return self._err.decode(errors="replace")

    def __enter__(self) -> Capture:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            _, err = stop_run(self.proc)
            self._end_log(err)
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def events(self) -> list[Event]:
        """The change log, read in-process (`dblog tail` itself is tested elsewhere;
        a subprocess per poll made waits slow enough to miss short-lived states).

        Read incrementally: only the records past the last one read are fetched and
        decoded (a committed offset never changes, and these scenarios set no retention),
        so a wait polling a log of 20k events no longer re-decodes it all five times a
        second on a 2-core machine shared with the capture it waits for. The events
        returned are shared between calls: do not mutate them."""
        if self._reader is None:
            if not log_exists(self.log_cfg):
                return list(self._events)
            self._reader = open_reader(self.log_cfg)
        for r in self._reader.read(self._next, 10**9):
            self._events.append(decode_envelope(r.offset, r.body))
            self._next = r.offset + 1
        return list(self._events)

    def notifications(self, kind: str | None = None) -> list[Event]:
        return [
            e for e in self.events()
            if e["op"] == "n" and (kind is None or e["notification"]["type"] == kind)
        ]

    def wait_until(self, pred: Callable[[list[Event]], bool], timeout: float = 120,
                   what: str = "condition") -> list[Event]:
        box: list[list[Event]] = [[]]

        def check() -> bool:
            box[0] = self.events()
            if pred(box[0]):
                return True
            if self.proc is not None and self.proc.poll() is not None:  # (it will not come)
                raise AssertionError(f"`dblog run` exited ({self.proc.returncode}) while waiting "
                                     f"for {what}:\n{self._stderr_so_far()[-6000:]}")
            return False

        try:
            wait_for(check, timeout, what, 0.1)  # (a poll reads only what is new)
        except AssertionError as e:  # what the capture was doing, in the failure itself
            raise AssertionError(f"{e}; `dblog run` logged:\n{self._stderr_so_far()[-6000:]}") from None
        return box[0]

    def end(self) -> int:
        """The offset the next logged event gets: a mark taken before an action, so
        that ``wait_notification(after=mark)`` waits for the action's own notification
        (one already in the log, of an earlier run or an earlier snapshot, does not
        count)."""
        if self._reader is None and not log_exists(self.log_cfg):
            return 0
        events = self.events()
        return int(events[-1]["offset"]) + 1 if events else 0

    def wait_notification(self, kind: str, count: int = 1, timeout: float = 120,
                          *, after: int | None = None, signal_id: str | None = None) -> list[Event]:
        """Until ``count`` notifications of ``kind`` are in the log; with ``after``
        (``end()`` taken before the action) only those logged at or after it count, with
        ``signal_id`` only that signal's (an earlier snapshot's may be logged late).
        Without either every one in the log counts, which an earlier run's or snapshot's
        can satisfy: pass one whenever the log may already hold one."""
        first = 0 if after is None else after
        return self.wait_until(
            lambda ev: sum(1 for e in ev if e["op"] == "n" and e["notification"]["type"] == kind
                           and e["offset"] >= first
                           and signal_id in (None, e["notification"].get("signal_id"))) >= count,
            timeout, f"{count} {kind} notification(s)" + (f" from offset {after}" if after else "")
            + (f" of signal {signal_id}" if signal_id else ""),
        )

    def caught_up(self, timeout: float = 60) -> list[Event]:
        token = f"m{time.monotonic_ns()}"
        self.h.marker(token)
        return self.wait_until(
            lambda ev: any((e.get("after") or {}).get("id") == token for e in ev), timeout,
            "the marker row",
        )

    def snapshot_status(self) -> dict[str, Any]:
        """The snapshot part of the capture's status (``status.json``, written at most
        once a second, also during a blocking snapshot); {} before there is one."""
        try:
            status = orjson.loads((self.log_dir / STATUS_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return dict(status.get("snapshot") or {})

    def read_again_or_completed(self, after: int, timeout: float = 60) -> None:
        """Until a snapshot's COMPLETED is logged at or after offset ``after``, or the
        status shows a read that could not decide (``reads_repeated``: a fenced read
        that is read again): a blocking snapshot whose reads run while a commit the
        stream delivered is invisible ends one way (unfenced: with stale rows) or the
        other (fenced)."""
        def either() -> bool:
            if any(e["offset"] >= after for e in self.notifications("COMPLETED")):
                return True
            return int(self.snapshot_status().get("reads_repeated") or 0) > 0

        wait_for(either, timeout, "a COMPLETED or a read read again", 0.1)

    def rereads_done(self, timeout: float = 120) -> None:
        """Until the capture's status (``status.json``, written at most once a second)
        reports no key re-read pending (``core.rereads``), in a status written after this
        call (made after ``caught_up``: every event the writers caused, so every re-read
        they queued, has been through the core by then). A snapshot's COMPLETED says its chunks are done; a row dropped by a partial
        (unchanged TOAST) update lands later, by its re-read, which another partial update
        of the same key inside the re-read's window postpones again (docs/exactness.md):
        the oracle compares once the writers have stopped and the re-reads have landed.
        Without a status file (no capture has written one) there is nothing to wait for."""
        path = self.log_dir / STATUS_FILE
        if self.proc is None or not path.exists():
            return
        since = time.time()

        def done() -> bool:
            try:
                status = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                return False
            snap = status.get("snapshot") or {}
            return float(status.get("updated_at", 0)) > since and not snap.get("rereads_queued")

        wait_for(done, timeout, "no key re-read pending in status.json", 0.1)

    def assert_oracle(self, tables: dict[str, list[str]]) -> list[Event]:
        events = self.caught_up()
        if any(e.get("unchanged") for e in events):  # only those queue key re-reads
            self.rereads_done()
            events = self.caught_up()
        got = materialize(events)
        for table, key in tables.items():
            want = self.h.rows(table, key)
            columns = list(next(iter(want.values())).keys()) if want else []
            have = {
                k: {c: r.get(c) for c in columns}
                for k, r in got.get(f"{self.h.schema}.{table}", {}).items()
            }
            missing, extra = set(want) - set(have), set(have) - set(want)
            diff = [k for k in set(want) & set(have) if want[k] != have[k]]
            assert not missing and not extra and not diff, (
                f"{table}: {len(missing)} missing, {len(extra)} extra, {len(diff)} differ: "
                f"missing={sorted(missing, key=str)[:5]} extra={sorted(extra, key=str)[:5]} "
                f"diff={[(want[k], have[k]) for k in diff[:2]]}"
            )
        assert_no_time_travel(self.h, events)
        return events


def assert_no_time_travel(h: Harness, events: list[Event]) -> None:
    """Positions are unique and increase with the offset (so per key, the log follows
    commit order and a snapshot row never lands after a newer log event)."""
    positions = [h.position(e) for e in events]
    if len(positions) != len(set(positions)):
        seen: dict[Any, int] = {}
        twice = []
        for i, p in enumerate(positions):
            if p in seen:
                twice.append((events[seen[p]], events[i]))
            seen[p] = i
        raise AssertionError(f"a position was logged twice: {twice[:2]}")
    assert positions == sorted(positions), "positions do not follow offsets"


def snapshot_rows(events: list[Event], table: str) -> list[Event]:
    return [e for e in events if e["op"] == "r" and e["source"]["table"] == table]
