"""`dblog verify`: a real capture, PostgreSQL and Delta mirrors written by the sync's own
sinks (applied here batch by batch on a local Spark session), damaged by hand: verify reports
exactly the damaged key ranges and nothing else, and passes on an intact mirror."""

from __future__ import annotations

import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import orjson
import psycopg
import pytest

from pydblog.config import load_config
from pydblog.devtools.pgcluster import PgCluster
from tests.conftest import drop_database
from tests.helpers import DBLOG, start_run, stop_run, wait_for_marker, write_config

pytest.importorskip("deltalake")
pytest.importorskip("pyarrow")

ROWS = 2000
CHUNK = 250  # 8 ranges of the items table
PROCS: dict[Path, subprocess.Popen[bytes]] = {}  # each test's `dblog run` (a test may restart it)


class MiniSync:
    """The sync's batch applier (what `dblog sync` runs per micro-batch, on a local Spark
    session) fed with the change log in batches, without Spark's streaming source."""

    def __init__(self, config: Path) -> None:
        import os

        from pydblog.spark.job import BatchApplier
        from pydblog.spark.pyexec import worker_python
        from pydblog.spark.session import spark_session
        from pydblog.spark.sinks import build_sink

        os.environ.setdefault("PYSPARK_PYTHON", worker_python("local[2]"))
        self.spark = spark_session("local[2]")
        self.cfg = load_config(config)
        self.sinks = [build_sink(s) for s in self.cfg.sync.sinks]
        self.applier = BatchApplier(self.cfg.log, self.sinks, retries=0, backoff_s=0)
        self.next = 0
        self.batch_id = 0

    def catch_up(self) -> None:
        import pyarrow as pa

        from pydblog.changelog import open_reader
        from pydblog.spark.decode import records_to_arrow
        from pydblog.spark.job import packed_frame

        reader = open_reader(self.cfg.log)
        try:
            end = reader.next_offset()
            while self.next < end:
                recs = [r for r in reader.read(self.next, 5000) if r.offset < end]
                if not recs:
                    break
                events = pa.Table.from_batches([records_to_arrow(recs)])
                # packed here: the applier may run in another thread (no active session)
                self.applier.apply(packed_frame(self.spark, events), self.batch_id, dense=False)
                self.batch_id += 1
                self.next = recs[-1].offset + 1
        finally:
            reader.close()

    def close(self) -> None:
        for s in self.sinks:
            s.close()


@pytest.fixture
def mirror_db(pg_cluster: PgCluster) -> Iterator[str]:
    name = f"m_{uuid.uuid4().hex[:10]}"
    dsn = pg_cluster.create_database(name)
    try:
        yield dsn
    finally:
        drop_database(pg_cluster, name)


