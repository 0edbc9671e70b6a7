"""Checks and prepares a PostgreSQL database for capture.

Each problem found becomes a ``SourceError`` that names the setting or grant and the
fix. Created when missing: the signal table, the watermark table, the publication and
the logical replication slot (``pgoutput``). Tables that have neither a primary key
nor ``REPLICA IDENTITY FULL`` are left out of the publication (publishing them would
make UPDATE/DELETE fail on the source) with a warning saying what to do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pydblog.config import TableMatcher
from pydblog.errors import SlotInUse, SourceError
from pydblog.positions import Lsn
from pydblog.sources.postgres.connect import INSUFFICIENT_PRIVILEGE

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CapturedTable:
    schema: str
    table: str
    has_pk: bool
    replica_identity: str  # d, n, f, i
    oid: int = 0  # the relation (a rename keeps it; a drop and create does not)
    partitioned: bool = False  # a partitioned table (its leaves are not listed)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"


def split_name(qualified: str) -> tuple[str, str]:
    schema, dot, table = qualified.partition(".")
    if not dot:
        return "public", qualified
    return schema, table


def check_server(conn: psycopg.Connection[Any]) -> None:
    """wal_level, version and the role's REPLICATION attribute."""
    row = conn.execute("SHOW wal_level").fetchone()
    if row is None or row[0] != "logical":
        raise SourceError(
            f"wal_level is {row[0] if row else '?'!r}, logical decoding needs 'logical'",
            hint="set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL",
        )
    version = conn.info.server_version
    if version < 120000:
        raise SourceError(f"PostgreSQL {version // 10000} is too old", hint="pydblog needs PostgreSQL 12 or newer")
    row = conn.execute(
        "SELECT rolreplication OR rolsuper, current_user FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if row is None or not row[0]:
        user = row[1] if row else "?"
        raise SourceError(
            f"role {user!r} may not use replication",
            hint=f"ALTER ROLE {user} REPLICATION (and allow 'replication' connections in pg_hba.conf)",
        )


def list_tables(conn: psycopg.Connection[Any], matcher: TableMatcher, own: set[str]) -> list[CapturedTable]:
    rows = conn.execute(
        """
        SELECT n.nspname, c.relname, c.relreplident,
               EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
               c.oid, c.relkind = 'p'
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
          AND n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND n.nspname NOT LIKE 'pg_toast%%' AND n.nspname NOT LIKE 'pg_temp%%'
        ORDER BY 1, 2
        """
    ).fetchall()
    out = []
    for schema, table, ident, has_pk, oid, partitioned in rows:
        q = f"{schema}.{table}"
        if q in own or not matcher(q):
            continue
        out.append(CapturedTable(schema, table, bool(has_pk), str(ident), int(oid), bool(partitioned)))
    return out


def publishable(tables: list[CapturedTable], warned: set[str]) -> list[CapturedTable]:
    """Tables that can be published; warns once (per ``warned``) about the others."""
    ok = []
    for t in tables:
        if t.replica_identity == "n" and t.qualified not in warned:
            # Published, its UPDATEs and DELETEs would fail on the source, even with a PK.
            warned.add(t.qualified)
            log.warning(
                "table %s has REPLICA IDENTITY NOTHING: it is NOT captured (publishing it "
                "would make its UPDATEs/DELETEs fail). Run ALTER TABLE %s REPLICA IDENTITY "
                "DEFAULT (with a primary key) or FULL, then restart dblog.",
                t.qualified, t.qualified,
            )
        elif t.replica_identity == "n":
            pass
        elif t.has_pk or t.replica_identity == "f" or t.replica_identity == "i":
            ok.append(t)
        elif t.qualified not in warned:
            warned.add(t.qualified)
            log.warning(
                "table %s has no primary key and REPLICA IDENTITY %s: it is NOT captured "
                "(publishing it would make its UPDATEs/DELETEs fail). Add a primary key, or run "
                "ALTER TABLE %s REPLICA IDENTITY FULL, then restart dblog.",
                t.qualified, {"d": "DEFAULT", "n": "NOTHING"}.get(t.replica_identity, t.replica_identity),
                t.qualified,
            )
    return ok


def table_exists(conn: psycopg.Connection[Any], qualified: str) -> bool:
    schema, table = split_name(qualified)
    row = conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s", (schema, table),
    ).fetchone()
    return row is not None


