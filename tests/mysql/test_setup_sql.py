"""``dblog setup --print-sql`` on MariaDB and MySQL 5.7: the printed SQL, run as root,
is all a capture user needs. The capture then runs as that user alone (an initial
snapshot under writes, then the stream) and the change log materializes to the source."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from tests.contract.capture import Capture
from tests.contract.harness import Wrapped
from tests.contract.test_snapshots import make_table, writer
from tests.helpers import dblog
from tests.mysql.harness import MariaHarness
from tests.mysql.servers import Server


def statements(script: str) -> list[str]:
    """The script's statements (one per line, comments left out)."""
    return [line.rstrip(";") for line in script.splitlines() if line and not line.startswith("--")]


class SetUpUser(Wrapped):
    """The harness, its capture connecting as the user ``dblog setup --print-sql``
    made (root runs the printed SQL, then sets the user's password)."""

    def __init__(self, inner: MariaHarness, directory: Path, extra: str) -> None:
        super().__init__(inner)
        self.inner: MariaHarness = inner
        self.user = f"cap_{uuid.uuid4().hex[:8]}"
        server = inner.server
        self.dsn = server.dsn(self.schema, user=self.user, password="pw")
        probe = self.config(directory / "probe", extra)
        self.sql = dblog("setup", "--print-sql", "--config", str(probe)).stdout
        for statement in statements(self.sql):
            server.execute(statement)
        server.execute(f"ALTER USER '{self.user}'@'%' IDENTIFIED BY 'pw'")

    def config(self, directory: Path, extra: str = "") -> Path:
        path = self.inner.config(directory, extra)
        server = self.inner.server
        path.write_text(path.read_text().replace(server.dsn(self.schema), self.dsn))
        return path


@pytest.mark.parametrize("mode", ["read-only", "table"])
def test_the_printed_setup_is_all_a_capture_needs(server: Server, db: str, tmp_path: Path,
                                                   mode: str) -> None:
    h = MariaHarness(server, db)
    make_table(h, "t1", 600)
    extra = f'[snapshot]\nmode = "initial"\nchunk_size = 50\nwatermark = "{mode}"\n'
    user = SetUpUser(h, tmp_path, extra)
    assert "IDENTIFIED BY" not in user.sql.replace("IDENTIFIED BY '...'", "")  # no password
    grants = " ".join(str(r[0]) for r in server.execute(f"SHOW GRANTS FOR '{user.user}'@'%'"))
    assert "INSERT" not in grants or mode == "table"  # read-only: the user cannot write
    stop = threading.Event()
    th = threading.Thread(target=writer, args=(h, "t1", stop, 5, 700))
    with Capture(user, tmp_path / "run", extra) as cap:
        th.start()
        try:
            cap.wait_notification("COMPLETED", timeout=180)
        finally:
            stop.set()
            th.join()
        cap.assert_oracle({"t1": ["id"]})
        err = cap.stop()
    assert "lacks" not in err and "denied" not in err.lower(), err[-3000:]
