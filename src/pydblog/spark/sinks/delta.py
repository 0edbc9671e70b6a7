"""Delta Lake mirror tables through Spark's own Delta (``io.delta:delta-spark``):
``<root>/<schema>/<table>``, one per source table, holding its current content. The
MERGE runs on the executors; the driver only plans it.

Exactly once: every data commit to a table carries the application transaction
``(APP_ID, end)`` where ``end`` is one past the batch's last offset, in the same atomic
Delta commit as the rows (Delta's idempotent writes: the session confs
``spark.databricks.delta.write.txnAppId``/``txnVersion`` for the MERGE, the writer
options ``txnAppId``/``txnVersion`` for an overwrite). Before applying, the sink reads
the table's transaction version ``w``: a batch with ``end <= w`` is skipped and only
events ``>= w`` are reduced and applied (a batch that straddles ``w`` only happens after
the Spark checkpoint was reset); Delta itself also refuses a second commit with a
version ``<= w``. A crash before the commit leaves nothing behind; after it, the replay
is a no-op.

One commit per table and batch: a MERGE (upserts and deletes of the reduced batch), or,
when the batch truncates the table, an overwrite with the rows after the truncate, or,
when every key of the table's reduced batch is new (``table_shapes``), an append, or,
when the table holds no more rows than the batch changes in it (``rewrites``), an
overwrite with the table's rows and the batch's net change joined in one pass.
Table creation and added columns are separate, idempotent commits before it. Up to
``parallelism`` tables are applied at once, each in a thread of its own with a Spark
session of its own (``SparkSession.newSession``: the transaction confs of a MERGE are
the session's, and sessions share the SparkContext, its cache and the executors); each
commit is itself spread over the executors.
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

import pyarrow as pa

from pydblog.errors import SinkError
from pydblog.ports import TableSchema
from pydblog.spark.plan import REDUCED_SCHEMA, SparkBatch, spark_schema, typed_fn
from pydblog.spark.repairs import SparkPurge, spark_purges, target_columns, target_deletes
from pydblog.spark.sinks.widen import widens
from pydblog.spark.typemap import arrow_schema

log = logging.getLogger(__name__)

T = TypeVar("T")
APP_ID = "pydblog-sync"
DEFAULT_SOURCE = "default"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
WATERMARKS_DIR = "_dblog_watermarks"
"""``<root>/_dblog_watermarks``: a Delta table of each source's progress time and the
merge's low watermark, rewritten after every batch's data commits."""


def app_id(base: str, source: str) -> str:
    """A source's application transaction id: ``base`` for the single-source sync's
    source (so its progress is honoured), ``base/<source>`` for any other."""
    return base if source == DEFAULT_SOURCE else f"{base}/{source}"


REWRITE_MIN_ROWS = 50_000
REWRITE_TARGET_RATIO = 1.0
"""A table's batch of at least ``REWRITE_MIN_ROWS`` net rows (keys changed) is applied
by rewriting the whole table when the table holds at most ``REWRITE_TARGET_RATIO`` times
as many rows (``rewrites``)."""


def _metadata(batch: SparkBatch) -> str:
    import json

    marks = batch.watermarks
    low = None if not marks or any(v is None for v in marks.values()) else min(
        v for v in marks.values() if v is not None)
    return json.dumps({"dblog": {"source": batch.source, "end": batch.end,
                                 "progress_ms": marks.get(batch.source), "low_ms": low,
                                 **({"cut_ms": batch.cut_ms} if batch.cut_ms is not None
                                    else {})}},
                      sort_keys=True)
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _delta_log(spark: Any, path: str) -> Any:
    jvm = spark._jvm
    return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)


def table_exists(spark: Any, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def txn_version(spark: Any, path: str, app_id: str) -> int | None:
    """The table's latest application transaction version of ``app_id`` (None: no
    table, or none recorded)."""
    if not table_exists(spark, path):
        return None
    jvm = spark._jvm
    snap = _delta_log(spark, path).update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
    # The version's checksum (``<version>.crc``, written by Spark's Delta after each
    # commit) lists the table's transactions: read there it costs a file read, through
    # the snapshot's state a state reconstruction (~1 s of Spark jobs per table and batch).
    listed = _checksum_transactions(snap)
    if listed is not None:
        versions = [v for a, v in listed if a == app_id]
        return max(versions) if versions else None
    found = snap.transactions().get(app_id)
    return int(found.get()) if found.isDefined() else None


def _checksum_transactions(snap: Any) -> list[tuple[str, int]] | None:
    """The ``(appId, version)`` transactions the snapshot's checksum lists (None: no
    checksum, one without them, or a Delta whose snapshot does not expose it)."""
    from py4j.protocol import Py4JError

    try:
        checksum = snap.checksumOpt()
        if not checksum.isDefined():
            return None
        listed = checksum.get().setTransactions()
        if not listed.isDefined():
            return None
        seq = listed.get()
        return [(str(t.appId()), int(t.version())) for t in (seq.apply(i) for i in range(seq.size()))]
    except Py4JError:
        return None


@contextmanager
def app_transaction(spark: Any, app_id: str, version: int) -> Iterator[None]:
    """Delta commits of ``spark``'s DML in this block carry ``(app_id, version)``."""
    spark.conf.set(TXN_APP_ID, app_id)
    spark.conf.set(TXN_VERSION, str(version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID)
        spark.conf.unset(TXN_VERSION)


def target_arrow_schema(spark: Any, path: str) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark.read.format("delta").load(path).schema, timezone="UTC")


