"""The TestServer ``Harness`` for the shared snapshot contract suite (tests/contract)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from pydblog.devtools.mysql57 import TestServer
from pydblog.sources.mysql.position import file_sequence
from tests.mysql.helpers import make, run_sql


class MariaHarness:
    name = "mysql"

    def __init__(self, server: TestServer, database: str) -> None:
        self.server = server
        self.schema = database
        self.execute("CREATE TABLE dblog_test_marker (id VARCHAR(64) PRIMARY KEY)")

    def execute(self, *statements: str) -> None:
        run_sql(self.server, self.schema, *statements)

    def config(self, directory: Path, extra: str = "") -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        if "[api]" not in extra:  # a free port each: tests run side by side
            extra = f'{extra}\n[api]\nlisten = "127.0.0.1:0"\n'
        path = directory / "dblog.toml"
        path.write_text(
            f'[source]\ntype = "mysql"\ndsn = "{self.server.dsn(self.schema)}"\n'
            f'heartbeat_interval_s = 0.5\n[log]\npath = "{directory / "data"}"\n{extra}\n'
        )
        return path

    def rows(self, table: str, key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The table as the chunk reader maps it (the binlog path maps identically)."""
        _, reader = make(self.server, self.schema)
        try:
            info = reader.table_info(f"{self.schema}.{table}")
            assert info is not None
            if not info.key:  # no primary key: every row, ordered by every column
                info = info.with_key(info.columns)
                rows = reader._select(reader._table(info), "TRUE", [], None, None, info)
            else:
                top = reader.max_key(info, None)
                rows = reader.read_chunk(info, None, top, 10**9, None) if top is not None else []
        finally:
            reader.close()
        return {tuple(r[k] for k in key): r for r in rows}

    def signal(self, signal_id: str, kind: str, data: dict[str, Any]) -> None:
        with self.server.admin(self.schema) as cur:
            cur.execute(
                "INSERT INTO dblog_signal (id, type, data) VALUES (%s, %s, %s)",
                (signal_id, kind, orjson.dumps(data).decode()),
            )

    def marker(self, token: str) -> None:
        with self.server.admin(self.schema) as cur:
            cur.execute("INSERT INTO dblog_test_marker VALUES (%s)", (token,))

    def position(self, event: dict[str, Any]) -> tuple[Any, ...]:
        s = event["source"]
        return (file_sequence(s["file"]), s["pos"], s["index"])
