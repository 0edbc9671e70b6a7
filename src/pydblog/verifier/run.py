"""The verification pass: every captured table against every mirror, range by range.

1. Ranges: the source table (PostgreSQL, MySQL or MariaDB) is read in key order,
   ``chunk_size`` rows per range, with no lock. Against a mirror in the same kind of
   database with comparable columns (``sql``), or a Delta mirror whose column types have
   a portable row hash (``spark``: Spark computes the mirror's side), each side computes
   the range's row count and hash sum itself; against any other mirror the rows are
   compared in Python (``rows``).
2. A range that differs is read again row by row on both sides, remembering the change
   log's end before the source read and the source position after it; once the capture
   has logged past that position and the mirror applied past it, the differing keys
   without an event in between are drift; the others are read again (``rounds`` times
   at most, then reported ``unsettled``, never as drift).

The result: for each (table, mirror), the ranges that differ, each with its missing,
extra and different keys.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import psycopg

from pydblog.config import Config, SinkConfig, redact_dsn
from pydblog.errors import ConfigError, DblogError
from pydblog.ports import ChangeLogReader, TableSchema
from pydblog.verifier.delta import DeltaMirror
from pydblog.verifier.pg import PgTable, open_conn, pg_applied
from pydblog.verifier.portable import portable
from pydblog.verifier.ranges import (
    Key,
    Range,
    Row,
    RowDiff,
    diff_distinct,
    diff_rows,
    is_keyless,
    sample,
)
from pydblog.verifier.settle import classify, touched, wait_capture, wait_mirror

log = logging.getLogger("pydblog.verify")


@dataclass
class RangeResult:
    range: Range
    status: str  # "drift" | "unsettled"
    diff: RowDiff
    unsettled: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            **self.range.to_json(),
            "status": self.status,
            "missing": len(self.diff.missing),
            "extra": len(self.diff.extra),
            "different": len(self.diff.different),
            "unsettled": self.unsettled,
            "sample": {
                "missing": sample(self.diff.missing),
                "extra": sample(self.diff.extra),
                "different": sample(self.diff.different),
            },
        }


@dataclass
class TableResult:
    table: str
    sink: str
    mode: str  # "sql" (checksums in both databases) | "spark" (PostgreSQL and Spark) | "rows"
    ranges: int = 0
    source_rows: int = 0
    seconds: float = 0.0
    suspects: int = 0  # ranges whose first comparison differed (read again row by row)
    differing: list[RangeResult] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.differing and self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "sink": self.sink,
            "mode": self.mode,
            "ok": self.ok,
            "ranges": self.ranges,
            "source_rows": self.source_rows,
            "suspects": self.suspects,
            "seconds": round(self.seconds, 3),
            "differing": [r.to_json() for r in self.differing],
            **({"error": self.error} if self.error else {}),
        }


@dataclass
class Report:
    tables: list[TableResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tables)

    @property
    def rows(self) -> int:
        return sum(t.source_rows for t in self.tables)

    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tables": [t.to_json() for t in self.tables],
            "rows": self.rows,
            "ranges": sum(t.ranges for t in self.tables),
            "differing_ranges": sum(len(t.differing) for t in self.tables),
            "seconds": round(self.seconds, 3),
            "rows_per_s": round(self.rows / self.seconds) if self.seconds > 0 else None,
        }


@dataclass(frozen=True)
class Options:
    chunk_size: int = 10_000
    rounds: int = 3
    lag_timeout_s: float = 60.0
    delta_spark: bool = False  # Delta mirrors checksummed through Spark (``dblog verify``)


if TYPE_CHECKING:  # the MySQL reader needs the mysql extra: imported where used
    from pydblog.verifier.mysql import MyTable

Source: TypeAlias = "PgTable | MyTable"
"""A source table (PostgreSQL or MySQL/MariaDB), read the same way on both kinds."""


# -- mirrors ------------------------------------------------------------------------------
class Mirror(Protocol):
    name: str
    kind: str

    def applied(self) -> int: ...

    def close(self) -> None: ...


def sink_names(sinks: Sequence[SinkConfig]) -> list[str]:
    """Each mirror sink's name for ``--sink``: its type (``delta``, ``postgres``), with
    ``#n`` (1-based, in config order) when several sinks share the type."""
    counts: dict[str, int] = {}
    for s in sinks:
        counts[s.type] = counts.get(s.type, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for s in sinks:
        seen[s.type] = seen.get(s.type, 0) + 1
        out.append(s.type if counts[s.type] == 1 else f"{s.type}#{seen[s.type]}")
    return out


class PgMirror:
    kind = "postgres"

    def __init__(self, cfg: SinkConfig, name: str) -> None:
        assert cfg.dsn is not None
        self.cfg = cfg
        self.name = name
        self.label = f"postgres:{redact_dsn(cfg.dsn)}"
        self.conn = open_conn(cfg.dsn, f"the {name} sink's dsn")

    def target(self, schema: TableSchema) -> tuple[str, str]:
        return (self.cfg.schema_ or schema.schema, schema.table)

    def table(self, schema: TableSchema) -> PgTable:
        tschema, tname = self.target(schema)
        return PgTable(self.conn, tschema, tname, schema)

    def applied(self) -> int:
        return pg_applied(self.conn, self.cfg.schema_ or "public", self.cfg.workers())

    def close(self) -> None:
        self.conn.close()


class MyMirror:
    """A ``mysql`` sink: its tables in the sink's database (``schema``, else the DSN's)."""

    kind = "mysql"

    def __init__(self, cfg: SinkConfig, name: str) -> None:
        from urllib.parse import unquote, urlsplit

        assert cfg.dsn is not None
        self.cfg = cfg
        self.name = name
        self.label = f"mysql:{redact_dsn(cfg.dsn)}"
        self.database = cfg.schema_ or unquote(urlsplit(cfg.dsn).path.lstrip("/"))
        from pydblog.verifier.mysql import open_mysql

        self.conn = open_mysql(cfg.dsn, self.database)

    def table(self, schema: TableSchema) -> MyTable:
        from pydblog.verifier.mysql import MyTable

        return MyTable(self.conn, self.database, schema.table, schema)

    def applied(self) -> int:
        from pydblog.verifier.mysql import mysql_applied

        return mysql_applied(self.conn, self.database, self.cfg.workers())

    def close(self) -> None:
        self.conn.close()


class DeltaRoot:
    kind = "delta"

    def __init__(self, cfg: SinkConfig, name: str, master: str = "local[*]") -> None:
        assert cfg.path is not None
        self.root = cfg.path
        self.name = name
        self.label = f"delta:{cfg.path}"
        self.master = master
        self._current: DeltaMirror | None = None
        self._spark: Any = None

    def spark(self) -> Any:
        """A Spark session of its own (UTC) for checksums, started on first use with the
        sync's master and jars."""
        if self._spark is None:
            from pydblog.spark.session import spark_session

            session = spark_session(self.master, s3=self.root.startswith("s3a://")).newSession()
            session.conf.set("spark.sql.session.timeZone", "UTC")
            self._spark = session
        return self._spark

    def table(self, schema: TableSchema) -> DeltaMirror:
        self._current = DeltaMirror(self.root, schema)
        return self._current

    def applied(self) -> int:
        return self._current.applied() if self._current is not None else 0

    def close(self) -> None:
        pass


AnyMirror = PgMirror | MyMirror | DeltaRoot


def open_mirrors(cfg: Config, only: str | None) -> list[AnyMirror]:
    sinks = cfg.sync.sinks
    names = sink_names(sinks)
    mirrors: list[AnyMirror] = []
    if only is not None and only not in names:
        raise ConfigError(
            f"no sink named {only!r} in [[sync.sinks]]",
            hint=f"the sinks are named {', '.join(names) or '(none)'}",
        )
    for s, name in zip(sinks, names, strict=True):
        if only is not None and name != only:
            continue
        if s.type == "history":
            continue  # an append-only history, not a mirror
        if s.type == "mysql":
            from pydblog.extras import needs_extra

            with needs_extra("mysql", "dblog verify of a mysql sink"):
                import pymysql  # noqa: F401
            mirrors.append(MyMirror(s, name))
        elif s.type == "delta":
            from pydblog.extras import needs_extra

            with needs_extra("spark", "dblog verify of a Delta sink"):
                import deltalake  # noqa: F401
            mirrors.append(DeltaRoot(s, name, cfg.sync.master))
        else:
            mirrors.append(PgMirror(s, name))
    if not mirrors:
        raise ConfigError(
            "no mirror to verify: [[sync.sinks]] has no delta, postgres or mysql sink",
            hint="add the sinks `dblog sync` writes to the configuration",
        )
    return mirrors


# -- tables -------------------------------------------------------------------------------
def captured_tables(cfg: Config, reader: ChangeLogReader, patterns: Sequence[str]) -> list[TableSchema]:
    """The latest schema of each table in the change log that the patterns (regexes on
    ``schema.table``, whole match) name, or of all of them."""
    try:
        regexes = [re.compile(p) for p in patterns]
    except re.error as exc:
        raise ConfigError(f"{exc.pattern!r} is not a regular expression: {exc}") from None
    latest: dict[str, TableSchema] = {}
    for _, s in reader.schemas():
        latest[s.qualified] = s
    own = {cfg.snapshot.signal_table, cfg.snapshot.watermark_table}
    matcher = cfg.source.table_matcher()
    out = []
    for q in sorted(latest):
        if q in own or not matcher(q):
            continue
        if regexes and not any(r.fullmatch(q) for r in regexes):
            continue
        out.append(latest[q])
    if patterns and not out:
        raise ConfigError(
            f"no captured table matches {', '.join(patterns)}",
            hint="the patterns are regular expressions on schema.table; `dblog status` lists the captured tables",
        )
    return out


# -- the pass -----------------------------------------------------------------------------
Progress = Callable[[int], None]


def _range(src: Source, index: int, lo: tuple[str, ...] | None, hi: tuple[str, ...] | None) -> Range:
    return Range(
        index, lo, hi,
        None if lo is None else src.key_of_text(lo),
        None if hi is None else src.key_of_text(hi),
    )


def _chunks(src: Source, size: int) -> Iterator[tuple[Range, list[tuple[Key, Row]]]]:
    """The source's ranges in key order, each with its rows (rows mode)."""
    lo: tuple[str, ...] | None = None
    i = 0
    while True:
        rows, last = src.rows(lo, None, size)
        hi = last if len(rows) == size else None
        yield _range(src, i, lo, hi), rows
        if hi is None:
            return
        lo, i = hi, i + 1


def suspects_sql(src: Source, dst: Source, size: int, res: TableResult,
                 advance: Progress) -> list[Range]:
    """Ranges whose count or hash sum differ, each side computed in its database (both
    PostgreSQL, or both MySQL/MariaDB)."""
    out = []
    if is_keyless(src.schema):
        n, h = src.checksum(None, None)
        res.ranges, res.source_rows = 1, n
        advance(n)
        return [] if (n, h) == dst.checksum(None, None) else [Range(0, None, None, None, None)]
    lo: tuple[str, ...] | None = None
    i = 0
    while True:
        n, h, last = src.next_chunk(lo, size)
        hi = last if n == size else None
        if (n, h) != dst.checksum(lo, hi):
            out.append(_range(src, i, lo, hi))
        res.ranges += 1
        res.source_rows += n
        advance(n)
        if hi is None:
            return out
        lo, i = hi, i + 1


def _spark_portable(src: Source) -> bool:
    """Whether the source table has a row hash Spark computes alike (``portable``)."""
    if isinstance(src, PgTable):
        return portable(src.schema)
    from pydblog.verifier.portable import my_portable

    return my_portable(src.schema, src.columns)


def suspects_spark(src: Source, table: DeltaMirror, root: DeltaRoot, size: int,
                   res: TableResult, advance: Progress) -> list[Range] | None:
    """Ranges whose count or hash sum differ, the source's computed in its database and
    the Delta mirror's by Spark (``portable``: the same canonical row text in both);
    None when the mirror's column types have no portable hash (then rows mode)."""
    from deltalake import DeltaTable

    from pydblog.verifier.delta import spark_checksums, spark_row_hash
    from pydblog.verifier.portable import my_hash, pg_hash

    if not DeltaTable.is_deltatable(table.path):
        return None
    mirror_hash = spark_row_hash(root.spark(), table.path, src.schema)
    if mirror_hash is None:
        return None
    h: Any = (pg_hash(src.schema, src.columns) if isinstance(src, PgTable)
              else my_hash(src.schema, src.columns))
    ranges: list[Range] = []
    sums: list[tuple[int, int]] = []
    lo: tuple[str, ...] | None = None
    while True:
        n, total, last = src.next_chunk(lo, size, h)
        hi = last if n == size else None
        ranges.append(_range(src, len(ranges), lo, hi))
        sums.append((n, total))
        advance(n)
        if hi is None:
            break
        lo = hi
    got = spark_checksums(root.spark(), table.path, src.schema, [r.hi for r in ranges],
                          mirror_hash)
    res.mode = "spark"
    res.ranges, res.source_rows = len(ranges), sum(n for n, _ in sums)
    return [r for r, want in zip(ranges, sums, strict=True) if got.get(r.index, (0, 0)) != want]


def suspects_rows(src: Source, mirror_rows: Callable[[Range, set[Key]], dict[Key, Row]],
                  all_mirror: Callable[[], dict[Key, Row]] | None, size: int,
                  res: TableResult, advance: Progress) -> list[Range]:
    """Ranges whose rows differ, compared in Python. With ``all_mirror`` (a mirror read
    whole), a mirror key the source has in no range is attributed at the end to the
    range that holds it by order."""
    out: list[Range] = []
    claimed: set[Key] = set()
    ranges: list[Range] = []
    for rng, rows in _chunks(src, size):
        source = dict(rows)
        got = mirror_rows(rng, set(source))
        if all_mirror is not None:
            got = {k: v for k, v in got.items() if k in source}  # extras: at the end
        claimed.update(got)
        if diff_rows(source, got):
            out.append(rng)
        ranges.append(rng)
        res.ranges += 1
        res.source_rows += len(rows)
        advance(len(rows))
    if all_mirror is not None:
        flagged = {r.index for r in out}
        for k in all_mirror():
            if k in claimed:
                continue
            rng = next((r for r in ranges if r.holds(k)), ranges[-1])
            if rng.index not in flagged:
                out.append(rng)
                flagged.add(rng.index)
        out.sort(key=lambda r: r.index)
    return out


Target = tuple[Range, set[Key] | None]
"""A range to read again: the whole range (``None``), or only these keys of it."""
Rows = dict[Key, Row] | list[Row]


def settle(
    src: Source,
    reader: ChangeLogReader,
    suspects: list[Range],
    read_mirror: Callable[[list[Target], dict[int, set[Key]]], dict[int, Rows]],
    applied: Callable[[], int],
    opts: Options,
) -> list[RangeResult]:
    """Read each suspect range again on both sides; its differing keys without a
    change-log event between the reads are drift, the others are read again (only those
    keys) until they settle or the rounds are spent (``unsettled``: never drift)."""
    schema = src.schema
    keyless = is_keyless(schema)
    ranges = {r.index: r for r in suspects}
    drift: dict[int, RowDiff] = {}
    unsettled: dict[int, int] = {}
    pending: list[Target] = [(r, None) for r in suspects]
    for _ in range(opts.rounds):
        if not pending:
            break
        o_start = reader.next_offset()
        source: dict[int, Rows] = {}
        for rng, keys in pending:
            rows = src.rows(rng.lo_text, rng.hi_text)[0] if keys is None else src.rows_by_keys(keys)
            source[rng.index] = [r for _, r in rows] if keyless else dict(rows)
        lsn = src.wal_lsn()
        o_l = wait_capture(reader, lsn, opts.lag_timeout_s)
        target = o_l if o_l is not None else reader.next_offset()
        a_before = wait_mirror(applied, reader, schema.qualified, target, opts.lag_timeout_s)
        keysets = {
            i: (set(rows) if isinstance(rows, dict) else set()) for i, rows in source.items()
        }
        mirror = read_mirror(pending, keysets)
        a_after = applied()
        moved = (
            touched(reader, schema, min(o_start, a_before), max(target, a_after))
            if o_l is not None
            else "unknown"
        )
        still: list[Target] = []
        for rng, keys in pending:
            s, m = source[rng.index], mirror[rng.index]
            if isinstance(s, dict) and isinstance(m, dict):
                d = diff_rows(s, m)
            else:
                d = diff_distinct(
                    s if isinstance(s, list) else list(s.values()),
                    m if isinstance(m, list) else list(m.values()),
                )
            if keys is not None:
                d = d.only(keys)
            sure, unsure = classify(sorted(d.keys(), key=repr), moved)
            if sure:
                drift[rng.index] = _merge(drift.get(rng.index), d.only(sure))
            unsettled[rng.index] = len(unsure)
            if unsure:
                still.append((rng, None if keyless else unsure))
        pending = still
    out = []
    for i in sorted(set(drift) | {i for i, n in unsettled.items() if n}):
        d = drift.get(i, RowDiff())
        out.append(RangeResult(ranges[i], "drift" if d else "unsettled", d, unsettled.get(i, 0)))
    return out


def _merge(a: RowDiff | None, b: RowDiff) -> RowDiff:
    if a is None:
        return b
    return RowDiff(
        a.missing + [k for k in b.missing if k not in set(a.missing)],
        a.extra + [k for k in b.extra if k not in set(a.extra)],
        a.different + [k for k in b.different if k not in set(a.different)],
    )


def source_table(cfg: Config, conn: Any, schema: TableSchema) -> Source:
    """The source's table of ``schema`` on ``conn`` (``open_source``)."""
    if cfg.source.type == "postgres":
        return PgTable(conn, schema.schema, schema.table, schema)
    from pydblog.verifier.mysql import MyTable

    return MyTable(conn, schema.schema, schema.table, schema)


def open_source(cfg: Config) -> Any:
    """A connection to the source database, for ``source_table``."""
    if cfg.source.type == "postgres":
        return open_conn(cfg.source.dsn, "[source] dsn")
    from pydblog.extras import needs_extra

    with needs_extra("mysql", "dblog verify of a MySQL or MariaDB source"):
        import pymysql  # noqa: F401
    from pydblog.verifier.mysql import open_mysql

    return open_mysql(cfg.source.dsn)


def _checksummed(src: Source, dst: Source) -> bool:
    """Whether both sides can checksum their ranges in their databases, comparably."""
    if isinstance(src, PgTable) and isinstance(dst, PgTable):
        return src.same_types(dst)
    if isinstance(src, PgTable) or isinstance(dst, PgTable):
        return False
    return src.comparable(dst)  # (both MySQL/MariaDB tables)


def _bounds(src: Source, dst: Source, rng: Range) -> tuple[Any, Any]:
    """``rng``'s bounds as ``dst``'s key text: the source's own text where both are one
    database kind, else ``dst``'s text of the normalized bounds (binary and time zone
    values print differently across kinds)."""
    if type(src) is type(dst):
        return rng.lo_text, rng.hi_text
    return dst.bound_text(rng.lo), dst.bound_text(rng.hi)


def verify_table(schema: TableSchema, src: Source, mirror: AnyMirror,
                 reader: ChangeLogReader, opts: Options, advance: Progress) -> TableResult:
    t0 = time.monotonic()
    if not src.exists:
        res = TableResult(schema.qualified, mirror.name, "-")
        res.error = "the source table does not exist (dropped since it was captured?)"
        return res
    keyless = is_keyless(schema)
    if isinstance(mirror, PgMirror | MyMirror):
        dst: Source = mirror.table(schema)
        mode = "sql" if _checksummed(src, dst) else "rows"
        res = TableResult(schema.qualified, mirror.name, mode)
        if mode == "sql":
            suspects = suspects_sql(src, dst, opts.chunk_size, res, advance)
        else:
            suspects = suspects_rows(
                src, lambda rng, _keys: dict(dst.rows(*_bounds(src, dst, rng))[0]), None,
                opts.chunk_size, res, advance,
            )

        def read_pg(targets: list[Target], _keys: dict[int, set[Key]]) -> dict[int, Rows]:
            out: dict[int, Rows] = {}
            for rng, keys in targets:
                rows = (dst.rows(*_bounds(src, dst, rng))[0] if keys is None
                        else dst.rows_by_keys(keys))
                out[rng.index] = [r for _, r in rows] if keyless else dict(rows)
            return out

        res.suspects = len(suspects)
        res.differing = settle(src, reader, suspects, read_pg, mirror.applied, opts)
    else:
        table = mirror.table(schema)
        res = TableResult(schema.qualified, mirror.name, "rows")
        checked = None
        if opts.delta_spark and not keyless and _spark_portable(src):
            checked = suspects_spark(src, table, mirror, opts.chunk_size, res, advance)
        if checked is not None:
            suspects = checked
        elif keyless:
            table.load()
            rows, _ = src.rows(None, None)
            res.ranges, res.source_rows = 1, len(rows)
            advance(len(rows))
            suspects = [] if not diff_distinct([r for _, r in rows], table.multiset) else [
                Range(0, None, None, None, None)]
        else:
            table.load()
            suspects = suspects_rows(src, table.range_rows, lambda: table.rows,
                                     opts.chunk_size, res, advance)

        def read_delta(targets: list[Target], keys: dict[int, set[Key]]) -> dict[int, Rows]:
            table.load()
            out: dict[int, Rows] = {}
            for rng, only in targets:
                if keyless:
                    out[rng.index] = list(table.multiset)
                elif only is None:
                    out[rng.index] = table.range_rows(rng, keys[rng.index])
                else:
                    out[rng.index] = {k: table.rows[k] for k in only if k in table.rows}
            return out

        res.suspects = len(suspects)
        res.differing = settle(src, reader, suspects, read_delta, table.applied, opts)
    res.seconds = time.monotonic() - t0
    return res


def run_verify(cfg: Config, patterns: Sequence[str], sink: str | None, opts: Options,
               on_start: Callable[[int], None] | None = None,
               advance: Progress | None = None,
               on_table: Callable[[str, str], None] | None = None) -> Report:
    """Verify every (table, mirror) pair; ``on_start`` gets the estimated row total,
    ``advance`` each range's source rows, ``on_table`` each pair as it starts."""
    from pydblog.changelog import open_reader

    t0 = time.monotonic()
    errors: tuple[type[BaseException], ...] = (psycopg.Error, *_mysql_errors())
    reader = open_reader(cfg.log)
    mirrors: list[AnyMirror] = []
    src_conn = None
    try:
        tables = captured_tables(cfg, reader, patterns)
        mirrors = open_mirrors(cfg, sink)
        src_conn = open_source(cfg)
        if on_start is not None:
            total = 0
            for s in tables:
                t = source_table(cfg, src_conn, s)
                total += t.estimate() * len(mirrors)
            on_start(total)
        report = Report()
        step = advance or (lambda _n: None)
        for s in tables:
            for m in mirrors:
                if on_table is not None:
                    on_table(s.qualified, m.name)
                try:
                    src = source_table(cfg, src_conn, s)
                    report.tables.append(verify_table(s, src, m, reader, opts, step))
                except errors as exc:
                    res = TableResult(s.qualified, m.name, "-")
                    res.error = " ".join(str(exc).split())
                    report.tables.append(res)
        report.seconds = time.monotonic() - t0
        return report
    except errors as exc:
        raise DblogError(f"verify failed: {' '.join(str(exc).split())}") from exc
    finally:
        for m in mirrors:
            m.close()
        if src_conn is not None:
            src_conn.close()
        reader.close()


def _mysql_errors() -> tuple[type[BaseException], ...]:
    try:
        import pymysql
    except ImportError:
        return ()
    return (pymysql.Error,)