DELETION_VECTORS = "delta.enableDeletionVectors"


def ensure_table(spark: Any, path: str, schema: pa.Schema,
                 deletion_vectors: bool = False, exists: bool | None = None) -> pa.Schema:
    """The table at ``path``, created with ``schema``'s columns, every one nullable (as
    a table made by its first write holds them: ``created_schema``), or evolved to hold
    its columns (with ``deletion_vectors``, created with them or switched to them);
    returns its (Arrow) schema. ``exists``: whether the caller just found the table
    (None: look)."""
    from delta.tables import DeltaTable

    if not (table_exists(spark, path) if exists is None else exists):
        builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(
            spark_schema(_nullable(schema)))
        if deletion_vectors:
            builder = builder.property(DELETION_VECTORS, "true")
        builder.execute()
    elif deletion_vectors and not uses_deletion_vectors(spark, path):
        spark.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES "
                  f"('{DELETION_VECTORS}' = 'true')")
    have = target_arrow_schema(spark, path)
    missing = [f for f in schema if f.name not in have.names]
    if missing:
        cols = ", ".join(
            f"{quote(f.name)} {spark_schema(pa.schema([f.with_nullable(True)]))[0].dataType.simpleString()}"
            for f in missing)
        spark.sql(f"ALTER TABLE delta.{quote(path)} ADD COLUMNS ({cols})")
        have = target_arrow_schema(spark, path)
    wider = {f.name: f.type for f in schema if f.name in have.names
             and widens(_sql_name(have.field(f.name).type), _sql_name(f.type))}
    if wider:
        _rewrite_wider(spark, path, have, wider)
        have = target_arrow_schema(spark, path)
    return have


def created_schema(schema: pa.Schema) -> pa.Schema:
    """The (Arrow) schema a table made with ``schema`` holds, as ``target_arrow_schema``
    reads it back: Spark's types, every column nullable (a table Delta makes by a write
    holds its columns so, and ``ensure_table`` makes them so too: a mirror's schema does
    not depend on which kind of commit created it)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return _nullable(to_arrow_schema(spark_schema(schema), timezone="UTC"))


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def uses_deletion_vectors(spark: Any, path: str) -> bool:
    """Whether the table's metadata turns deletion vectors on (a file read: the
    snapshot's metadata, no state reconstruction)."""
    jvm = spark._jvm
    snap = _delta_log(spark, path).update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
    found = snap.metadata().configuration().get(DELETION_VECTORS)
    return bool(found.isDefined() and str(found.get()).lower() == "true")


