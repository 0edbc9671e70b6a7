"""Capture behind column-changing ALTERs, on MySQL 5.7 (no column names in the binlog: the
schema history names the rows) and MariaDB (names in the binlog: the history stays out).

Scenario: capture starts, stops; then phases of DML, each ending with an UPDATE of every
row and a marker row, separated by ALTERs that rename, retype, move, drop and add columns
and change charsets; capture resumes behind all of it. Oracle: materializing the events
up to each phase's marker gives the table as it was read (every column, through the chunk
reader's mapping) at the end of that phase. And a restart from the checkpoint after any
item gives exactly the rest of the events.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.events import ChangeEvent
from pydblog.ports import Checkpoint, Commit, Heartbeat, SourceState
from pydblog.positions import Position
from pydblog.sources.mysql.dumpconn import DUMP_CONNECTION_KEY
from tests.chaos import kill_and_restart, kill_seed, reporting
from tests.helpers import kill9, start_run, stop_run, tail, wait_for
from tests.mysql.helpers import make, opened, read_until, run_sql

CREATE = (
    "CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(20) CHARACTER SET latin1, n INT, "
    "e ENUM('x','y'), v INT NOT NULL DEFAULT 0) DEFAULT CHARSET=utf8mb4"
)
# Each ALTER comes after a phase of DML; rows of every version must keep their values.
ALTERS = [
    "ALTER TABLE t CHANGE a b VARCHAR(20)",  # renamed, latin1 -> utf8mb4 (table default)
    "ALTER TABLE t ADD COLUMN c VARCHAR(5) CHARACTER SET latin1 FIRST, "
    "MODIFY n INT UNSIGNED AFTER c",  # moved and retyped: same binlog type, unsigned
    "ALTER TABLE t DROP COLUMN e, ADD COLUMN e2 SET('p','q') AFTER id",
    "ALTER TABLE t MODIFY c VARCHAR(5) CHARACTER SET utf8mb4 AFTER b, ADD INDEX (v)",
    "ALTER TABLE t ADD COLUMN d DECIMAL(8,2) NOT NULL DEFAULT 1.50 FIRST, DROP COLUMN n",
]
TEXT = ["plain", "é ü", "😀 ✓", "a'b", ""]


def phase_dml(phase: int, rng: random.Random) -> list[str]:
    """Inserts, updates and deletes valid for the table version of ``phase``, then an
    UPDATE of every row (so each row's last image has this version's columns)."""
    out = []
    ids = rng.sample(range(phase * 100, phase * 100 + 100), 12)
    for i in ids:
        text = rng.choice(TEXT if phase >= 1 else [*TEXT[:2], "x"])
        if phase == 0:
            out.append(f"INSERT INTO t (id, a, n, e) VALUES ({i}, '{_q(text)}', {-i}, 'y')")
        elif phase == 1:
            out.append(f"INSERT INTO t (id, b, n, e) VALUES ({i}, '{_q(text)}', {i * 7}, 'x')")
        elif phase == 2:
            out.append(f"INSERT INTO t (id, b, c, n) VALUES ({i}, '{_q(text)}', 'é', 4000000000)")
        elif phase == 3:
            out.append(f"INSERT INTO t (id, b, c, e2) VALUES ({i}, '{_q(text)}', 'ab', 'p,q')")
        else:
            out.append(f"INSERT INTO t (id, b, c, e2) VALUES ({i}, '{_q(text)}', '✓', 'q')")
    out.append(f"DELETE FROM t WHERE id = {ids[0]}")
    if phase == 0:
        out.append("UPDATE t SET a = 'ø' WHERE id % 3 = 0")
    if phase == 1:
        out.append("UPDATE t SET n = 5 WHERE n < 0")  # MODIFY n UNSIGNED comes next
    out.append(f"UPDATE t SET v = v + 1 + {phase}")
    return out


def _q(text: str) -> str:
    return text.replace("'", "''")


def rows_now(server: TestServer, db: str) -> dict[int, dict[str, Any]]:
    """Table t as the chunk reader maps it (the binlog path maps identically)."""
    _, reader = make(server, db)
    try:
        info = reader.table_info(f"{db}.t")
        assert info is not None
        top = reader.max_key(info, None)
        rows = reader.read_chunk(info, None, top, 10**9, None) if top is not None else []
    finally:
        reader.close()
    return {int(r["id"]): r for r in rows}


def run_phases(server: TestServer, db: str, seed: int) -> list[dict[int, dict[str, Any]]]:
    """All phases with their ALTERs between; each phase ends with a marker row. The
    table as it was at each marker."""
    rng = random.Random(seed)
    states = []
    for phase in range(len(ALTERS) + 1):
        if phase:
            server.execute(ALTERS[phase - 1], db)
        run_sql(server, db, *phase_dml(phase, rng))
        states.append(rows_now(server, db))
        run_sql(server, db, f"INSERT INTO m VALUES ('{phase}')")
    return states


def markers(n: int) -> Callable[[list[Any]], bool]:
    return lambda items: sum(
        1 for i in items if isinstance(i, ChangeEvent) and i.table == "m"
    ) >= n


def check_phases(events: list[tuple[str, str, Any, Any, Any]], states: list[dict[int, dict[str, Any]]]) -> None:
    """Materialize t up to each marker: the table as it was then, every column."""
    rows: dict[int, dict[str, Any]] = {}
    phase = 0
    for op, table, key, _before, after in events:
        if table == "m":
            assert rows == states[phase], f"phase {phase} differs"
            phase += 1
        elif op == "d":
            rows.pop(key["id"], None)
        else:
            rows[key["id"]] = after
    assert phase == len(states)


def events_seen(n: int) -> Callable[[list[Any]], bool]:
    return lambda items: len(summary(items)) >= n


def summary(items: list[Any]) -> list[tuple[str, str, Any, Any, Any]]:
    return [
        (str(e.op), e.table, e.key, e.before, e.after)
        for e in items
        if isinstance(e, ChangeEvent) and e.table in ("t", "m")
    ]


def checkpoints(items: list[Any], start: Checkpoint) -> list[Checkpoint]:
    """The checkpoint a runner would write after each item (position and extra)."""
    pos: Position | None = start.position
    extra = dict(start.extra)
    out = []
    for it in items:
        if isinstance(it, SourceState):
            extra[it.key] = it.value
            if it.position is not None and (pos is None or pos < it.position):
                pos = it.position
        elif isinstance(it, ChangeEvent | Commit | Heartbeat) and (pos is None or pos < it.position):
            pos = it.position
        out.append(Checkpoint(pos, None, dict(extra)))
    return out


def setup(server: TestServer, db: str) -> None:
    server.execute(CREATE, db)
    server.execute("CREATE TABLE m (id VARCHAR(40) PRIMARY KEY)", db)


def first_checkpoint(server: TestServer, db: str) -> Checkpoint:
    """Capture starts (a fresh start) and stops before anything happens."""
    src, stream = opened(server, db)
    try:
        items = read_until(stream, lambda items: any(isinstance(i, Heartbeat) for i in items))
    finally:
        src.close()
    return checkpoints(items, Checkpoint(None))[-1]


def test_behind_column_changing_alters_every_version_decoded_and_restart_anywhere(
    server: TestServer, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    setup(server, db)
    start = first_checkpoint(server, db)
    mysql57 = "mysql_schema_history" in start.extra
    assert mysql57 == isinstance(server, MySQL57), start.extra.keys()
    states = run_phases(server, db, seed=11)
    src, stream = opened(server, db, start)
    try:
        items = read_until(stream, markers(len(states)), timeout=60)
    finally:
        src.close()
    check_phases(summary(items), states)
    # (every dump also records its connection: dumpconn, not the schema history)
    states_items = [i for i, it in enumerate(items)
                    if isinstance(it, SourceState) and it.key != DUMP_CONNECTION_KEY]
    assert bool(states_items) == mysql57
    # Restart from the checkpoint after item i: exactly the rest, with the same values.
    cps = checkpoints(items, start)
    around = {j + d for j in states_items for d in (-1, 0)}
    chosen = sorted({*around, *random.Random(5).sample(range(len(items) - 1), 6)})
    for i in chosen:
        if i < 0:
            continue
        rest = summary(items[i + 1 :])
        if not rest:
            continue
        src, stream = opened(server, db, cps[i])
        try:
            again = read_until(stream, events_seen(len(rest)), timeout=30)
        finally:
            src.close()
        assert summary(again) == rest, f"restart after item {i} ({items[i]})"
    # The history followed every ALTER itself (information_schema did not correct it).
    assert "differ from information_schema" not in caplog.text
    assert "could not follow a DDL" not in caplog.text


# -- dblog run, killed while it catches up ------------------------------------------------
def write_config(tmp: Path, server: TestServer, db: str) -> Path:
    path = tmp / "dblog.toml"
    path.write_text(
        f'[source]\ntype = "mysql"\ndsn = "{server.dsn(db)}"\nserver_id = 778\n'
        f'tables = ["{db}\\\\.t", "{db}\\\\.m"]\nheartbeat_interval_s = 0.5\n'
        f'[log]\npath = "{tmp / "data"}"\nbatch_max_events = 7\n'
        '[api]\nlisten = "127.0.0.1:0"\n'
    )
    return path


def log_summary(events: list[dict[str, Any]]) -> list[tuple[str, str, Any, Any, Any]]:
    return [
        (e["op"], e["source"]["table"], e["key"], e["before"], e["after"])
        for e in events
        if e["op"] in ("c", "u", "d")
    ]


@pytest.mark.slow  # ~20 s a flavour; the restart-anywhere test above runs by default
def test_dblog_run_behind_alters_killed_mid_history(
    server: TestServer, db: str, tmp_path: Path
) -> None:
    setup(server, db)
    config = write_config(tmp_path, server, db)
    proc = start_run(config)
    code, err = stop_run(proc)
    assert code == 0, err[-2000:]
    states = run_phases(server, db, seed=23)
    # Killed (kill -9) while it works through the history: somewhere in it, or before.
    procs = [start_run(config, wait=False)]
    kills = kill_and_restart(lambda: kill9(procs[-1]),
                             lambda: procs.append(start_run(config, wait=False)),
                             3, kill_seed(9), delay=(0.8, 2.5), restart_last=False)
    proc = start_run(config)
    try:
        def caught_up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"dblog run stopped: {proc.communicate()[1].decode()[-3000:]}")
            return sum(1 for e in tail(config) if e["source"]["table"] == "m") >= len(states)

        with reporting(kills):
            wait_for(caught_up, 60, "every marker in the change log")
        events = tail(config)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err[-3000:]
    with reporting(kills):
        check_phases(log_summary(events), states)
        logged = [(e["source"]["file"], e["source"]["pos"], e["source"]["index"])
                  for e in events if e["op"] in ("c", "u", "d")]
        assert len(logged) == len(set(logged)), "an event was logged twice"
