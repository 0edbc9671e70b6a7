"""Several sources, one `dblog sync`: two PostgreSQL databases and one MariaDB database,
each captured by its own `dblog run`, merged by a route into one table of a Delta lake
and of a downstream PostgreSQL. The oracle: the union of the sources' tables, each row
with its source's identity columns, every column compared; equal keys of two shards
are two rows. The watermarks: each source's progress and T in the sinks' tables."""

from __future__ import annotations

import subprocess
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable, write_deltalake

from pydblog.config import load_config, parse_config
from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.pgcluster import PgCluster
from pydblog.errors import ConfigError
from pydblog.spark.job import run_sync
from tests.contract.capture import Capture
from tests.contract.harness import PgHarness
from tests.helpers import DBLOG, write_config
from tests.mysql.harness import MariaHarness
from tests.spark.helpers import merged_rows

Row = tuple[Any, ...]


def _pg_rows(dsn: str) -> list[tuple[int, Decimal | None, str | None, str | None]]:
    with psycopg.connect(dsn) as conn:
        cols = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'orders'")}
        extra = "b_only" if "b_only" in cols else "NULL::text"
        return [tuple(r) for r in conn.execute(
            f"SELECT id, amount, note, {extra} FROM orders").fetchall()]


class SlotHarness(PgHarness):
    """A PostgreSQL source with its own slot (slot names are cluster-wide)."""

    def __init__(self, dsn: str, slot: str) -> None:
        super().__init__(dsn)
        self.slot = slot

    def config(self, directory: Path, extra: str = "") -> Path:
        return write_config(directory, self.dsn, extra=extra, source_extra=f'slot = "{self.slot}"')