def _sql_name(t: pa.DataType) -> str:
    """An Arrow numeric type's SQL name (for ``widens``); other types' own names."""
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    return {pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "integer",
            pa.int64(): "bigint", pa.float32(): "real", pa.float64(): "double"}.get(t, str(t))


def _rewrite_wider(spark: Any, path: str, have: pa.Schema, wider: dict[str, pa.DataType]) -> None:
    """Rewrite the table with ``wider``'s columns cast to their wider types (one
    overwrite commit with the new schema; every value is kept, ``widen.widens``). No
    table feature is turned on, so every Delta reader still reads the table (Delta's
    own type widening needs a reader feature delta-rs lacks). Idempotent: a replay finds
    the types already wide."""
    from pyspark.sql import functions as F

    cols = [F.col(quote(n)).cast(spark_schema(pa.schema([pa.field(n, wider[n])]))[0].dataType)
            .alias(n) if n in wider else F.col(quote(n)) for n in have.names]
    log.warning("Delta table %s: widening %s (the table is rewritten once)", path,
                ", ".join(f"{n} to {t}" for n, t in wider.items()))
    (spark.read.format("delta").load(path).select(*cols).write.format("delta")
     .mode("overwrite").option("overwriteSchema", "true").save(path))


class DeltaSink:
    """Mirror tables under ``root`` (a local path or any URI Spark's Hadoop file systems
    take, ``s3a://bucket/prefix`` with the S3 jars)."""

    def __init__(self, root: str, parallelism: int = 2, deletion_vectors: bool = False) -> None:
        self.root = root
        self.deletion_vectors = deletion_vectors
        self.name = f"delta:{root}"
        self.parallelism = max(1, parallelism)
        self._pool: ThreadPoolExecutor | None = None
        self._sessions: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._owner: Any = None  # the session the pooled sessions were made from

    def _each(self, spark: Any, fn: Callable[[Any, str], T], tables: list[str]) -> dict[str, T]:
        """``fn(session, q)`` for every table, up to ``parallelism`` at once, each call
        with a session of its own (made from ``spark``, reused across batches); the
        first error is raised after every call ended."""
        if self.parallelism == 1 or len(tables) < 2:
            return {q: fn(spark, q) for q in tables}
        if self._owner is not spark:  # a new session (tests, a restarted job)
            self._sessions = queue.SimpleQueue()
            self._owner = spark
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.parallelism, thread_name_prefix="dblog-delta")

        def run(q: str) -> T:
            try:
                session = self._sessions.get_nowait()
            except queue.Empty:
                session = spark.newSession()
            try:
                return fn(session, q)
            finally:
                self._sessions.put(session)

        futures = {q: self._pool.submit(run, q) for q in tables}
        wait(futures.values())
        return {q: f.result() for q, f in futures.items()}

    def table_path(self, schema: str, table: str) -> str:
        if "://" in self.root:
            return f"{self.root.rstrip('/')}/{schema}/{table}"
        return os.path.join(self.root, schema, table)

    def apply(self, batch: SparkBatch) -> None:
        spark = batch.packed.sparkSession
        marked = {f"{m[1]}.{m[2]}" for m in batch.markers}

        def version(session: Any, q: str) -> int | None:
            schema_name, _, table = q.partition(".")
            try:
                return txn_version(session, self.table_path(schema_name, table),
                                   app_id(APP_ID, batch.source))
            except Exception as exc:
                raise SinkError(f"table {q}: {exc}") from exc

        done = self._each(spark, version, sorted(set(batch.tables) | marked))
        todo = sorted(q for q, w in done.items() if w is None or w < batch.end)
        if not todo:
            return
        since = {q: w for q in todo if (w := done[q]) is not None}
        # Tables already done take no part: a since beyond the batch drops their events.
        since.update({q: batch.end for q in done if q not in todo})
        cuts = batch.cuts(since)
        reduced = batch.reduced(since)
        try:
            purges = spark_purges(batch, since)  # repairs: spark/repairs.py
        except Exception as exc:
            raise SinkError(f"repairs: {_first_line(exc)}") from exc
        shapes = table_shapes(batch, batch.reduced_packed(since),
                              [q for q in todo if q not in cuts and q not in purges])
        fresh = {q for q, (new, _) in shapes.items() if new}
        parts = batch.scoped_truncates(since)
        for q in todo:  # inferred schemas: one job for all tables, before the threads
            if q in batch.tables:
                batch.schema_for(q)
        self._each(spark, lambda session, q: self._apply_table(
            batch, q, reduced, q in cuts, purges.get(q), q in fresh, session,
            [scope for _, scope in parts.get(q, ())], since,
            shapes[q][1] if q in shapes else None), todo)

    def write_watermarks(self, spark: Any, batch: SparkBatch) -> None:
        self.write_marks(spark, batch.watermarks, batch.source, batch.end, batch.cut_ms)

    def write_marks(self, spark: Any, marks: dict[str, int | None], source: str,
                    end: int | None, cut: int | None = None) -> None:
        """``<root>/_dblog_watermarks``: one row per source (its progress time, the low
        watermark, its applied end), overwritten after data commits (the job writes it
        at most every 10 s and when it stops: a Delta commit is not free), each time
        never below what the table held. Every data commit carries the batch's
        watermarks in its ``userMetadata``."""
        if not marks:
            return
        import datetime as dt

        path = (f"{self.root.rstrip('/')}/{WATERMARKS_DIR}" if "://" in self.root
                else os.path.join(self.root, WATERMARKS_DIR))
        try:
            have: dict[str, tuple[int | None, int | None, int | None, int | None]] = {}
            if table_exists(spark, path):
                for r in spark.read.format("delta").load(path).collect():
                    d = r.asDict()
                    have[r["source"]] = (r["progress_ms"], r["low_ms"], r["applied_end"],
                                         d.get("cut_ms"))
            low = None if any(v is None for v in marks.values()) else min(
                v for v in marks.values() if v is not None)

            def most(a: int | None, b: int | None) -> int | None:
                return b if a is None else a if b is None else max(a, b)

            rows = []
            for name in sorted(marks):
                old = have.get(name, (None, None, None, None))
                rows.append((name, most(old[0], marks[name]), most(old[1], low),
                             end if name == source and end is not None else old[2],
                             most(old[3], cut), dt.datetime.now(dt.UTC)))
            if {r[0]: r[1:5] for r in rows} == have:
                return  # nothing moved (a replayed batch, an idle source)
            df = spark.createDataFrame(rows, "source string, progress_ms long, low_ms long, "
                                             "applied_end long, cut_ms long, "
                                             "updated_at timestamp")
            df.write.format("delta").mode("overwrite").option("overwriteSchema", "true") \
                .save(path)
        except Exception as exc:
            raise SinkError(f"{WATERMARKS_DIR}: {_first_line(exc)}") from exc

    def _apply_table(self, batch: SparkBatch, qualified: str, reduced: Any, truncated: bool,
                     purge: SparkPurge | None = None, fresh: bool = False,
                     session: Any = None, parts: Sequence[dict[str, str]] = (),
                     since: Mapping[str, int] | None = None,
                     net_rows: int | None = None) -> None:
        """One table's net change in one MERGE (an overwrite after a truncate, an
        insert-only write when ``fresh``: ``table_shapes``, a whole-table rewrite when
        ``rewrites`` says so for its ``net_rows``, the reduced rows of the table in the
        batch; None: not a candidate) under the batch's ``txnAppId``/``txnVersion``. A repair's ``purge`` joins the same commit: the net
        change of its dropped keys becomes a delete, and the target keys it deletes are
        added to the MERGE's source as deletes. So do the target rows of the ``parts``
        (identities) of a merged target truncated in the batch, except the keys the
        batch writes again. DataFrames are built in the batch's session, the table's
        commands run in ``session`` (default: the batch's). ``reduced`` is
        ``batch.reduced(since)``; the MERGE source is read from its packed form where no
        row is rewritten or added."""
        from pyspark.sql import functions as F

        spark = batch.packed.sparkSession
        own = session or spark
        schema_name, _, table = qualified.partition(".")
        path = self.table_path(schema_name, table)
        ts = batch.tables.get(qualified)
        try:
            if ts is None and (purge is None or not table_exists(own, path)):
                return  # only markers, and no target to repair
            schema = batch.schema_for(qualified)
            if not schema.columns and not table_exists(own, path):
                # Only a truncate of a table with no schema and no target (dropped before
                # any row was logged): nothing to empty, nothing to create.
                return
            created = not table_exists(own, path)
            typed = arrow_schema(schema)
            # A table the batch creates and only inserts into is made by that append:
            # one commit (no empty version 0, no state of it computed before the write).
            made_by_append = (created and fresh and bool(schema.key) and not truncated
                              and purge is None and not parts)
            target = (created_schema(typed) if made_by_append else
                      ensure_table(own, path, typed, self.deletion_vectors, exists=not created))
            fields = [(target.field(n) if n in target.names else typed.field(n)).with_nullable(True)
                      for n in typed.names]
            any_json = [c.name for c in schema.columns
                        if c.logical.lower() == "json" or c.logical.lower().startswith("array")]
            out = pa.schema([*fields, pa.field("_dblog_op", pa.string()),
                             pa.field("_dblog_unchanged", pa.list_(pa.string()))])
            packed = batch.reduced_packed(since)
            rows = packed.where((packed["schema"] == schema_name) & (packed["table"] == table))
            if parts or purge is not None:  # rows are rewritten and added: unpacked
                rows = reduced.where((reduced["schema"] == schema_name)
                                     & (reduced["table"] == table))
            if parts:
                gone_parts = _part_deletes(spark, path, schema, rows, parts)
                if gone_parts:
                    rows = rows.unionByName(spark.createDataFrame(
                        [(schema_name, table, g, "d", batch.end - 1, g, [], 0, False)
                         for g in gone_parts], spark_schema(REDUCED_SCHEMA)))
            if purge is not None:
                if purge.dropped:
                    rows = rows.withColumn("op", F.when(F.col("key").isin(purge.dropped), F.lit("d"))
                                           .otherwise(F.col("op")))
                gone = [] if truncated else target_deletes(purge, schema, [
                    r.asDict() for r in spark.read.format("delta").load(path)
                    .select(*[quote(k) for k in target_columns(purge, schema)]).collect()])
                if gone:
                    extra = spark.createDataFrame(
                        [(schema_name, table, g, "d", batch.end - 1, g, [], 0, False) for g in gone],
                        spark_schema(REDUCED_SCHEMA))
                    rows = rows.unionByName(extra)
                elif ts is None:
                    # Only markers, nothing to delete: record the batch (an empty MERGE
                    # would commit nothing, and the table's version would not say it).
                    (spark.createDataFrame([], spark_schema(target)).write.format("delta")
                     .mode("append").option("userMetadata", _metadata(batch))
                     .option("txnAppId", app_id(APP_ID, batch.source))
                     .option("txnVersion", str(batch.end)).save(path))
                    return
            source = rows.mapInArrow(typed_fn(qualified, pa.schema(fields), any_json),
                                     spark_schema(out))
            app = app_id(APP_ID, batch.source)
            meta = _metadata(batch)
            if truncated:
                self._overwrite(spark, path, source, target, batch.end, app, meta=meta)
            elif fresh and schema.key and (batch.dense or created):
                # A table this batch created holds no row, so no key of the batch is in
                # it even when the log may have gaps: an append, as from a dense log.
                props = ({DELETION_VECTORS: "true"} if made_by_append and self.deletion_vectors
                         else {})
                self._overwrite(spark, path, source, target, batch.end, app, "append", meta,
                                props)
            else:
                own.conf.set(USER_METADATA, meta)
                try:
                    if fresh and schema.key:
                        self._insert(own, path, source, schema, batch.end, app)
                    elif (net_rows is not None and schema.key
                          and rewrites(own, path, net_rows)):
                        self._rewrite(own, path, source, schema,
                                      ts is not None and ts.unchanged, batch.end, app, target,
                                      meta)
                    else:
                        self._merge(own, path, source, schema, ts is not None and ts.unchanged,
                                    batch.end, app)
                finally:
                    own.conf.unset(USER_METADATA)
        except SinkError as exc:
            raise SinkError(f"table {qualified}: {exc.message}", hint=exc.hint) from exc
        except Exception as exc:
            if type(exc).__name__ in ("KeyboardInterrupt", "SystemExit"):
                raise
            raise SinkError(f"table {qualified} ({path}): {_first_line(exc)}") from exc

    @staticmethod
    def _overwrite(spark: Any, path: str, source: Any, target: pa.Schema, end: int,
                   app: str = APP_ID, mode: str = "overwrite", meta: str | None = None,
                   props: Mapping[str, str] | None = None) -> None:
        """Write the upserts of ``source`` as the table's content (``mode`` overwrite)
        or added to it (append), under ``(app, end)``, with ``meta`` as the commit's
        ``userMetadata``; a write that creates the table gives it the table properties
        ``props``."""
        from pyspark.sql import functions as F

        t_spark = spark_schema(target)
        have = set(source.columns)
        cols = [
            (F.col(quote(f.name)) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in t_spark.fields
        ]
        (source.where(F.col("_dblog_op") != "d").select(*cols)
         .write.format("delta").mode(mode).options(**({"userMetadata": meta} if meta else {}))
         .options(**(props or {}))
         .option("txnAppId", app).option("txnVersion", str(end)).save(path))

    @staticmethod
    def _insert(spark: Any, path: str, source: Any, schema: TableSchema, end: int,
                app: str = APP_ID) -> None:
        """The upserts of ``source`` in an insert-only MERGE (Delta reads the target's
        keys, rewrites no file): a row whose key the target holds is left as it is."""
        from delta.tables import DeltaTable

        predicate = key_match(schema)
        inserts: dict[str, Any] = {quote(c.name): f"s.{quote(c.name)}" for c in schema.columns}
        with app_transaction(spark, app, end):
            (DeltaTable.forPath(spark, path).alias("t")
             .merge(source.where("_dblog_op = 'u'").alias("s"), predicate)
             .whenNotMatchedInsert(values=inserts)
             .execute())

    @staticmethod
    def _rewrite(spark: Any, path: str, source: Any, schema: TableSchema, unchanged: bool,
                 end: int, app: str, target: pa.Schema, meta: str) -> None:
        """The MERGE of ``_merge`` done as one overwrite of the whole table under
        ``(app, end)``: the table's rows full-outer-joined with ``source`` on the key, a
        key the batch deletes left out, a key it upserts taking the row ``_merge`` would
        write (unchanged-TOAST columns kept from the table where it has the key, columns
        outside the schema kept as they are), every other row as it is. Same content as
        the MERGE; one pass over the table instead of the MERGE's two (finding the
        touched files, then rewriting them), for tables whose files the batch touches
        almost all of."""
        from pyspark.sql import functions as F

        here = "_dblog_in_target"
        table = spark.read.format("delta").load(path).withColumn(here, F.lit(True))
        joined = table.alias("t").join(source.alias("s"), F.expr(key_match(schema)), "full_outer")
        op = F.col("s._dblog_op")
        held = F.col(f"t.{here}").isNotNull()
        names = {c.name for c in schema.columns}
        cols = []
        for f in spark_schema(target).fields:
            tv, sv = F.col(f"t.{quote(f.name)}"), F.col(f"s.{quote(f.name)}")
            if f.name not in names:
                value = tv
            elif unchanged and f.name not in schema.key:
                value = F.when(op.isNull(), tv).when(
                    held & F.array_contains(F.col("s._dblog_unchanged"), f.name), tv
                ).otherwise(sv)
            else:
                value = F.when(op.isNull(), tv).otherwise(sv)
            cols.append(value.cast(f.dataType).alias(f.name))
        (joined.where(op.isNull() | (op == "u")).select(*cols)
         .write.format("delta").mode("overwrite").option("userMetadata", meta)
         .option("txnAppId", app).option("txnVersion", str(end)).save(path))

    @staticmethod
    def _merge(spark: Any, path: str, source: Any, schema: TableSchema, unchanged: bool,
               end: int, app: str = APP_ID) -> None:
        from delta.tables import DeltaTable

        key = schema.key or tuple(c.name for c in schema.columns)
        predicate = key_match(schema)
        names = [c.name for c in schema.columns]
        updates: dict[str, Any] = {}
        for n in names:
            if unchanged and n not in key:
                lit = "'" + n.replace("\\", "\\\\").replace("'", "\\'") + "'"
                updates[quote(n)] = (
                    f"CASE WHEN array_contains(s._dblog_unchanged, {lit}) "
                    f"THEN t.{quote(n)} ELSE s.{quote(n)} END"
                )
            else:
                updates[quote(n)] = f"s.{quote(n)}"
        inserts: dict[str, Any] = {quote(n): f"s.{quote(n)}" for n in names}
        with app_transaction(spark, app, end):
            (
                DeltaTable.forPath(spark, path).alias("t")
                .merge(source.alias("s"), predicate)
                .whenMatchedDelete("s._dblog_op = 'd'")
                .whenMatchedUpdate("s._dblog_op = 'u'", updates)
                .whenNotMatchedInsert("s._dblog_op = 'u'", inserts)
                .execute()
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._sessions = queue.SimpleQueue()
        self._owner = None


def key_match(schema: TableSchema) -> str:
    """The condition a target row ``t`` and a source row ``s`` of the same key meet: its
    primary key's columns equal (a nullable one null-safely), or, without a primary key,
    every column null-safely equal (the whole row is the identity)."""
    nullable = {c.name for c in schema.columns if c.nullable}
    key = schema.key or tuple(c.name for c in schema.columns)
    return " AND ".join(
        f"t.{quote(k)} <=> s.{quote(k)}" if k in nullable or not schema.key
        else f"t.{quote(k)} = s.{quote(k)}"
        for k in key)


def _part_deletes(spark: Any, path: str, schema: TableSchema, rows: Any,
                  parts: Sequence[dict[str, str]]) -> list[str]:
    """The key texts of the target rows of ``parts`` (identity column values) that the
    batch's own rows (``rows``, reduced) do not write again: a repair's target deletes
    (``target_deletes``) over the whole key space of those rows."""
    from pyspark.sql import functions as F

    from pydblog.core.repair import TargetDelete

    key = list(schema.key) or [c.name for c in schema.columns]
    cond: Any = None
    for part in parts:
        one: Any = None
        for c, v in part.items():
            eq = F.col(quote(c)) == F.lit(v)
            one = eq if one is None else one & eq
        cond = one if cond is None else cond | one
    target = [r.asDict() for r in spark.read.format("delta").load(path).where(cond)
              .select(*[quote(k) for k in key]).collect()]
    if not target:
        return []
    written = {r["key"] for r in rows.select("key").collect() if r["key"]}
    whole = SparkPurge(key, [TargetDelete(None, None, frozenset())], [], written)
    return target_deletes(whole, schema, target)


def rewrites(spark: Any, path: str, net_rows: int) -> bool:
    """Whether a table's batch of ``net_rows`` reduced rows is applied by rewriting the
    whole table (``DeltaSink._rewrite``) rather than by a MERGE: when the batch has at
    least ``REWRITE_MIN_ROWS`` of them and the table holds at most
    ``REWRITE_TARGET_RATIO`` times as many rows (``held_rows``), and the table has no
    change data feed (whose readers would see every row deleted and inserted again). A
    MERGE reads the table's key columns to find the files the batch touches, then
    rewrites those; when the batch changes about as many rows as the table holds, it
    touches almost every file, and one pass over the whole table costs less. Both write
    the same rows; where the table's state cannot be read this way, the MERGE."""
    from py4j.protocol import Py4JError

    if net_rows < REWRITE_MIN_ROWS:
        return False
    jvm = spark._jvm
    try:
        snap = _delta_log(spark, path).update(False, jvm.scala.Option.empty(),
                                              jvm.scala.Option.empty())
        cdf = snap.metadata().configuration().get("delta.enableChangeDataFeed")
        if cdf.isDefined() and str(cdf.get()).strip().lower() == "true":
            return False
        held = held_rows(spark, path, snap)
    except Py4JError as exc:
        log.debug("Delta table %s: no whole-table rewrite (%s)", path, _first_line(exc))
        return False
    return bool(held <= net_rows * REWRITE_TARGET_RATIO)


CHECKSUM_FILES_MAX = 100
"""Up to this many files, ``held_rows`` sums the checksum's file statistics (a few py4j
calls per file, ~1.5 ms; beyond it Delta's metadata-only count costs less)."""


def held_rows(spark: Any, path: str, snap: Any) -> int:
    """The rows the table holds at snapshot ``snap``: the sum of its files' record counts
    where the version's checksum lists its files (Spark's Delta does for small tables)
    with their statistics, else counted by Delta from the files' statistics (a
    metadata-only query, ~0.5 s of Spark jobs)."""
    checksum = snap.checksumOpt()
    if checksum.isDefined() and checksum.get().allFiles().isDefined():
        files = checksum.get().allFiles().get()
        if files.size() <= CHECKSUM_FILES_MAX:
            total = 0
            for i in range(files.size()):
                n = files.apply(i).numLogicalRecords()
                if not n.isDefined():
                    break
                total += int(n.get())
            else:
                return total
    return int(spark.read.format("delta").load(path).count())


def table_shapes(batch: SparkBatch, reduced: Any, candidates: list[str]) -> dict[str, tuple[bool, int]]:
    """Per table of ``candidates`` that is not a merged target: whether it is *fresh* and
    how many reduced rows it has (``reduced``: the batch's reduced rows, unpacked or
    packed); one Spark job for all. A table is fresh when every reduced key of it is
    ``fresh``: the key's first event applied by this batch is an insert (``c``) and the
    net row keeps nothing from the target. Such a table's batch is written insert-only,
    without a MERGE.

    Exact: the target holds the mirror of the table's events below the first event this
    batch applies to it (every earlier batch applied exactly once, the straddle of a
    replay cut at the table's transaction version). A source inserts a key only when it
    has no row of that key, so just before that insert the table had no row of the key,
    and neither has its mirror: the key's net row is new to the target, and a net delete
    deletes nothing there. A key deleted and inserted again within the batch, or a
    snapshot row (``r``, which may re-read a row the target holds), has a first event
    other than ``c``, which sends the whole table to the MERGE. The write carries the
    batch's ``txnAppId``/``txnVersion`` in its one commit, as a MERGE does: a replay
    skips it. A log whose offsets are dense (checked per batch) has no gap, so no event
    of a key can be missing before its insert: those batches are plain appends. A log
    that may have gaps (a compacted Kafka topic: a delete removed before it was read)
    gets an insert-only MERGE instead: a key the target holds after all is left as is
    rather than written twice. Targets that hold other sources' rows (merged), a repair's
    or a truncate's table and tables without a primary key always take the MERGE. A
    fresh table that the batch itself creates is appended to from any log: it holds no
    row, so no key can be written twice (a replay finds it created and its transaction
    recorded, or created and empty, and then takes the insert-only MERGE)."""
    from pyspark.sql import functions as F

    wanted = [q for q in candidates if q in batch.tables and q not in batch.merged]
    if not wanted:
        return {}
    count = F.sum("n") if "n" in reduced.columns else F.count(F.lit(1))
    rows = (reduced.groupBy("schema", "table")
            .agg(F.min(F.col("fresh").cast("int")).alias("fresh"), count.alias("n")).collect())
    return {q: (r["fresh"] == 1, int(r["n"])) for r in rows
            if (q := f"{r['schema']}.{r['table']}") in wanted}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
