"""`dblog run` against MariaDB (and MySQL 5.7 in `-m slow`): random load, snapshot, kill -9;
the change log rebuilds the tables (materialize the log as `dblog tail --no-follow` prints
it, read in-process, and compare with the source)."""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.devtools.mysql57 import TestServer
from tests.chaos import kill_and_restart, kill_seed, writing
from tests.helpers import dblog, kill9, read_log, start_run, stop_run, wait_for
from tests.mysql.helpers import make

TABLES = {
    "w": "CREATE TABLE w (id INT PRIMARY KEY, v VARCHAR(40), n INT, d DECIMAL(12,3), "
    "t DATETIME(6), j JSON)",
    "wc": "CREATE TABLE wc (a INT, b VARCHAR(8), n INT, PRIMARY KEY (a, b))",
}
KEYS = {"w": ("id",), "wc": ("a", "b")}


def write_config(tmp: Path, mariadb: TestServer, db: str, extra: str = "") -> Path:
    path = tmp / "dblog.toml"
    path.write_text(
        f'[source]\ntype = "mysql"\ndsn = "{mariadb.dsn(db)}"\nserver_id = 777\n'
        f'tables = ["{db}\\\\.w.*", "{db}\\\\.marker"]\nheartbeat_interval_s = 0.5\n'
        f'[log]\npath = "{tmp / "data"}"\n{extra}\n'
    )
    return path


def writer(mariadb: TestServer, db: str, stop: threading.Event, seed: int,
           pause: float = 0.0) -> None:
    """Random transactions until ``stop``, ``pause`` seconds apart."""
    rng = random.Random(seed)
    conn = mariadb.connect(db)
    conn.autocommit(False)
    try:
        with conn.cursor() as cur:
            while not stop.is_set():
                for _ in range(rng.randrange(1, 15)):
                    i, r = rng.randrange(300), rng.random()
                    if r < 0.45:
                        cur.execute(
                            "INSERT INTO w VALUES (%s, %s, 1, %s, NOW(6), %s) ON DUPLICATE KEY "
                            "UPDATE v = VALUES(v), n = n + 1, d = VALUES(d)",
                            (
                                i,
                                f"x{rng.random()}",
                                f"{rng.uniform(-1e6, 1e6):.3f}",
                                orjson.dumps({"k": i, "l": [rng.random()]}).decode(),
                            ),
                        )
                    elif r < 0.6:
                        cur.execute(
                            "INSERT INTO wc VALUES (%s, %s, 0) ON DUPLICATE KEY UPDATE n = n + 1",
                            (i % 30, rng.choice("abc")),
                        )
                    elif r < 0.8:
                        cur.execute("UPDATE w SET n = n + 1, t = NOW(6) WHERE id = %s", (i,))
                    elif r < 0.9:
                        cur.execute("DELETE FROM wc WHERE a = %s", (i % 30,))
                    else:
                        cur.execute("DELETE FROM w WHERE id = %s", (i,))
                conn.commit()
                if pause:
                    time.sleep(pause)
    finally:
        conn.close()


def materialize(events: list[dict[str, Any]]) -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    tables: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
    for e in events:
        table = e["source"]["table"]
        rows = tables.setdefault(table, {})
        if e["op"] == "t":
            rows.clear()
        elif e["op"] in ("c", "u", "r"):
            rows[tuple(e["key"][k] for k in KEYS.get(table, ("id",)))] = e["after"]
        elif e["op"] == "d":
            rows.pop(tuple(e["key"][k] for k in KEYS.get(table, ("id",))), None)
    return tables


