"""A heartbeat (a non-transactional logical message) sorts before every transaction
delivered after it, also one whose commit record directly follows the message.

PostgreSQL reports a message at the end of its record, which is where the next record
starts: a transaction whose changes were written before the heartbeat and whose commit
record follows it has that very LSN as its commit LSN. A heartbeat at ``(lsn, 0)``
then had the position of that transaction's first event: snapshot rows placed after
the heartbeat (read-only snapshots) collided with the transaction's events, and a
checkpoint at the heartbeat made a restart drop that event (``<= checkpoint``)."""

from __future__ import annotations

import psycopg

from pydblog.config import parse_config
from pydblog.events import ChangeEvent
from pydblog.ports import Heartbeat
from pydblog.positions import PgPosition
from pydblog.sources.postgres.source import HEARTBEAT_PREFIX, PgLogSource
from tests.helpers import each_event


def test_heartbeat_sorts_before_a_commit_that_follows_it(pg_db: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE hb_t (id int PRIMARY KEY)")
    cfg = parse_config({"source": {"dsn": pg_db, "tables": ["public\\.hb_t"],
                                   "heartbeat_interval_s": 3600}})
    source = PgLogSource(cfg)
    source.open(None)
    try:
        with psycopg.connect(pg_db) as writer, psycopg.connect(pg_db, autocommit=True) as other:
            writer.execute("INSERT INTO hb_t VALUES (1)")  # written, not committed yet
            other.execute("SELECT pg_logical_emit_message(false, %s, '')", (HEARTBEAT_PREFIX,))
            writer.commit()  # its commit record starts where the message ends
        heartbeat = None
        for item in each_event(source.stream()):
            if isinstance(item, Heartbeat):
                heartbeat = item
            elif isinstance(item, ChangeEvent) and item.table == "hb_t":
                assert heartbeat is not None
                hb, ev = heartbeat.position, item.position
                assert isinstance(hb, PgPosition) and isinstance(ev, PgPosition)
                assert hb < ev, (hb, ev)
                assert hb.ack_lsn.value <= ev.commit_lsn.value  # acked: resent on restart
                break
    finally:
        source.close()
