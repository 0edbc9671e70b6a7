"""The MySQL/MariaDB sink: `dblog run` captures a PostgreSQL source with varied types,
`run_sync` mirrors it into MariaDB (MySQL 5.7 in ``-m slow``), and every column of every
row is compared with the source after normalization (``verify.norm``), rows counted
(a stale duplicate would vanish in a comparison by key); a trigger on the progress
table records every step's move, which must only ever go forward (a step applied twice
would move a row to where it already was). Also: the type mapping on a real server,
errors, and config validation."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import psycopg
import pytest

from pydblog.config import load_config, parse_config
from pydblog.errors import ConfigError, SinkError
from pydblog.ports import ColumnSchema, TableSchema
from pydblog.spark.job import run_sync
from pydblog.spark.sinks.mysql import (
    PROGRESS_TABLE,
    MySqlSink,
    column_types,
    mysql_type,
    to_db,
)
from tests.helpers import assert_oracle, source_rows, start_run, stop_run, write_config
from tests.spark.helpers import Table, _key, _row, assert_tables_equal, latest_schemas

TABLES = {
    "public.mt": ["id"],
    "public.tk": ["k", "n"],
    "public.nk": ["a", "b", "c"],
    "public.tr": ["id"],
}
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g)"
ROW = (
    "g, g - 100, g * 10000000000, g / 7.0, (g / 3.0)::numeric, g / 4.0, g / 3.0, g % 2 = 0,"
    " 'tëxt ' || g || ' ✓', 'v' || g, 'c' || (g % 10), decode(lpad(to_hex(g), 4, '0'), 'hex'),"
    " md5(g::text)::uuid, DATE '2024-02-29' + g, TIME '00:00:00.5' + g * INTERVAL '1 minute',"
    " TIMETZ '01:02:03.25-08', TIMESTAMP '2024-01-02 03:04:05.123' + g * INTERVAL '1 hour',"
    " TIMESTAMPTZ '2024-01-02 03:04:05.123+02' + g * INTERVAL '1 day', g * INTERVAL '1 day 2 hours',"
    " json_build_object('g', g, 'l', json_build_array(1, 'x', NULL)),"
    " jsonb_build_object('k', 'v' || g, 'n', g / 2.0), ARRAY[g, NULL, 3], ARRAY['a,b', 'c\"d', NULL],"
    " (ARRAY['sad', 'ok', 'happy']::mood[])[g % 3 + 1], " + BIG + " || g"
)


def setup_source(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for st in (
            "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
            "CREATE TABLE mt (id int PRIMARY KEY, si smallint, bi bigint, num numeric(12,3),"
            " anynum numeric, r real, d double precision, b boolean, t text, vc varchar(20),"
            " ch char(5), by bytea, u uuid, dt date, tm time, ttz timetz, ts timestamp,"
            " tstz timestamptz, iv interval, j json, jb jsonb, ia int[], ta text[], e mood, big text)",
            "ALTER TABLE mt ALTER COLUMN big SET STORAGE EXTERNAL",
            f"INSERT INTO mt SELECT {ROW} FROM generate_series(1, 30) g",
            "INSERT INTO mt (id, tm) VALUES (1000, '24:00')",  # every other column NULL
            "CREATE TABLE tk (k text, n int, v text, PRIMARY KEY (k, n))",
            # keys a case-insensitive or PAD SPACE collation would merge
            "INSERT INTO tk VALUES ('a', 1, 'lower'), ('A', 1, 'upper'), ('a ', 1, 'space'),"
            " ('', 1, 'empty'), ('é', 2, 'accent'), ('e', 2, 'plain')",
            "CREATE TABLE nk (a int, b text, c jsonb)",
            "ALTER TABLE nk REPLICA IDENTITY FULL",
            "CREATE TABLE tr (id int PRIMARY KEY, v text)",
            "INSERT INTO tr SELECT g, 'old' || g FROM generate_series(1, 12) g",
        ):
            conn.execute(st)


def keyless_rows(dsn: str) -> None:
    """nk's rows, streamed (the initial snapshot skips a table without key)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO nk VALUES (1, 'x', NULL), (2, NULL, '{\"a\": 1}'), (NULL, 'y', '[1]'),"
            " (4, 'z ', '{}'), (NULL, NULL, NULL), (6, 'z', '2')")


