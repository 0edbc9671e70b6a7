"""Apache Flink's ``debezium-json`` format as an outside consumer of pydblog's topics.

Flink SQL reads Debezium's JSON change events (``'format' = 'debezium-json'``) as a
changelog (+I, -U/+U, -D); no code of pydblog's is involved in what it makes of them, so
a table Flink materializes from a table's topic that equals the source shows the topic
reads as Debezium's. PyPI ``apache-flink`` (``FLINK_VERSION``) runs it in local mode on
the machine's Java 17; it pins its own pandas and pyarrow, so it lives in a venv of its
own (~850 MB):

- ``$PYDBLOG_FLINK_HOME`` if set;
- else ``flink-venv`` in ``devtools.cache.cache_root()`` (``$PYDBLOG_CACHE_DIR``, else
  ``/var/cache/pydblog`` as root, else ``~/.cache/pydblog``).

``python -m pydblog.devtools.flink install`` makes it (idempotent; ``.ci/run`` calls it).
``materialize`` runs one Flink job in that venv's Python: a ``filesystem`` table of the
messages' values in ``debezium-json``, with the table's primary key and
``table.exec.source.cdc-events-duplicate`` (Flink's setting for Debezium topics that
may hold an event twice: Flink then keeps the last row per key). An incremental snapshot,
pydblog's as Debezium's, needs it: a row updated before its chunk was read has its ``u``
event (with a ``before`` the consumer never had: Flink alone fails to take away a row it
does not hold) and then its chunk's ``r`` (a second insert of the key). The rows of the
changelog Flink emits are applied in order (+I and +U add a row, -U and -D take one
away). Timestamps are taken as Flink's
text of them (``CAST(... AS STRING)``): the rows its Python API returns hold
``datetime`` values cut to milliseconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydblog.devtools.cache import cache_root

FLINK_VERSION = "2.3.0"
KAFKA_CONNECTOR = "org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2"
"""Flink's Kafka SQL connector (one jar, its Kafka client shaded in), from Maven Central:
the newest there is built for Flink 2.2 and runs on 2.3 (``tests/flink``)."""


def home() -> Path:
    """Where the venv is kept (see the module docstring)."""
    env = os.environ.get("PYDBLOG_FLINK_HOME")
    if env:
        return Path(env)
    return cache_root() / "flink-venv"


def python() -> Path | None:
    """The venv's Python if Flink is installed there, else None."""
    exe = home() / "bin" / "python"
    if not exe.exists():
        return None
    ok = subprocess.run([str(exe), "-c", "import pyflink.table"], capture_output=True,
                        timeout=120, check=False)
    return exe if ok.returncode == 0 else None


def connector_jar() -> Path:
    """Where the Kafka SQL connector's jar is kept (beside the venv)."""
    _, artifact, version = KAFKA_CONNECTOR.split(":")
    return home().parent / f"{artifact}-{version}.jar"


