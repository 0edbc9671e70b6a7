"""Capture by a PostgreSQL role with the least privilege that works: LOGIN REPLICATION and
SELECT, with the publication made by an administrator; and the hints a role that cannot
make its publication gets."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from pydblog.devtools.pgcluster import PgCluster
from tests.helpers import (
    dblog,
    materialize,
    read_log,
    source_rows,
    start_run,
    stop_run,
    wait_for,
    write_config,
)

READ_ONLY = '[snapshot]\nwatermark = "read-only"\nmode = "initial"\n'


def role(pg_db: str, name: str, *grants: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {name}")
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'pw'")
        for grant in grants:
            conn.execute(grant)


def capture_matches_source(config: Path, dsn: str, table: str, rows: int) -> list[dict[str, object]]:
    """Until the change log materializes ``table`` as the source holds it (``rows`` rows;
    the writes are done: a count alone was reached before their updates and deletes were
    logged, after the inserts); then the oracle, which names what differs."""
    want = source_rows(dsn, f"public.{table}", ["id"])
    assert len(want) == rows
    state: dict[str, object] = {}

    def done() -> bool:
        events = read_log(config)
        got = materialize(events).get(f"public.{table}", {})
        state["events"] = events
        state["have"] = {k: {c: r.get(c) for c in want[k]} if k in want else r
                         for k, r in got.items()}
        return state["have"] == want

    try:
        wait_for(done, 60, f"the {rows} rows of {table} in the change log")
    except AssertionError:
        assert state.get("have") == want
        raise
    events = state["events"]
    assert isinstance(events, list)
    return events


def test_an_administrators_publication_of_plain_tables_is_accepted(
    pg_db: str, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    """The usual ``CREATE PUBLICATION dblog FOR TABLE public.t`` (no
    publish_via_partition_root, owned by the administrator), a capture role with LOGIN
    REPLICATION and SELECT only: the capture runs (no captured table is partitioned) and
    warns about partitioned tables captured later."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g")
        conn.execute("CREATE PUBLICATION dblog FOR TABLE public.t")
    role(pg_db, "capture_ro", "ALTER ROLE capture_ro REPLICATION", "GRANT SELECT ON public.t TO capture_ro")
    dbname = pg_db.rsplit("/", 1)[1]
    config = write_config(tmp_path, pg_cluster.dsn(dbname, user="capture_ro", password="pw"),
                          extra=READ_ONLY, source_extra='tables = ["public\\\\.t"]')
    proc = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO t SELECT g, 'w' || g FROM generate_series(51, 80) g")
            conn.execute("UPDATE t SET v = 'u' WHERE id <= 10")
            conn.execute("DELETE FROM t WHERE id BETWEEN 11 AND 15")
        capture_matches_source(config, pg_db, "t", 75)
    finally:
        code, err = stop_run(proc)
    assert code == 0, err[-3000:]
    assert "does not publish partitioned tables by their root" in err
    assert "publish_via_partition_root = true" in err  # what to run before one is captured
    assert "must be owner" not in err