@pytest.fixture
def setup(tmp_path: Path, pg_db: str, mirror_db: str) -> Iterator[tuple[Path, MiniSync]]:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2), "
            "tags text[], doc json, at timestamptz, ratio real)"
        )
        conn.execute("CREATE TABLE words (w text PRIMARY KEY, n bigint)")
        conn.execute("CREATE TABLE pairs (a int, b text, v text, PRIMARY KEY (a, b))")
        conn.execute("CREATE TABLE notes (a int, b text)")  # keyless: compared as a set of rows
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        conn.execute(  # every type with a portable checksum (Delta through Spark)
            "CREATE TABLE kinds (id int PRIMARY KEY, a int2, b int8, c numeric(12,3), d numeric, "
            "e text, f uuid, g bool, h date, i real, j double precision, k timestamp, "
            "l timestamptz, m bytea, n mood)")
        conn.execute("ALTER TABLE notes REPLICA IDENTITY FULL")
        conn.execute(  # keyless, distinct rows of many types, NULLs: repaired whole
            "CREATE TABLE bag (a int, b text, c numeric(8,2), d timestamptz, e double precision, "
            "f bytea, g jsonb)")
        conn.execute("ALTER TABLE bag REPLICA IDENTITY FULL")
    config = write_config(
        tmp_path, pg_db,
        extra=f"""
[[sync.sinks]]
type = "postgres"
dsn = "{mirror_db}"
schema = "mirror"
[[sync.sinks]]
type = "delta"
path = "{tmp_path / "lake"}"
[snapshot]
chunk_size = 100
""",
    )
    PROCS[config] = start_run(config)
    try:
        with psycopg.connect(pg_db, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO items SELECT g, 'item ' || g, g * 1.25, ARRAY['a', 'b' || g], "
                "json_build_object('g', g, 'h', ARRAY[g]), '2024-01-01 00:00:00+00'::timestamptz "
                "+ g * interval '1 minute', g / 7.0 FROM generate_series(1, %s) g",
                (ROWS,),
            )
            conn.execute(
                "INSERT INTO words SELECT 'w' || g || CASE WHEN g % 3 = 0 THEN 'Ä' ELSE 'a' END, g "
                "FROM generate_series(1, 600) g"
            )
            conn.execute("INSERT INTO pairs SELECT g % 10, 'k' || g, 'v' FROM generate_series(1, 300) g")
            conn.execute("INSERT INTO notes SELECT g % 5, NULL FROM generate_series(1, 20) g")
            conn.execute(
                "INSERT INTO bag SELECT g % 40, CASE WHEN g % 7 = 0 THEN NULL ELSE 'b' || g END, "
                "CASE WHEN g % 5 = 0 THEN NULL ELSE g * 1.5 END, "
                "TIMESTAMPTZ '2024-03-31 01:30:00+02' + g * interval '90 minutes', "
                "CASE WHEN g % 6 = 0 THEN NULL ELSE g / 3.0 END, "
                "CASE WHEN g % 4 = 0 THEN NULL ELSE decode(lpad(to_hex(g), 4, '0'), 'hex') END, "
                "CASE WHEN g % 3 = 0 THEN NULL ELSE jsonb_build_object('g', g) END "
                "FROM generate_series(1, 150) g")
            conn.execute(
                "INSERT INTO kinds SELECT g, (g * 7 - 300)::int2, g::int8 * 1000000007, "
                "g * 1.001, (g / 3.0)::numeric, CASE WHEN g % 5 = 0 THEN NULL "
                "WHEN g % 5 = 1 THEN '' ELSE 'tëxt ' || g || E' \\ \"q\"' END, "
                "md5(g::text)::uuid, g % 2 = 0, DATE '2000-02-29' + g * 17, "
                "(ARRAY['NaN', '-0', '1e30', '1.17549e-38']::real[])[g % 5] , "
                "CASE g % 6 WHEN 0 THEN 'Infinity'::float8 WHEN 1 THEN -0.0 WHEN 2 THEN 1e300 "
                "WHEN 3 THEN 5e-324 ELSE g / 7.0 END, "
                "TIMESTAMP '1969-12-31 23:59:59.999999' + g * interval '1 day 1.000001 s', "
                "TIMESTAMPTZ '2024-03-31 01:30:00+02' + g * interval '7 hours', "
                "CASE WHEN g % 4 = 0 THEN NULL ELSE decode(repeat(lpad(to_hex(g), 2, '0'), g % 9), "
                "'hex') END, (ARRAY['sad', 'ok', 'happy']::mood[])[1 + g % 3] "
                "FROM generate_series(1, 120) g")
        wait_for_marker(config, pg_db)
        sync = MiniSync(config)
        sync.catch_up()
        yield config, sync
        sync.close()
    finally:
        stop_run(PROCS.pop(config))