def ensure_own_tables(conn: psycopg.Connection[Any], signal_table: str, watermark_table: str) -> None:
    for qualified, ddl in (
        (signal_table, "CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY, type text NOT NULL, data text)"),
        (watermark_table, "CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY, value text)"),
    ):
        schema, table = split_name(qualified)
        ident = sql.Identifier(schema, table)
        if table_exists(conn, qualified):
            # (made by an administrator: CREATE ... IF NOT EXISTS would still need CREATE
            # on the schema, which a least-privilege role lacks)
            continue
        try:
            conn.execute(sql.SQL(ddl).format(ident))
        except psycopg.Error as exc:
            raise _privilege_error(exc, f"cannot create {qualified}", f"create it as its owner: {ddl.format(qualified)}") from None
    schema, table = split_name(watermark_table)
    conn.execute(
        sql.SQL("INSERT INTO {} (id, value) VALUES (1, '') ON CONFLICT (id) DO NOTHING").format(
            sql.Identifier(schema, table)
        )
    )


def publication_sql(name: str, tables: list[str], via_root: bool = True) -> str:
    """The ``CREATE PUBLICATION`` that publishes ``tables`` as a capture needs them."""
    listed = ", ".join(sql_name(t) for t in tables)
    with_ = " WITH (publish_via_partition_root = true)" if via_root else ""
    return f"CREATE PUBLICATION {quote_ident(name)} FOR TABLE {listed}{with_}"


def ensure_publication(conn: psycopg.Connection[Any], name: str, tables: list[str],
                       partitioned: list[str] | tuple[str, ...] = (),
                       warned: set[str] | None = None) -> None:
    """The publication holds exactly ``tables`` (captured + signal + watermark).

    From PostgreSQL 13 on it publishes via the partition root: a partitioned table's
    changes come under the parent's name (whatever leaf holds the row, also leaves
    created or attached later), as its snapshot reads the parent; its leaves are not
    captured separately (``list_tables`` skips them). Only a captured partitioned table
    (``partitioned``) needs that: a publication without it that the capture role cannot
    alter (an administrator's, the usual ``CREATE PUBLICATION ... FOR TABLE``) is
    accepted when no captured table is partitioned, with a warning (once per
    ``warned``) about partitioned tables captured later."""
    idents = sql.SQL(", ").join(sql.Identifier(*split_name(t)) for t in tables)
    via_root = conn.info.server_version >= 130000
    exists = conn.execute(
        "SELECT puballtables, to_jsonb(p) -> 'pubviaroot', pg_has_role(p.pubowner, 'MEMBER') "
        "FROM pg_publication p WHERE pubname = %s",
        (name,),
    ).fetchone()
    try:
        if exists is None:
            creator = _Creator.look(conn, tables)
            try:
                conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}{}").format(
                    sql.Identifier(name), idents,
                    sql.SQL(" WITH (publish_via_partition_root = true)" if via_root else ""),
                ))
            except psycopg.errors.InsufficientPrivilege as exc:
                raise _privilege_error(
                    exc, f"cannot create publication {name!r}",
                    creator.fix(publication_sql(name, tables, via_root)),
                ) from None
            return
        owner = bool(exists[2])
        if via_root and exists[1] is not True:
            alter = sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(
                sql.Identifier(name))
            if owner or partitioned:
                try:
                    conn.execute(alter)
                except psycopg.Error as exc:
                    raise _privilege_error(
                        exc, f"publication {name!r} does not publish partitioned tables by their "
                        f"root, and {', '.join(partitioned)} {'is' if len(partitioned) == 1 else 'are'}"
                        " partitioned: their changes would come under the partitions' names and "
                        "not be captured",
                        f"as the publication's owner (or a superuser) run: {alter.as_string(conn)}",
                    ) from None
            elif warned is None or f"publication {name}" not in warned:
                if warned is not None:
                    warned.add(f"publication {name}")
                log.warning(
                    "publication %s does not publish partitioned tables by their root "
                    "(publish_via_partition_root is off) and this role does not own it: fine "
                    "while no captured table is partitioned; before a partitioned table is "
                    "captured, its owner (or a superuser) must run: %s",
                    name, alter.as_string(conn))
        if exists[0]:
            log.info("publication %s is FOR ALL TABLES; table filtering happens in dblog", name)
        else:
            current = {
                f"{s}.{t}"
                for s, t in conn.execute(
                    "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,)
                )
            }
            if current != set(tables):
                alter_tables = sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(
                    sql.Identifier(name), idents)
                try:
                    conn.execute(alter_tables)
                except psycopg.errors.InsufficientPrivilege as exc:
                    missing = sorted(set(tables) - current)
                    raise _privilege_error(
                        exc, f"publication {name!r} does not publish {', '.join(missing[:5]) or 'the same tables'}"
                        f" (it has {', '.join(sorted(current)[:5]) or 'none'}), and this role "
                        "cannot change it",
                        f"as the publication's owner (or a superuser) run: "
                        f"{alter_tables.as_string(conn)}; or set [source] tables to the "
                        "published tables",
                    ) from None
    except psycopg.errors.UndefinedTable as exc:
        # A listed table was dropped since it was listed: the caller lists again.
        raise TableDropped(f"publication {name!r}: {str(exc).strip().splitlines()[0]}") from None
    except SourceError:
        raise
    except psycopg.Error as exc:
        raise _privilege_error(
            exc, f"cannot create or alter publication {name!r}",
            f"have an administrator run: {publication_sql(name, tables, via_root)}",
        ) from None


