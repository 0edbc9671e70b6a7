"""The life of a ``dblog run`` with ``[ha]``: standby until elected, leader for one
term, back to standby when the term ends (lost, fenced, or the capture failed with a
retriable error), until stopped.

On ``SIGTERM`` the leader's capture flushes, acknowledges and closes; leadership is
released right after, so a standby takes over at once.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable

from pydblog.config import Config
from pydblog.errors import DblogError, LeadershipLost
from pydblog.ha import create_election
from pydblog.ha.members import MemberFile, default_member_name
from pydblog.ha.role import ROLE, RoleInfo
from pydblog.ports import Lease

log = logging.getLogger(__name__)

Capture = Callable[[Config, threading.Event, Lease], None]


def run_member(cfg: Config, stop: threading.Event, capture: Capture) -> None:
    assert cfg.ha is not None
    name = cfg.ha.name or default_member_name()
    election = create_election(cfg, name)
    _warm_up(cfg)
    ROLE.set(RoleInfo("standby", member=name, ha=True))
    members = MemberFile(cfg.log_dir, name).start()
    try:
        while not stop.is_set():
            leader = election.leader()
            ROLE.set(RoleInfo("standby", None, leader, name, True))
            log.info("standby %s: waiting for leadership (leader: %s)", name, leader or "none")
            members.write()
            lease = election.campaign(stop)
            if lease is None:
                break
            ROLE.set(RoleInfo("leader", lease.epoch, name, name, True))
            log.info("leader %s: elected with epoch %d, capturing", name, lease.epoch)
            members.write()
            try:
                capture(cfg, stop, lease)
            except DblogError as exc:
                if not exc.retriable:
                    raise
                log.warning("%s; stepping down to standby", exc.message)
                if not isinstance(exc, LeadershipLost):
                    stop.wait(1.0)  # let another member try before campaigning again
            finally:
                lease.release()
                ROLE.set(RoleInfo("standby", None, None, name, True))
                log.info("%s: leadership of epoch %d released", name, lease.epoch)
    finally:
        ROLE.set(RoleInfo("stopped", member=name, ha=True))
        members.close()
        election.close()


def _warm_up(cfg: Config) -> None:
    """Import the source's modules while standing by: on a loaded host that took 0.7-2 s,
    which a new leader would otherwise spend inside the failover."""
    importlib.import_module(f"pydblog.sources.{cfg.source.type}.factory")
    importlib.import_module("pydblog.capture.runner")