def verify(config: Path, *args: str, spark: bool = False) -> tuple[int, dict[str, Any]]:
    """``dblog verify --json``; Delta mirrors row by row unless ``spark`` (the default
    mode's Spark session costs each process a JVM start: the tests of that mode ask)."""
    mode = () if spark else ("--delta-mode", "rows")
    res = subprocess.run(
        [*DBLOG, "verify", "--config", str(config), "--json", "--chunk-size", str(CHUNK),
         "--lag-timeout", "20", *mode, *args],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode in (0, 1), res.stderr
    assert res.stdout, res.stderr[-3000:]
    return res.returncode, orjson.loads(res.stdout)


def differing(report: dict[str, Any], sink: str) -> dict[str, list[dict[str, Any]]]:
    return {
        t["table"]: t["differing"]
        for t in report["tables"]
        if t["sink"] == sink and t["differing"]
    }


def assert_intact(config: Path) -> None:
    """Intact mirrors verify: every mode (``sql``, ``spark``, ``rows``) finds them equal."""
    code, report = verify(config, r"public\.(items|words|pairs|kinds)", spark=True)
    assert code == 0, [(t["sink"], t["table"], t["differing"][0]["sample"]) for t in report["tables"] if not t["ok"]]
    assert report["ok"]
    by = {(t["table"], t["sink"]): t for t in report["tables"]}
    # every portable type checksums alike in PostgreSQL and Spark: no range read again
    kinds = by[("public.kinds", "delta")]
    assert (kinds["mode"], kinds["ranges"], kinds["suspects"]) == ("spark", 1, 0)
    assert by[("public.words", "delta")]["suspects"] == by[("public.pairs", "delta")]["suspects"] == 0
    assert by[("public.items", "postgres")]["mode"] == "sql"
    assert by[("public.items", "delta")]["mode"] == "rows"  # (an array and a json column)
    assert by[("public.words", "delta")]["mode"] == "spark"
    assert by[("public.pairs", "delta")]["mode"] == "spark"
    assert by[("public.words", "delta")]["source_rows"] == 600
    assert by[("public.items", "postgres")]["source_rows"] == ROWS
    assert by[("public.items", "postgres")]["ranges"] == ROWS // CHUNK + 1


def test_intact_then_damaged_mirrors(setup: tuple[Path, MiniSync], mirror_db: str,
                                     tmp_path: Path) -> None:
    """Intact mirrors verify; then both mirrors damaged differently: each reports
    exactly its own damage."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    config, _ = setup
    assert_intact(config)
    with psycopg.connect(mirror_db, autocommit=True) as conn:
        conn.execute("DELETE FROM mirror.items WHERE id IN (10, 11)")  # range 0: missing
        conn.execute("UPDATE mirror.items SET price = price + 1 WHERE id = 600")  # range 2
        conn.execute("DELETE FROM mirror.items WHERE id > 1000 AND id <= 1250")  # range 4 whole
        conn.execute(
            "INSERT INTO mirror.items (id, name) VALUES (5000, 'ghost'), (-1, 'below')"
        )  # extra beyond the last key and before the first
        conn.execute("UPDATE mirror.words SET n = 0 WHERE w = 'w3Ä'")
        conn.execute("TRUNCATE mirror.pairs")
        conn.execute("DELETE FROM mirror.notes WHERE ctid IN (SELECT ctid FROM mirror.notes WHERE a = 2 LIMIT 1)")
        conn.execute("INSERT INTO mirror.notes VALUES (9, 'x')")
    path = str(tmp_path / "lake" / "public" / "items")
    dt = DeltaTable(path)
    dt.delete("id = 7 OR (id > 500 AND id <= 750)")
    dt = DeltaTable(path)
    dt.update(predicate="id = 1999", updates={"name": "'changed'"})
    extra = DeltaTable(path).to_pyarrow_table().filter(pa.compute.equal(pa.compute.field("id"), 3))
    extra = extra.set_column(extra.schema.get_field_index("id"), "id", pa.array([3333], extra.schema.field("id").type))
    write_deltalake(path, extra, mode="append")
    # checksummed through Spark (no json or array column): a changed value, a lost row of
    # a composite key
    DeltaTable(str(tmp_path / "lake" / "public" / "words")).update(
        predicate="w = 'w100a'", updates={"n": "-5"})
    DeltaTable(str(tmp_path / "lake" / "public" / "pairs")).delete("a = 4 AND b = 'k4'")

    code, report = verify(config, r"public\.(items|words|pairs|notes)", spark=True)
    assert code == 1
    got = differing(report, "postgres")
    [n] = got["public.notes"]  # one range: the whole keyless table, its distinct rows
    assert (n["missing"], n["extra"], n["sample"]["missing"], n["sample"]["extra"]) == (
        1, 1, [[2, None]], [[9, "x"]])
    assert {r["index"] for r in got["public.items"]} == {0, 2, 4, 8}
    assert all(r["status"] == "drift" for r in got["public.items"])
    first = next(r for r in got["public.items"] if r["index"] == 0)
    assert (first["missing"], first["extra"], first["different"]) == (2, 1, 0)
    assert first["sample"]["missing"] == [[10], [11]] and first["sample"]["extra"] == [[-1]]
    whole = next(r for r in got["public.items"] if r["index"] == 4)
    assert (whole["lo"], whole["hi"], whole["missing"]) == ([1000], [1250], 250)
    last = next(r for r in got["public.items"] if r["index"] == 8)
    assert (last["hi"], last["extra"]) == (None, 1)
    assert next(r for r in got["public.items"] if r["index"] == 2)["different"] == 1
    [w] = got["public.words"]
    assert (w["different"], w["sample"]["different"]) == (1, [["w3Ä"]])
    assert sum(r["missing"] for r in got["public.pairs"]) == 300

    lake = {r["index"]: r for r in differing(report, "delta")["public.items"]}
    delta = differing(report, "delta")
    assert set(delta) == {"public.items", "public.words", "public.pairs"}  # notes intact
    [w] = delta["public.words"]
    assert (w["status"], w["different"], w["sample"]["different"]) == ("drift", 1, [["w100a"]])
    [pr] = delta["public.pairs"]
    assert (pr["missing"], pr["sample"]["missing"]) == (1, [[4, "k4"]])
    modes = {(t["table"], t["sink"]): t["mode"] for t in report["tables"]}
    assert modes[("public.words", "delta")] == modes[("public.pairs", "delta")] == "spark"
    assert set(lake) == {0, 2, 7, 8}, lake
    assert lake[0]["sample"]["missing"] == [[7]]
    assert lake[2]["missing"] == 250
    assert lake[7]["sample"]["different"] == [[1999]]
    assert lake[8]["sample"]["extra"] == [[3333]]

    code, report = verify(config, r"public\.items", "--sink", "delta")
    assert code == 1 and {t["sink"] for t in report["tables"]} == {"delta"}


@pytest.mark.slow
def test_lag_is_not_drift(setup: tuple[Path, MiniSync], pg_db: str) -> None:
    """Source changes the mirror has not applied yet (the sync stopped) are reported as
    unsettled, never as drift; once applied, verify passes."""
    config, sync = setup
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("UPDATE items SET name = 'new' WHERE id IN (5, 1500)")
        conn.execute("DELETE FROM items WHERE id = 800")
    wait_for_marker(config, pg_db)
    code, report = verify(config, r"public\.items", "--sink", "postgres", "--lag-timeout", "1",
                          "--rounds", "1")
    assert code == 1
    [t] = report["tables"]
    assert t["differing"] and all(r["status"] == "unsettled" for r in t["differing"])
    assert all(r["missing"] + r["extra"] + r["different"] == 0 for r in t["differing"])
    sync.catch_up()
    code, report = verify(config, r"public\.items")
    assert code == 0, report


class SyncThread:
    """``MiniSync.catch_up`` in a loop (a running `dblog sync`)."""

    def __init__(self, sync: MiniSync) -> None:
        import threading

        self.sync = sync
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.sync.catch_up()
            except BaseException as exc:  # surfaced by close()
                self.error = exc
                return
            self.stop.wait(0.2)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        if self.error is not None:
            raise self.error


def assert_mirrors_equal_source(config: Path, pg_db: str, mirror_db: str, tables: list[str]) -> None:
    """The demo's independent comparison (whole tables, every column)."""
    from pydblog.verify import compare, delta_table, postgres_table, schemas, source_table

    cfg = load_config(config)
    found = schemas(Path(cfg.log.path))
    for name in tables:
        s = found[name]
        f32 = [i for i, c in enumerate(s.columns) if c.logical == "float32"]

        def single(rows: dict[str, tuple[Any, ...]], f32: list[int] = f32) -> dict[str, tuple[Any, ...]]:
            # (a real read as text parses to a double; Delta holds the float32)
            return {k: tuple(struct.unpack("f", struct.pack("f", v))[0] if i in f32 and v is not None
                             else v for i, v in enumerate(r)) for k, r in rows.items()}

        src = single(source_table(pg_db, s))
        pg = single(postgres_table(mirror_db, "mirror", s))
        lake = single(delta_table(tmp_lake(config), s))
        assert compare(name, "postgres", src, pg).ok, name
        assert compare(name, "delta", src, lake).ok, name


def tmp_lake(config: Path) -> Path:
    return config.parent / "lake"


def damage(mirror_db: str, lake: Path) -> None:
    from deltalake import DeltaTable

    with psycopg.connect(mirror_db, autocommit=True) as conn:
        conn.execute("DELETE FROM mirror.items WHERE id IN (10, 11)")
        conn.execute("UPDATE mirror.items SET price = price + 1 WHERE id = 600")
        conn.execute("DELETE FROM mirror.items WHERE id > 1000 AND id <= 1250")
        conn.execute("INSERT INTO mirror.items (id, name) VALUES (5000, 'ghost'), (-1, 'below')")
        conn.execute("UPDATE mirror.words SET n = 0 WHERE w = 'w3Ä'")
        conn.execute("INSERT INTO mirror.words VALUES ('zz-extra', 1)")
    DeltaTable(str(lake / "public" / "items")).delete("id = 7 OR (id > 500 AND id <= 750)")
    DeltaTable(str(lake / "public" / "words")).delete("w = 'w31a'")


def test_repair_heals_exactly_the_damage(setup: tuple[Path, MiniSync], pg_db: str, mirror_db: str) -> None:
    """Key ranges of the keyed tables and the whole tables without primary key (chunked
    by a column verify picks; NULLs and every type matched null-safely) heal."""
    config, sync = setup
    damage(mirror_db, tmp_lake(config))
    damage_keyless(mirror_db, tmp_lake(config))
    running = SyncThread(sync)
    try:
        code, out = verify(config, r"public\.(items|words|pairs|notes|bag)", "--repair",
                           "--repair-timeout", "120")
    finally:
        running.close()
    assert out["before"]["ok"] is False
    assert set(out["repair"]["markers"]) == {"public.items", "public.words", "public.notes",
                                             "public.bag"}
    assert out["repair"]["whole"] == ["public.bag", "public.notes"], out["repair"]
    ranges = out["repair"]["ranges"]
    assert (ranges["public.items"], ranges["public.words"]) == (5, 2) or \
        ranges["public.items"] >= 4, out["repair"]
    assert code == 0, out["after"]
    assert out["after"]["ok"]
    assert_mirrors_equal_source(config, pg_db, mirror_db, ["public.items", "public.words", "public.pairs"])
    assert_keyless_mirrors_equal_source(config, pg_db, mirror_db, ["public.notes", "public.bag"])


@pytest.mark.slow
def test_whole_table_repair_deletes_what_the_source_lost(setup: tuple[Path, MiniSync], pg_db: str,
                                                          mirror_db: str) -> None:
    """`dblog snapshot --repair`: a row the source no longer has (here: inserted in the
    mirrors by hand) goes, the rest is upserted."""
    from deltalake import DeltaTable

    config, sync = setup
    with psycopg.connect(mirror_db, autocommit=True) as conn:
        conn.execute("INSERT INTO mirror.pairs VALUES (99, 'ghost', 'x')")
        conn.execute("DELETE FROM mirror.pairs WHERE a = 3")
    DeltaTable(str(tmp_lake(config) / "public" / "pairs")).delete("a = 4")
    res = subprocess.run(
        [*DBLOG, "snapshot", "--config", str(config), "--repair", "--wait", r"public\.pairs"],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr
    wait_for_marker(config, pg_db)
    sync.catch_up()
    code, report = verify(config, r"public\.pairs")
    assert code == 0, report
    assert_mirrors_equal_source(config, pg_db, mirror_db, ["public.pairs"])


def distinct_rows(rows: dict[str, tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    return {tuple(orjson.dumps(v, default=str).decode() for v in r) for r in rows.values()}


def assert_keyless_mirrors_equal_source(config: Path, pg_db: str, mirror_db: str,
                                        tables: list[str]) -> None:
    """Tables without primary key: each mirror holds every distinct source row once,
    every column compared (equal rows cannot be told apart: a mirror keeps one)."""
    from dataclasses import replace

    from pydblog.verify import delta_table, postgres_table, schemas, source_table

    cfg = load_config(config)
    found = schemas(Path(cfg.log.path))
    for name in tables:
        s = found[name]
        whole = replace(s, key=tuple(c.name for c in s.columns))  # a row is its own key
        want = distinct_rows(source_table(pg_db, whole))
        assert want
        for sink, got in (("postgres", postgres_table(mirror_db, "mirror", whole)),
                          ("delta", delta_table(tmp_lake(config), whole))):
            have = distinct_rows(got)
            assert have == want, (name, sink, sorted(want - have)[:3], sorted(have - want)[:3])
        with psycopg.connect(mirror_db) as conn:
            n = conn.execute(f"SELECT count(*) FROM mirror.{s.table}").fetchone()
        assert n is not None and n[0] == len(want), (name, "postgres holds duplicates")


def damage_keyless(mirror_db: str, lake: Path) -> None:
    """Damage the tables without primary key in both mirrors: rows lost, changed, added
    (NULLs among them; bytes and JSON in ``bag``'s rows)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    with psycopg.connect(mirror_db, autocommit=True) as conn:
        conn.execute("DELETE FROM mirror.notes WHERE a = 2")
        conn.execute("INSERT INTO mirror.notes VALUES (9, 'x')")
        conn.execute("DELETE FROM mirror.bag WHERE a = 3")  # rows with NULLs among them
        conn.execute("UPDATE mirror.bag SET e = -1 WHERE a = 5 AND b IS NULL")
        conn.execute("INSERT INTO mirror.bag (a, b) VALUES (77, NULL), (78, 'ghost')")
    DeltaTable(str(lake / "public" / "notes")).delete("a = 4")
    bag = str(lake / "public" / "bag")
    DeltaTable(bag).delete("a = 11")
    DeltaTable(bag).update(predicate="a = 12", updates={"b": "'changed'"})
    extra = DeltaTable(bag).to_pyarrow_table().filter(pa.compute.equal(pa.compute.field("a"), 13))
    write_deltalake(bag, extra.set_column(0, "a", pa.array([99] * extra.num_rows, pa.int32())),
                    mode="append")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_repair_of_tables_without_primary_key_under_writes(
        setup: tuple[Path, MiniSync], pg_db: str, mirror_db: str) -> None:
    """A table without primary key is repaired whole (chunked by a column verify picks)
    while the source changes its rows: rows lost, added and changed in both mirrors heal,
    NULLs and every type matched null-safely (without writes: the repair test above)."""
    import threading

    config, sync = setup
    damage_keyless(mirror_db, tmp_lake(config))
    stop = threading.Event()

    def writes() -> None:  # distinct rows in, out and changed while the repair runs
        with psycopg.connect(pg_db, autocommit=True) as conn:
            i = 0
            while not stop.is_set():
                i += 1
                conn.execute("INSERT INTO bag (a, b, c) VALUES (%s, %s, NULL)", (1000 + i, f"w{i}"))
                conn.execute("UPDATE bag SET b = b || '+' WHERE a = %s", (1000 + i // 2,))
                if i % 3 == 0:
                    conn.execute("DELETE FROM bag WHERE a = %s", (1000 + i - 2,))
                stop.wait(0.02)

    writer = threading.Thread(target=writes, daemon=True)
    running = SyncThread(sync)
    writer.start()
    try:
        _, out = verify(config, r"public\.(notes|bag)", "--repair", "--repair-timeout", "120")
    finally:
        stop.set()
        writer.join(30)
        running.close()
    before = differing(out["before"], "postgres")
    assert set(before) == {"public.notes", "public.bag"}, before
    assert set(differing(out["before"], "delta")) == {"public.notes", "public.bag"}
    assert out["repair"]["whole"] == ["public.bag", "public.notes"], out["repair"]
    assert set(out["repair"]["markers"]) == {"public.notes", "public.bag"}, out["repair"]
    # the writes went on while verify read again: changed rows are unsettled, never drift
    assert all(r["status"] == "unsettled" for t in out["after"]["tables"] for r in t["differing"]), \
        [(t["table"], t["sink"], t["differing"]) for t in out["after"]["tables"] if not t["ok"]]
    wait_for_marker(config, pg_db)
    sync.catch_up()
    code, report = verify(config, r"public\.(notes|bag)")
    assert code == 0, report
    assert_keyless_mirrors_equal_source(config, pg_db, mirror_db, ["public.notes", "public.bag"])


class Workload:
    """Writes to ``items`` while verify and repair run: updates, inserts, deletes and
    key-changing updates, on keys the damage leaves alone (the damage stays exactly what
    the test made), in the damaged ranges and the others."""

    DAMAGED: ClassVar[frozenset[int]] = frozenset({7, 10, 11, 600, 1999, *range(501, 751), *range(1001, 1251)})

    def __init__(self, dsn: str) -> None:
        import random
        import threading

        self.dsn = dsn
        self.rng = random.Random(7)
        self.stop = threading.Event()
        self.writes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _key(self) -> int:
        while True:
            k = self.rng.randint(12, 1990)
            if k not in self.DAMAGED:
                return k

    def _run(self) -> None:
        next_id = 20_000
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                op = self.rng.random()
                k = self._key()
                if op < 0.5:
                    conn.execute("UPDATE items SET name = md5(random()::text) WHERE id = %s", (k,))
                elif op < 0.7:
                    conn.execute("DELETE FROM items WHERE id = %s", (k,))
                elif op < 0.85:
                    conn.execute("INSERT INTO items (id, name) VALUES (%s, 'new') ON CONFLICT DO NOTHING", (k,))
                else:  # a key-changing update, into another range
                    next_id += 1
                    conn.execute("UPDATE items SET id = %s WHERE id = %s", (next_id, k))
                self.writes += 1
                self.stop.wait(0.005)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_verify_and_repair_under_writes(setup: tuple[Path, MiniSync], pg_db: str, mirror_db: str) -> None:
    config, sync = setup
    damage(mirror_db, tmp_lake(config))
    running = SyncThread(sync)
    work = Workload(pg_db)
    try:
        # Range bounds move with the writes; the drift itself must be exactly the damage.
        # A starved capture or sync leaves ranges unsettled (never drift): verify again.
        want = {
            ("public.items", "postgres", "missing"): 252,
            ("public.items", "postgres", "extra"): 2,
            ("public.items", "postgres", "different"): 1,
            ("public.items", "delta", "missing"): 251,
            ("public.words", "postgres", "different"): 1,
            ("public.words", "postgres", "extra"): 1,
            ("public.words", "delta", "missing"): 1,
        }
        for _ in range(3):
            code, report = verify(config, r"public\.(items|words)", "--lag-timeout", "30")
            assert code == 1
            found: dict[tuple[str, str, str], int] = {}
            keys: dict[tuple[str, str, str], set[Any]] = {}
            for t in report["tables"]:
                for r in t["differing"]:
                    assert r["status"] in ("drift", "unsettled"), r
                    for kind in ("missing", "extra", "different"):
                        at = (t["table"], t["sink"], kind)
                        found[at] = found.get(at, 0) + r[kind]
                        keys.setdefault(at, set()).update(k[0] for k in r["sample"][kind])
            found = {k: v for k, v in found.items() if v}
            if found == want:
                break
        assert found == want, report
        assert keys[("public.items", "postgres", "extra")] == {-1, 5000}
        assert keys[("public.items", "postgres", "different")] == {600}
        assert keys[("public.items", "delta", "missing")] <= {7, *range(501, 751)}
        assert keys[("public.words", "delta", "missing")] == {"w31a"}
        code, out = verify(config, r"public\.(items|words)", "--repair", "--repair-timeout", "180",
                           "--lag-timeout", "30")
        assert out["repair"]["markers"], out["repair"]
    finally:
        work.close()
        running.close()
    assert work.writes > 100
    # healed: what still differs while the writes went on is lag (unsettled), never drift
    assert code == 0 or all(r["status"] == "unsettled" for t in out["after"]["tables"]
                            for r in t["differing"]), out
    wait_for_marker(config, pg_db)
    sync.catch_up()
    code, report = verify(config, r"public\.(items|words|pairs)")
    assert code == 0, report
    assert_mirrors_equal_source(config, pg_db, mirror_db, ["public.items", "public.words"])


def markers_of(config: Path, signal_id: str) -> list[str]:
    """The tables whose range-end marker of ``signal_id`` is in the change log."""
    from pydblog.changelog import open_reader

    reader = open_reader(load_config(config).log)
    try:
        out = []
        for rec in reader.read(0, 1_000_000):
            if rec.op == "n":
                body = orjson.loads(rec.body)
                note = body.get("notification") or {}
                if note.get("signal_id") == signal_id and (body.get("after") or {}).get("repair"):
                    out.append(f"{body['source']['schema']}.{body['source']['table']}")
        return out
    finally:
        reader.close()


def start_repair(config: Path) -> str:
    """`dblog snapshot --repair` of ``items`` and ``words`` (what ``damage`` damaged):
    the repair's signal id, once the signal is sent."""
    res = subprocess.run(
        [*DBLOG, "snapshot", "--config", str(config), "--repair", r"public\.(items|words)"],
        capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.split()[-1]


def assert_repair_ends(config: Path, signal_id: str) -> None:
    """The repair ``start_repair`` sent ends with a marker for each of its tables."""
    from pydblog.verifier.repair import wait_markers

    outcome = wait_markers(load_config(config), signal_id, 0, 120)
    assert set(outcome.markers) == {"public.items", "public.words"}, outcome


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.05, 0.2, 0.4])
def test_kill_9_during_a_repair(setup: tuple[Path, MiniSync], pg_db: str, mirror_db: str,
                                after_s: float) -> None:
    """`kill -9` of the capture while a repair reads its table, and a sync that starts
    over from the change log's start (its progress in the targets makes the replay a
    no-op): the repair still ends with its marker and the mirrors equal the source."""
    import time

    from deltalake import DeltaTable

    from tests.helpers import kill9

    config, sync = setup
    damage(mirror_db, tmp_lake(config))
    DeltaTable(str(tmp_lake(config) / "public" / "items")).delete("id > 1500 AND id <= 1600")
    running = SyncThread(sync)
    work = Workload(pg_db)
    try:
        signal_id = start_repair(config)
        time.sleep(after_s)
        kill9(PROCS[config])
        assert len(markers_of(config, signal_id)) < 2, "the repair ended before the kill"
        PROCS[config] = start_run(config)
        assert_repair_ends(config, signal_id)
    finally:
        work.close()
        running.close()
    wait_for_marker(config, pg_db)
    sync.catch_up()
    fresh = MiniSync(config)  # a sync whose checkpoint was lost: replays everything
    try:
        fresh.catch_up()
    finally:
        fresh.close()
    code, report = verify(config, r"public\.(items|words|pairs)")
    assert code == 0, report
    assert_mirrors_equal_source(config, pg_db, mirror_db, ["public.items", "public.words"])


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.0, 1.5])
def test_kill_9_of_the_sync_during_a_repair(setup: tuple[Path, MiniSync], pg_db: str,
                                            mirror_db: str, tmp_path: Path,
                                            after_s: float) -> None:
    """`kill -9` of `dblog sync` (a process, as users run it) while it applies a
    repair's range snapshots: the restarted sync applies every batch once (its progress
    is in each target's commit), the repair ends with its markers, and the mirrors equal
    the source."""
    import time

    from pydblog.devtools.proc import end_process
    from tests.helpers import kill9, wait_for

    config, _sync = setup
    damage(mirror_db, tmp_lake(config))
    log = tmp_path / "sync.log"

    def start_sync() -> subprocess.Popen[bytes]:
        with open(log, "ab") as err:
            return subprocess.Popen([*DBLOG, "sync", "--config", str(config)],
                                    stdout=subprocess.DEVNULL, stderr=err)

    proc = start_sync()
    try:
        signal_id = start_repair(config)
        wait_for(lambda: bool(markers_of(config, signal_id)), 120, "the repair's first marker")
        time.sleep(after_s)
        kill9(proc)
        assert_repair_ends(config, signal_id)
        proc = start_sync()
        wait_for_marker(config, pg_db)
        wait_for(lambda: verify(config, r"public\.(items|words|pairs)")[0] == 0, 240,
                 "the restarted sync to heal the mirrors")
    finally:
        end_process(proc, 60)
    assert_mirrors_equal_source(config, pg_db, mirror_db, ["public.items", "public.words"])


@pytest.mark.slow
def test_scheduled_verify_on_health_and_metrics(setup: tuple[Path, MiniSync], mirror_db: str) -> None:
    """`[verify] interval_minutes`: `dblog run` verifies in the background; /health's
    `verify` check and /metrics follow the mirrors."""
    from tests.helpers import wait_for
    from tests.integration.test_api import Api

    config, _ = setup
    stop_run(PROCS[config])
    (config.parent / "data" / "api.json").unlink(missing_ok=True)
    with config.open("a") as f:
        f.write('\n[verify]\ninterval_minutes = 0.05\ntables = ["public\\\\.items"]\nsink = "postgres"\n')
    PROCS[config] = start_run(config)
    api = Api(config)

    def check() -> dict[str, Any] | None:
        _, report = api.json("GET", "/health")
        return next((c for c in report["checks"] if c["name"] == "verify"), None)

    wait_for(lambda: (check() or {}).get("detail", "").startswith("every mirror"), 90, "a passing verify")
    assert api.metrics()["dblog_verify_ok"] == 1.0
    with psycopg.connect(mirror_db, autocommit=True) as conn:
        conn.execute("DELETE FROM mirror.items WHERE id = 42")
    wait_for(lambda: (check() or {}).get("ok") is False, 90, "a failing verify")
    assert "public.items -> postgres (1 ranges)" in (check() or {})["detail"]
    m = api.metrics()
    assert m["dblog_verify_ok"] == 0.0 and m["dblog_verify_differing_ranges"] == 1.0


@pytest.mark.slow
def test_post_repairs(setup: tuple[Path, MiniSync], pg_db: str, mirror_db: str) -> None:
    """`POST /repairs` with key ranges as `dblog verify --json` reports them."""
    from pydblog.verifier.repair import wait_markers
    from tests.integration.test_api import Api

    config, sync = setup
    stop_run(PROCS[config])
    (config.parent / "data" / "api.json").unlink(missing_ok=True)
    token = "a-test-token-of-some-length"
    with config.open("a") as f:
        f.write(f'token = "{token}"\n')  # (the file ends with its [api] table)
    PROCS[config] = start_run(config)
    api = Api(config)
    with psycopg.connect(mirror_db, autocommit=True) as conn:
        conn.execute("DELETE FROM mirror.items WHERE id = 42")
        conn.execute("INSERT INTO mirror.items (id, name) VALUES (7777, 'extra')")
    start = load_config(config)
    from pydblog.changelog import open_reader

    reader = open_reader(start.log)
    offset = reader.next_offset()
    reader.close()
    body = orjson.dumps({"ranges": {"public.items": [{"lo": None, "hi": [100]}, {"lo": [2000], "hi": None}]}})
    auth = {"Authorization": f"Bearer {token}"}
    code, answer = api.json("POST", "/repairs", body=body, headers=auth)
    assert code == 202, answer
    code, bad = api.json("POST", "/repairs", body=b'{"ranges": {"public.nope": []}}', headers=auth)
    assert code == 400 and "public.nope" in bad["error"]
    outcome = wait_markers(start, answer["id"], offset, 60)
    assert set(outcome.markers) == {"public.items"}
    wait_for_marker(config, pg_db)
    sync.catch_up()
    code, report = verify(config, r"public\.items", "--sink", "postgres")
    assert code == 0, report
