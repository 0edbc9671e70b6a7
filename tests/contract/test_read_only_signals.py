"""Read-only snapshots take their signals straight into the running capture
(``capture.inbox``): ``POST /snapshots`` and ``dblog snapshot`` write no signal row (the
source is never written), 202 means the request is in a durable checkpoint (a kill -9
right after it keeps the snapshot), and a signal id is applied at most once, also across
a restart. Real servers: PostgreSQL, MariaDB and MySQL 5.7 (capture user without any
write grant)."""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.contract.capture import Capture
from tests.contract.harness import Harness, KafkaLogHarness, PgHarness, Wrapped, without_kafka
from tests.contract.test_read_only import ReadOnlyUser
from tests.contract.test_snapshots import make_table, q
from tests.helpers import dblog
from tests.mysql.harness import MariaHarness

TOKEN = "ro-signal-token-0123456789"
EXTRA = (
    '[snapshot]\nchunk_size = 60\nwatermark = "read-only"\n'
    f'[api]\nlisten = "127.0.0.1:0"\ntoken = "{TOKEN}"\n'
)


class PgReadOnlyUser(Wrapped):
    """A PostgreSQL harness whose capture connects as a role that can only read and
    replicate (LOGIN REPLICATION, SELECT on the tables); the publication is created
    beforehand by an administrator (FOR ALL TABLES: tables made later are in it)."""

    def __init__(self, inner: PgHarness) -> None:
        super().__init__(inner)
        self.inner: PgHarness = inner
        self.user = f"ro_{uuid.uuid4().hex[:8]}"
        inner.execute(
            f"CREATE ROLE {self.user} LOGIN REPLICATION PASSWORD 'ro'",
            f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {self.user}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {self.user}",
            "CREATE PUBLICATION dblog FOR ALL TABLES WITH (publish_via_partition_root = true)",
        )

    def config(self, directory: Path, extra: str = "") -> Path:
        path = self.inner.config(directory, extra)
        path.write_text(path.read_text().replace("//postgres:postgres@", f"//{self.user}:ro@"))
        return path


def read_only_user(harness: Harness) -> Harness:
    """A capture user with no write grant at all, on every server (in front of the
    same Kafka log, if the harness writes one)."""
    if isinstance(harness, KafkaLogHarness):
        return harness.around(read_only_user(harness.inner))
    if isinstance(harness, MariaHarness):
        return ReadOnlyUser(harness)
    assert isinstance(harness, PgHarness)
    return PgReadOnlyUser(harness)


@pytest.fixture
def ro(harness: Harness) -> Harness:
    return read_only_user(harness)


def signal_rows(h: Harness) -> int:
    """Rows in the source's signal table (created by an administrator on MySQL)."""
    h = without_kafka(h)
    if isinstance(h, PgReadOnlyUser):
        with psycopg.connect(h.inner.dsn) as conn:
            found = conn.execute("SELECT to_regclass('dblog_signal')").fetchone()
            if found is None or found[0] is None:
                return 0
            row = conn.execute("SELECT count(*) FROM dblog_signal").fetchone()
            assert row is not None
            return int(row[0])
    assert isinstance(h, ReadOnlyUser)
    server = h.inner.server
    return int(server.execute(f"SELECT count(*) FROM `{h.schema}`.dblog_signal")[0][0])


def post(cap: Capture, body: dict[str, Any], token: str = TOKEN) -> tuple[int, dict[str, Any]]:
    url = orjson.loads((cap.log_dir / "api.json").read_bytes())["url"]
    req = urllib.request.Request(
        f"{url}/snapshots", data=orjson.dumps(body), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def completed(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if e["op"] == "n" and e["notification"]["type"] == "COMPLETED")


@pytest.mark.mysql57
def test_read_only_signals_go_to_the_capture(ro: Harness, tmp_path: Path) -> None:
    make_table(ro, "t1", 400)
    user = without_kafka(ro)
    assert isinstance(user, PgReadOnlyUser | ReadOnlyUser)
    assert f"{user.user}:ro@" in ro.config(tmp_path / "probe").read_text()
    before = signal_rows(ro)
    first = f"ro-{uuid.uuid4().hex[:8]}"
    body = {"id": first, "type": "execute-snapshot", "data": {"data-collections": [q(ro, "t1")]}}
    cap = Capture(ro, tmp_path, EXTRA).start()
    try:
        # 202 only once the request is durable: a kill -9 right after keeps it (and
        # the resumed snapshot finishes on an idle server: MySQL/MariaDB once waited
        # forever there for progress past the checkpoint's own transaction)
        code, answer = post(cap, body)
        assert code == 202 and answer["applied"] is True, answer
        cap.kill()
        cap.start()
        events = cap.wait_notification("COMPLETED", timeout=120)
        assert completed(events) == 1

        # the same id again (after the restart): applied once, never twice
        code, answer = post(cap, body)
        assert code == 202 and answer["applied"] is False and answer["duplicate"] is True, answer

        # the core's answer comes back: nothing captured matches -> SKIPPED
        code, answer = post(cap, {"type": "execute-snapshot",
                                  "data": {"data-collections": ["nothing\\.here"]}})
        assert code == 202 and answer["notification"]["type"] == "SKIPPED", answer
        assert answer["notification"]["additional_data"]["unknown"] == ["nothing\\.here"]

        # `dblog snapshot` goes through the API too; --wait follows it to the end
        mark = cap.end()
        out = dblog("snapshot", "--config", str(cap.config), "--wait", q(ro, "t1"), timeout=120)
        assert "sent execute-snapshot" in out.stdout, out
        events = cap.wait_notification("COMPLETED", timeout=120, after=mark)
        cap.assert_oracle({"t1": ["id"]})

        # a wrong token changes nothing
        assert post(cap, body, token="wrong-token-000000000000")[0] == 401
    finally:
        if cap.proc is not None:
            cap.stop()
    assert signal_rows(ro) == before, "a signal row was written to the source"


def test_read_only_snapshot_cli_needs_the_api(pg_db: str, tmp_path: Path) -> None:
    """Without a running capture (no api.json) or without a token the CLI says what
    to do, and writes nothing."""
    h = PgHarness(pg_db)
    config = h.config(tmp_path, '[snapshot]\nwatermark = "read-only"\n')
    out = dblog("snapshot", "--config", str(config), "public\\.t1", check=False)
    assert out.returncode != 0
    assert "read-only snapshots take signals through the running capture" in out.stderr
    assert "[api] listen" in out.stderr
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "api.json").write_bytes(b'{"url": "http://127.0.0.1:9"}')
    out = dblog("snapshot", "--config", str(config), "public\\.t1", check=False)
    assert out.returncode != 0 and "needs a token" in out.stderr, out.stderr
