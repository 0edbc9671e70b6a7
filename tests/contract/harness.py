"""What the shared snapshot contract suite needs from a source database.

Every source (PostgreSQL, MySQL/MariaDB) provides one ``Harness``; the scenarios in
``test_snapshots.py`` run unchanged against each (the Debezium/Estuary pattern). Test
SQL sticks to what both dialects accept (INT, VARCHAR, TEXT, composite keys).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import orjson
import psycopg

from tests.helpers import source_rows, write_config


class Harness(Protocol):
    name: str
    schema: str  # the schema (PostgreSQL) or database (MySQL) holding the test tables

    def execute(self, *statements: str) -> None:
        """Run the statements in one transaction."""
        ...

    def config(self, directory: Path, extra: str = "") -> Path: ...

    def rows(self, table: str, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]: ...

    def signal(self, signal_id: str, kind: str, data: dict[str, Any]) -> None: ...

    def marker(self, token: str) -> None:
        """Write a row the capture will log (proves it caught up)."""
        ...

    def position(self, event: dict[str, Any]) -> tuple[Any, ...]:
        """The event's source position as a comparable tuple."""
        ...


class PgHarness:
    name = "postgres"
    schema = "public"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        # The signal table as an administrator creates it: read-only captures create
        # none (the others find it there and use it).
        self.execute("CREATE TABLE dblog_test_marker (id text PRIMARY KEY)",
                     "CREATE TABLE dblog_signal (id text PRIMARY KEY, type text NOT NULL, data text)")

    def execute(self, *statements: str) -> None:
        with psycopg.connect(self.dsn) as conn:
            for st in statements:
                conn.execute(st)

    def config(self, directory: Path, extra: str = "") -> Path:
        return write_config(directory, self.dsn, extra=extra)

    def rows(self, table: str, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
        return source_rows(self.dsn, f"{self.schema}.{table}", key)

    def signal(self, signal_id: str, kind: str, data: dict[str, Any]) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO dblog_signal (id, type, data) VALUES (%s, %s, %s)",
                (signal_id, kind, orjson.dumps(data).decode()),
            )

    def marker(self, token: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO dblog_test_marker VALUES (%s)", (token,))

    def position(self, event: dict[str, Any]) -> tuple[Any, ...]:
        return (event["source"]["lsn"], event["source"]["index"])


class Wrapped:
    """A harness that changes one thing of ``inner`` and hands everything else to it."""

    def __init__(self, inner: Harness) -> None:
        self.inner = inner
        self.name = inner.name
        self.schema = inner.schema

    def execute(self, *statements: str) -> None:
        self.inner.execute(*statements)

    def config(self, directory: Path, extra: str = "") -> Path:
        return self.inner.config(directory, extra)

    def rows(self, table: str, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
        return self.inner.rows(table, key)

    def signal(self, signal_id: str, kind: str, data: dict[str, Any]) -> None:
        self.inner.signal(signal_id, kind, data)

    def marker(self, token: str) -> None:
        self.inner.marker(token)

    def position(self, event: dict[str, Any]) -> tuple[Any, ...]:
        return self.inner.position(event)


class KafkaLogHarness(Wrapped):
    """A source harness whose capture writes to Kafka (a fresh topic prefix, three
    partitions per table) instead of the embedded log. Every capture of one harness
    (restarts, another host's) shares its topics."""

    def __init__(self, inner: Harness, bootstrap: str, log_keys: str | None = None) -> None:
        import uuid

        super().__init__(inner)
        self.name = f"{inner.name}+kafka"
        self.log_keys = log_keys or (
            f'type = "kafka"\nbootstrap_servers = "{bootstrap}"\n'
            f'topic_prefix = "c{uuid.uuid4().hex[:10]}"\npartitions = 3\n'
        )
        self.bootstrap = bootstrap

    def config(self, directory: Path, extra: str = "") -> Path:
        return self.inner.config(directory, self.log_keys + extra)

    def around(self, inner: Harness) -> KafkaLogHarness:
        """The same Kafka log (topics) in front of another source harness (``inner``
        wrapped: a read-only capture user, say)."""
        return KafkaLogHarness(inner, self.bootstrap, self.log_keys)


def without_kafka(h: Harness) -> Harness:
    """The source harness behind a Kafka log (``h`` itself on the embedded log): for
    scenarios that look at the source directly."""
    return h.inner if isinstance(h, KafkaLogHarness) else h


def source_name(h: Harness) -> str:
    """``postgres``, ``mysql`` or ``mysql57``, whichever log the capture writes."""
    return without_kafka(h).name
