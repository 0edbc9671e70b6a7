"""Test helpers shared by the integration suites: run `dblog` as a real process,
read its change log, materialize it, and read the source tables the same way.

The oracle (invariant 2 of docs/architecture.md): replaying the change log (c/u/r upsert
``after``, d delete, t truncate) must give each source table's content.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

from pydblog.devtools.proc import end_process
from pydblog.events import UNCHANGED_TOAST, InsertRun
from pydblog.sources.postgres.types import SESSION_SETTINGS, TypeRegistry

DBLOG = [sys.executable, "-m", "pydblog"]

STARTED: list[subprocess.Popen[bytes]] = []
"""The `dblog run` processes ``start_run`` started during the current test: the
``_nothing_left_running`` fixture (tests/conftest.py) ends those a failed test left
running and closes their pipes."""

Key = tuple[Any, ...]
Tables = dict[str, dict[Key, dict[str, Any]]]


def write_config(directory: Path, dsn: str, extra: str = "", source_extra: str = "",
                 heartbeat_s: float = 0.5) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if "[api]" not in extra:  # a free port each: tests run side by side
        extra = f'{extra}\n[api]\nlisten = "127.0.0.1:0"\n'
    path = directory / "dblog.toml"
    path.write_text(
        f"""
[source]
type = "postgres"
dsn = "{dsn}"
heartbeat_interval_s = {heartbeat_s}
{source_extra}
[log]
path = "{directory / "data"}"
{extra}
"""
    )
    return path


_DRAINS: dict[int, tuple[threading.Thread, list[bytes]]] = {}


def start_run(
    config: Path, env: dict[str, str] | None = None, wait: bool = True, drain: bool = False
) -> subprocess.Popen[bytes]:
    """Start `dblog run`; with ``wait``, return once its slot exists (the first
    checkpoint is in the change log), so writes from then on are captured. ``drain``:
    a thread reads its stderr while it runs (``stop_run`` returns it), for a test whose
    capture may log more than a pipe holds (64 KB: the client's connection errors while
    a broker is down for seconds) before it is stopped: else the capture blocks in its
    next log line."""
    proc = subprocess.Popen(
        [*DBLOG, "run", "--config", str(config), *(["-v"] if os.environ.get("DBLOG_TEST_VERBOSE") else [])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    if drain:
        chunks: list[bytes] = []
        assert proc.stderr is not None
        fd = proc.stderr.fileno()
        reader = threading.Thread(
            target=lambda: chunks.extend(iter(lambda: os.read(fd, 65536), b"")), daemon=True)
        reader.start()
        _DRAINS[proc.pid] = (reader, chunks)
    STARTED.append(proc)
    if wait:

        def ready() -> bool:
            if proc.poll() is not None:
                _, _, err = end_process(proc)
                raise AssertionError(f"dblog run exited: {err.decode()[-3000:]}")
            return first_checkpoint(config)

        try:
            from pydblog.config import load_config

            # (an embedded log is cheap to look at: a few hundred starts in a run)
            embedded = load_config(config).log.type == "embedded"
            wait_for(ready, 60, "dblog run to start", 0.05 if embedded else 0.2)
        except BaseException as exc:  # not left running, its pipe closed
            _, _, err = end_process(proc, kill=True)
            if isinstance(exc, AssertionError) and "dblog run exited" not in str(exc):
                raise AssertionError(f"{exc}; dblog run's stderr: {err.decode()[-3000:]}") from None
            raise
    return proc


def end_started() -> None:
    """End every process ``start_run`` started since the last call (SIGKILL: a test that
    left one running failed already) and close their pipes."""
    while STARTED:
        proc = STARTED.pop()
        drained = _DRAINS.pop(proc.pid, None)
        if drained is not None:  # its thread reads stderr: let it see the end first
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            drained[0].join(10)
        end_process(proc, kill=True)


def first_checkpoint(config: Path) -> bool:
    """Whether the change log of ``config`` holds a checkpoint (`dblog run` has its slot:
    writes from then on are captured)."""
    from pydblog.changelog import log_exists, open_reader
    from pydblog.config import load_config

    log_cfg = load_config(config).log
    if not log_exists(log_cfg):
        return False
    from pydblog.errors import ChangeLogUnavailable

    try:
        reader = open_reader(log_cfg)
    except ChangeLogUnavailable:  # e.g. Kafka's topics just made, no leader elected yet
        return False
    try:
        return reader.last_checkpoint() is not None
    except ChangeLogUnavailable:
        return False
    finally:
        reader.close()


def stop_run(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[int, str]:
    """SIGTERM `dblog run` and wait for it; its exit code and stderr. Its pipe is closed
    and it is reaped whatever happens (``end_process``)."""
    drained = _DRAINS.pop(proc.pid, None)
    if drained is not None:  # (``start_run(drain=True)``: its thread reads stderr)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            drained[0].join(10)
            if proc.stderr is not None:
                proc.stderr.close()
            raise AssertionError("dblog run did not stop on SIGTERM: "
                                 f"{b''.join(drained[1]).decode()[-2000:]}") from None
        drained[0].join(10)
        if proc.stderr is not None:
            proc.stderr.close()
        return proc.returncode, b"".join(drained[1]).decode()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _, _, err = end_process(proc, kill=True)
        raise AssertionError(f"dblog run did not stop on SIGTERM: {err.decode()[-2000:]}") from None
    except ValueError:  # read already (stopped before)
        err = b""
    finally:
        end_process(proc)  # nothing left running or open, whatever happened
    return proc.returncode, (err or b"").decode()


def kill9(proc: subprocess.Popen[bytes]) -> None:
    end_process(proc, kill=True)


def dblog(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([*DBLOG, *args], capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"dblog {' '.join(args)} failed ({res.returncode}): {res.stderr}")
    return res


def tail(config: Path) -> list[dict[str, Any]]:
    res = dblog("tail", "--config", str(config), "--no-follow")
    return [orjson.loads(line) for line in res.stdout.splitlines() if line]


def read_log(config: Path) -> list[dict[str, Any]]:
    """The whole change log as ``dblog tail --no-follow`` prints it (every event with its
    offset), read in-process: a ``dblog tail`` subprocess per poll cost ~0.5-1 s of a
    Python start and a JSON dump. (``dblog tail`` itself: ``tail`` below, and
    ``tests/integration/test_capture.py::test_tail_filters_and_offsets``.)"""
    from pydblog.changelog import log_exists, open_reader
    from pydblog.config import load_config
    from pydblog.events import decode_envelope

    cfg = load_config(config).log
    if not log_exists(cfg):
        raise AssertionError(f"no change log at {cfg.path} yet")
    reader = open_reader(cfg)
    try:
        return [decode_envelope(r.offset, r.body) for r in reader.read(reader.first_offset(), 10**9)]
    finally:
        reader.close()


class LogFollower:
    """``read_log`` for a poll loop: the first call reads the whole log, later ones only
    what was committed since (committed offsets never change), so a wait does not
    re-decode the whole log every 0.2 s on a machine whose 2 cores the capture needs.
    Returns the same events as ``read_log`` would; they are shared between calls (do
    not mutate them). ``close`` when done."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.reader: Any = None
        self.events: list[dict[str, Any]] = []
        self.next = 0

    def __call__(self) -> list[dict[str, Any]]:
        from pydblog.changelog import log_exists, open_reader
        from pydblog.config import load_config
        from pydblog.events import decode_envelope

        if self.reader is None:
            cfg = load_config(self.config).log
            if not log_exists(cfg):
                raise AssertionError(f"no change log at {cfg.path} yet")
            self.reader = open_reader(cfg)
            self.next = self.reader.first_offset()
        for r in self.reader.read(self.next, 10**9):
            self.events.append(decode_envelope(r.offset, r.body))
            self.next = r.offset + 1
        return list(self.events)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


