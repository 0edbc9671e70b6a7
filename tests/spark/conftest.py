"""Spark tests: one SparkSession (local[2]) shared by the whole session."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/spark/" in str(item.fspath).replace(os.sep, "/"):
            # pyspark warns that it does not fully support pandas 3 (we do not use pandas).
            item.add_marker(pytest.mark.filterwarnings("ignore::FutureWarning"))
            item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))
        if "spark" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            # A test over its time limit is stopped by ending its worker process: the
            # default (SIGALRM) raises inside whatever py4j call is running, and the
            # shared session's gateway then answers each later call with an earlier
            # call's reply, failing every Spark test after it on that worker.
            item.add_marker(pytest.mark.timeout(method="thread"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pydblog.spark.pyexec import worker_python

    os.environ.setdefault("PYSPARK_PYTHON", worker_python("local[2]"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pyspark.sql import SparkSession

        from pydblog.spark.cds import record_dump_context
        from pydblog.spark.job import driver_java_options
        from pydblog.spark.session import CODEGEN_CACHE_ENTRIES, delta_confs
        from pydblog.spark.source import DblogDataSource

        java_options, dump = driver_java_options()
        builder = SparkSession.builder
        for k, v in delta_confs().items():
            builder = builder.config(k, v)
        session = (
            builder.master("local[2]")
            .config("spark.driver.extraJavaOptions", java_options)
            .appName("pydblog-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.driver.memory", "1g")
            .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
            .getOrCreate()
        )
    if dump is not None:
        record_dump_context(session, dump)
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(DblogDataSource)
    try:
        yield session
    finally:
        session.stop()
