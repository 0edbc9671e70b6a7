"""What `dblog sync` and `dblog demo` print: pydblog's own lines by default.

Spark's driver JVM writes log4j lines, JVM warnings and class-data-sharing notes to
the process's stdout/stderr, and so do the Python workers it starts; py4j logs INFO
lines through Python's logging. By default (``configure(verbose=False, ...)``) the
JVM is started with its stdout and stderr going to a file (``spark.log`` in the log
directory: kept for diagnosis, named in errors), and py4j's logger is set to
WARNING. ``--verbose`` leaves everything as it was. Library use (tests, benchmarks)
that never calls ``configure`` keeps Spark's output.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

JVM_LOG = "spark.log"


@dataclass
class _Settings:
    verbose: bool = True
    jvm_log: Path | None = None


SETTINGS = _Settings()


def configure(verbose: bool, log_dir: Path | None) -> None:
    SETTINGS.verbose = verbose
    SETTINGS.jvm_log = None if verbose or log_dir is None else log_dir / JVM_LOG
    if not verbose:
        logging.getLogger("py4j").setLevel(logging.WARNING)


def jvm_log() -> Path | None:
    """Where the Spark JVM's output goes (None: the console)."""
    return SETTINGS.jvm_log


@contextlib.contextmanager
def jvm_output() -> Iterator[None]:
    """While the Spark JVM starts: file descriptors 1 and 2 point at the JVM log, so
    the JVM (and every process it starts) inherits the file, not the console.
    Python's own ``sys.stdout``/``sys.stderr`` objects are flushed around the switch."""
    path = SETTINGS.jvm_log
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as target:
        os.dup2(target.fileno(), 1)
        os.dup2(target.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
