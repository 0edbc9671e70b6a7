"""One root exception for pydblog; every error says whether a retry can help.

Errors raised to the CLI carry a message that names what was wrong and what to do;
the CLI prints that message (never a traceback) and exits with ``exit_code``.
"""

from __future__ import annotations


class DblogError(Exception):
    """Root of every pydblog error.

    ``retriable`` is True when the same operation may succeed later without a change
    of configuration (a server that is down, a slot held by a dying process).
    """

    retriable: bool = False
    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class ConfigError(DblogError):
    """The configuration file is missing, malformed or holds an invalid value."""

    exit_code = 2


class SourceError(DblogError):
    """The source database refused us or is not set up for capture (fatal)."""

    exit_code = 3


class SourceUnavailable(SourceError):
    """The source database cannot be reached right now (retriable)."""

    retriable = True
    exit_code = 4


class SlotInUse(SourceError):
    """The replication slot is held by another process."""

    retriable = True
    exit_code = 5


class ChangeLogError(DblogError):
    """The change log cannot be opened or written."""

    exit_code = 6


class ChangeLogUnavailable(ChangeLogError):
    """The change log's server (Kafka) cannot be reached or failed a commit right now
    (retriable: capture restarts from the change log's last checkpoint)."""

    retriable = True


class SignalError(DblogError):
    """A snapshot signal is invalid; it is rejected and capture goes on."""


class SinkError(DblogError):
    """A sink refused a batch (target down, type mismatch, constraint violation)."""

    retriable = True
    exit_code = 7


class LeadershipLost(DblogError):
    """This process is no longer (certainly) the elected leader: it stops capturing
    and goes back to standby (high availability, ``[ha]``)."""

    retriable = True
    exit_code = 8


class Fenced(LeadershipLost):
    """The change log was claimed by a leader with a newer epoch: this process's write
    (or acknowledgement) was refused."""


class ElectionUnavailable(DblogError):
    """The election backend (ZooKeeper, the lock's PostgreSQL) cannot be reached now."""

    retriable = True
    exit_code = 9
