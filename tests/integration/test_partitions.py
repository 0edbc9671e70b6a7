"""Partitioned tables are captured under the parent's name, against a
real PostgreSQL through `dblog run`: stream and snapshot events name ``public.orders``
(publish_via_partition_root), leaves are not listed separately, rows moving between
partitions and partitions created after start are covered, and the log materializes to
one ``orders`` table equal to the source."""

from __future__ import annotations

import uuid
from pathlib import Path

from pydblog.changelog.sqlite import SqliteChangeLogReader
from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness
from tests.helpers import dblog


def test_partitioned_table_under_parent_name(pg_db: str, tmp_path: Path) -> None:
    h = PgHarness(pg_db)
    h.execute(
        "CREATE TABLE orders (id int, region text, qty int, PRIMARY KEY (id, region))"
        " PARTITION BY LIST (region)",
        "CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu')",
        "CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us')",
        "INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g"
        " FROM generate_series(1, 200) g",
    )
    extra = '[snapshot]\nchunk_size = 16\nmode = "initial"'
    with Capture(h, tmp_path, extra) as cap:
        cap.wait_notification("COMPLETED")
        h.execute("UPDATE orders SET qty = qty + 1 WHERE id <= 20")
        h.execute("UPDATE orders SET region = 'us' WHERE id = 2")  # moves to another leaf
        h.execute("DELETE FROM orders WHERE id = 3")
        h.execute("CREATE TABLE orders_ap PARTITION OF orders FOR VALUES IN ('ap')")
        h.execute("INSERT INTO orders VALUES (500, 'ap', 5), (501, 'ap', 6)")
        h.execute("UPDATE orders SET qty = 7 WHERE id = 500")
        mark = cap.end()
        h.execute("INSERT INTO dblog_signal (id, type, data) VALUES "
                  f"('{uuid.uuid4().hex}', 'execute-snapshot', "
                  """'{"data-collections": ["public\\\\.orders"]}')""")
        cap.wait_notification("COMPLETED", after=mark)
        events = cap.assert_oracle({"orders": ["id", "region"]})
    tables = {e["source"]["table"] for e in events if e["op"] != "n"} - {"dblog_test_marker"}
    assert tables == {"orders"}
    assert len(snapshot_rows(events, "orders")) == 200 + 201  # both snapshots, parent only
    stream = [e for e in events if e["op"] in "cud" and e["source"]["table"] == "orders"]
    assert any(e["key"] == {"id": 500, "region": "ap"} for e in stream)
    res = dblog("status", "--config", str(cap.config), check=False)
    assert "orders_eu" not in res.stdout
    recorded = {s.table for _, s in SqliteChangeLogReader(cap.log_dir).schemas()}
    assert "orders" in recorded and not recorded & {"orders_eu", "orders_us", "orders_ap"}