@dataclass(frozen=True, slots=True)
class _Creator:
    """What ``CREATE PUBLICATION`` needs of the role: ``CREATE`` on the database and
    ownership of every table it lists (a superuser has both)."""

    user: str
    database: str
    can_create: bool
    not_owned: list[str]

    @classmethod
    def look(cls, conn: psycopg.Connection[Any], tables: list[str]) -> _Creator:
        row = conn.execute(
            "SELECT current_user, current_database(), "
            "has_database_privilege(current_database(), 'CREATE')").fetchone()
        assert row is not None
        owners = conn.execute(
            "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname || '.' || c.relname = ANY(%s) "
            "AND NOT pg_has_role(c.relowner, 'MEMBER') ORDER BY 1",
            ([sql_name(t).replace('"', "") for t in tables],)).fetchall()
        return cls(str(row[0]), str(row[1]), bool(row[2]), [str(r[0]) for r in owners])

    def fix(self, create: str) -> str:
        if not self.can_create and not self.not_owned:
            return (f"the role owns the tables but lacks CREATE on the database: GRANT CREATE "
                    f"ON DATABASE {quote_ident(self.database)} TO {quote_ident(self.user)} (as "
                    f"an administrator); or have an administrator run: {create}")
        return (f"have an administrator (or the owner of "
                f"{', '.join(self.not_owned[:3]) or 'the tables'}, with CREATE on the "
                f"database) run: {create}; `dblog setup --print-sql` prints everything a "
                "least-privilege capture needs")


def quote_ident(name: str) -> str:
    """An SQL identifier, always quoted (a reserved word is a valid table name)."""
    return '"' + name.replace('"', '""') + '"'


def sql_name(qualified: str) -> str:
    """``schema.table`` as SQL (``split_name``: a bare name is in ``public``)."""
    schema, table = split_name(qualified)
    return f"{quote_ident(schema)}.{quote_ident(table)}"


class TableDropped(SourceError):
    """A table listed for the publication was dropped before the publication changed
    (a concurrent DROP TABLE): list the tables again."""

    retriable = True


def published_tables(conn: psycopg.Connection[Any], name: str) -> set[str] | None:
    """The tables the publication lists (None: it does not exist yet, or is FOR ALL
    TABLES, whose membership nothing changes)."""
    row = conn.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", (name,)).fetchone()
    if row is None or row[0]:
        return None
    return {
        f"{s}.{t}"
        for s, t in conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,)
        )
    }


def missing_tables(conn: psycopg.Connection[Any], publication: str, tables: list[str]) -> list[str]:
    current = {
        f"{s}.{t}"
        for s, t in conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,)
        )
    }
    return [t for t in tables if t not in current]


LOST_FIX = ("start a fresh change log (another [log] path; with Kafka also another topic_prefix) with "
            "[snapshot] mode = \"initial\": the slot is created and every captured table "
            "snapshotted; the old log stays readable as it is")