def writes(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for st in (
            # big is TOASTed and left alone: its value is kept from the mirror
            "UPDATE mt SET num = num + 1, tstz = tstz + INTERVAL '1 second', r = -r WHERE id % 3 = 0",
            "DELETE FROM mt WHERE id % 5 = 0",
            f"INSERT INTO mt SELECT {ROW} FROM generate_series(31, 36) g",
            "ALTER TABLE mt ADD COLUMN extra numeric(5,1)",
            "UPDATE mt SET extra = id / 2.0, jb = '[]' WHERE id < 10",
            "UPDATE mt SET id = id + 500 WHERE id = 2",
            "DELETE FROM tk WHERE k = 'a '",
            "UPDATE tk SET v = 'UPPER' WHERE k = 'A'",
            "INSERT INTO tk VALUES ('a  ', 1, 'two spaces')",
            "UPDATE nk SET c = '{\"b\": 2}' WHERE a = 1",
            "DELETE FROM nk WHERE a IS NULL AND b = 'y'",
            "UPDATE nk SET b = 'w' WHERE a IS NULL AND b IS NULL",
            "INSERT INTO nk VALUES (7, NULL, NULL)",
            "TRUNCATE tr",
            "INSERT INTO tr SELECT g, 'new' || g FROM generate_series(8, 20) g",
        ):
            conn.execute(st)


def _log_value(logical: str, v: Any) -> Any:
    """A value read from MySQL in the change log's form where ``verify.norm`` does not
    already take both (TIME as timedelta, text keys held as VARBINARY)."""
    if isinstance(v, dt.timedelta):
        us = v // dt.timedelta(microseconds=1)
        sign = "-" if us < 0 else ""
        secs, frac = divmod(abs(us), 1_000_000)
        text = f"{sign}{secs // 3600:02d}:{secs % 3600 // 60:02d}:{secs % 60:02d}"
        return text + (f".{frac:06d}" if frac else "")
    if isinstance(v, bytes | bytearray) and logical not in ("bytes",):
        return bytes(v).decode()
    if isinstance(v, str) and (logical == "json" or logical.startswith("array")):
        return orjson.loads(v)  # (the key of a keyless table holds it)
    return v


def mysql_table(server: Any, database: str, schema: TableSchema) -> tuple[Table, int]:
    """The mirror of ``schema`` (normalized like the oracle) and its row count."""
    names = [c.name for c in schema.columns]
    cols = ", ".join(f"`{n}`" for n in names)
    conn = server.connect(database)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {cols} FROM `{schema.table}`")
            fetched = cur.fetchall()
    finally:
        conn.close()
    logical = {c.name: c.logical for c in schema.columns}
    rows = [{n: _log_value(logical[n], v) for n, v in zip(names, r, strict=True)} for r in fetched]
    return {_key(schema, r): _row(schema, r) for r in rows}, len(rows)


def audit_progress(server: Any, database: str) -> None:
    """The progress table as the sink creates it, plus a trigger that logs every move
    of a step's row (created before the first sync, so the sink keeps it)."""
    for st in (
        f"CREATE TABLE `{PROGRESS_TABLE}` (part INT NOT NULL, nparts INT NOT NULL, "
        "applied_end BIGINT NOT NULL, batch_id BIGINT NOT NULL, applied_at DATETIME(6) NOT NULL "
        "DEFAULT CURRENT_TIMESTAMP(6), PRIMARY KEY (part, nparts)) ENGINE=InnoDB",
        "CREATE TABLE progress_audit (seq INT AUTO_INCREMENT PRIMARY KEY, part INT, "
        "old_end BIGINT, new_end BIGINT)",
        f"CREATE TRIGGER progress_moves AFTER UPDATE ON `{PROGRESS_TABLE}` FOR EACH ROW "
        "INSERT INTO progress_audit (part, old_end, new_end) "
        "VALUES (NEW.part, OLD.applied_end, NEW.applied_end)",
    ):
        server.execute(st, database)


def assert_steps_once(server: Any, database: str, end: int, parts: int) -> None:
    """Every step's row only moved forward (a step applied again would move it to where
    it was) and every step reached ``end``."""
    moves = server.execute("SELECT part, old_end, new_end FROM progress_audit ORDER BY seq",
                           database)
    back = [m for m in moves if m[2] <= m[1]]
    assert not back, f"steps applied again: {back[:5]} (of {len(moves)} moves)"
    ends = dict(server.execute(
        f"SELECT part, applied_end FROM `{PROGRESS_TABLE}` WHERE nparts = {parts}", database))
    assert ends == {p: end for p in range(-1, parts)}, ends


def log_end(log_dir: Path) -> int:
    from pydblog.changelog.sqlite import SqliteChangeLogReader

    reader = SqliteChangeLogReader(log_dir)
    try:
        return int(reader.next_offset())
    finally:
        reader.close()


def wait_oracle(config: Path, dsn: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            assert_oracle(config, dsn, TABLES)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def run_pg_to_mysql(server: Any, pg_db: str, tmp_path: Path) -> None:
    database = f"m_{tmp_path.name[-8:].lower()}_{int(time.time())}"
    server.execute(f"CREATE DATABASE `{database}`")
    audit_progress(server, database)
    setup_source(pg_db)
    config = write_config(tmp_path, pg_db, extra=f"""
[snapshot]
mode = "initial"
chunk_size = 7
[api]
listen = "127.0.0.1:0"
sync_listen = "127.0.0.1:0"
[sync]
checkpoint = "{tmp_path / "cp"}"
master = "local[2]"
sink_retries = 0
max_events_per_trigger = 100
[[sync.sinks]]
type = "mysql"
dsn = "{server.dsn(database)}"
parallelism = 2
""")
    proc = start_run(config)
    try:
        keyless_rows(pg_db)
        wait_oracle(config, pg_db)
        cfg = load_config(config)
        assert run_sync(cfg, available_now=True) == 0  # the snapshot first: kept TOAST
        writes(pg_db)
        wait_oracle(config, pg_db)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err
    assert run_sync(cfg, available_now=True) == 0
    schemas = latest_schemas(tmp_path / "data")
    assert "extra" in [c.name for c in schemas["public.mt"].columns]
    for table, key in TABLES.items():
        s = schemas[table]
        want = {_key(s, r): _row(s, r) for r in source_rows(pg_db, table, key).values()}
        got, count = mysql_table(server, database, s)
        assert_tables_equal(want, got, f"mysql {table}", [c.name for c in s.columns])
        assert count == len(want), f"mysql {table}: {count} rows for {len(want)} keys"
    assert_steps_once(server, database, log_end(tmp_path / "data"), 2)
    server.execute(f"DROP DATABASE `{database}`")


def test_pg_capture_mirrored_into_mariadb(spark: Any, pg_db: str, mariadb: Any,
                                          tmp_path: Path) -> None:
    run_pg_to_mysql(mariadb, pg_db, tmp_path)


@pytest.mark.slow
def test_pg_capture_mirrored_into_mysql57(spark: Any, pg_db: str, mysql57: Any,
                                          tmp_path: Path) -> None:
    run_pg_to_mysql(mysql57, pg_db, tmp_path)


# -- types ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source_type", "logical", "expected"),
    [
        ("integer", "int32", "INT"),
        ("smallint", "int16", "SMALLINT"),
        ("bigint", "int64", "BIGINT"),
        ("int(10) unsigned", "int32", "INT UNSIGNED"),
        ("bigint(20) unsigned", "int64", "BIGINT UNSIGNED"),
        ("tinyint(3) unsigned", "int16", "TINYINT UNSIGNED"),
        ("bit(64)", "int64", "BIGINT UNSIGNED"),
        ("numeric(12,3)", "decimal", "DECIMAL(12,3)"),
        ("decimal(65,30)", "decimal", "DECIMAL(65,30)"),
        ("numeric(70,2)", "decimal", "LONGTEXT"),
        ("numeric", "decimal", "LONGTEXT"),
        ("real", "float32", "DOUBLE"),
        ("double precision", "float64", "DOUBLE"),
        ("boolean", "bool", "BOOLEAN"),
        ("text", "string", "LONGTEXT"),
        ("character varying(20)", "string", "LONGTEXT"),
        ("bytea", "bytes", "LONGBLOB"),
        ("uuid", "uuid", "CHAR(36)"),
        ("date", "date", "DATE"),
        ("time without time zone", "time", "TIME(6)"),
        ("time with time zone", "timetz", "LONGTEXT"),
        ("timestamp(3) without time zone", "timestamp", "DATETIME(6)"),
        ("timestamp with time zone", "timestamptz", "DATETIME(6)"),
        ("datetime(6)", "timestamp", "DATETIME(6)"),
        ("interval", "interval", "LONGTEXT"),
        ("jsonb", "json", "JSON"),
        ("integer[]", "array<int32>", "JSON"),
        ("set('x','y')", "array<string>", "JSON"),
        ("public.mood", "enum", "LONGTEXT"),
        ("enum('a','b')", "string", "LONGTEXT"),
        ("geometry", "bytes", "LONGBLOB"),
        ("inet", "string", "LONGTEXT"),
        ("whatever", "unknown", "LONGTEXT"),
    ],
)
def test_mysql_type(source_type: str, logical: str, expected: str) -> None:
    assert mysql_type(ColumnSchema("c", source_type, logical)) == expected


def _schema(*cols: tuple[str, str, str], key: tuple[str, ...]) -> TableSchema:
    return TableSchema("public", "t", tuple(ColumnSchema(n, t, lg, n not in key)
                                            for n, t, lg in cols), key)


def test_key_columns_fit_an_index_on_the_server(mariadb: Any, my_db: str) -> None:
    """Text, bytes and json key columns get a VARCHAR/VARBINARY sized so that the key
    fits InnoDB's 3072 bytes; the server accepts each table, and a text key's collation
    tells 'a', 'A' and 'a ' apart."""
    schemas = [
        _schema(("k", "text", "string"), ("v", "text", "string"), key=("k",)),
        _schema(("a", "text", "string"), ("b", "bytea", "bytes"), ("c", "jsonb", "json"),
                ("n", "bigint", "int64"), ("ts", "timestamptz", "timestamptz"), key=("a", "b", "c", "n", "ts")),
        _schema(("k", "character varying(20)", "string"), ("u", "uuid", "uuid"), key=("k", "u")),
    ]
    for i, s in enumerate(schemas):
        for nopad in (True, False):
            types = column_types(s, nopad=nopad)
            ddl = ", ".join(f"`{c.name}` {types[c.name]}" for c in s.columns)
            name = f"t{i}_{int(nopad)}"
            mariadb.execute(f"CREATE TABLE `{name}` ({ddl}, PRIMARY KEY ({', '.join(s.key)})) "
                            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4", my_db)
    assert column_types(schemas[2])["k"].startswith("VARCHAR(20)")
    mariadb.execute("INSERT INTO t0_1 VALUES ('a', '1'), ('A', '2'), ('a ', '3')", my_db)
    mariadb.execute("INSERT INTO t0_0 VALUES ('a', '1'), ('A', '2'), ('a ', '3')", my_db)
    assert len(mariadb.execute("SELECT * FROM t0_1", my_db)) == 3
    assert len(mariadb.execute("SELECT * FROM t0_0", my_db)) == 3


def test_values_convert() -> None:
    assert to_db("AP8Q", "bytes") == b"\x00\xff\x10"
    assert to_db("2024-01-02T01:04:05.123000Z", "datetime") == "2024-01-02 01:04:05.123000"
    assert to_db({"a": [1, None]}, "json") == '{"a":[1,null]}'
    assert to_db("s", "json") == '"s"'
    assert to_db(True, "bool") == 1
    assert to_db(["x"], "plain") == '["x"]'
    with pytest.raises(ValueError, match="NaN"):
        to_db("NaN", "float")


def test_statements_fit_the_packet() -> None:
    """Multi-row statements are cut by rows and by bytes (MySQL 5.7's default
    max_allowed_packet is 4 MiB: 1000 rows of TOASTed text would exceed it)."""
    from pydblog.spark.sinks.mysql import ROWS_PER_STATEMENT, statements

    wide = {i: ["x" * (100_000 if i % 7 else 3_000_000)] for i in range(50)}
    runs = list(statements(list(wide), wide.__getitem__, 1 << 20))
    assert [i for r in runs for i in r] == list(wide)
    assert all(len(r) == 1 or sum(2 * len(wide[i][0]) + 12 for i in r) <= 1 << 20 for r in runs)
    assert any(len(r) > 1 for r in runs)
    narrow = list(range(2500))
    assert [len(r) for r in statements(narrow, lambda i: [i], 1 << 20)] == [
        ROWS_PER_STATEMENT, ROWS_PER_STATEMENT, 500]


MYSQL_SOURCE = TableSchema("app", "m", tuple(ColumnSchema(n, t, lg, n != "id") for n, t, lg in (
    ("id", "int(11)", "int32"), ("u", "bigint(20) unsigned", "int64"), ("bits", "bit(64)", "int64"),
    ("tiny", "tinyint(3) unsigned", "int16"), ("y", "year(4)", "int16"),
    ("dec", "decimal(12,2)", "decimal"), ("f", "float", "float32"), ("dbl", "double", "float64"),
    ("d", "date", "date"), ("tm", "time(6)", "time"), ("dtm", "datetime(6)", "timestamp"),
    ("ts", "timestamp(6)", "timestamptz"), ("s", "varchar(40)", "string"),
    ("e", "enum('a','b')", "string"), ("st", "set('x','y','z')", "array<string>"),
    ("bl", "blob", "bytes"), ("j", "json", "json"))), ("id",))
MYSQL_ROW = {"id": 1, "u": 18446744073709551615, "bits": 18446744073709551615, "tiny": 255,
             "y": 2024, "dec": "-123.45", "f": 1.1, "dbl": 2.25, "d": "2024-02-29",
             "tm": "-12:34:56.789000", "dtm": "2024-01-02T03:04:05.123456",
             "ts": "2038-01-19T03:14:07Z", "s": "héllo ✓ 😀", "e": "b", "st": ["x", "z"],
             "bl": "YWIAAA==", "j": {"a": [1, 2.5]}}


def mysql_source_row_lands_exactly(server: Any, database: str) -> None:
    import pyarrow as pa

    from pydblog.spark.batch import Batch

    sink = MySqlSink(server.dsn(database), parallelism=1)
    _prepare(sink, MYSQL_SOURCE)  # (also learns the server's flavour)
    events = pa.table({
        "offset": [0], "op": ["c"], "schema": ["app"], "table": ["m"], "key": ['{"id":1}'],
        "after": [orjson.dumps(MYSQL_ROW).decode()],
        "unchanged": pa.array([None], pa.list_(pa.string())),
    })
    batch = Batch(0, 0, 1, events, {MYSQL_SOURCE.qualified: MYSQL_SOURCE})
    try:
        sink._apply_part(batch, 0, batch.changes(), {MYSQL_SOURCE.qualified: MYSQL_SOURCE})
    finally:
        sink.close()
    want = {_key(MYSQL_SOURCE, MYSQL_ROW): _row(MYSQL_SOURCE, MYSQL_ROW)}
    got, count = mysql_table(server, database, MYSQL_SOURCE)
    assert_tables_equal(want, got, "mysql app.m", [c.name for c in MYSQL_SOURCE.columns])
    assert count == 1


def test_a_mysql_source_row_lands_exactly(mariadb: Any, my_db: str) -> None:
    """A row as the MySQL source logs it (docs/mysql.md: unsigned BIGINT and BIT(64)
    at 2^64 - 1, negative TIME, SET as a list, BLOB as base64) applied by a key
    partition's step and read back equal, every column."""
    mysql_source_row_lands_exactly(mariadb, my_db)


@pytest.mark.slow
def test_a_mysql_source_row_lands_exactly_on_mysql57(mysql57: Any, my57_db: str) -> None:
    mysql_source_row_lands_exactly(mysql57, my57_db)


# -- errors --------------------------------------------------------------------------------
def _fake_batch(*schemas: TableSchema) -> Any:
    tables = {s.qualified: SimpleNamespace(schema=s.schema, table=s.table, truncate=None)
              for s in schemas}
    return SimpleNamespace(tables=tables, markers=[], end=10, start=0, batch_id=0,
                           schema_for=lambda q: next(s for s in schemas if s.qualified == q),
                           scoped_truncates=lambda since: {})


def _prepare(sink: MySqlSink, *schemas: TableSchema) -> None:
    batch = _fake_batch(*schemas)
    try:
        sink._prepare(batch, {s.qualified: s for s in schemas})
    finally:
        sink.close()


SIMPLE = _schema(("id", "integer", "int32"), ("v", "text", "string"), key=("id",))


def test_unreachable_server_is_named_without_the_password() -> None:
    from pydblog.devtools.mariadb import free_port

    sink = MySqlSink(f"mysql://u:s3cret@127.0.0.1:{free_port()}/db")
    with pytest.raises(SinkError) as err:
        _prepare(sink, SIMPLE)
    assert "cannot reach MySQL" in err.value.message and "s3cret" not in str(err.value)
    assert "s3cret" not in sink.name and "***" in sink.name


def test_missing_privileges_name_the_grant(mariadb: Any, my_db: str) -> None:
    user = f"ro_{my_db[-6:]}"
    mariadb.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")
    try:
        mariadb.execute(f"GRANT SELECT ON `{my_db}`.* TO '{user}'@'%'")
        sink = MySqlSink(f"mysql://{user}:pw@127.0.0.1:{mariadb.port}/{my_db}")
        with pytest.raises(SinkError) as err:
            _prepare(sink, SIMPLE)
        assert "denied" in err.value.message
        assert err.value.hint is not None and "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER" \
            in err.value.hint and f"`{my_db}`.*" in err.value.hint
        assert "pw@" not in err.value.message
    finally:
        mariadb.execute(f"DROP USER '{user}'@'%'")


def test_identifiers_longer_than_64_characters(mariadb: Any, my_db: str) -> None:
    long_table = TableSchema("public", "t" * 65, SIMPLE.columns, SIMPLE.key)
    with pytest.raises(SinkError, match="at most 64"):
        _prepare(MySqlSink(mariadb.dsn(my_db)), long_table)
    long_col = _schema(("id", "integer", "int32"), ("c" * 65, "text", "string"), key=("id",))
    with pytest.raises(SinkError, match=r"column of public\.t .* at most 64"):
        _prepare(MySqlSink(mariadb.dsn(my_db)), long_col)


def test_two_source_tables_onto_one_target_table(mariadb: Any, my_db: str) -> None:
    other = TableSchema("other", "t", SIMPLE.columns, SIMPLE.key)
    with pytest.raises(SinkError, match="would both be written"):
        _prepare(MySqlSink(mariadb.dsn(my_db)), SIMPLE, other)


def test_text_key_too_long_for_its_column(mariadb: Any, my_db: str) -> None:
    """A text key longer than the VARCHAR the key got: an error saying why, not a
    truncated key."""
    import pyarrow as pa

    from pydblog.spark.batch import Batch

    schema = _schema(("k", "text", "string"), ("v", "text", "string"), key=("k",))
    sink = MySqlSink(mariadb.dsn(my_db), parallelism=1)
    _prepare(sink, schema)
    key = "x" * 800
    events = pa.table({
        "offset": [0], "op": ["c"], "schema": ["public"], "table": ["t"],
        "key": [f'{{"k":"{key}"}}'], "after": [f'{{"k":"{key}","v":"1"}}'],
        "unchanged": pa.array([None], pa.list_(pa.string())),
    })
    batch = Batch(0, 0, 1, events, {schema.qualified: schema})
    sink = MySqlSink(mariadb.dsn(my_db), parallelism=1)
    sink._flavour = {"mariadb": True, "nopad": True}
    try:
        with pytest.raises(SinkError) as err:
            sink._apply_part(batch, 0, batch.changes(), {schema.qualified: schema})
    finally:
        sink.close()
    assert err.value.hint is not None and "key column" in err.value.hint


# -- config --------------------------------------------------------------------------------
def _cfg(**sink: Any) -> Any:
    return parse_config({"source": {"dsn": "postgresql://u@h/x"}, "log": {"path": "/tmp/x"},
                         "sync": {"sinks": [{"type": "mysql", **sink}]}})


def test_config_validation() -> None:
    cfg = _cfg(dsn="mysql://u:pw@db:3306/replica", parallelism=4)
    s = cfg.sync.sinks[0]
    assert (s.type, s.parallelism) == ("mysql", 4) and "pw" not in repr(s)
    assert _cfg(dsn="mysql://u@db", schema="replica").sync.sinks[0].schema_ == "replica"
    for bad, says in (
        ({}, "needs dsn"),
        ({"dsn": "postgresql://u@h/x"}, "needs a MySQL dsn"),
        ({"dsn": "mysql://u:pw@db:3306"}, "names no database"),
        ({"dsn": "mysql://u@db/x", "path": "/tmp"}, "takes dsn, not path"),
        ({"dsn": "mysql://u@db/x", "schema": "bad name"}, "not a valid schema name"),
    ):
        with pytest.raises(ConfigError) as err:
            _cfg(**bad)
        assert says in str(err.value) + str(err.value.hint or ""), (bad, str(err.value))
        assert "pw" not in str(err.value)
    with pytest.raises(ConfigError):
        MySqlSink("mysql://u:pw@db:3306")



def test_a_watermark_write_is_seen_whole(mariadb: Any, my_db: str) -> None:
    """The rows of one watermark write (every source's progress and the low watermark)
    commit together: a reader never sees some sources' rows moved and others not (a
    DDL statement inside the write's transaction would commit it early in MySQL, and
    the rows after it would commit one by one)."""
    import threading

    sources = [f"s{i}" for i in range(6)]
    sink = MySqlSink(mariadb.dsn(my_db), parallelism=1)
    sink.write_watermarks({s: 0 for s in sources}, "", None)
    seen: list[list[tuple[Any, ...]]] = []
    done = threading.Event()

    def read() -> None:
        conn = mariadb.connect(my_db)
        try:
            while not done.is_set():
                with conn.cursor() as cur:
                    cur.execute("SELECT progress_ms, low_ms FROM _dblog_watermarks")
                    seen.append(list(cur.fetchall()))
        finally:
            conn.close()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(1, 301):
            sink.write_watermarks({s: i for s in sources}, "", None)
    finally:
        done.set()
        reader.join()
        sink.close()
    mixed = [rows for rows in seen if len({r[0] for r in rows} | {r[1] for r in rows}) > 1]
    assert len(seen) > 10 and not mixed, mixed[:3]
