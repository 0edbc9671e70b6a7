"""Schema shapes that break naive capture, against a real PostgreSQL through
`dblog run` and signals: domains and enums as keys, quoted case-sensitive identifiers,
very wide rows, generated columns, REPLICA IDENTITY NOTHING. Each table is snapshotted
in small chunks while it is written to, and the log must materialize to it."""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.contract.capture import Capture, snapshot_rows
from tests.contract.harness import PgHarness
from tests.helpers import materialize, sid, source_rows

WIDE = 300


def test_domain_enum_quoted_and_wide_tables(pg_db: str, tmp_path: Path) -> None:
    h = PgHarness(pg_db)
    wide_cols = ", ".join(f"c{i} int" for i in range(WIDE))
    wide_vals = ", ".join(f"g + {i}" for i in range(WIDE))
    h.execute(
        "CREATE DOMAIN code AS text CHECK (VALUE ~ '^[a-z]+[0-9]+$')",
        "CREATE TABLE dk (k code PRIMARY KEY, v int)",
        "INSERT INTO dk SELECT 'k' || g, g FROM generate_series(1, 25) g",
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'ecstatic')",
        "CREATE TABLE ek (m mood, n int, v text, PRIMARY KEY (m, n))",
        "INSERT INTO ek SELECT (enum_range(NULL::mood))[1 + g % 4], g, 'v' FROM generate_series(1, 25) g",
        'CREATE TABLE "Mixed Case" ("Id" int PRIMARY KEY, "a ""b""" text, "Ünï" text)',
        """INSERT INTO "Mixed Case" SELECT g, 'x' || g, 'ü' FROM generate_series(1, 25) g""",
        f"CREATE TABLE wide (id int PRIMARY KEY, {wide_cols})",
        f"INSERT INTO wide SELECT g, {wide_vals} FROM generate_series(1, 25) g",
    )
    tables = ["public\\.dk", "public\\.ek", "public\\.Mixed Case", "public\\.wide"]
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 4\nadaptive = false") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": tables})
        h.execute("UPDATE dk SET v = -v WHERE v % 3 = 0", "DELETE FROM dk WHERE v = 7")
        h.execute("UPDATE ek SET v = 'w' WHERE n % 2 = 0", "DELETE FROM ek WHERE n = 5")
        h.execute('UPDATE "Mixed Case" SET "a ""b""" = \'y\' WHERE "Id" < 5')
        h.execute("UPDATE wide SET c299 = 0 WHERE id % 2 = 0", "DELETE FROM wide WHERE id = 3")
        cap.wait_notification("COMPLETED", timeout=120)
        assert not cap.notifications("REJECTED")
        events = cap.assert_oracle(
            {"dk": ["k"], "ek": ["m", "n"], "Mixed Case": ["Id"], "wide": ["id"]}
        )
    for t in ("dk", "ek", "Mixed Case", "wide"):
        assert snapshot_rows(events, t), t


def test_generated_columns_are_left_out_on_both_paths(pg_db: str, tmp_path: Path) -> None:
    """PostgreSQL (before 18) does not publish generated columns: stream events lack
    them. Snapshot rows must lack them too, or a row's shape depends on which path
    wrote it last (a snapshot row had ``g``, an update of it did not)."""
    h = PgHarness(pg_db)
    h.execute(
        "CREATE TABLE gen (id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a * 2) STORED)",
        "INSERT INTO gen (id, a) SELECT g, g FROM generate_series(1, 20) g",
    )
    with Capture(h, tmp_path, "[snapshot]\nchunk_size = 4\nadaptive = false") as cap:
        h.signal(sid(), "execute-snapshot", {"data-collections": ["public\\.gen"]})
        cap.wait_notification("COMPLETED")
        h.execute("UPDATE gen SET a = a + 100 WHERE id <= 10")
        events = cap.caught_up()
    rows = materialize(events)["public.gen"]
    want = source_rows(pg_db, "public.gen", ["id"])
    assert {k: {c: r[c] for c in ("id", "a")} for k, r in want.items()} == rows
    shapes = {tuple(sorted(r)) for r in rows.values()}
    assert shapes == {("a", "id")}


def test_replica_identity_nothing_is_not_published(pg_db: str, tmp_path: Path) -> None:
    """A table with a primary key but REPLICA IDENTITY NOTHING: publishing it makes its
    UPDATEs and DELETEs fail on the source ("cannot update table ... does not have a
    replica identity"). It must be left out (with a warning), never break the writers."""
    h = PgHarness(pg_db)
    h.execute(
        "CREATE TABLE rn (id int PRIMARY KEY, v int)",
        "ALTER TABLE rn REPLICA IDENTITY NOTHING",
        "INSERT INTO rn VALUES (1, 1)",
    )
    with Capture(h, tmp_path) as cap:
        cap.caught_up()
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("UPDATE rn SET v = 2 WHERE id = 1")
            conn.execute("DELETE FROM rn WHERE id = 1")
        err = cap.stop()
    assert "rn" in err and "REPLICA IDENTITY NOTHING" in err