def each_event(items: Iterable[Any]) -> Iterator[Any]:
    """A source's stream items with every ``InsertRun`` (a run of Inserts the native
    decoder encoded) as the ``ChangeEvent``s it stands for, lazily (a test may act on
    the source between items, as the runner does)."""
    for item in items:
        if type(item) is InsertRun:
            yield from item.events()
        else:
            yield item


def sid() -> str:
    """A fresh signal id."""
    return f"sig-{uuid.uuid4().hex[:8]}"


def wait_for(pred: Callable[[], bool], timeout: float = 60, what: str = "condition",
             interval: float = 0.2) -> None:
    """Poll ``pred`` every ``interval`` s until it holds (a wait overshoots by interval/2
    on average: a cheap ``pred`` may poll faster)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def wait_for_marker(config: Path, dsn: str, timeout: float = 60,
                    read: Callable[[], list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """Write a marker row and wait until it is in the change log; returns the log
    (``read``: the whole log as ``dblog tail`` prints it; by default ``read_log``).

    The marker table may be new to a running capture (tables created after start are
    added to the publication at the next heartbeat), so a fresh marker is written
    every couple of seconds until one arrives.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS dblog_test_marker (id text PRIMARY KEY)")
    events: list[dict[str, Any]] = []
    tokens: set[str] = set()
    last_write = 0.0
    follower = LogFollower(config)  # (opens nothing unless called: when ``read`` is None)
    poll: Callable[[], list[dict[str, Any]]] = read or follower

    def seen() -> bool:
        nonlocal events, last_write
        if time.monotonic() - last_write > 2.0:
            token = f"m{time.monotonic_ns()}"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO dblog_test_marker VALUES (%s)", (token,))
            tokens.add(token)
            last_write = time.monotonic()
        try:
            events = poll()
        except AssertionError:
            return False
        return any(
            e["source"]["table"] == "dblog_test_marker" and (e.get("after") or {}).get("id") in tokens
            for e in events
        )

    try:
        wait_for(seen, timeout, "the marker row in the change log")
    finally:
        follower.close()
    return events


