"""`dblog run` against a real PostgreSQL: the oracle, TOAST, schema changes, truncate,
big transactions, and restarts."""

from __future__ import annotations

import random
from pathlib import Path

import psycopg

from pydblog.capture.status import read_status
from pydblog.config import load_config
from tests.helpers import (
    assert_oracle,
    materialize,
    start_run,
    stop_run,
    tail,
    wait_for_marker,
    write_config,
)

TABLES = {"public.a": ["id"], "public.b": ["k1", "k2"], "public.c": ["id"]}


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(12,3), f boolean)")
        conn.execute(
            "CREATE TABLE b (k1 text, k2 int, ts timestamptz, j jsonb, PRIMARY KEY (k1, k2))"
        )
        conn.execute("CREATE TABLE c (id bigint PRIMARY KEY, big text, arr int[])")
        conn.execute("ALTER TABLE c REPLICA IDENTITY FULL")


def random_writes(dsn: str, rng: random.Random, n: int) -> None:
    with psycopg.connect(dsn) as conn:
        for _ in range(n):
            table = rng.choice("abc")
            op = rng.random()
            i = rng.randrange(60)
            if table == "a":
                if op < 0.5:
                    conn.execute(
                        "INSERT INTO a VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
                        "SET v = excluded.v, n = excluded.n",
                        (i, f"v{rng.random()}", rng.randrange(10**6) / 1000, rng.random() < 0.5),
                    )
                elif op < 0.8:
                    conn.execute("UPDATE a SET n = n + 1, f = NOT f WHERE id = %s", (i,))
                else:
                    conn.execute("DELETE FROM a WHERE id = %s", (i,))
            elif table == "b":
                k1 = f"k{i % 7}"
                if op < 0.6:
                    conn.execute(
                        "INSERT INTO b VALUES (%s, %s, now(), %s) ON CONFLICT (k1, k2) DO UPDATE "
                        "SET j = excluded.j, ts = excluded.ts",
                        (k1, i, f'{{"x": {i}, "s": "{rng.random()}"}}'),
                    )
                else:
                    conn.execute("DELETE FROM b WHERE k1 = %s AND k2 = %s", (k1, i))
            else:
                if op < 0.5:
                    big = "".join(rng.choice("abcdefghij") for _ in range(3000)) if rng.random() < 0.3 else "s"
                    conn.execute(
                        "INSERT INTO c VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET arr = excluded.arr",
                        (i, big, [i, None, i + 1]),
                    )
                elif op < 0.8:
                    conn.execute("UPDATE c SET arr = array_append(arr, 1) WHERE id = %s", (i,))
                else:
                    conn.execute("DELETE FROM c WHERE id = %s", (i,))
            if rng.random() < 0.3:
                conn.commit()
        conn.commit()


def test_oracle_random_writes(pg_db: str, tmp_path: Path) -> None:
    create_tables(pg_db)
    config = write_config(tmp_path, pg_db)
    proc = start_run(config)
    try:
        random_writes(pg_db, random.Random(7), 600)
        events = assert_oracle(config, pg_db, TABLES)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
    assert "Traceback" not in err
    offsets = [e["offset"] for e in events]
    assert offsets == list(range(len(offsets)))
    positions = [(e["source"]["lsn"], e["source"]["index"]) for e in events if e["op"] != "n"]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)


def test_restart_continues_without_duplicates(pg_db: str, tmp_path: Path) -> None:
    create_tables(pg_db)
    config = write_config(tmp_path, pg_db)
    rng = random.Random(11)
    for _ in range(3):
        proc = start_run(config)
        try:
            random_writes(pg_db, rng, 150)
            wait_for_marker(config, pg_db)
        finally:
            code, err = stop_run(proc)
        assert code == 0, err
        random_writes(pg_db, rng, 50)  # written while capture is down
    proc = start_run(config)
    try:
        events = assert_oracle(config, pg_db, TABLES)
    finally:
        stop_run(proc)
    positions = [(e["source"]["lsn"], e["source"]["index"]) for e in events]
    assert len(set(positions)) == len(positions)


