"""A class-data-sharing (AppCDS) archive of the Spark driver JVM's classes.

A fresh driver JVM loads and verifies ~20k classes from Spark's jars, a good part of
them during the first query (data source lookup, streaming, planning, the first job).
Java 17 can archive the classes a run loaded when it exits
(``-XX:ArchiveClassesAtExit``) and map them at the next start
(``-XX:SharedArchiveFile``): 1.2-1.5 s less for a fresh query on the 2-core machine.

``driver_java_options`` returns the option for the session about to start:

- the archive of this exact Java and Spark (the name is a hash of the java binary,
  ``libjvm`` and every Spark jar: name, size, mtime) if there is one: it is used;
- otherwise ``-XX:ArchiveClassesAtExit`` with a temporary name in the cache directory:
  the JVM writes the archive when it exits (a ``kill -9`` writes none). The next
  session promotes it to the archive's name after a JVM has started with it under
  ``-Xshare:on`` (which fails on any mismatch) with the class path and module options
  the dumping JVM had (``record_dump_context``, saved next to it). A JVM writes the
  archive's header last, so a partial file never passes; a file that does not pass is
  removed once it is an hour old (it may still be being written before).

Nothing here can stop a session from starting: any error just means no archive
(``-Xshare:auto``, the JVM's default, ignores an archive it cannot use).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydblog.spark.pyexec import cache_dir

ENV_DISABLE = "DBLOG_SPARK_CDS"
"""``DBLOG_SPARK_CDS=0`` turns the archive off."""
STALE_S = 3600.0
UNUSED_S = 30 * 86400.0
"""Archives of other Java/Spark builds (an upgrade, another virtualenv) not used for
this long are removed: each is ~170 MB."""
_DYNAMIC_MAGIC = bytes.fromhex("a8ab0bf0")  # 0xf00baba8, little-endian


def cds_dir() -> Path:
    return cache_dir() / "cds"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    exe = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not exe or not os.path.isfile(exe):
        return None
    return Path(os.path.realpath(exe))


def fingerprint(java: Path, spark_home: str) -> str:
    """What the JVM checks an archive against, hashed: the Java build and the jars."""
    h = hashlib.sha256()
    libjvm = java.parent.parent / "lib" / "server" / "libjvm.so"
    for f in (java, libjvm):
        if f.exists():
            st = f.stat()
            h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    jars = Path(spark_home) / "jars"
    for jar in sorted(jars.glob("*.jar")):
        st = jar.stat()
        h.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _archive(spark_home: str) -> tuple[Path, Path] | None:
    java = _java()
    if java is None or not (Path(spark_home) / "jars").is_dir():
        return None
    return java, cds_dir() / f"spark-{fingerprint(java, spark_home)}.jsa"


def _validates(java: Path, candidate: Path, context: dict[str, Any]) -> bool:
    """Whether a JVM starts with ``candidate`` mapped (``-Xshare:on``: any mismatch or
    damage is an error) with the dumping JVM's class path and module options."""
    try:
        with candidate.open("rb") as f:
            if f.read(4) != _DYNAMIC_MAGIC:
                return False
        args = [a for a in context.get("jvm_args", []) if a.startswith("--add-")]
        cmd = [
            str(java),
            # a damaged archive crashes this JVM: no crash report or core file
            "-XX:ErrorFile=/dev/null",
            "-XX:-CreateCoredumpOnCrash",
            "-Xshare:on",
            f"-XX:SharedArchiveFile={candidate}",
            "-cp",
            str(context["classpath"]),
            *args,
            "-version",
        ]
        done = subprocess.run(
            cmd, capture_output=True, timeout=60, check=False, cwd=tempfile.gettempdir()
        )
    except (OSError, KeyError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _promote(java: Path, final: Path) -> bool:
    """Turn a finished dump of ``final``'s fingerprint into ``final``; remove dumps that
    failed. True if ``final`` exists afterwards."""
    now = time.time()
    for tmp in sorted(final.parent.glob(final.name + ".*.tmp")):
        ctx_file = tmp.with_suffix(".json")
        try:
            context = json.loads(ctx_file.read_text())
        except (OSError, ValueError):
            context = None
        try:
            age = now - tmp.stat().st_mtime
        except OSError:
            continue
        if context is not None and not final.exists() and _validates(java, tmp, context):
            with tmp.open("rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
            ctx_file.unlink(missing_ok=True)
        elif age > STALE_S or final.exists():
            tmp.unlink(missing_ok=True)
            ctx_file.unlink(missing_ok=True)
    # contexts whose JVM never wrote an archive (killed, still running for long)
    for ctx_file in final.parent.glob(final.name + ".*.json"):
        tmp = ctx_file.with_suffix(".tmp")
        try:
            if not tmp.exists() and now - ctx_file.stat().st_mtime > 7 * 86400:
                ctx_file.unlink()
        except OSError:
            pass
    return final.exists()


def _mark_used(archive: Path) -> None:
    """Its mtime says when it was last used (refreshed at most daily)."""
    try:
        if time.time() - archive.stat().st_mtime > 86400:
            os.utime(archive)
    except OSError:
        pass


def prune(directory: Path, keep: Path, now: float | None = None) -> list[Path]:
    """Remove the archives in ``directory`` other than ``keep`` that were not used for
    ``UNUSED_S``; returns them."""
    now = time.time() if now is None else now
    gone = []
    for other in directory.glob("spark-*.jsa"):
        try:
            if other != keep and now - other.stat().st_mtime > UNUSED_S:
                other.unlink()
                gone.append(other)
        except OSError:
            pass
    return gone


def driver_java_options(spark_home: str) -> tuple[str, Path | None]:
    """The driver JVM option for the archive and, when this session is to write one,
    the path ``record_dump_context`` needs. ``("", None)`` when disabled or unusable."""
    if os.environ.get(ENV_DISABLE, "1") == "0":
        return "", None
    try:
        found = _archive(spark_home)
        if found is None:
            return "", None
        java, final = found
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists() or _promote(java, final):
            _mark_used(final)
            prune(final.parent, keep=final)
            return f"-XX:SharedArchiveFile={final}", None
        if any(final.parent.glob(final.name + ".*.tmp")):
            return "", None  # another JVM's archive is being written or checked
        tmp = final.parent / f"{final.name}.{uuid.uuid4().hex[:12]}.tmp"
        return f"-XX:ArchiveClassesAtExit={tmp}", tmp
    except OSError:
        return "", None


def record_dump_context(spark: Any, tmp: Path) -> None:
    """Save the running driver JVM's class path and arguments next to the archive it
    will write at exit (``_promote`` starts a JVM with them to check the archive)."""
    try:
        jvm = spark.sparkContext._jvm
        runtime = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
        context = {
            "classpath": str(jvm.java.lang.System.getProperty("java.class.path")),
            "jvm_args": [str(a) for a in runtime.getInputArguments()],
        }
        tmp.with_suffix(".json").write_text(json.dumps(context))
    except Exception:  # best effort: without it the dump is never used
        pass