def _drop_slots(dsn: str, *slots: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for slot in slots:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = %s", (slot,))


def _sync_config(tmp_path: Path, sources: dict[str, Path], lake: Path, replica: str,
                 extra: str = "", mysql: str | None = None) -> Path:
    text = f'[sync]\ncheckpoint = "{tmp_path / "cp"}"\nmax_events_per_trigger = 200\n{extra}\n'
    for name, cfg in sources.items():
        text += f'[[sync.sources]]\nname = "{name}"\nlog = {{ path = "{load_config(cfg).log.path}" }}\n'
    text += (
        '[[sync.routes]]\ntables = "[^.]+\\\\.orders"\ntarget = "public.orders"\n'
        '[[sync.routes]]\ntables = "[^.]+\\\\.(dblog_test_marker|dblog_signal)"\n'
        'target = "public.dblog_test_marker"\n'
        f'[[sync.sinks]]\ntype = "delta"\npath = "{lake}"\n'
        f'[[sync.sinks]]\ntype = "postgres"\ndsn = "{replica}"\nschema = "merged"\n'
    )
    if mysql is not None:
        text += f'[[sync.sinks]]\ntype = "mysql"\ndsn = "{mysql}"\n'

    path = tmp_path / "sync.toml"
    path.write_text(text)
    return path


def test_three_sources_merged_into_delta_and_postgres(
    spark: Any, pg_cluster: PgCluster, mariadb: MariaDB, my_db: str, tmp_path: Path
) -> None:
    stamp = f"{tmp_path.name[-6:].lower()}_{int(time.time())}"
    dsn_a = pg_cluster.create_database(f"sa_{stamp}")
    dsn_b = pg_cluster.create_database(f"sb_{stamp}")
    slots = (f"dblog_a_{stamp}", f"dblog_b_{stamp}")
    pa, pb = SlotHarness(dsn_a, slots[0]), SlotHarness(dsn_b, slots[1])
    my = MariaHarness(mariadb, my_db)
    pa.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), note text)")
    pb.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), note text, "
               "b_only text)")
    my.execute("CREATE TABLE orders (id INT PRIMARY KEY, amount DECIMAL(10,2), note VARCHAR(40))")
    caps = {"pg_a": Capture(pa, tmp_path / "a"), "pg_b": Capture(pb, tmp_path / "b"),
            "maria": Capture(my, tmp_path / "m")}
    for c in caps.values():
        c.start()
    try:
        # equal keys in every shard; updates, deletes, and a column only one shard has
        pa.execute("INSERT INTO orders SELECT i, i * 1.5, 'a' || i FROM generate_series(1, 30) i",
                   "UPDATE orders SET note = 'a-upd' WHERE id % 3 = 0",
                   "DELETE FROM orders WHERE id % 7 = 0")
        pb.execute("INSERT INTO orders SELECT i, i * 2, 'b' || i, 'x' || i "
                   "FROM generate_series(1, 25) i",
                   "DELETE FROM orders WHERE id % 5 = 0")
        my.execute(*[f"INSERT INTO orders VALUES ({i}, {i}.25, 'm{i}')" for i in range(1, 21)],
                   "UPDATE orders SET amount = NULL WHERE id = 4")
        for c in caps.values():
            c.caught_up()
    finally:
        for c in caps.values():
            c.stop()

    lake = tmp_path / "lake"
    replica = pg_cluster.create_database(f"r_{stamp}")
    mysql_db = f"rm_{stamp}"
    mariadb.execute(f"CREATE DATABASE `{mysql_db}`")
    cfg = load_config(_sync_config(tmp_path, {n: c.config for n, c in caps.items()}, lake, replica,
                                   mysql=mariadb.dsn(mysql_db)))
    assert run_sync(cfg, available_now=True) == 0

    want: set[Row] = set()
    for name, dsn, db in (("pg_a", dsn_a, f"sa_{stamp}"), ("pg_b", dsn_b, f"sb_{stamp}")):
        want |= {(name, db, "public", i, a, n, b) for i, a, n, b in _pg_rows(dsn)}
    want |= {("maria", my_db, my_db, i, None if i == 4 else Decimal(f"{i}.25"), f"m{i}", None)
             for i in range(1, 21)}
    assert len(want) == 30 - 4 + 25 - 5 + 20
    cols = ["_dblog_source", "_dblog_db", "_dblog_schema", "id", "amount", "note", "b_only"]

    assert merged_rows(lake, "public.orders", cols) == want
    assert merged_rows(replica, "merged.orders", cols) == want
    assert merged_rows((mariadb, mysql_db), "orders", cols) == want
    with psycopg.connect(replica) as conn:
        marks: dict[str, int] = dict(conn.execute(
            "SELECT source, progress_ms FROM merged._dblog_watermarks").fetchall())
        low = conn.execute("SELECT min(low_ms) FROM merged._dblog_watermarks").fetchone()
        progress = conn.execute("SELECT source, count(*) FROM merged.dblog_sync_progress "
                                "GROUP BY source ORDER BY source").fetchall()
        key = conn.execute(
            "SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_index i JOIN pg_attribute a "
            "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = 'merged.orders'::regclass AND i.indisprimary").fetchone()
    my_marks = dict(mariadb.execute("SELECT source, progress_ms FROM _dblog_watermarks", mysql_db))
    assert my_marks == marks
    assert key is not None and key[0] == ["_dblog_source", "_dblog_db", "_dblog_schema", "id"]
    assert [p[0] for p in progress] == ["maria", "pg_a", "pg_b"]
    # each source's progress: a real commit time, at most now; T is their minimum
    now_ms = time.time() * 1000
    assert set(marks) == {"pg_a", "pg_b", "maria"}
    assert all(v is not None and now_ms - 600_000 < v <= now_ms for v in marks.values()), marks
    assert low is not None and low[0] is not None and low[0] <= min(marks.values())
    wm = DeltaTable(str(lake / "_dblog_watermarks")).to_pyarrow_table().to_pylist()
    assert {r["source"] for r in wm} == {"pg_a", "pg_b", "maria"}
    assert all(r["progress_ms"] is not None for r in wm)
    meta = [h.get("userMetadata") for h in DeltaTable(str(lake / "public" / "orders")).history()]
    assert any(m and '"low_ms"' in m for m in meta)

    # a second run applies nothing again (per-source progress honoured)
    before = DeltaTable(str(lake / "public" / "orders")).version()
    assert run_sync(cfg, available_now=True) == 0
    assert DeltaTable(str(lake / "public" / "orders")).version() == before

    # A repair of one shard's table heals only its part of the merged table, in every
    # sink: its lost, changed and extra rows; the other shard's damage stays.
    ident = {"pg_a": ("pg_a", f"sa_{stamp}", "public"), "pg_b": ("pg_b", f"sb_{stamp}", "public")}
    damage = [("DELETE FROM {t} WHERE _dblog_source = 'pg_a' AND id = 1", ()),
              ("UPDATE {t} SET note = 'damaged' WHERE _dblog_source = 'pg_a' AND id = 2", ()),
              ("DELETE FROM {t} WHERE _dblog_source = 'pg_b' AND id = 1", ()),
              ("INSERT INTO {t} (_dblog_source, _dblog_db, _dblog_schema, id, note) "
               "VALUES (%s, %s, %s, 999, 'ghost')", ident["pg_a"]),
              ("INSERT INTO {t} (_dblog_source, _dblog_db, _dblog_schema, id, note) "
               "VALUES (%s, %s, %s, 998, 'ghost')", ident["pg_b"])]
    with psycopg.connect(replica, autocommit=True) as conn:
        for st, args in damage:
            conn.execute(st.format(t="merged.orders"), args)
    for st, args in damage:
        mariadb.execute(st.format(t="orders").replace("%s", "'{}'").format(*args), mysql_db)
    orders = DeltaTable(str(lake / "public" / "orders"))
    orders.delete("_dblog_source = 'pg_a' AND id = 1")
    orders.update(predicate="_dblog_source = 'pg_a' AND id = 2", updates={"note": "'damaged'"})
    orders.delete("_dblog_source = 'pg_b' AND id = 1")
    import pyarrow as pa_

    extra = orders.to_pyarrow_table().filter(pa_.compute.equal(pa_.compute.field("id"), 3))
    extra = extra.filter(pa_.compute.is_in(extra["_dblog_source"], pa_.array(["pg_a", "pg_b"])))
    extra = extra.set_column(extra.schema.get_field_index("id"), "id",
                             pa_.array([999 if s == "pg_a" else 998
                                        for s in extra["_dblog_source"].to_pylist()], pa_.int32()))
    write_deltalake(str(lake / "public" / "orders"), extra, mode="append")
    try:
        caps["pg_a"].start()
        res = subprocess.run([*DBLOG, "snapshot", "--config", str(caps["pg_a"].config), "--repair",
                              "--wait", r"public\.orders"], capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr
        caps["pg_a"].caught_up()
    finally:
        caps["pg_a"].stop()
    assert run_sync(cfg, available_now=True) == 0
    b1 = next(r for r in want if r[0] == "pg_b" and r[3] == 1)
    healed = (want - {b1}) | {("pg_b", f"sb_{stamp}", "public", 998, None, "ghost", None)}
    got_delta = merged_rows(lake, "public.orders", cols)
    b998 = {r for r in got_delta if r[0] == "pg_b" and r[3] == 998}
    assert len(b998) == 1
    assert got_delta == (healed - {("pg_b", f"sb_{stamp}", "public", 998, None, "ghost", None)}) | b998
    assert merged_rows(replica, "merged.orders", cols) == healed
    assert merged_rows((mariadb, mysql_db), "orders", cols) == healed
    want = healed

    # A truncate of one shard empties only its part of the merged table, in every sink;
    # in the same batch, its row before the truncate is gone, its rows after it are there.
    try:
        caps["pg_a"].start()
        pa.execute("INSERT INTO orders VALUES (100, 100, 'a-before')", "TRUNCATE orders",
                   "INSERT INTO orders VALUES (1, 1, 'a-after'), (200, 200, 'a-after')")
        caps["pg_a"].caught_up()
    finally:
        caps["pg_a"].stop()
        _drop_slots(dsn_a, *slots)
    assert run_sync(cfg, available_now=True) == 0
    want = {r for r in want if r[0] != "pg_a"}
    want |= {("pg_a", f"sa_{stamp}", "public", i, Decimal(i), "a-after", None) for i in (1, 200)}
    got_delta = merged_rows(lake, "public.orders", cols)
    assert {r for r in got_delta if r[3] != 998} == {r for r in want if r[3] != 998}
    assert merged_rows(replica, "merged.orders", cols) == want
    assert merged_rows((mariadb, mysql_db), "orders", cols) == want


@pytest.mark.slow
def test_a_column_widened_in_one_shard_is_widened_in_every_sink(
    spark: Any, pg_cluster: PgCluster, mariadb: MariaDB, tmp_path: Path
) -> None:
    """A shard's ``int`` column becomes ``bigint`` after the targets were created: the
    merged column is widened in place in Delta, PostgreSQL and MySQL, the rows already
    there keep their values, and a value above 2^31 lands in every sink."""
    stamp = f"w{tmp_path.name[-6:].lower()}_{int(time.time())}"
    dsn_a = pg_cluster.create_database(f"wa_{stamp}")
    dsn_b = pg_cluster.create_database(f"wb_{stamp}")
    slots = (f"dblog_wa_{stamp}", f"dblog_wb_{stamp}")
    pa, pb = SlotHarness(dsn_a, slots[0]), SlotHarness(dsn_b, slots[1])
    for h in (pa, pb):
        h.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), note text, "
                  "qty int)")
    caps = {"pg_a": Capture(pa, tmp_path / "a"), "pg_b": Capture(pb, tmp_path / "b")}
    lake = tmp_path / "lake"
    replica = pg_cluster.create_database(f"wr_{stamp}")
    mysql_db = f"wm_{stamp}"
    mariadb.execute(f"CREATE DATABASE `{mysql_db}`")
    cfg = load_config(_sync_config(tmp_path, {n: c.config for n, c in caps.items()}, lake,
                                   replica, mysql=mariadb.dsn(mysql_db)))
    big = 5_000_000_000
    for c in caps.values():
        c.start()
    try:
        pa.execute("INSERT INTO orders SELECT i, i, 'a', i FROM generate_series(1, 5) i")
        pb.execute("INSERT INTO orders SELECT i, i, 'b', -i FROM generate_series(1, 5) i")
        for c in caps.values():
            c.caught_up()
        assert run_sync(cfg, available_now=True) == 0
        pb.execute("ALTER TABLE orders ALTER COLUMN qty TYPE bigint",
                   f"INSERT INTO orders VALUES (6, 6, 'b', {big})",
                   f"UPDATE orders SET qty = {-big} WHERE id = 1")
        pa.execute("UPDATE orders SET qty = 7 WHERE id = 2")
        for c in caps.values():
            c.caught_up()
    finally:
        for c in caps.values():
            c.stop()
        _drop_slots(dsn_a, *slots)
    assert run_sync(cfg, available_now=True) == 0

    want = {("pg_a", i, 7 if i == 2 else i) for i in range(1, 6)}
    want |= {("pg_b", i, -big if i == 1 else -i) for i in range(1, 6)} | {("pg_b", 6, big)}
    table = DeltaTable(str(lake / "public" / "orders")).to_pyarrow_table()
    assert str(table.schema.field("qty").type) == "int64"
    assert {(r["_dblog_source"], r["id"], r["qty"]) for r in table.to_pylist()} == want
    with psycopg.connect(replica) as conn:
        got_pg = {tuple(r) for r in conn.execute("SELECT _dblog_source, id, qty FROM merged.orders")}
        [pg_type] = conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                                 "WHERE attrelid = 'merged.orders'::regclass AND attname = 'qty'"
                                 ).fetchone() or [None]
    assert (got_pg, pg_type) == (want, "bigint")
    got_my = {tuple(r) for r in mariadb.execute("SELECT _dblog_source, id, qty FROM orders", mysql_db)}
    assert got_my == want


