"""Where a MySQL/MariaDB capture resumes after a checkpoint: ``plan_resume`` decides
(IO-free: the checkpoint's position and what is known of the server in, a plan out);
``MySqlLogSource.open`` checks the plan against the server and starts its dump.

The rules are ``position.py``'s resume invariants:

- with a GTID state (the server has GTIDs and the checkpoint a non-empty state of its
  flavour): a GTID dump of every transaction after the state, in epoch ``p.epoch + 1``,
  dropping the already-logged part (index ``<= p.index``) of transaction ``p.gtid``
  only; MySQL may start reading at the checkpoint's coordinates when the checkpoint
  recorded the server its epoch's dump read (``dumpstart``), MariaDB never needs to;
- otherwise: a dump of ``p.file`` from ``p.pos`` (the start of ``p``'s transaction,
  never below 4, the first event after the file header) on the same server, in epoch
  ``p.epoch``, dropping every item at or below ``p``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydblog.sources.mysql import dumpstart
from pydblog.sources.mysql.dumpstart import DumpStart
from pydblog.sources.mysql.gtid import GtidState
from pydblog.sources.mysql.position import BinlogPosition

FIRST_EVENT = 4
"""The offset of a binlog file's first event (after its 4-byte magic number)."""


@dataclass(frozen=True)
class GtidResume:
    """Ask the server for every transaction after ``state``."""

    state: GtidState
    epoch: int
    """The epoch of every position yielded (one above the checkpoint's)."""
    skip_tx: Mapping[str, int]
    """GTID -> drop that transaction's items up to this index (its logged part)."""
    delivered: BinlogPosition | None
    """The checkpoint's position when nothing of it is read again (a checkpoint between
    transactions: the stream has delivered its state already); None otherwise."""
    start: DumpStart | None
    """Where a MySQL dump may start reading (``dumpstart``); None: the server finds it."""


@dataclass(frozen=True)
class FileResume:
    """Read ``file`` from ``offset`` on the server that wrote the checkpoint."""

    file: str
    offset: int
    epoch: int
    skip_upto: BinlogPosition
    """Drop every item at or below this position (already logged)."""
    state: GtidState | None
    """The GTID state at ``offset`` as far as the checkpoint knows it (an empty state);
    None: ask the server."""


def plan_resume(
    pos: BinlogPosition, state: GtidState | None, *, mariadb: bool, dump_record: Any
) -> GtidResume | FileResume:
    """Where to resume after ``pos``, the checkpoint's position. ``state``: its GTID
    state in the server's flavour, None where the server has no GTIDs; ``dump_record``:
    the checkpoint's record of the server its epoch's dump read (``DUMP_SERVER_KEY``)."""
    if state:
        start = None if mariadb else dumpstart.from_record(
            dump_record, pos.epoch, pos.file, pos.pos, pos.gtid
        )
        return GtidResume(
            state=state,
            epoch=pos.epoch + 1,
            skip_tx={pos.gtid: pos.index} if pos.gtid else {},
            delivered=None if pos.gtid else pos,
            start=start,
        )
    return FileResume(
        file=pos.file,
        offset=max(pos.pos, FIRST_EVENT),
        epoch=pos.epoch,
        skip_upto=pos,
        state=state,
    )
