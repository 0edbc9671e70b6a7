"""Oracle comparisons for the sync tests: targets read back and normalized."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import psycopg
from deltalake import DeltaTable
from psycopg import sql

from pydblog.changelog.sqlite import SqliteChangeLogReader
from pydblog.deltaread import has_deletion_vectors, read_table
from pydblog.devtools.synth import key_json, materialize
from pydblog.ports import TableSchema
from pydblog.verify import norm

Table = dict[str, tuple[Any, ...]]


def latest_schemas(log_dir: str | Path) -> dict[str, TableSchema]:
    reader = SqliteChangeLogReader(log_dir)
    try:
        out: dict[str, TableSchema] = {}
        for _, s in reader.schemas():
            out[s.qualified] = s
        return out
    finally:
        reader.close()


def _row(schema: TableSchema, row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(norm(c.logical, row.get(c.name)) for c in schema.columns)


def _key(schema: TableSchema, row: dict[str, Any]) -> str:
    return key_json({k: row[k] for k in schema.key})


def oracle(log_dir: str | Path) -> dict[str, Table]:
    schemas = latest_schemas(log_dir)
    out: dict[str, Table] = {}
    for q, rows in materialize(log_dir).items():
        s = schemas[q]
        out[q] = {k: _row(s, r) for k, r in rows.items()}
    return out


def delta_table(root: str | Path, schema: TableSchema) -> Table:
    path = Path(root) / schema.schema / schema.table
    if not DeltaTable.is_deltatable(str(path)):
        return {}
    rows = read_table(DeltaTable(str(path))).to_pylist()
    return {_key(schema, r): _row(schema, r) for r in rows}


def spark_delta_table(spark: Any, root: str | Path, schema: TableSchema) -> Table:
    """The mirror read by Spark itself: the Delta table's live Parquet files (a table
    without deletion vectors, whose files hold exactly its rows)."""
    path = Path(root) / schema.schema / schema.table
    assert not has_deletion_vectors(DeltaTable(str(path))), path
    files = DeltaTable(str(path)).file_uris()
    if not files:
        return {}
    df = spark.read.option("mergeSchema", "true").parquet(*files)
    rows = [r.asDict() for r in df.collect()]
    return {_key(schema, r): _row(schema, r) for r in rows}


def pg_table(dsn: str, target_schema: str, schema: TableSchema) -> Table:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute(
            "SELECT to_regclass(%s)", (f'"{target_schema}"."{schema.table}"',)
        ).fetchone()
        if exists is None or exists[0] is None:
            return {}
        cur = conn.execute(
            sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(c.name) for c in schema.columns),
                sql.Identifier(target_schema, schema.table),
            )
        )
        names = [c.name for c in schema.columns]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return {_key(schema, r): _row(schema, r) for r in rows}


def assert_tables_equal(
    expected: Table, got: Table, what: str, columns: Sequence[str] = ()
) -> None:
    """``got`` (a mirror) equals ``expected`` (the source, i.e. the oracle); else the
    message names the missing, extra and differing keys and, per differing key (up to
    three), each column whose value differs, source against mirror (``columns``: the
    names of the tuples' fields)."""
    missing = expected.keys() - got.keys()
    extra = got.keys() - expected.keys()
    wrong = sorted(k for k in expected.keys() & got.keys() if expected[k] != got[k])
    if not missing and not extra and not wrong:
        return
    details = []
    for k in wrong[:3]:
        exp, have = expected[k], got[k]
        names = list(columns) if len(columns) == len(exp) else [f"#{i}" for i in range(len(exp))]
        cols = [f"{n}: source {e!r}, mirror {g!r}"
                for n, e, g in zip(names, exp, have, strict=False) if e != g]
        details.append(f"key {k}: " + "; ".join(cols))
    raise AssertionError(
        f"{what}: {len(missing)} missing (e.g. {sorted(missing)[:3]}), "
        f"{len(extra)} extra (e.g. {sorted(extra)[:3]}), {len(wrong)} differ"
        + (" (" + " | ".join(details) + ")" if details else "")
    )


def assert_mirrors(
    log_dir: str | Path,
    *,
    lake: str | Path | None = None,
    pg_dsn: str | None = None,
    pg_schema: str = "public",
    spark: Any = None,
    state: Callable[[], str] | None = None,
) -> dict[str, Table]:
    """Every mirror equals the oracle (the log materialized); ``state``: what a failure
    message adds (``sync_state``: the sinks' recorded offsets)."""
    expected = oracle(log_dir)
    schemas = latest_schemas(log_dir)

    def check(table: Table, got: Table, what: str, s: TableSchema) -> None:
        try:
            assert_tables_equal(table, got, what, [c.name for c in s.columns])
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{state()}" if state is not None else str(exc)) from None

    for q, table in expected.items():
        s = schemas[q]
        if lake is not None:
            check(table, delta_table(lake, s), f"delta {q}", s)
            if spark is not None:
                check(table, spark_delta_table(spark, lake, s), f"spark delta {q}", s)
        if pg_dsn is not None:
            check(table, pg_table(pg_dsn, pg_schema, s), f"postgres {q}", s)
    return expected


def history_offsets(path: str | Path) -> list[int]:
    t = DeltaTable(str(path)).to_pyarrow_table(columns=["offset"])
    return sorted(t["offset"].to_pylist())


def assert_offsets_once(offsets: Sequence[int], end: int, state: Callable[[], str] | None = None) -> None:
    """``offsets`` (sorted) are ``0..end-1``, each once; else the message names the
    offsets missing and those applied more than once (then ``state``)."""
    if list(offsets) == list(range(end)):
        return
    seen: dict[int, int] = {}
    for o in offsets:
        seen[o] = seen.get(o, 0) + 1
    missing = [o for o in range(end) if o not in seen]
    twice = sorted(o for o, n in seen.items() if n > 1)
    outside = sorted(o for o in seen if not 0 <= o < end)
    raise AssertionError(
        f"offsets 0..{end - 1}: {len(missing)} missing {_ranges(missing)}, "
        f"{len(twice)} more than once {_ranges(twice)}, {len(outside)} outside {outside[:10]}"
        + (f"\n{state()}" if state is not None else "")
    )


def _ranges(xs: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` as ``[1..3, 7]`` (at most 10 ranges)."""
    out: list[str] = []
    for x in xs:
        if out and out[-1].split("..")[-1] == str(x - 1):
            out[-1] = f"{out[-1].split('..')[0]}..{x}"
        else:
            out.append(str(x))
    return "[" + ", ".join(out[:10]) + (", ..." if len(out) > 10 else "") + "]"


def delta_txn_versions(path: str | Path, app_id: str) -> list[int]:
    """The application-transaction versions of ``app_id`` in the Delta table's commits,
    in commit order (from ``_delta_log``; no checkpoint files expected): a sink commits a
    batch once, so they strictly increase; one seen twice is a batch applied twice."""
    out: list[int] = []
    for f in sorted((Path(path) / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            txn = orjson.loads(line).get("txn") if line.strip() else None
            if txn is not None and txn.get("appId") == app_id:
                out.append(int(txn["version"]))
    return out


def assert_delta_batches_once(lake: str | Path, state: Callable[[], str] | None = None) -> None:
    """Every Delta mirror under ``lake`` and the history (``lake/_changes``) committed
    each batch at most once (``delta_txn_versions`` strictly increase)."""
    tables = [(p, "pydblog-sync") for p in sorted(Path(lake).glob("*/*"))
              if not p.parent.name.startswith("_") and (p / "_delta_log").is_dir()]
    tables.append((Path(lake) / "_changes", "pydblog-history"))
    for path, app in tables:
        versions = delta_txn_versions(path, app)
        again = sorted({b for a, b in itertools.pairwise(versions) if b <= a})
        assert not again, (
            f"{path}: batches committed more than once (or out of order): application "
            f"transaction versions {versions}" + (f"\n{state()}" if state is not None else ""))


def sync_state(
    *, lake: str | Path | None = None, history: str | Path | None = None,
    pg_dsn: str | None = None, pg_schema: str = "public", checkpoint: str | Path | None = None,
    logs: Sequence[Path] = (),
) -> str:
    """What the sinks recorded as applied (each Delta mirror's application transaction,
    the history's, the PostgreSQL progress rows), Spark's checkpoint (each batch's
    offsets, which batches it committed) and the jobs' batch log lines: for a failure
    message of an exactness test. Best effort: what cannot be read says why."""
    out: list[str] = []

    def attempt(what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # a diagnostic must not hide the failure it explains
            out.append(f"{what}: unreadable ({type(exc).__name__}: {exc})")

    def delta() -> None:
        assert lake is not None
        for path in sorted(Path(lake).glob("*/*")):
            if path.parent.name.startswith("_") or not path.is_dir() \
                    or not DeltaTable.is_deltatable(str(path)):
                continue
            dt = DeltaTable(str(path))
            out.append(f"delta {path.parent.name}.{path.name}: applied below "
                       f"{dt.transaction_version('pydblog-sync')} (table version {dt.version()})")

    def hist() -> None:
        assert history is not None
        if DeltaTable.is_deltatable(str(history)):
            dt = DeltaTable(str(history))
            out.append(f"history: applied below {dt.transaction_version('pydblog-history')} "
                       f"(table version {dt.version()})")

    def pg() -> None:
        assert pg_dsn is not None
        with psycopg.connect(pg_dsn) as conn:
            if conn.execute("SELECT to_regclass(%s)",
                            (f'"{pg_schema}".dblog_sync_progress',)).fetchone() == (None,):
                out.append("postgres: no progress table")
                return
            rows = conn.execute(sql.SQL(
                "SELECT part, nparts, applied_end, batch_id FROM {} ORDER BY nparts, part"
            ).format(sql.Identifier(pg_schema, "dblog_sync_progress"))).fetchall()
            out.append("postgres progress (part/nparts: applied below, by batch): " + ", ".join(
                f"{p}/{n}: {e} (batch {b})" for p, n, e, b in rows))

    def spark_cp() -> None:
        assert checkpoint is not None
        cp = Path(checkpoint)
        commits = sorted(int(f.name) for f in (cp / "commits").iterdir() if f.name.isdigit())
        for f in sorted((cp / "offsets").iterdir(), key=lambda f: int(f.name) if f.name.isdigit() else -1):
            if f.name.isdigit():
                lines = f.read_text().splitlines()
                out.append(f"spark batch {f.name} ({'committed' if int(f.name) in commits else 'NOT committed'}): "
                           f"{lines[-1]}")

    if lake is not None:
        attempt("delta", delta)
    if history is not None:
        attempt("history", hist)
    if pg_dsn is not None:
        attempt("postgres", pg)
    if checkpoint is not None:
        attempt("spark checkpoint", spark_cp)
    for log in logs:
        def job_log(log: Path = log) -> None:
            lines = [ln for ln in log.read_text(errors="replace").splitlines()
                     if " batch " in ln or "fault injection" in ln or "rror" in ln]
            out.append(f"{log.name}: " + ("\n  ".join(["", *lines[-40:]]) if lines else "(no batch lines)"))
        attempt(log.name, job_log)
    return "\n".join(out)


def merged_rows(where: str | Path | tuple[Any, str], table: str,
                cols: Sequence[str]) -> set[tuple[Any, ...]]:
    """The rows of a merged target, as tuples of ``cols``: ``where`` a Delta lake (a
    ``Path``: ``table`` is ``schema.table`` under it), a PostgreSQL DSN (``table``
    qualified by the sink's schema) or a MySQL/MariaDB ``(server, database)``; an
    absent table has no rows."""
    if isinstance(where, Path):
        path = where.joinpath(*table.split("."))
        if not DeltaTable.is_deltatable(str(path)):
            return set()
        return {tuple(r[c] for c in cols)
                for r in DeltaTable(str(path)).to_pyarrow_table(columns=list(cols)).to_pylist()}
    select = f"SELECT {', '.join(cols)} FROM {table}"
    if isinstance(where, str):
        with psycopg.connect(where) as conn:
            if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,):
                return set()
            return {tuple(r) for r in conn.execute(select).fetchall()}
    server, db = where
    if not server.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = "
                          f"'{db}' AND table_name = '{table}'"):
        return set()
    return {tuple(r) for r in server.execute(select, db)}