def install() -> Path:
    """Make the venv (in a temporary directory beside it, renamed when complete: a
    half-made venv is never taken for one) and fetch the Kafka connector's jar (Maven);
    the venv's Python."""
    jar = connector_jar()
    if not jar.exists():
        jar.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=jar.parent) as fetched:
            subprocess.run(["mvn", "-q", "dependency:copy", f"-Dartifact={KAFKA_CONNECTOR}",
                            f"-DoutputDirectory={fetched}"], check=True)
            (Path(fetched) / jar.name).rename(jar)
    exe = python()
    if exe is not None:
        return exe
    target = home()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".flink-venv-", dir=target.parent))
    try:
        subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True)
        subprocess.run([str(tmp / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        f"apache-flink=={FLINK_VERSION}"], check=True)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    # The scripts of a venv name its directory: made elsewhere, they would point there.
    exe = target / "bin" / "python"
    subprocess.run([str(exe), "-m", "pip", "--version"], check=True, capture_output=True)
    return exe


_JOB = r'''
import base64, datetime, decimal, json, sys
from collections import Counter
from pyflink.common import RowKind
from pyflink.table import EnvironmentSettings, TableEnvironment

spec = json.loads(sys.argv[1])
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
conf = env.get_config()
conf.set("parallelism.default", "1")
conf.set("table.exec.source.cdc-events-duplicate", "true")
if spec.get("jars"):
    conf.set("pipeline.jars", ";".join(spec["jars"]))
cols = ", ".join(f"`{n}` {t}" for n, t in spec["columns"])
key = ", ".join(f"`{k}`" for k in spec["key"])
options = {"format": "debezium-json", "debezium-json.timestamp-format.standard": "ISO-8601",
           **spec["options"]}
with_ = ", ".join(f"'{k}' = '{v}'" for k, v in options.items())
env.execute_sql(f"CREATE TABLE src ({cols}, PRIMARY KEY ({key}) NOT ENFORCED) WITH ({with_})")


def plain(v):
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    return v


# Timestamps as Flink's own text: its Python rows keep milliseconds only.
stamps = [t.upper().startswith("TIMESTAMP") for _, t in spec["columns"]]
select = ", ".join(f"CAST(`{n}` AS STRING)" if s else f"`{n}`"
                   for (n, _), s in zip(spec["columns"], stamps))


def value(v, stamp):
    if stamp and v is not None:
        return datetime.datetime.fromisoformat(v).isoformat()
    return plain(v)


rows = Counter()
changes = 0
with env.execute_sql(f"SELECT {select} FROM src").collect() as results:
    for r in results:
        row = json.dumps([value(v, s) for v, s in zip(r, stamps)])
        changes += 1
        if r.get_row_kind() in (RowKind.INSERT, RowKind.UPDATE_AFTER):
            rows[row] += 1
        else:
            rows[row] -= 1
bad = [row for row, n in rows.items() if n < 0]
if bad:
    sys.exit(f"rows taken away that were not there: {bad[:5]}")
print(json.dumps({"changes": changes,
                  "rows": [json.loads(row) for row, n in rows.items() for _ in range(n)]}))
'''


def plain(value: Any) -> Any:
    """A source value as the job gives Flink's (decimals as text, times as ISO-8601)."""
    import base64
    import datetime
    import decimal

    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    return value


def materialize(messages: Path, columns: Sequence[tuple[str, str]], key: Sequence[str],
                options: dict[str, str] | None = None,
                timeout: float = 600) -> tuple[list[list[Any]], int]:
    """The table Flink's ``debezium-json`` makes of ``messages`` (a file of message
    values, one a line, or a directory of such files): its rows (values as ``plain``
    gives them) and the number of changelog rows Flink emitted. ``columns``: ``(name,
    Flink SQL type)``; ``key``: the primary key's columns. Raises ``RuntimeError`` with
    Flink's error if the job fails (an ``op`` it does not know, a value it cannot
    parse)."""
    return _run({"columns": list(columns), "key": list(key),
                 "options": {"connector": "filesystem", "path": messages.resolve().as_uri(),
                             **(options or {})}}, timeout)


def materialize_kafka(bootstrap: str, topic: str, columns: Sequence[tuple[str, str]],
                      key: Sequence[str], timeout: float = 600) -> tuple[list[list[Any]], int]:
    """``materialize`` reading ``topic`` from Kafka itself, from its start to its end as
    of the job's start (the partitions' latest offsets: a broker whose list-offsets
    answer is not the partition's end, as Tansu's, cuts the read short), read_committed,
    through Flink's Kafka SQL connector (``connector_jar``)."""
    jar = connector_jar()
    if not jar.exists():
        raise RuntimeError(f"Flink's Kafka connector is not installed at {jar}: "
                           "python -m pydblog.devtools.flink install")
    return _run({"columns": list(columns), "key": list(key), "jars": [jar.resolve().as_uri()],
                 "options": {"connector": "kafka", "topic": topic,
                             "properties.bootstrap.servers": bootstrap,
                             "properties.group.id": "pydblog-flink",
                             "properties.isolation.level": "read_committed",
                             "scan.startup.mode": "earliest-offset",
                             "scan.bounded.mode": "latest-offset"}}, timeout)


def _run(spec: dict[str, Any], timeout: float) -> tuple[list[list[Any]], int]:
    exe = python()
    if exe is None:
        raise RuntimeError(f"Flink is not installed in {home()}: "
                           "python -m pydblog.devtools.flink install")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK"))}
    proc = subprocess.run([str(exe), "-c", _JOB, json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the Flink job failed (exit {proc.returncode}): {proc.stderr[-6000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["rows"], int(out["changes"])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["install"]:
        print("usage: python -m pydblog.devtools.flink install", file=sys.stderr)
        return 2
    print(install())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
