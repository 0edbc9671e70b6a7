"""What a DBA runs for a least-privilege MySQL/MariaDB capture (``dblog setup
--print-sql``): the server settings, the capture user and its grants, and pydblog's own
tables where the watermark mode needs them.

No I/O. The capture user gets ``REPLICATION SLAVE`` (to read the binlog), ``REPLICATION
CLIENT`` (the binlog position; MariaDB 10.5+ calls it ``BINLOG MONITOR`` and takes the old
name) and ``SELECT`` on the captured database (snapshots, column names on servers whose
binlog has none). With ``watermark = "table"`` an administrator creates the signal and the
watermark table, and the user may ``INSERT``/``UPDATE`` the watermark row (the capture
creates only a missing table). With ``"read-only"`` the user cannot write anything; the signal table is
created by the administrator (the capture never creates it: even ``CREATE TABLE IF NOT
EXISTS`` of an existing table is written to the binlog).

Invariant: the statements are exactly what ``setup.check_source`` and
``setup.ensure_own_tables`` need of the server and the user: a capture run as that user
alone starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydblog.config import Config
from pydblog.sources.mysql.setup import own_tables, signal_table_ddl, watermark_table_ddl
from pydblog.sources.mysql.types import quote_ident

SERVER_SETTINGS = (
    ("log_bin", "mysql-bin", "the binary log"),
    ("binlog_format", "ROW", ""),
    ("binlog_row_image", "FULL", ""),
    ("binlog_row_metadata", "FULL", "MySQL 8.0.14+ and MariaDB 10.5+ only; older servers have none"),
    ("server_id", "1", "any id unique among the servers; not the capture's [source] server_id"),
)
"""``[mysqld]`` settings the capture checks (``setup.binlog_problems``)."""


@dataclass(frozen=True, slots=True)
class MyTarget:
    """The capture user (from the DSN), the host it connects from (a MySQL account is
    ``'user'@'host'``) and the captured database."""

    user: str
    database: str
    host: str = "%"


def account(target: MyTarget) -> str:
    return f"'{_quote(target.user)}'@'{_quote(target.host)}'"


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "''")


def setup_sql(cfg: Config, target: MyTarget) -> str:
    """The statements, with comments, for an administrator (root)."""
    mode = cfg.snapshot.watermark
    who = account(target)
    db = quote_ident(target.database)
    own = own_tables(cfg.snapshot, target.database)
    sig = ".".join(quote_ident(p) for p in own.signal)
    wm = ".".join(quote_ident(p) for p in own.watermark)
    out = [
        f"-- dblog setup: a least-privilege capture of database {db} by {who} "
        f"([snapshot] watermark = \"{mode}\"). Run as an administrator (root).",
        "-- Server settings (in the server's config, [mysqld]; log_bin needs a restart):",
    ]
    for name, value, note in SERVER_SETTINGS:
        out.append(f"--   {name} = {value}" + (f"  ({note})" if note else ""))
    gtids = ("required: read-only chunks are fenced by GTID sets" if mode == "read-only"
             else "recommended: a resume survives a failover")
    out += [
        f"-- GTIDs, {gtids}: MySQL gtid_mode = ON and enforce_gtid_consistency = ON; "
        "MariaDB has them always.",
        f"CREATE USER IF NOT EXISTS {who};",
        f"-- Its password (never printed): ALTER USER {who} IDENTIFIED BY '...';",
        f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {who};",
        f"GRANT SELECT ON {db}.* TO {who};",
        signal_table_ddl(own) + ";",
    ]
    if mode == "read-only":
        out.append("-- watermark = \"read-only\": the user writes nothing; signals by table: "
                   f"GRANT INSERT ON {sig} TO <whoever sends them>.")
    else:
        out += [
            watermark_table_ddl(own) + ";",
            f"INSERT IGNORE INTO {wm} (id, value) VALUES (1, NULL);",
            f"GRANT INSERT, UPDATE ON {wm} TO {who};",
            f"-- Signals by table: GRANT INSERT ON {sig} TO <whoever sends them>.",
        ]
    return "\n".join(out) + "\n"
