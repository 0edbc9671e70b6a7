"""`dblog verify` with MySQL/MariaDB on either side: a MariaDB source with a PostgreSQL
mirror, and a PostgreSQL source with a ``mysql`` sink's mirror (on MariaDB), both written
by the sync's own sinks (``MiniSync``) and damaged by hand: verify reports exactly the
damaged key ranges, ``--repair`` heals them through the running capture, and verify then
passes."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.mysql57 import MySQL57, TestServer
from pydblog.devtools.pgcluster import PgCluster
from tests.conftest import drop_database
from tests.helpers import (
    DBLOG,
    LogFollower,
    start_run,
    stop_run,
    wait_for,
    wait_for_marker,
    write_config,
)
from tests.integration.test_verify import CHUNK, MiniSync, SyncThread, differing, verify
from tests.mysql.servers import require_mysql57

pytest.importorskip("pymysql")
pytest.importorskip("deltalake")

ROWS = 1000  # 5 ranges of CHUNK rows
BLOB_KEYS = sorted({bytes([g % 256]) * (1 + g % 3) + bytes([255 - g % 256]) * (g % 2)
                    for g in range(320)})
"""Binary keys of several lengths (byte order is neither their hex's by length nor their
base64's): two ranges of CHUNK rows."""


def check_binary_keys(config: Path, table: str, sink: str, damage: Callable[[str], None]) -> None:
    """A binary-keyed table's mirror in another database kind: intact it verifies;
    damaged (the fifth key deleted, the last key's row changed), exactly the first and
    last ranges differ, each with that key."""
    code, report = verify(config, rf"{re.escape(table)}")
    assert code == 0, [t for t in report["tables"] if not t["ok"]]
    [t] = report["tables"]
    assert (t["source_rows"], t["ranges"]) == (len(BLOB_KEYS), len(BLOB_KEYS) // CHUNK + 1)
    damage(f"{BLOB_KEYS[4].hex()}")
    code, report = verify(config, rf"{re.escape(table)}", "--sink", sink)
    assert code == 1
    got = {r["index"]: r for r in differing(report, sink)[table]}
    last = (len(BLOB_KEYS) - 1) // CHUNK
    assert set(got) == {0, last}, got
    assert (got[0]["missing"], got[0]["extra"], got[0]["different"]) == (1, 0, 0), got[0]
    assert (got[last]["missing"], got[last]["different"]) == (0, 1), got[last]


def wait_for_my_marker(config: Path, server: TestServer, db: str, timeout: float = 60) -> None:
    """Write a marker row to the MariaDB source and wait until it is in the change log."""
    token = f"m{time.monotonic_ns()}"
    server.execute(f"INSERT INTO `{db}`.dblog_test_marker VALUES ('{token}')")
    follower = LogFollower(config)

    def seen() -> bool:
        try:
            events = follower()
        except AssertionError:
            return False
        return any(
            e["source"]["table"] == "dblog_test_marker" and (e.get("after") or {}).get("id") == token
            for e in events
        )

    try:
        wait_for(seen, timeout, "the marker row in the change log")
    finally:
        follower.close()


# -- a MariaDB source, a PostgreSQL mirror ---------------------------------------------------
@pytest.fixture
def mirror_db(pg_cluster: PgCluster) -> Iterator[str]:
    name = f"m_{uuid.uuid4().hex[:10]}"
    dsn = pg_cluster.create_database(name)
    try:
        yield dsn
    finally:
        drop_database(pg_cluster, name)


def _maria_source(tmp_path: Path, mariadb: TestServer, my_db: str,
                  sinks: str) -> Iterator[tuple[Path, MiniSync]]:
    mariadb.execute("CREATE TABLE dblog_test_marker (id VARCHAR(64) PRIMARY KEY)", my_db)
    mariadb.execute(
        "CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2), "
        "doc JSON, at DATETIME(6), seen TIMESTAMP(3) NULL, raw VARBINARY(8), ratio DOUBLE)", my_db)
    mariadb.execute("CREATE TABLE words (w VARCHAR(20) PRIMARY KEY, n BIGINT UNSIGNED)", my_db)
    mariadb.execute("CREATE TABLE blobs (k VARBINARY(16) PRIMARY KEY, n INT)", my_db)
    mariadb.execute(  # every type with a portable checksum (Delta through Spark)
        "CREATE TABLE kinds (id INT PRIMARY KEY, a TINYINT, b SMALLINT UNSIGNED, "
        "c MEDIUMINT, d BIGINT, e BIGINT UNSIGNED, f DECIMAL(12,3), g VARCHAR(40), "
        "h ENUM('sad','ok','happy'), i YEAR, j BIT(10), k DATE, l DATETIME(6), "
        "m TIMESTAMP(3) NULL, n VARBINARY(20), o TEXT, p CHAR(3))", my_db)
    mariadb.execute(  # no primary key: repaired whole
        "CREATE TABLE bag (a INT, b VARCHAR(20), c JSON, d VARBINARY(4), e DATETIME(6))", my_db)
    config = tmp_path / "dblog.toml"
    config.write_text(
        f'[source]\ntype = "mysql"\ndsn = "{mariadb.dsn(my_db)}"\nheartbeat_interval_s = 0.5\n'
        f'[log]\npath = "{tmp_path / "data"}"\n'
        f'[api]\nlisten = "127.0.0.1:0"\n{sinks}'
        "[snapshot]\nchunk_size = 100\n"
    )
    proc = start_run(config)
    try:
        values = ", ".join(
            f"({g}, 'item {g}', {g * 1.25:.2f}, '{{\"g\": {g}, \"h\": [{g}]}}', "
            f"'2024-01-01 00:00:00.{g:06d}', "
            + ("NULL" if g % 7 == 0 else f"'2024-02-01 00:{g % 60:02d}:00.123'")
            + f", UNHEX('{g:08x}'), {g / 7.0!r})"
            for g in range(1, ROWS + 1)
        )
        mariadb.execute(f"INSERT INTO items VALUES {values}", my_db)
        # text keys whose code point order is not the collation's (case, non-ASCII)
        words = ", ".join(
            f"('{'W' if g % 2 else 'w'}{g}{'Ä' if g % 3 == 0 else 'a'}', {2**63 + g})"
            for g in range(1, 301)
        )
        mariadb.execute(f"INSERT INTO words VALUES {words}", my_db)
        blobs = ", ".join(f"(UNHEX('{k.hex()}'), {n})" for n, k in enumerate(BLOB_KEYS))
        mariadb.execute(f"INSERT INTO blobs VALUES {blobs}", my_db)
        kinds = ", ".join(
            f"({g}, {g % 256 - 128}, {g * 500}, {-g * 1000}, {g * 10**15}, {2**64 - g}, "
            f"{g * 1.001:.3f}, " + ("NULL" if g % 5 == 0 else "''" if g % 5 == 1
                                    else f"'tëxt {g} \\\\ \"q\"'")
            + f", '{('sad', 'ok', 'happy')[g % 3]}', {1901 + g}, b'{g % 1024:b}', "
            f"DATE_ADD('1969-02-28', INTERVAL {g * 17} DAY), "
            f"DATE_ADD('1969-12-31 23:59:59.999999', INTERVAL {g * 86401000001} MICROSECOND), "
            + ("NULL" if g % 4 == 0 else f"FROM_UNIXTIME({1700000000 + g * 3600}.125)")
            + ", " + ("NULL" if g % 4 == 0 else f"UNHEX('{(bytes([g % 256]) * (g % 9)).hex()}')")
            + f", REPEAT('ü', {g % 7}), 'c{g % 10}')"
            for g in range(1, 121)
        )
        mariadb.execute(f"INSERT INTO kinds VALUES {kinds}", my_db)
        bag = ", ".join(
            f"({g % 20}, " + ("NULL" if g % 7 == 0 else f"'b{g}'") + ", "
            + ("NULL" if g % 3 == 0 else f"'{{\"g\": {g}}}'") + ", "
            + ("NULL" if g % 4 == 0 else f"UNHEX('{g:04x}')")
            + f", '2024-03-31 01:{g % 60:02d}:00.{g:06d}')"
            for g in range(1, 61))
        mariadb.execute(f"INSERT INTO bag VALUES {bag}", my_db)
        wait_for_my_marker(config, mariadb, my_db)
        sync = MiniSync(config)
        sync.catch_up()
        yield config, sync
        sync.close()
    finally:
        stop_run(proc)


@pytest.fixture
def maria_setup(tmp_path: Path, mariadb: MariaDB, my_db: str,
                mirror_db: str) -> Iterator[tuple[Path, MiniSync]]:
    yield from _maria_source(
        tmp_path, mariadb, my_db,
        f'[[sync.sinks]]\ntype = "postgres"\ndsn = "{mirror_db}"\nschema = "mirror"\n')


@pytest.fixture
def my57_setup(tmp_path: Path, mysql57: TestServer, my57_db: str,
               mirror_db: str) -> Iterator[tuple[Path, MiniSync]]:
    yield from _maria_source(
        tmp_path, mysql57, my57_db,
        f'[[sync.sinks]]\ntype = "postgres"\ndsn = "{mirror_db}"\nschema = "mirror"\n')


@pytest.fixture
def maria_delta(tmp_path: Path, mariadb: MariaDB, my_db: str) -> Iterator[tuple[Path, MiniSync]]:
    yield from _maria_source(
        tmp_path, mariadb, my_db, f'[[sync.sinks]]\ntype = "delta"\npath = "{tmp_path / "lake"}"\n')


@pytest.mark.slow
def test_mariadb_source_delta_mirror_through_spark(maria_delta: tuple[Path, MiniSync],
                                                  my_db: str, tmp_path: Path) -> None:
    """MariaDB and Spark checksum a Delta mirror alike for every portable type (no range
    read again); a value changed in Delta is found; a table with a float or JSON column
    is compared row by row."""
    from deltalake import DeltaTable

    config, _ = maria_delta
    tables = rf"{my_db}\.(kinds|words|blobs|items)"
    code, report = verify(config, tables, spark=True)
    assert code == 0, [t for t in report["tables"] if not t["ok"]]
    by = {t["table"]: t for t in report["tables"]}
    for name in ("kinds", "words", "blobs"):
        assert (by[f"{my_db}.{name}"]["mode"], by[f"{my_db}.{name}"]["suspects"]) == ("spark", 0)
    assert by[f"{my_db}.items"]["mode"] == "rows"  # a DOUBLE and a JSON column

    # one column changed per range of ten rows, each a type of its own: each one changes
    # its range's checksum (exactly the damaged ranges are suspects)
    lake = DeltaTable(str(tmp_path / "lake" / my_db / "kinds"))
    changes = {"g": "'changed'", "e": "e - 1", "j": "j + 1", "k": "k + INTERVAL '1 day'",
               "l": "l + INTERVAL '1 microsecond'", "m": "m + INTERVAL '1 second'",
               "n": "X'00'", "f": "f + 0.001", "h": "'ok2'", "p": "'zz'"}
    ids = [5 + 10 * n for n in range(len(changes))]
    for i, (col, expr) in zip(ids, changes.items(), strict=True):
        lake.update(predicate=f"id = {i}", updates={col: expr})
    code, report = verify(config, rf"{my_db}\.kinds", "--chunk-size", "10", spark=True)
    assert code == 1
    [t] = report["tables"]
    assert (t["mode"], t["suspects"]) == ("spark", len(ids)), t
    got = differing(report, "delta")[f"{my_db}.kinds"]
    assert [(r["status"], r["sample"]["different"]) for r in got] == [
        ("drift", [[i]]) for i in ids]


def source_items(mariadb: TestServer, db: str) -> dict[int, tuple[Any, ...]]:
    """The source's items (id -> name, price, doc as JSON, raw), for the independent check."""
    import json

    return {int(r[0]): (r[1], str(r[2]), json.loads(r[3]), bytes(r[4]))
            for r in mariadb.execute("SELECT id, name, price, doc, raw FROM items", db)}


def test_mariadb_source_postgres_mirror(maria_setup: tuple[Path, MiniSync], mariadb: MariaDB,
                                         my_db: str, mirror_db: str) -> None:
    check_postgres_mirror(*maria_setup, mariadb, my_db, mirror_db)


def test_mariadb_binary_keys_postgres_mirror(maria_setup: tuple[Path, MiniSync],
                                             my_db: str, mirror_db: str) -> None:
    def damage(key_hex: str) -> None:
        with psycopg.connect(mirror_db, autocommit=True) as conn:
            conn.execute(f"DELETE FROM mirror.blobs WHERE k = '\\x{key_hex}'::bytea")
            conn.execute("UPDATE mirror.blobs SET n = -1 WHERE k = %s", (BLOB_KEYS[-1],))

    check_binary_keys(maria_setup[0], f"{my_db}.blobs", "postgres", damage)


@pytest.mark.slow
def test_mysql57_source_postgres_mirror(my57_setup: tuple[Path, MiniSync], mysql57: TestServer,
                                        my57_db: str, mirror_db: str) -> None:
    check_postgres_mirror(*my57_setup, mysql57, my57_db, mirror_db)


def test_mysql57_gtid_mode_off_settles_drift(tmp_path: Path, mirror_db: str) -> None:
    """A MySQL source with GTIDs off has no GTID state to wait for: verify waits for the
    capture to pass the binlog's end it saw (an idle capture's checkpoint moves there),
    so damage is still reported as drift (not unsettled) and repaired."""
    require_mysql57()
    with MySQL57(server_id=9, settings={"gtid_mode": "OFF",
                                        "enforce_gtid_consistency": "OFF"}) as server:
        server.create_database("nogtid")
        setup = _maria_source(
            tmp_path, server, "nogtid",
            f'[[sync.sinks]]\ntype = "postgres"\ndsn = "{mirror_db}"\nschema = "mirror"\n')
        config, sync = next(setup)
        try:
            check_postgres_mirror(config, sync, server, "nogtid", mirror_db)
        finally:
            for _ in setup:  # its teardown: the sync's connections, the capture
                pass


def damage_mirror(run: Callable[[str], object], prefix: str, change_300: str, change_320: str,
                  change_word: str) -> None:
    """Damage a mirror of a MySQL/MariaDB source's ``items`` and ``words`` (tables
    ``<prefix>items``, ``<prefix>words``) by hand, each damage in a range of its own
    (``assert_damage_found``): range 0 of items misses keys 10 and 11; range 1 differs at
    300 and 320 (``change_300``, ``change_320``: SET clauses); range 2 misses all of
    (500, 750]; range 4 holds key 5000 the source never had; words differs at 'W3Ä'
    (``change_word``) in its range 0 ('W' < 'w')."""
    run(f"DELETE FROM {prefix}items WHERE id IN (10, 11)")
    run(f"UPDATE {prefix}items SET {change_300} WHERE id = 300")
    run(f"UPDATE {prefix}items SET {change_320} WHERE id = 320")
    run(f"DELETE FROM {prefix}items WHERE id > 500 AND id <= 750")
    run(f"INSERT INTO {prefix}items (id, name) VALUES (5000, 'ghost')")
    run(f"UPDATE {prefix}words SET {change_word} WHERE w = 'W3Ä'")


def assert_damage_found(config: Path, db: str, sink: str) -> None:
    """`dblog verify` reports exactly the ranges ``damage_mirror`` damaged in ``sink``'s
    mirror, each as drift, with the keys it sampled."""
    code, report = verify(config, rf"{db}\.(items|words)")
    assert code == 1
    got = {r["index"]: r for r in differing(report, sink)[f"{db}.items"]}
    assert set(got) == {0, 1, 2, 4}, got
    assert all(r["status"] == "drift" for r in got.values())
    assert got[0]["sample"]["missing"] == [[10], [11]] and got[0]["extra"] == 0
    assert got[1]["sample"]["different"] == [[300], [320]]
    assert (got[2]["lo"], got[2]["hi"], got[2]["missing"]) == ([500], [750], 250)
    assert (got[4]["hi"], got[4]["sample"]["extra"]) == (None, [[5000]])
    [w] = differing(report, sink)[f"{db}.words"]
    assert (w["index"], w["sample"]["different"]) == (0, [["W3Ä"]])


def check_postgres_mirror(config: Path, sync: MiniSync, mariadb: TestServer, my_db: str,
                          mirror_db: str) -> None:
    """Intact: verify passes; damaged by hand: exactly the damaged ranges; repaired: equal."""
    code, report = verify(config, rf"{my_db}\.(items|words)")
    assert code == 0, [t for t in report["tables"] if not t["ok"]]
    by = {t["table"]: t for t in report["tables"]}
    t = by[f"{my_db}.items"]
    assert (t["mode"], t["source_rows"], t["ranges"]) == ("rows", ROWS, ROWS // CHUNK + 1)
    assert (by[f"{my_db}.words"]["source_rows"], by[f"{my_db}.words"]["ranges"]) == (300, 2)

    with psycopg.connect(mirror_db, autocommit=True) as conn:
        damage_mirror(conn.execute, "mirror.", "price = price + 1", "doc = '{\"g\": 0}'",
                      "n = 0")
    assert_damage_found(config, my_db, "postgres")

    running = SyncThread(sync)
    try:
        code, out = verify(config, rf"{my_db}\.(items|words)", "--repair", "--repair-timeout", "120")
    finally:
        running.close()
    assert out["before"]["ok"] is False
    assert set(out["repair"]["markers"]) == {f"{my_db}.items", f"{my_db}.words"}, out["repair"]
    assert code == 0, out["after"]
    assert out["after"]["ok"]
    with psycopg.connect(mirror_db, autocommit=True) as conn:
        mirror = {int(r[0]): (r[1], str(r[2]), r[3], bytes(r[4]))
                  for r in conn.execute("SELECT id, name, price, doc, raw FROM mirror.items")}
    assert mirror == source_items(mariadb, my_db)


@pytest.mark.slow
def test_mariadb_source_delta_mirror(maria_delta: tuple[Path, MiniSync], mariadb: MariaDB,
                                     my_db: str, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    config, sync = maria_delta
    code, report = verify(config, rf"{my_db}\.(items|words)")
    assert code == 0, report
    path = str(tmp_path / "lake" / my_db / "items")
    DeltaTable(path).delete("id = 7 OR (id > 250 AND id <= 500)")
    DeltaTable(path).update(predicate="id = 999", updates={"name": "'changed'"})
    code, report = verify(config, rf"{my_db}\.(items|words)")
    assert code == 1
    got = {r["index"]: r for r in differing(report, "delta")[f"{my_db}.items"]}
    assert set(got) == {0, 1, 3}, got
    assert got[0]["sample"]["missing"] == [[7]] and got[1]["missing"] == 250
    assert got[3]["sample"]["different"] == [[999]]
    running = SyncThread(sync)
    try:
        code, out = verify(config, rf"{my_db}\.items", "--repair", "--repair-timeout", "120")
    finally:
        running.close()
    assert code == 0, out["after"]


# -- a PostgreSQL source, a mysql sink's mirror ----------------------------------------------
@pytest.fixture
def pg_to_maria(tmp_path: Path, pg_db: str, mariadb: MariaDB,
                my_db: str) -> Iterator[tuple[Path, MiniSync]]:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), "
            "doc jsonb, at timestamptz, ok boolean, ratio double precision)"
        )
        conn.execute("CREATE TABLE words (w text PRIMARY KEY, n bigint)")
        conn.execute("CREATE TABLE blobs (k bytea PRIMARY KEY, n int)")
    config = write_config(
        tmp_path, pg_db,
        extra=f'[[sync.sinks]]\ntype = "mysql"\ndsn = "{mariadb.dsn(my_db)}"\n'
              "[snapshot]\nchunk_size = 100\n",
    )
    proc = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO items SELECT g, 'item ' || g, g * 1.25, "
                "jsonb_build_object('g', g, 'h', ARRAY[g]), '2024-01-01 00:00:00+00'::timestamptz "
                "+ g * interval '1 minute 1.5 seconds', g %% 2 = 0, g / 7.0 "
                "FROM generate_series(1, %s) g",
                (ROWS,),
            )
            conn.execute(
                "INSERT INTO words SELECT 'w' || g || CASE WHEN g % 3 = 0 THEN 'Ä' ELSE 'a' END, g "
                "FROM generate_series(1, 300) g"
            )
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO blobs VALUES (%s, %s)",
                                [(k, n) for n, k in enumerate(BLOB_KEYS)])
        wait_for_marker(config, pg_db)
        sync = MiniSync(config)
        sync.catch_up()
        yield config, sync
        sync.close()
    finally:
        stop_run(proc)