def test_toast_default_and_full_identity(pg_db: str, tmp_path: Path) -> None:
    rng = random.Random(1)
    big = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8000))
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE td (id int PRIMARY KEY, big text, n int)")
        conn.execute("CREATE TABLE tf (id int PRIMARY KEY, big text, n int)")
        conn.execute("ALTER TABLE tf REPLICA IDENTITY FULL")
    config = write_config(tmp_path, pg_db)
    proc = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            for t in ("td", "tf"):
                conn.execute(f"INSERT INTO {t} VALUES (1, %s, 0)", (big,))
                conn.execute(f"UPDATE {t} SET n = 1 WHERE id = 1")
                (size,) = conn.execute(f"SELECT pg_column_size(big) FROM {t}").fetchone()  # type: ignore[misc]
                assert size > 2000, "the value must be stored out of line (TOAST)"
        events = assert_oracle(config, pg_db, {"public.td": ["id"], "public.tf": ["id"]})
    finally:
        stop_run(proc)
    upd = {e["source"]["table"]: e for e in events if e["op"] == "u"}
    assert upd["td"]["unchanged"] == ["big"]
    assert upd["td"]["after"]["big"] == "__dblog_unchanged_toast__"
    assert "unchanged" not in upd["tf"]
    assert upd["tf"]["after"]["big"] == big
    assert upd["tf"]["before"]["n"] == 0


