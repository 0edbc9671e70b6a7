"""The Spark session of ``dblog sync``, and a cold process's start-up around it.

Light to import (no pyarrow, pandas, numba, deltalake): ``dblog sync`` starts the
driver JVM from here first, while a background thread imports the rest of the job
(``preload``): the JVM's start (spark-submit, 2-3 s) and the job's Python imports
(1-2 s of CPU) overlapped instead of one after the other.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydblog.changelog import log_exists
from pydblog.console import jvm_output
from pydblog.errors import ChangeLogError, ConfigError
from pydblog.spark.cds import driver_java_options as cds_java_options
from pydblog.spark.cds import record_dump_context
from pydblog.spark.pyexec import worker_python

if TYPE_CHECKING:
    from pydblog.config import Config

log = logging.getLogger("pydblog.sync")

PRELOAD = (
    "pandas",  # what the session's start imports (pyspark.sql.pandas) comes first
    "pyarrow",
    "pydblog.spark.job",
    "pydblog.spark.sinks.delta",
    "pydblog.spark.sinks.postgres",
    "pydblog.spark.sinks.history",
    "delta.tables",
)
"""What ``preload`` imports: the job and what its first batch needs (the Delta Lake
Python API the sinks use; psycopg is imported only when the PostgreSQL sink is built)."""


def preload(modules: tuple[str, ...] = PRELOAD) -> threading.Thread:
    """Import ``modules`` in a background thread (best effort: an import that fails
    fails again, with its error, where it is needed). Imports are silent, so this can
    run while ``spark_session`` points the process's output at the JVM log. PySpark's
    SQL modules are imported first, in the caller: the session needs them at once, and
    two threads importing the same package's modules could meet in a circular import."""
    importlib.import_module("pyspark.sql")

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # e.g. an optional dependency not installed
                log.debug("preloading %s failed: %s", name, exc)

    thread = threading.Thread(target=run, name="dblog-preload", daemon=True)
    thread.start()
    return thread


def check_config(cfg: Config) -> None:
    """The sync's own checks of its config, before anything starts: a sink, and a log."""
    if not cfg.sync.sinks:
        raise ConfigError(
            "[sync] has no sinks",
            hint='add at least one [[sync.sinks]] with type = "delta", "postgres" or "history"',
        )
    for source in cfg.sync.effective_sources(cfg.log):
        if not log_exists(source.log):
            named = "" if not cfg.sync.sources else f" (source {source.name})"
            raise ChangeLogError(
                f"no change log at {source.log.path}{named}",
                hint="start `dblog run` first, or check [log] path in the config"
                + ("" if not cfg.sync.sources else " ([[sync.sources]] log)"),
            )


def delta_confs(s3: bool = False) -> dict[str, str]:
    """The Spark confs of Delta Lake (and, with ``s3``, of the S3A file system): the
    jars (``jars.sync_jars``: fetched by Maven on first use, cached), the session
    extension and catalog, and Delta's own small-batch settings (its log replay in as
    many tasks as a small cluster has cores instead of 50)."""
    from pydblog.spark.jars import sync_jars

    confs = {
        "spark.jars": ",".join(sync_jars(s3)),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.databricks.delta.snapshotPartitions": "2",
    }
    if s3:
        confs.update(s3_confs())
    return confs