@pytest.mark.parametrize("text, expect", [
    ('[[sync.sources]]\nname = "a"\nlog = { path = "x" }\n[[sync.sources]]\nname = "a"\n'
     'log = { path = "y" }', "names must be unique: a"),
    ('[[sync.sources]]\nname = "a b"\nlog = { path = "x" }', "source name 'a b'"),
    ('[[sync.sources]]\nname = "a"\nlog = { path = "x" }\n[[sync.routes]]\ntables = "("\n'
     'target = "public.t"', "not a valid regex"),
    ('[[sync.sources]]\nname = "a"\nlog = { path = "x" }\n[[sync.routes]]\ntables = "t"\n'
     'target = "t"', "must be schema.table"),
    ('[[sync.sources]]\nname = "a"\nlog = { path = "x" }\n[[sync.routes]]\ntables = "t"\n'
     'target = "s.t"\nsources = ["zz"]', "unknown source(s) zz"),
])
def test_sync_sources_config_errors(text: str, expect: str) -> None:
    import tomllib

    data = tomllib.loads("[sync]\n" + text)
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert expect in str(err.value)


def test_sync_only_config_needs_no_source() -> None:
    import tomllib

    cfg = parse_config(tomllib.loads('[[sync.sources]]\nname = "a"\nlog = { path = "x" }\n'))
    assert [s.name for s in cfg.sync.effective_sources(cfg.log)] == ["a"]
    single = parse_config(tomllib.loads('[source]\ndsn = "postgresql://h/d"\n'))
    assert [s.name for s in single.sync.effective_sources(single.log)] == ["default"]