def test_schema_change_truncate_and_big_transaction(pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE s (id int PRIMARY KEY, v text)")
    config = write_config(tmp_path, pg_db)
    proc = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO s VALUES (1, 'a')")
            conn.execute("ALTER TABLE s ADD COLUMN extra int DEFAULT 5")
            conn.execute("INSERT INTO s VALUES (2, 'b', 7)")
            conn.execute("ALTER TABLE s DROP COLUMN v")
            conn.execute("INSERT INTO s VALUES (3, 9)")
            conn.execute("UPDATE s SET extra = 10 WHERE id = 1")
            with conn.transaction():
                for i in range(100, 3100):
                    conn.execute("INSERT INTO s VALUES (%s, %s)", (i, i))
                conn.execute("DELETE FROM s WHERE id BETWEEN 100 AND 1099")
                conn.execute("UPDATE s SET extra = -1 WHERE id BETWEEN 1100 AND 1599")
        events = assert_oracle(config, pg_db, {"public.s": ["id"]})
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("TRUNCATE s")
            conn.execute("INSERT INTO s VALUES (42, 1)")
        events = assert_oracle(config, pg_db, {"public.s": ["id"]})
    finally:
        stop_run(proc)
    s_events = [e for e in events if e["source"]["table"] == "s"]
    assert s_events[0]["after"] == {"id": 1, "v": "a"}
    assert s_events[1]["after"] == {"id": 2, "v": "b", "extra": 7}
    assert s_events[2]["after"] == {"id": 3, "extra": 9}
    assert any(e["op"] == "t" for e in s_events)
    assert materialize(s_events)["public.s"] == {(42,): {"id": 42, "extra": 1}}
    big_tx = [e for e in s_events if e["source"]["txId"] == s_events[5]["source"]["txId"]]
    assert len(big_tx) == 3000 + 1000 + 500
    from pydblog.changelog.sqlite import SqliteChangeLogReader

    schemas = [s for _, s in SqliteChangeLogReader(tmp_path / "data").schemas("public.s")]
    assert [tuple(c.name for c in s.columns) for s in schemas] == [
        ("id", "v"), ("id", "v", "extra"), ("id", "extra")
    ]


def test_tail_filters_and_offsets(pg_db: str, tmp_path: Path) -> None:
    create_tables(pg_db)
    config = write_config(tmp_path, pg_db)
    proc = start_run(config)
    try:
        random_writes(pg_db, random.Random(3), 100)
        events = wait_for_marker(config, pg_db)
    finally:
        stop_run(proc)
    import orjson

    from tests.helpers import dblog

    out = dblog("tail", "--config", str(config), "--no-follow", "--table", "public.a", "--from-offset", "5")
    got = [orjson.loads(x) for x in out.stdout.splitlines()]
    want = [e for e in events if e["offset"] >= 5 and e["source"]["table"] == "a"]
    assert got == want
    assert tail(config) == events


def test_status_reports_position_lag_size_and_rate(pg_db: str, tmp_path: Path) -> None:
    import orjson

    from tests.helpers import dblog

    create_tables(pg_db)
    config = write_config(tmp_path, pg_db)
    before = orjson.loads(dblog("status", "--config", str(config), "--json").stdout)
    assert before["capture"] == "never started"
    proc = start_run(config)
    try:
        random_writes(pg_db, random.Random(5), 300)
        wait_for_marker(config, pg_db)
        import time

        time.sleep(1.5)  # status.json is refreshed every second
        st = orjson.loads(dblog("status", "--config", str(config), "--json").stdout)
        text = dblog("status", "--config", str(config)).stdout
    finally:
        stop_run(proc)
    assert st["capture"] == "running"
    assert st["position"]["kind"] == "pg" and st["position"]["lsn"] > 0
    assert isinstance(st["slot_lag_bytes"], int) and st["slot_lag_bytes"] >= 0
    assert st["changelog"]["last_offset"] >= 100 and st["changelog"]["size_bytes"] > 0
    assert "events_per_second" in st and ":***@" in st["source"] and "postgres:postgres" not in text
    assert "slot_lag_bytes:" in text
    after = orjson.loads(dblog("status", "--config", str(config), "--json").stdout)
    assert after["capture"] == "stopped" and after["events_per_second"] == 0.0


def test_retention_by_size_runs_in_capture(pg_db: str, tmp_path: Path) -> None:
    from pydblog.changelog.sqlite import SqliteChangeLogReader
    from tests.helpers import wait_for

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE r (id int PRIMARY KEY, pad text)")
    config = write_config(tmp_path, pg_db)
    proc = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            # Incompressible rows (a stream's inserts are stored zstd-compressed): ~3 MB.
            conn.execute("INSERT INTO r SELECT g, md5(g::text) || md5((-g)::text) || md5((7 * g)::text) "
                         "|| md5((13 * g)::text) || md5((17 * g)::text) || md5((19 * g)::text) "
                         "FROM generate_series(1, 20000) g")
        wait_for_marker(config, pg_db)
    finally:
        stop_run(proc)
    limited = write_config(tmp_path, pg_db, extra="retention_bytes = 1000000")
    proc = start_run(limited)
    reader = SqliteChangeLogReader(tmp_path / "data")
    try:
        wait_for(lambda: reader.first_offset() > 0, 30, "retention to drop old blocks")
        events = tail(limited)
    finally:
        stop_run(proc)
    assert events[0]["offset"] == reader.first_offset() > 0
    assert events[-1]["offset"] == reader.next_offset() - 1
    assert [e["offset"] for e in events] == list(range(events[0]["offset"], reader.next_offset()))


def test_an_idle_source_with_a_long_heartbeat_has_a_position_at_once(pg_db: str, tmp_path: Path) -> None:
    """`dblog run` on a source nobody writes to, with a heartbeat interval longer than the
    machine has been up (monotonic time: a fresh machine's is small): the first idle moment
    sends a heartbeat, so the first checkpoint (writes from then on are captured) and a
    status with a position come within seconds, not after the interval."""
    import time

    from tests.helpers import first_checkpoint, wait_for

    create_tables(pg_db)
    config = write_config(tmp_path, pg_db, heartbeat_s=10**9)
    t0 = time.monotonic()
    proc = start_run(config, wait=False)
    try:
        wait_for(lambda: first_checkpoint(config), 30, "the first checkpoint", 0.05)

        def positioned() -> bool:
            status = read_status(load_config(config).log_dir)
            return status is not None and status.get("position") is not None

        wait_for(positioned, 10, "a status with a position", 0.05)
        elapsed = time.monotonic() - t0
    finally:
        code, err = stop_run(proc)
    assert code == 0, err[-2000:]
    assert elapsed < 30