def check_slot_continues(conn: psycopg.Connection[Any], slot: str, acked: int | None) -> None:
    """The slot can give every change after the checkpoint (``acked``: its position's
    ack LSN; None without a checkpoint position). A slot that is missing (dropped, or
    lost with a rebuilt server) would be created at the current WAL position, and an
    invalidated one (WAL removed, a standby's conflict) gives nothing more: the changes
    since the checkpoint would be in no event, and nothing would say so. Fatal: only a
    fresh log (a snapshot of everything) makes the log exact again.

    A slot confirmed past the checkpoint is not refused: psycopg2 itself confirms an
    idle stream's keepalive position once the last message was acknowledged, so a
    healthy slot is often ahead of the checkpoint (with nothing for us in between)."""
    row = conn.execute(
        "SELECT to_jsonb(s) ->> 'wal_status', to_jsonb(s) ->> 'conflicting', "
        "to_jsonb(s) ->> 'invalidation_reason' FROM pg_replication_slots s "
        "WHERE slot_name = %s", (slot,)).fetchone()
    if row is None:
        if acked is not None:
            raise SourceError(
                f"replication slot {slot!r} does not exist, but the change log has a "
                f"checkpoint at LSN {Lsn(acked)}: the slot was dropped or lost (a rebuilt "
                "or replaced server), and a new slot would start at the current WAL "
                f"position: every change after {Lsn(acked)} until then would be missing "
                "from the log, so dblog does not create it",
                hint=LOST_FIX)
        return
    wal_status, conflicting, reason = row
    if wal_status == "lost" or conflicting == "true" or reason is not None:
        why = reason or ("conflict with recovery" if conflicting == "true"
                         else "required WAL removed")
        gap = (f"changes committed after LSN {Lsn(acked)} (the change log's last checkpoint: "
               "every change before it is in the log) are missing from it" if acked is not None else
               "the changes since the change log's last checkpoint are lost")
        raise SourceError(
            f"replication slot {slot!r} is invalidated ({why}): it can no longer give "
            f"changes, and {gap}",
            hint=f"drop the slot (SELECT pg_drop_replication_slot('{slot}')) and {LOST_FIX}. "
            f"Against a repeat: {AGAINST.get(reason or '', AGAINST_ANY)}")


AGAINST = {
    "wal_removed": "raise max_slot_wal_keep_size (-1: unlimited)",
    "rows_removed": "on a standby, set hot_standby_feedback = on with a physical slot "
    "(primary_slot_name)",
    "wal_level_insufficient": "keep wal_level = logical on the primary (set it back and "
    "restart the primary first: no logical slot can be created on its standby before)",
    "idle_timeout": "raise idle_replication_slot_timeout (0: never), or keep dblog running",
}
"""What keeps a slot from being invalidated again, by PostgreSQL's ``invalidation_reason``
(17+); ``AGAINST_ANY`` when it is not known (PostgreSQL 16 tells only ``conflicting``)."""
AGAINST_ANY = ("raise max_slot_wal_keep_size (-1: unlimited), keep wal_level = logical on "
               "the primary and, on a standby, set hot_standby_feedback = on with a "
               "physical slot (primary_slot_name)")


def ensure_slot(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Create the slot if missing; True if it was created. Raises ``SlotInUse`` if an
    active process holds it."""
    row = conn.execute(
        "SELECT plugin, database, active, active_pid FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        try:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        except psycopg.Error as exc:
            raise _privilege_error(exc, f"cannot create replication slot {slot!r}", "grant the role REPLICATION") from None
        return True
    plugin, database, active, pid = row
    if plugin != "pgoutput":
        raise SourceError(
            f"replication slot {slot!r} uses plugin {plugin!r}, not pgoutput",
            hint="configure another [source] slot name, or drop that slot",
        )
    if database != conn.info.dbname:
        raise SourceError(
            f"replication slot {slot!r} belongs to database {database!r}, not {conn.info.dbname!r}",
            hint="slot names are cluster-wide: configure another [source] slot",
        )
    if active:
        raise SlotInUse(
            f"replication slot {slot!r} is in use by another process (pid {pid})",
            hint="stop the other `dblog run` of this slot, or configure another [source] slot",
        )
    return False


def _privilege_error(exc: psycopg.Error, what: str, fix: str) -> SourceError:
    detail = str(exc).strip().splitlines()[0]
    if exc.sqlstate == INSUFFICIENT_PRIVILEGE:
        return SourceError(f"{what}: {detail}", hint=fix)
    return SourceError(f"{what}: {detail}")
