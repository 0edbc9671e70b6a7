"""The schema history's DDL interpretation against the server itself: after each
statement, the history's definition of the table must decode exactly as
information_schema's does (``signature``), or the history must have let go of the table
(never a wrong definition). MySQL 5.7 (the server the history is for) and MariaDB (the same
statements where it accepts them)."""

from __future__ import annotations

from pydblog.devtools.mysql57 import TestServer
from pydblog.sources.mysql.history import SchemaHistory, signature, strip_comments
from pydblog.sources.mysql.tablemap import read_table

# (statement, whether the history must follow it exactly; False: it may let go)
SCRIPT: list[tuple[str, bool]] = [
    ("CREATE TABLE t (id INT NOT NULL, a VARCHAR(10) CHARACTER SET latin1, n INT, "
     "PRIMARY KEY (id)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4", True),
    ("ALTER TABLE t ADD COLUMN b TINYINT UNSIGNED, ADD INDEX ix_b (b)", True),
    ("ALTER TABLE t ADD COLUMN c TEXT COLLATE latin1_german1_ci FIRST", True),
    ("ALTER TABLE t ADD d ENUM('x','y''z') AFTER id, ADD e SET('p','q')", True),
    ("ALTER TABLE t CHANGE a a2 VARCHAR(12)", True),
    ("ALTER TABLE t CHANGE COLUMN a2 a3 VARCHAR(12) CHARACTER SET latin1 NOT NULL AFTER c", True),
    ("ALTER TABLE t MODIFY n BIGINT UNSIGNED FIRST", True),
    ("ALTER TABLE t MODIFY COLUMN b INT ZEROFILL", True),
    ("ALTER TABLE t DROP COLUMN d", True),
    ("ALTER TABLE t DROP e, ADD COLUMN f DOUBLE, ADD COLUMN g FLOAT(30), ADD h FLOAT(7,3)", True),
    ("ALTER TABLE t ALTER COLUMN f SET DEFAULT 1.5, ALGORITHM=INPLACE, LOCK=NONE", True),
    ("ALTER TABLE t ADD COLUMN i BOOL, ADD COLUMN j DECIMAL(10,2) UNSIGNED, ADD k SERIAL", True),
    ("ALTER TABLE t ADD COLUMN l DATETIME(6), ADD m TIMESTAMP(3) NULL, ADD o TIME(2), "
     "ADD p DATE, ADD q YEAR", True),
    ("ALTER TABLE t ADD COLUMN r VARBINARY(8), ADD s BINARY(3), ADD u BLOB, ADD v JSON", True),
    ("ALTER TABLE t ADD COLUMN w VARCHAR(4) CHARACTER SET binary, ADD x CHAR(2) BINARY", True),
    ("ALTER TABLE t ADD COLUMN y NCHAR(3), ADD z NVARCHAR(4), ADD aa BIT(5)", True),
    ("ALTER TABLE t DEFAULT CHARSET = latin1", True),
    ("ALTER TABLE t ADD COLUMN bb VARCHAR(5)", True),  # the new table default
    ("ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (ID, n)", True),
    ("ALTER TABLE t ADD COLUMN cc INT GENERATED ALWAYS AS (id + 1) VIRTUAL", True),
    ("ALTER TABLE /* a comment */ t COMMENT 'hi', ROW_FORMAT=DYNAMIC", True),
    ("ALTER TABLE t ADD UNIQUE KEY uq (cc), DROP INDEX ix_b", True),
    ("ALTER TABLE t RENAME INDEX uq TO uq2", True),
    ("ALTER TABLE t STATS_PERSISTENT=1, FORCE", True),
    ("/*!40000 ALTER TABLE `t` DISABLE KEYS */", True),
    ("ALTER TABLE t ENABLE KEYS", True),
    ("ALTER TABLE t ADD COLUMN ff INT /*!99999 this server never runs this */, ORDER BY id", True),
    ("ALTER TABLE t ADD COLUMN dd REAL", False),  # an alias sqlglot maps otherwise
    ("ALTER TABLE t ADD COLUMN ee INT", True),  # t is lost: stays lost
]

SCRIPT_2: list[tuple[str, bool]] = [
    ("CREATE TABLE u (id INT PRIMARY KEY, a VARCHAR(3))", True),  # the database's charset
    ("CREATE TABLE IF NOT EXISTS u (id INT)", True),  # exists: a no-op
    ("CREATE TABLE u2 LIKE u", True),
    ("ALTER TABLE u2 ADD COLUMN x INT, RENAME TO u3", True),
    ("RENAME TABLE u3 TO u4, u TO u5", True),
    ("ALTER TABLE u4 CONVERT TO CHARACTER SET latin1", False),
    ("DROP TABLE u4, u5", True),
    ("CREATE TABLE v (id INT, a VARCHAR(4), CONSTRAINT pk PRIMARY KEY (id, a(2)))", True),
    ("ALTER TABLE v ADD COLUMN (x INT, y INT)", False),
]


def _run(server: TestServer, db: str, script: list[tuple[str, bool]]) -> None:
    history = SchemaHistory(charsets={db: "utf8mb4"}, server_version=server_version(server))
    may_lose: set[str] = set()
    for statement, exact in script:
        server.execute(statement, db)
        history.apply(statement, db, lambda d, t: d == db)
        if not exact:
            may_lose |= {t for _, t in history.lost}
        assert {t for _, t in history.lost} <= may_lose, (statement, history.lost)
        with server.admin(db) as cur:
            for (_, name), entry in sorted(history.tables.items()):
                now = read_table(cur, db, name)
                assert now is not None, (statement, name, "the history has a dropped table")
                assert signature(entry) == signature(now), (statement, name)
            cur.execute(
                "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
                (db,),
            )
            known = {t for _, t in history.tables} | {t for _, t in history.lost}
            assert {str(r[0]) for r in cur.fetchall()} <= known, statement


def server_version(server: TestServer) -> int:
    with server.admin() as cur:
        cur.execute("SELECT @@version")
        text = str(cur.fetchone()[0]).split("-")[0]
    major, minor, patch = (int(p) for p in text.split(".")[:3])
    return major * 10000 + minor * 100 + patch


def test_history_follows_alters_as_the_server_does(mysql57: TestServer, my57_db: str) -> None:
    _run(mysql57, my57_db, SCRIPT)


def test_history_follows_creates_renames_drops(server: TestServer, db: str) -> None:
    server.execute(f"ALTER DATABASE `{db}` CHARACTER SET utf8mb4", db)
    _run(server, db, SCRIPT_2)


def test_executable_comments_kept_for_this_version_only() -> None:
    q = "CREATE TABLE t (a INT) /*!50100 DEFAULT CHARSET=latin1 */ /*!80099 TABLESPACE x */ -- c\n"
    assert strip_comments(q, 50729).split() == ["CREATE", "TABLE", "t", "(a", "INT)", "DEFAULT", "CHARSET=latin1"]
    assert strip_comments("SELECT '/* not a comment */'", 50729) == "SELECT '/* not a comment */'"