def key_of(event: dict[str, Any]) -> Key:
    key = event.get("key") or {}
    return tuple(_hashable(v) for v in key.values())


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def materialize(events: Iterable[dict[str, Any]]) -> Tables:
    tables: Tables = {}
    for e in events:
        op = e["op"]
        if op == "n":
            continue
        name = f"{e['source']['schema']}.{e['source']['table']}"
        rows = tables.setdefault(name, {})
        if op == "t":
            rows.clear()
        elif op == "d":
            rows.pop(key_of(e), None)
        else:
            after = dict(e["after"])
            old = rows.get(key_of(e))
            for col in e.get("unchanged", []):
                assert after[col] == UNCHANGED_TOAST
                if old is not None:
                    after[col] = old[col]
            rows[key_of(e)] = after
    return tables


def source_rows(dsn: str, table: str, key: list[str]) -> dict[Key, dict[str, Any]]:
    """The table's rows, mapped exactly as the capture maps values."""
    opts = " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())
    with psycopg.connect(dsn, options=opts) as conn:
        types = TypeRegistry.load(conn)
        schema, _, name = table.partition(".")
        cols = conn.execute(
            "SELECT a.attname, a.atttypid FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
            "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (schema, name),
        ).fetchall()
        exprs = ", ".join(
            types.text_expr(sql.Identifier(c).as_string(conn), oid) for c, oid in cols
        )
        convs = [types.converter(oid) for _, oid in cols]
        out: dict[Key, dict[str, Any]] = {}
        query = f"SELECT {exprs} FROM {sql.Identifier(schema, name).as_string(conn)}"
        for r in conn.execute(query):
            row = {c: (f(v) if v is not None else None) for (c, _), f, v in zip(cols, convs, r, strict=True)}
            out[tuple(_hashable(row[k]) for k in key)] = row
        return out


def assert_oracle(config: Path, dsn: str, tables: dict[str, list[str]],
                  read: Callable[[], list[dict[str, Any]]] | None = None,
                  context: object = "") -> list[dict[str, Any]]:
    """Materialize the change log and compare it with every table in ``tables``
    (name -> key columns). Returns the events read (``read``: as ``wait_for_marker``).
    ``context``: what a failure message adds (``tests.chaos.Kills``: the kills done)."""
    try:
        events = wait_for_marker(config, dsn, 60 if read is None else 300, read)
        assert_materializes_to_source(events, dsn, tables)
    except AssertionError as exc:
        if not str(context):
            raise
        raise AssertionError(f"{exc}\n{context}") from exc
    return events


def assert_materializes_to_source(events: list[dict[str, Any]], dsn: str,
                                  tables: dict[str, list[str]]) -> None:
    """``events`` (the log as ``dblog tail`` prints it), materialized, equal every table
    in ``tables`` (name -> key columns) of the source now."""
    got = materialize(events)
    for table, key in tables.items():
        want = source_rows(dsn, table, key)
        # Project onto the source's current columns: a dropped column stays in rows the
        # log has not touched since (sinks project with the recorded schema as well).
        columns = next(iter(want.values())).keys() if want else []
        have = {
            k: {c: row.get(c) for c in columns} for k, row in got.get(table, {}).items()
        }
        missing = set(want) - set(have)
        extra = set(have) - set(want)
        diff = [k for k in set(want) & set(have) if want[k] != have[k]]
        assert not missing and not extra and not diff, (
            f"{table}: {len(missing)} missing, {len(extra)} extra, {len(diff)} differ; "
            f"e.g. missing={list(missing)[:3]} extra={list(extra)[:3]} "
            f"diff={[(want[k], have[k]) for k in diff[:2]]}"
        )
