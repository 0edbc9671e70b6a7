"""The least-privilege setup SQL (``dblog setup --print-sql``), without a server: what
each watermark mode asks of the DBA, quoting, and no secret printed. (That the SQL is
enough: tests/integration/test_least_privilege.py and tests/mysql/test_setup_sql.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from pydblog.cli import main
from pydblog.config import Config, parse_config
from pydblog.setup_sql import literal_tables
from pydblog.sources.mysql.grants import MyTarget
from pydblog.sources.mysql.grants import setup_sql as my_sql
from pydblog.sources.postgres.grants import PgTarget
from pydblog.sources.postgres.grants import setup_sql as pg_sql


def cfg(mode: str, **source: Any) -> Config:
    return parse_config({"source": {"dsn": "postgresql://cap:s3cret@db:5432/app", **source},
                         "snapshot": {"watermark": mode}})


def statements(script: str) -> list[str]:
    return [line for line in script.splitlines() if not line.startswith("--")]


def test_postgres_read_only_creates_nothing_and_publishes_the_tables() -> None:
    sql = statements(pg_sql(cfg("read-only"), PgTarget("cap", "app", ["public.t", "sales.o"])))
    assert sql == [
        'CREATE ROLE "cap" LOGIN REPLICATION;',
        'GRANT CONNECT ON DATABASE "app" TO "cap";',
        'GRANT USAGE ON SCHEMA "public" TO "cap";',
        'GRANT USAGE ON SCHEMA "sales" TO "cap";',
        'GRANT SELECT ON "public"."t", "sales"."o" TO "cap";',
        'CREATE PUBLICATION "dblog" FOR TABLE "public"."t", "sales"."o" '
        "WITH (publish_via_partition_root = true);",
    ]


def test_postgres_read_only_publishes_an_existing_signal_table() -> None:
    """The capture's publication lists pydblog's tables whenever they exist: the printed
    one must too, or a role that cannot alter it is refused."""
    script = pg_sql(cfg("read-only"), PgTarget("cap", "app", ["public.t"],
                                               existing_own=["public.dblog_signal"]))
    assert 'FOR TABLE "public"."t", "public"."dblog_signal" WITH' in script
    assert "CREATE TABLE" not in script


@pytest.mark.parametrize("mode", ["table", "message"])
def test_postgres_writing_modes_get_their_tables_and_only_the_grants_used(mode: str) -> None:
    sql = statements(pg_sql(cfg(mode), PgTarget("cap", "app", ["public.t"])))
    assert 'CREATE TABLE IF NOT EXISTS "public"."dblog_signal" (id text PRIMARY KEY, type text NOT NULL, data text);' in sql
    assert 'GRANT SELECT, INSERT, UPDATE ON "public"."dblog_watermark" TO "cap";' in sql
    assert not any("dblog_signal" in s and s.startswith("GRANT") for s in sql)  # rows come by the stream
    assert sql[-1] == ('CREATE PUBLICATION "dblog" FOR TABLE "public"."t", "public"."dblog_signal", '
                       '"public"."dblog_watermark" WITH (publish_via_partition_root = true);')


def test_postgres_all_tables_and_old_servers() -> None:
    script = pg_sql(cfg("read-only"), PgTarget("cap", "app", ["public.t"], all_tables=True,
                                               server_version=120000))
    assert 'CREATE PUBLICATION "dblog" FOR ALL TABLES;' in script  # (no option on 12)
    assert 'GRANT SELECT ON ALL TABLES IN SCHEMA "public" TO "cap";' in script
    new = pg_sql(cfg("read-only"), PgTarget("cap", "app", [], all_tables=True, server_version=160000))
    assert "FOR ALL TABLES WITH (publish_via_partition_root = true);" in new
    assert "PostgreSQL 12" not in new


def test_postgres_names_are_quoted() -> None:
    script = pg_sql(cfg("read-only", publication="pub"),
                    PgTarget('we"ird', "my app", ["Sales.Order", "public.user"]))
    assert 'CREATE ROLE "we""ird" LOGIN REPLICATION;' in script
    assert 'GRANT SELECT ON "Sales"."Order", "public"."user" TO "we""ird";' in script
    assert 'GRANT CONNECT ON DATABASE "my app"' in script


def my_cfg(mode: str) -> Config:
    return parse_config({"source": {"type": "mysql", "dsn": "mysql://cap:s3cret@db:3306/app"},
                         "snapshot": {"watermark": mode}})


def test_mysql_read_only_user_gets_no_write_grant() -> None:
    sql = statements(my_sql(my_cfg("read-only"), MyTarget("cap", "app")))
    assert sql[:3] == [
        "CREATE USER IF NOT EXISTS 'cap'@'%';",
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'cap'@'%';",
        "GRANT SELECT ON `app`.* TO 'cap'@'%';",
    ]
    assert sql[3].startswith("CREATE TABLE IF NOT EXISTS `app`.`dblog_signal`")
    assert len(sql) == 4


def test_mysql_table_mode_and_server_settings() -> None:
    script = my_sql(my_cfg("table"), MyTarget("cap", "app", host="10.0.0.%"))
    sql = statements(script)
    assert "GRANT INSERT, UPDATE ON `app`.`dblog_watermark` TO 'cap'@'10.0.0.%';" in sql
    assert not any("CREATE" in s for s in sql if s.startswith("GRANT"))
    assert "INSERT IGNORE INTO `app`.`dblog_watermark` (id, value) VALUES (1, NULL);" in sql
    for setting in ("binlog_format = ROW", "binlog_row_image = FULL", "log_bin", "server_id",
                    "binlog_row_metadata = FULL"):
        assert setting in script


def test_literal_table_patterns() -> None:
    assert literal_tables(["public\\.t", "sales\\.order_lines", "plain"]) == [
        "public.t", "sales.order_lines", "public.plain"]
    assert literal_tables(["public\\..*"]) is None
    assert literal_tables(["public.t"]) is None  # (an unescaped dot matches any character)


def test_the_command_prints_no_secret(tmp_path: Any) -> None:
    path = tmp_path / "dblog.toml"
    path.write_text('[source]\ndsn = "postgresql://cap:s3cret@127.0.0.1:1/app"\n'
                    'tables = ["public\\\\.t"]\n[snapshot]\nwatermark = "read-only"\n')
    res = CliRunner().invoke(main, ["setup", "--print-sql", "--config", str(path)])
    assert res.exit_code == 0, res.output
    assert 'GRANT SELECT ON "public"."t" TO "cap";' in res.output
    assert "s3cret" not in res.output
    pattern = tmp_path / "pattern.toml"
    pattern.write_text(path.read_text().replace('public\\\\.t', 'public\\\\..*'))
    res = CliRunner().invoke(main, ["setup", "--print-sql", "--config", str(pattern)])
    assert res.exit_code != 0
    assert "--dsn" in res.output and "s3cret" not in res.output
