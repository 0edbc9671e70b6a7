"""The IO-free DBLog core: signals, chunk windows and the snapshot state machine.

Nothing in this package does IO, reads a clock or starts a thread; the capture runner
feeds it stream items and the chunk reader's answers and logs what it returns.
"""

from pydblog.core.notices import Notice, NotificationType
from pydblog.core.requests import (
    BoundsRequest,
    ChunkRequest,
    KeyReadRequest,
    MarkRequest,
    Request,
    TableStartRequest,
)
from pydblog.core.signals import (
    AdditionalCondition,
    Signal,
    SignalType,
    match_tables,
    parse_signal,
    parse_signal_row,
)
from pydblog.core.sizing import CoreSettings
from pydblog.core.snapshot import SnapshotCore

__all__ = [
    "AdditionalCondition",
    "BoundsRequest",
    "ChunkRequest",
    "CoreSettings",
    "KeyReadRequest",
    "MarkRequest",
    "Notice",
    "NotificationType",
    "Request",
    "Signal",
    "SignalType",
    "SnapshotCore",
    "TableStartRequest",
    "match_tables",
    "parse_signal",
    "parse_signal_row",
]