def source_rows(mariadb: TestServer, db: str, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The table as the chunk reader maps it (the mapping the binlog path must match)."""
    _, reader = make(mariadb, db)
    try:
        info = reader.table_info(f"{db}.{table}")
        assert info is not None
        top = reader.max_key(info, None)
        rows = reader.read_chunk(info, None, top, 10**9, None) if top is not None else []
    finally:
        reader.close()
    return {tuple(r[k] for k in KEYS[table]): r for r in rows}


def catch_up(
    config: Path, mariadb: TestServer, db: str, stall_s: float = 60.0, cap_s: float = 200.0
) -> list[dict[str, Any]]:
    """Write a marker row and wait until it is in the change log; then the whole log.
    Fails when the log stops growing for ``stall_s`` before the marker (capture stuck or
    gone), not merely because a loaded machine needs longer (``cap_s`` bounds it)."""
    token = uuid.uuid4().hex
    mariadb.execute(f"INSERT INTO marker VALUES ('{token}')", db)
    data = config.parent / "data"
    offset, grown, start = 0, time.monotonic(), time.monotonic()
    while True:
        reader = SqliteChangeLogReader(data)
        try:
            records = reader.read(offset, 100_000)
        finally:
            reader.close()
        if any(token.encode() in r.body for r in records):
            return read_log(config)
        if records:
            offset, grown = records[-1].offset + 1, time.monotonic()
        now = time.monotonic()
        if now - grown > stall_s or now - start > cap_s:
            raise AssertionError(
                f"the marker row is not in the change log after {now - start:.0f} s "
                f"(log at offset {offset}, last grew {now - grown:.0f} s ago)"
            )
        time.sleep(0.2)


def assert_oracle(config: Path, mariadb: TestServer, db: str) -> list[dict[str, Any]]:
    events = catch_up(config, mariadb, db)
    got = materialize(events)
    for table in TABLES:
        assert got.get(table, {}) == source_rows(mariadb, db, table), f"{table} differs"
    logged = [e for e in events if e["source"]["snapshot"] == "false"]
    positions = [(e["source"]["file"], e["source"]["pos"], e["source"]["index"]) for e in logged]
    assert len(positions) == len(set(positions)), "a binlog position was logged twice"
    assert positions == sorted(positions)
    return events


def setup_tables(mariadb: TestServer, db: str) -> None:
    for ddl in TABLES.values():
        mariadb.execute(ddl, db)
    mariadb.execute("CREATE TABLE marker (id VARCHAR(40) PRIMARY KEY)", db)


@pytest.mark.parametrize(
    "server", ["mariadb", pytest.param("mysql57", marks=pytest.mark.slow)], indirect=True
)
def test_run_oracle_with_snapshot(server: TestServer, db: str, tmp_path: Path) -> None:
    setup_tables(server, db)
    # Rows from before capture starts only reach the log through a snapshot.
    server.execute(
        "INSERT INTO w VALUES (1000, 'old', 0, 1.5, '2020-01-01', '{}'), "
        "(1001, 'old', 0, NULL, NULL, NULL)",
        db,
    )
    config = write_config(tmp_path, server, db, "[snapshot]\nchunk_size = 37")
    proc = start_run(config)
    with writing(lambda stop: writer(server, db, stop, 1)):
        time.sleep(1.0)
        dblog("snapshot", "--config", str(config), rf"{db}\.w.*")
        time.sleep(3.0)
    try:
        wait_for(
            lambda: any(e["op"] == "r" and e["source"]["table"] == "wc" for e in read_log(config)),
            60,
            "snapshot rows of wc",
        )
        events = assert_oracle(config, server, db)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err[-3000:]
    snap = [e for e in events if e["op"] == "r"]
    assert {e["source"]["table"] for e in snap} == {"w", "wc"}
    assert all(e["source"]["snapshot"] == "incremental" and e["before"] is None for e in snap)
    assert all(
        e["source"]["connector"] == "mysql" and e["source"]["db"] == db
        for e in events
        if e["op"] != "n"
    )


@pytest.mark.parametrize(
    "server", ["mariadb", pytest.param("mysql57", marks=pytest.mark.slow)], indirect=True
)
def test_kill9_during_load(server: TestServer, db: str, tmp_path: Path) -> None:
    setup_tables(server, db)
    config = write_config(tmp_path, server, db, "batch_max_events = 150")
    procs = [start_run(config)]
    with writing(lambda stop: writer(server, db, stop, 7)):
        # (down: writes while the capture is down)
        done = kill_and_restart(lambda: kill9(procs[-1]), lambda: procs.append(start_run(config)),
                                5, kill_seed(3), delay=(0.6, 1.8), down=(0.0, 0.5))
    proc = procs[-1]
    try:
        try:
            assert_oracle(config, server, db)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{done}") from exc
    finally:
        code, err = stop_run(proc)
    assert code == 0, err[-3000:]
    # The restarts resumed by GTID state (a new epoch each time one logged something),
    # not by file + offset.
    reader = SqliteChangeLogReader(tmp_path / "data")
    try:
        checkpoint = reader.last_checkpoint()
    finally:
        reader.close()
    assert checkpoint is not None and checkpoint.position is not None
    position = checkpoint.position.to_json()
    assert position["gtids"] and position["e"] >= 1, position