def s3_confs() -> dict[str, str]:
    """S3A settings from the AWS environment: ``AWS_ENDPOINT_URL`` (an S3-compatible
    server: path-style access, plain HTTP allowed when the URL says ``http``),
    ``AWS_REGION``; credentials through the AWS SDK's default chain (the environment's
    ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, profiles, instance roles)."""
    confs = {"spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        confs["spark.hadoop.fs.s3a.endpoint"] = endpoint
        confs["spark.hadoop.fs.s3a.path.style.access"] = "true"
        confs["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            endpoint.startswith("https")).lower()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        confs["spark.hadoop.fs.s3a.endpoint.region"] = region
    return confs


CODEGEN_CACHE_ENTRIES = 1_000
"""Spark's cache of compiled generated code (``spark.sql.codegen.cache.maxEntries``,
100 by default). A Delta batch compiles ~45-70 classes (its queries' stages, Delta's
log replay, statistics and commit jobs), the same source text every batch: with 100
entries a batch's classes evicted the previous batch's and every batch compiled its
own again (43 compilations in a warm 500k-event batch); with room for them a running
job compiles none after its first batches."""


SESSION_TIME_ZONE = "UTC"
"""The sync's Spark session time zone, whatever the machine's, as the driver JVM's
(``UTC_OPTION``). Every value the sync moves is an instant or a zone-less value (its
Arrow conversions use UTC), so the zone changes no row."""


def spark_session(master: str, s3: bool = False) -> Any:
    """A SparkSession for the sync (reuses the active one, e.g. in tests)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    # Python workers must run this interpreter (the one that has pydblog installed);
    # in local mode through a launcher that spares them compiling pyspark's zip.
    os.environ.setdefault("PYSPARK_PYTHON", worker_python(master))
    builder = (
        SparkSession.builder.master(master)
        .appName("dblog-sync")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", os.environ.get("DBLOG_SPARK_DRIVER_MEMORY", "2g"))
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
        .config("spark.sql.session.timeZone", SESSION_TIME_ZONE)
    )
    for k, v in delta_confs(s3).items():
        builder = builder.config(k, v)
    # Builder confs reach spark-submit, which starts the driver JVM with them.
    java_options, dump = driver_java_options()
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    t0 = time.monotonic()
    with jvm_output():
        spark = builder.getOrCreate()
    log.info("Spark session started in %.2fs", time.monotonic() - t0)
    if dump is not None:
        record_dump_context(spark, dump)
    spark.sparkContext.setLogLevel("WARN")
    return spark


DRIVER_JAVA_OPTIONS_ENV = "DBLOG_SPARK_DRIVER_JAVA_OPTIONS"
DEFAULT_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
"""The driver JVM compiles with C1 only: on 2 busy cores C2's background compilation of
the first batches' code competes with the work itself (a fresh 1.15M-event drain:
10.8-11.6 s with C2, 9.2-9.6 s without; the second query of the session 7.3 s against
5.7-6.6 s; same-window A/B). C1 alone would size the code cache at 48 MiB, which a
running sync fills within a minute (Spark generates and compiles code for every
batch's plans): the JVM then stops compiling and every later batch runs interpreted
(a 5k events/s stream's batches took 10 s instead of 4.6). The cache keeps the size a
JVM with both compilers gets. ``DBLOG_SPARK_DRIVER_JAVA_OPTIONS`` replaces both."""


UTC_OPTION = "-Duser.timezone=UTC"
"""The driver JVM runs in UTC whatever the machine's zone (unless the options given in
``DBLOG_SPARK_DRIVER_JAVA_OPTIONS`` name a ``user.timezone``): Spark's Delta, in a JVM
whose zone is not UTC, reconstructs a table's whole state after every commit to verify
its incremental checksum (``allFilesInCrc.verificationMode.forceOnNonUTC.enabled``). On
a machine in Europe/Berlin a 1M-event drain into Delta ran 121 Spark jobs and 59,806-
64,129 events/s as a running job; with this option 103 jobs and 78,959, as on a UTC
machine. No value the sync moves depends on the zone (``SESSION_TIME_ZONE``)."""


def driver_java_options() -> tuple[str, Path | None]:
    """``spark.driver.extraJavaOptions`` for a new session: the class-data-sharing
    archive (``cds.py``), ``DEFAULT_DRIVER_JAVA_OPTIONS`` and ``UTC_OPTION``; and where
    the JVM will write an archive at exit, if it is to write one
    (``cds.record_dump_context``)."""
    cds_option, dump = cds_java_options(spark_home())
    extra = os.environ.get(DRIVER_JAVA_OPTIONS_ENV, DEFAULT_DRIVER_JAVA_OPTIONS)
    zone = "" if "-Duser.timezone=" in extra else UTC_OPTION
    return " ".join(o for o in (cds_option, extra, zone) if o), dump


def spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()
