"""Ending the processes tests start (``devtools.proc.end_process``, ``helpers.start_run``):
nothing left running, unreaped or open, whatever the process does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pydblog.devtools.proc import end_process
from pydblog.errors import ConfigError
from tests.helpers import STARTED, start_run, write_config

STUBBORN = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
           "print('ready', flush=True); sys.stderr.write('x' * 200000); sys.stderr.flush(); " \
           "time.sleep(60)"


def test_a_process_that_ignores_sigterm_and_fills_its_pipe_is_ended() -> None:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"  # SIGTERM ignored
    code, out, err = end_process(proc, timeout=1)
    assert code == -9 and out == b"" and len(err) > 0
    assert all(s is not None and s.closed for s in (proc.stdin, proc.stdout, proc.stderr))
    assert end_process(proc)[0] == -9  # again: nothing to do, no error


def test_a_group_is_ended_with_its_leader() -> None:
    """A process group (a Spark job and its JVM): a child left by the leader goes too."""
    child = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', " \
            "'import time; time.sleep(60)']); print(p.pid, flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    end_process(proc, kill=True, group=True)
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # reaped by init: gone within moments of its SIGKILL
            os.kill(grandchild, 0)
            time.sleep(0.05)


def test_a_failed_start_leaves_no_process_and_no_open_pipe(tmp_path: Path) -> None:
    """(The configuration error is raised by the test's own look at the configuration,
    while `dblog run` may still be starting: it is ended all the same.)"""
    config = write_config(tmp_path, "postgresql://u:p@127.0.0.1:1/x", extra="bogus_key = 1")
    with pytest.raises(ConfigError, match="bogus_key"):
        start_run(config)
    proc = STARTED[-1]
    assert proc.returncode is not None
    assert proc.stderr is not None and proc.stderr.closed