def test_a_partitioned_table_needs_its_publication_by_root(
    pg_db: str, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    """A captured partitioned table in a publication without publish_via_partition_root
    that the role cannot alter: refused, naming the table and what its owner runs."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE p (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100)")
        conn.execute("CREATE PUBLICATION dblog FOR TABLE public.p")
    role(pg_db, "capture_rp", "ALTER ROLE capture_rp REPLICATION", "GRANT SELECT ON public.p TO capture_rp")
    dbname = pg_db.rsplit("/", 1)[1]
    config = write_config(tmp_path, pg_cluster.dsn(dbname, user="capture_rp", password="pw"),
                          extra=READ_ONLY, source_extra='tables = ["public\\\\.p"]')
    res = dblog("run", "--config", str(config), check=False, timeout=60)
    assert res.returncode == 3, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert "public.p is partitioned" in res.stderr
    assert 'ALTER PUBLICATION "dblog" SET (publish_via_partition_root = true)' in res.stderr


def test_an_owner_without_create_on_the_database_is_told_to_get_it(
    pg_db: str, pg_cluster: PgCluster, tmp_path: Path
) -> None:
    """A role that owns its tables but lacks CREATE on the database cannot create the
    publication: the hint names the grant (or an administrator's CREATE PUBLICATION),
    not a CREATE PUBLICATION the owner cannot run either."""
    dbname = pg_db.rsplit("/", 1)[1]
    role(pg_db, "capture_own", "ALTER ROLE capture_own REPLICATION",
         "GRANT CREATE ON SCHEMA public TO capture_own")
    with psycopg.connect(pg_cluster.dsn(dbname, user="capture_own", password="pw"), autocommit=True) as conn:
        conn.execute("CREATE TABLE o (id int PRIMARY KEY)")
    config = write_config(tmp_path, pg_cluster.dsn(dbname, user="capture_own", password="pw"),
                          extra=READ_ONLY, source_extra='tables = ["public\\\\.o"]')
    res = dblog("run", "--config", str(config), check=False, timeout=60)
    assert res.returncode == 3, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert f'GRANT CREATE ON DATABASE "{dbname}" TO "capture_own"' in res.stderr
    assert 'CREATE PUBLICATION "dblog" FOR TABLE "public"."o"' in res.stderr  # the administrator's way
    assert "as the tables' owner run" not in res.stderr


def run_as_superuser(pg_cluster: PgCluster, dbname: str, script: str) -> None:
    """``psql -v ON_ERROR_STOP=1 -f``: as a DBA runs a script."""
    import subprocess

    path = Path(pg_cluster.root) / f"setup-{dbname}.sql"
    path.write_text(script)
    res = subprocess.run([str(pg_cluster.bindir / "psql"), "-v", "ON_ERROR_STOP=1", "-q", "-f", str(path),
                          pg_cluster.dsn(dbname)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("mode", ["read-only", "table", "message"])
def test_the_printed_setup_is_all_a_capture_needs(
    pg_db: str, pg_cluster: PgCluster, tmp_path: Path, mode: str
) -> None:
    """``dblog setup --print-sql`` run by a superuser (psql) is all the capture role
    needs: the capture runs as it alone (an initial snapshot, then the stream, of a plain
    and a partitioned table in two schemas) and the change log materializes to the
    source. The role owns nothing and has no CREATE anywhere."""
    dbname = pg_db.rsplit("/", 1)[1]
    user = f"cap_{mode.replace('-', '_')}"
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {user}")
        conn.execute("CREATE SCHEMA sales")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g")
        conn.execute("CREATE TABLE sales.p (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE sales.p1 PARTITION OF sales.p FOR VALUES FROM (0) TO (1000)")
        conn.execute("CREATE TABLE sales.p2 PARTITION OF sales.p FOR VALUES FROM (1000) TO (2000)")
        conn.execute("INSERT INTO sales.p SELECT g, 'v' || g FROM generate_series(1, 1500, 3) g")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")  # not captured: no grant
    config = write_config(
        tmp_path, pg_cluster.dsn(dbname, user=user, password="pw"),
        extra=f'[snapshot]\nmode = "initial"\nchunk_size = 100\nwatermark = "{mode}"\n',
        source_extra='tables = ["public\\\\.t", "sales\\\\.p"]')
    script = dblog("setup", "--print-sql", "--config", str(config)).stdout
    assert "pw" not in script.replace("PASSWORD '...'", "")
    run_as_superuser(pg_cluster, dbname, script)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {user} PASSWORD 'pw'")
    proc = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute("INSERT INTO t SELECT g, 'w' || g FROM generate_series(301, 340) g")
            conn.execute("UPDATE t SET v = 'u' WHERE id <= 20")
            conn.execute("INSERT INTO sales.p VALUES (1999, 'late'), (2, 'two')")
            conn.execute("DELETE FROM sales.p WHERE id = 1")
        capture_matches_source(config, pg_db, "t", 340)
        events = read_log(config)
        def p_done() -> bool:
            return len(materialize(read_log(config)).get("sales.p", {})) >= 501

        wait_for(p_done, 60, "sales.p in the change log")
        events = read_log(config)
        got = materialize(events)["sales.p"]
        want = source_rows(pg_db, "sales.p", ["id"])
        assert {k: {c: r.get(c) for c in ("id", "v")} for k, r in got.items()} == want
    finally:
        code, err = stop_run(proc)
    assert code == 0, err[-3000:]
    assert "must be owner" not in err and "permission denied" not in err, err[-3000:]
    assert not any(e["source"].get("table") == "other" for e in events if "source" in e)