def _writer(execute: Any, prefix: str, n: int, seed: int) -> None:
    """``n`` random single-row transactions on ``orders`` (keys 1..60: the shards'
    keys overlap), through ``execute(sql)``."""
    import random

    rng = random.Random(seed)
    for j in range(n):
        i = rng.randrange(1, 61)
        r = rng.random()
        if r < 0.5:
            execute(f"DELETE FROM orders WHERE id = {i}")
            execute(f"INSERT INTO orders (id, amount, note) VALUES ({i}, {j}, '{prefix}{j}')")
        elif r < 0.85:
            execute(f"UPDATE orders SET amount = {j}, note = '{prefix}u{j}' WHERE id = {i}")
        else:
            execute(f"DELETE FROM orders WHERE id = {i}")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_shards_written_concurrently_with_kill_9(
    spark: Any, pg_cluster: PgCluster, mariadb: MariaDB, my_db: str, tmp_path: Path
) -> None:
    """Three sources written concurrently while a capture and the streaming sync are
    killed with SIGKILL (and the sync once more between its sinks and Spark's commit);
    after a clean drain both targets equal the union of the sources, and T never moved
    back nor passed a source's progress."""
    import subprocess

    from tests.chaos import Load, kill_and_restart, kill_group, kill_seed, reporting, writing
    from tests.spark.test_crash import start_job

    stamp = f"{tmp_path.name[-6:].lower()}_{int(time.time())}"
    dsn_a = pg_cluster.create_database(f"ka_{stamp}")
    dsn_b = pg_cluster.create_database(f"kb_{stamp}")
    slots = (f"dblog_ka_{stamp}", f"dblog_kb_{stamp}")
    pa, pb = SlotHarness(dsn_a, slots[0]), SlotHarness(dsn_b, slots[1])
    my = MariaHarness(mariadb, my_db)
    pa.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), note text)")
    pb.execute("CREATE TABLE orders (id int PRIMARY KEY, amount numeric(10,2), note text)")
    my.execute("CREATE TABLE orders (id INT PRIMARY KEY, amount INT, note VARCHAR(40))")
    caps = {"pg_a": Capture(pa, tmp_path / "a"), "pg_b": Capture(pb, tmp_path / "b"),
            "maria": Capture(my, tmp_path / "m")}
    lake = tmp_path / "lake"
    replica = pg_cluster.create_database(f"rk_{stamp}")
    sync_cfg = _sync_config(tmp_path, {n: c.config for n, c in caps.items()}, lake, replica,
                            extra='trigger = "300 ms"\nmaster = "local[1]"\nsink_retries = 0')
    def pg_exec(dsn: str) -> Any:
        conn = psycopg.connect(dsn, autocommit=True)
        return lambda q: conn.execute(q)

    def my_exec(q: str) -> None:
        my.execute(q)

    lows: list[int] = []

    def watch() -> None:
        try:
            with psycopg.connect(replica, autocommit=True) as conn:
                row = conn.execute("SELECT max(low_ms), min(progress_ms) "
                                   "FROM merged._dblog_watermarks").fetchone()
        except psycopg.Error:
            return
        if row is not None and row[0] is not None:
            assert row[1] is None or row[0] <= row[1], row  # T is at most every progress
            lows.append(int(row[0]))

    for c in caps.values():
        c.start()
    jobs = [start_job(sync_cfg, None, tmp_path, 0)]
    # Each writer runs its transactions to the end (the block waits for them).
    loads: list[Load] = [lambda stop: _writer(pg_exec(dsn_a), "a", 300, 1),
                         lambda stop: _writer(pg_exec(dsn_b), "b", 300, 2),
                         lambda stop: _writer(my_exec, "m", 200, 3)]

    def watched(n: int, rng: object) -> None:  # the sync's first T
        deadline = time.monotonic() + 240
        while not lows and time.monotonic() < deadline:
            watch()
            time.sleep(0.5)

    seed = kill_seed(41)
    try:
        with writing(*loads):
            # kill -9 of a capture 8 s into the writes, down for 2 s while its source is
            # written; then of the sync mid-stream, once it published a T.
            capture = kill_and_restart(caps["pg_a"].kill, caps["pg_a"].start, 1, seed,
                                       delay=(8.0, 8.0), down=(2.0, 2.0))
            sync = kill_and_restart(lambda: kill_group(jobs[-1]), lambda: None, 1, seed + 1,
                                    delay=(0.0, 0.0), each_round=watched, restart_last=False,
                                    note=lambda: f"T {lows[-1] if lows else None}")
            # and between a batch's sinks and Spark's commit: the next batch of any source
            done = [int(f.name) for f in (tmp_path / "cp").glob("by-source/*/commits/*")
                    if f.name.isdigit()]
            jobs.append(start_job(sync_cfg, f"after-sinks:{max(done, default=0) + 1}", tmp_path, 1))
            try:
                jobs[-1].wait(timeout=240)
            except subprocess.TimeoutExpired:  # no source reached that batch: killed here
                kill_group(jobs[-1])
            jobs.append(start_job(sync_cfg, None, tmp_path, 2))
        with reporting(capture, sync):
            for c in caps.values():
                c.caught_up(timeout=180)
            for _ in range(10):
                watch()
                time.sleep(0.5)
    finally:
        for j in jobs:
            kill_group(j)
        for c in caps.values():
            if c.proc is not None:
                c.stop()
        _drop_slots(dsn_a, *slots)
    with reporting(capture, sync):
        assert run_sync(load_config(sync_cfg), available_now=True) == 0
        watch()
        assert lows == sorted(lows), lows  # T never moved back

        want: set[Row] = set()
        for name, dsn, db in (("pg_a", dsn_a, f"ka_{stamp}"), ("pg_b", dsn_b, f"kb_{stamp}")):
            want |= {(name, db, "public", i, a, n) for i, a, n, _ in _pg_rows(dsn)}
        with my.server.admin(my_db) as cur:
            cur.execute("SELECT id, amount, note FROM orders")
            want |= {("maria", my_db, my_db, i, None if a is None else Decimal(a), n)
                     for i, a, n in cur.fetchall()}
        cols = ["_dblog_source", "_dblog_db", "_dblog_schema", "id", "amount", "note"]
        assert merged_rows(lake, "public.orders", cols) == want
        assert merged_rows(replica, "merged.orders", cols) == want
