"""What a DBA runs for a least-privilege PostgreSQL capture (``dblog setup --print-sql``).

No I/O: the caller resolves the captured tables. The capture role gets ``LOGIN
REPLICATION`` (a logical slot, the stream, heartbeats) and ``SELECT`` on the captured
tables; an administrator makes the publication (the role need not own the tables nor
have ``CREATE`` on the database) and, when the watermark mode writes to the source, the
signal and watermark tables, with exactly the grants the capture uses on them:

- ``watermark = "table"``: the watermark table's row is updated (``INSERT ... ON
  CONFLICT DO NOTHING`` at start, ``UPDATE`` per chunk), both tables are published;
- ``"message"``: the same tables (the capture checks them at start), watermarks are
  logical messages;
- ``"read-only"``: nothing is written; an existing signal or watermark table is
  published (the capture's publication lists them whenever they exist).

Invariant: the publication printed holds exactly the tables the capture's own
``setup.ensure_publication`` wants (captured + existing own tables), so a role that
cannot alter it never has to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydblog.config import Config
from pydblog.sources.postgres.setup import publication_sql, quote_ident, split_name, sql_name

SIGNAL_DDL = "CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY, type text NOT NULL, data text)"
WATERMARK_DDL = "CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY, value text)"


@dataclass(frozen=True, slots=True)
class PgTarget:
    """The source as the caller found it: the capture role and database (from the DSN),
    the captured tables (``schema.table``), and which of pydblog's own tables exist."""

    role: str
    database: str
    tables: Sequence[str]
    all_tables: bool = False
    """``[source] tables`` is unset: everything is captured, also tables made later
    (the publication is ``FOR ALL TABLES``)."""
    existing_own: Sequence[str] = field(default_factory=tuple)
    server_version: int | None = None  # server_version_num; None: not known


def setup_sql(cfg: Config, target: PgTarget) -> str:
    """The statements, with comments, for a superuser connected to the database."""
    mode = cfg.snapshot.watermark
    role = quote_ident(target.role)
    signal, watermark = cfg.snapshot.signal_table, cfg.snapshot.watermark_table
    writes = mode != "read-only"
    own = [signal, watermark] if writes else [t for t in (signal, watermark) if t in target.existing_own]
    tables = list(target.tables)
    schemas = sorted({split_name(t)[0] for t in [*tables, *own]})
    out = [
        f"-- dblog setup: a least-privilege capture of database {quote_ident(target.database)} "
        f"by role {role} ([snapshot] watermark = \"{mode}\").",
        f"-- Run as a superuser connected to database {quote_ident(target.database)}.",
        f"CREATE ROLE {role} LOGIN REPLICATION;",
        f"-- Its password (never printed): ALTER ROLE {role} PASSWORD '...'; and pg_hba.conf "
        "must let it make both a database and a replication connection.",
        f"GRANT CONNECT ON DATABASE {quote_ident(target.database)} TO {role};",
    ]
    out += [f"GRANT USAGE ON SCHEMA {quote_ident(s)} TO {role};" for s in schemas]
    if target.all_tables:
        out += [f"GRANT SELECT ON ALL TABLES IN SCHEMA {quote_ident(s)} TO {role};"
                for s in sorted({split_name(t)[0] for t in tables} or {"public"})]
        out.append(f"-- Tables made later need their own GRANT SELECT ... TO {role} (or ALTER "
                   "DEFAULT PRIVILEGES FOR ROLE <their creator> ... GRANT SELECT ON TABLES).")
    elif tables:
        out.append(f"GRANT SELECT ON {', '.join(sql_name(t) for t in tables)} TO {role};")
    if writes:
        out += [
            SIGNAL_DDL.format(sql_name(signal)) + ";",
            WATERMARK_DDL.format(sql_name(watermark)) + ";",
            f"INSERT INTO {sql_name(watermark)} (id, value) VALUES (1, '') "
            "ON CONFLICT (id) DO NOTHING;",
            f"GRANT SELECT, INSERT, UPDATE ON {sql_name(watermark)} TO {role};",
            f"-- Signals by table: GRANT INSERT ON {sql_name(signal)} TO <whoever sends them>.",
        ]
    else:
        out.append("-- watermark = \"read-only\": nothing is written to the source; signals go "
                   "through `dblog snapshot` or the HTTP API.")
    via_root = target.server_version is None or target.server_version >= 130000
    if target.all_tables:
        with_ = " WITH (publish_via_partition_root = true)" if via_root else ""
        out.append(f"CREATE PUBLICATION {quote_ident(cfg.source.publication)} FOR ALL TABLES{with_};")
    else:
        out.append(publication_sql(cfg.source.publication, [*tables, *own], via_root) + ";")
    if target.server_version is None:
        out.append("-- (PostgreSQL 12: without the WITH clause; it has no "
                   "publish_via_partition_root and captures no partitioned table.)")
    out.append(f"-- The capture makes its replication slot {quote_ident(cfg.source.slot)} itself.")
    return "\n".join(out) + "\n"