def test_postgres_binary_keys_mysql_mirror(pg_to_maria: tuple[Path, MiniSync],
                                           mariadb: MariaDB, my_db: str) -> None:
    def damage(key_hex: str) -> None:
        mariadb.execute(f"DELETE FROM blobs WHERE k = UNHEX('{key_hex}')", my_db)
        mariadb.execute(f"UPDATE blobs SET n = -1 WHERE k = UNHEX('{BLOB_KEYS[-1].hex()}')", my_db)

    check_binary_keys(pg_to_maria[0], "public.blobs", "mysql", damage)


def test_postgres_source_mysql_mirror(pg_to_maria: tuple[Path, MiniSync], mariadb: MariaDB,
                                      my_db: str, pg_db: str) -> None:
    config, sync = pg_to_maria
    code, report = verify(config, r"public\.(items|words)")
    assert code == 0, report
    by = {t["table"]: t for t in report["tables"]}
    assert by["public.items"]["sink"] == "mysql" and by["public.items"]["mode"] == "rows"
    assert by["public.items"]["source_rows"] == ROWS

    run: Any = mariadb.execute
    run("DELETE FROM items WHERE id IN (10, 11)", my_db)  # range 0
    run("UPDATE items SET at = at + INTERVAL 1 SECOND WHERE id = 260", my_db)  # range 1
    run("UPDATE items SET ok = NOT ok WHERE id = 270", my_db)  # range 1
    run("DELETE FROM items WHERE id > 750", my_db)  # range 3 whole (750, 1000]
    run("INSERT INTO items (id, name) VALUES (-5, 'below')", my_db)  # range 0
    run("UPDATE words SET n = 0 WHERE w = 'w3Ä'", my_db)
    code, report = verify(config, r"public\.(items|words)", "--sink", "mysql")
    assert code == 1
    got = differing(report, "mysql")
    items = {r["index"]: r for r in got["public.items"]}
    assert set(items) == {0, 1, 3}, items
    assert items[0]["sample"]["missing"] == [[10], [11]] and items[0]["sample"]["extra"] == [[-5]]
    assert items[1]["sample"]["different"] == [[260], [270]]
    assert (items[3]["lo"], items[3]["hi"], items[3]["missing"]) == ([750], [1000], 250)
    [w] = got["public.words"]
    assert w["sample"]["different"] == [["w3Ä"]]

    running = SyncThread(sync)
    try:
        code, out = verify(config, r"public\.(items|words)", "--repair", "--repair-timeout", "120")
    finally:
        running.close()
    assert set(out["repair"]["markers"]) == {"public.items", "public.words"}, out["repair"]
    assert code == 0, out["after"]
    with psycopg.connect(pg_db, autocommit=True) as conn:
        source = {(int(r[0]), r[1], str(r[2]), bool(r[3]))
                  for r in conn.execute("SELECT id, name, price, ok FROM items")}
    mirror = {(int(r[0]), r[1], str(r[2]), bool(r[3]))
              for r in mariadb.execute("SELECT id, name, price, ok FROM items", my_db)}
    assert mirror == source

    # ``--sink`` names the mysql sink; an unknown name is a configuration error naming it
    res = subprocess.run(
        [*DBLOG, "verify", "--config", str(config), "--sink", "nope"],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 2 and "mysql" in res.stderr, res.stderr


# -- a MariaDB source, a mysql sink's mirror on MariaDB: checksums in both servers ----------
@pytest.fixture
def maria_to_maria(tmp_path: Path, mariadb: MariaDB,
                   my_db: str) -> Iterator[tuple[Path, MiniSync, str]]:
    mirror = f"m_{uuid.uuid4().hex[:10]}"
    mariadb.execute(f"CREATE DATABASE {mirror}")
    try:
        for config, sync in _maria_source(
                tmp_path, mariadb, my_db,
                f'[[sync.sinks]]\ntype = "mysql"\ndsn = "{mariadb.dsn(mirror)}"\n'):
            yield config, sync, mirror
    finally:
        mariadb.execute(f"DROP DATABASE IF EXISTS {mirror}")


def test_mariadb_source_mysql_mirror_in_database_checksums(
        maria_to_maria: tuple[Path, MiniSync, str], mariadb: MariaDB, my_db: str) -> None:
    """The sink's types differ from the source's (VARCHAR -> LONGTEXT, DATETIME(6),
    JSON text re-serialized): equal rows still checksum equal; each damage, down to one
    microsecond or one byte, makes its range differ."""
    config, _sync, mirror = maria_to_maria
    code, report = verify(config, rf"{my_db}\.(items|words)")
    assert code == 0, [t for t in report["tables"] if not t["ok"]]
    by = {t["table"]: t for t in report["tables"]}
    t = by[f"{my_db}.items"]
    assert (t["mode"], t["source_rows"], t["ranges"]) == ("sql", ROWS, ROWS // CHUNK + 1)
    assert (by[f"{my_db}.words"]["mode"], by[f"{my_db}.words"]["source_rows"]) == ("sql", 300)

    damage_mirror(lambda st: mariadb.execute(st, mirror), "",
                  "at = at + INTERVAL 1 MICROSECOND", "raw = UNHEX('00')", "n = n + 1")
    assert_damage_found(config, my_db, "mysql")
    # (repairs into a mysql mirror: test_postgres_source_mysql_mirror)


def bag_rows(mariadb: MariaDB, db: str) -> set[tuple[Any, ...]]:
    """The distinct rows of ``bag``, JSON parsed (a mirror re-serializes it)."""
    import json

    return {(r[0], r[1], None if r[2] is None else json.dumps(json.loads(r[2]), sort_keys=True),
             r[3], str(r[4]))
            for r in mariadb.execute("SELECT a, b, c, HEX(d), e FROM bag", db)}


def test_mariadb_keyless_table_repaired_whole_in_a_mysql_mirror(
        maria_to_maria: tuple[Path, MiniSync, str], mariadb: MariaDB, my_db: str) -> None:
    """A table without primary key: rows lost, added (with NULLs) and changed in the
    mirror are found as one whole-table range and repaired whole; the mirror's rows that
    the source lacks go, matched null-safely (``<=>``, JSON and bytes included)."""
    config, sync, mirror = maria_to_maria
    want = bag_rows(mariadb, my_db)
    assert len(want) == 60 and bag_rows(mariadb, mirror) == want
    run: Any = mariadb.execute
    run("DELETE FROM bag WHERE a = 3", mirror)
    run("UPDATE bag SET c = '{\"g\": -1}' WHERE a = 5 AND c IS NOT NULL", mirror)
    run("INSERT INTO bag VALUES (77, NULL, NULL, NULL, NULL), (78, 'ghost', '[1]', x'00', NULL)",
        mirror)
    code, report = verify(config, rf"{my_db}\.bag")
    assert code == 1
    [r] = differing(report, "mysql")[f"{my_db}.bag"]
    assert (r["status"], r["lo"], r["hi"]) == ("drift", None, None), r
    running = SyncThread(sync)
    try:
        code, out = verify(config, rf"{my_db}\.bag", "--repair", "--repair-timeout", "120")
    finally:
        running.close()
    assert out["repair"]["whole"] == [f"{my_db}.bag"], out["repair"]
    assert code == 0, out["after"]
    assert bag_rows(mariadb, mirror) == want
    [n] = mariadb.execute("SELECT COUNT(*) FROM bag", mirror)
    assert n[0] == 60


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mysql_mirror_verify_and_repair_under_writes(pg_to_maria: tuple[Path, MiniSync],
                                                      mariadb: MariaDB, my_db: str,
                                                      pg_db: str) -> None:
    """A mysql sink's mirror damaged by hand while a workload writes (updates, deletes,
    inserts, key-changing updates; never on the damaged keys): verify finds exactly the
    damage as drift (lag is only ever unsettled), the repair heals it, and once the
    writes stop the mirror equals the source."""
    from tests.integration.test_verify import Workload

    config, sync = pg_to_maria
    run: Any = mariadb.execute
    # (the keys Workload never writes)
    run("DELETE FROM items WHERE id IN (10, 11) OR (id > 500 AND id <= 750 AND id <> 600)", my_db)
    run("UPDATE items SET price = price + 1 WHERE id = 600", my_db)
    run("INSERT INTO items (id, name) VALUES (-1, 'below')", my_db)
    want = {"missing": 2 + 249, "different": 1, "extra": 1}
    running = SyncThread(sync)
    work = Workload(pg_db)
    try:
        for _ in range(3):
            code, report = verify(config, r"public\.items", "--lag-timeout", "30")
            assert code == 1
            found = {k: 0 for k in want}
            for r in differing(report, "mysql").get("public.items", []):
                assert r["status"] in ("drift", "unsettled"), r
                for k in want:
                    found[k] += r[k]
            if found == want:
                break
        assert found == want, report
        code, out = verify(config, r"public\.items", "--repair", "--repair-timeout", "180",
                           "--lag-timeout", "30")
        assert out["repair"]["markers"] == {"public.items": out["repair"]["markers"]["public.items"]}
        assert code == 0 or all(r["status"] == "unsettled" for t in out["after"]["tables"]
                                for r in t["differing"]), out
    finally:
        work.close()
        running.close()
    assert work.writes > 100
    wait_for_marker(config, pg_db)
    sync.catch_up()
    code, report = verify(config, r"public\.items")
    assert code == 0, report
    with psycopg.connect(pg_db) as conn:
        source = {(int(r[0]), r[1], None if r[2] is None else str(r[2]), r[3])
                  for r in conn.execute("SELECT id, name, price, ok FROM items")}
    mirror = {(int(r[0]), r[1], None if r[2] is None else str(r[2]),
               None if r[3] is None else bool(r[3]))
              for r in mariadb.execute("SELECT id, name, price, ok FROM items", my_db)}
    assert mirror == source
