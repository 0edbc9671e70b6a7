"""Leader election through ZooKeeper (kazoo), as DBLog does.

Layout under ``path``: ``leader/`` holds kazoo's fair lock (one ephemeral sequential
node per member; the lowest leads), ``epoch`` a counter.

Invariants:
- The epoch is incremented in one ZooKeeper transaction with a ``check`` that this
  member's lock node still exists: a member whose session expired before the increment
  cannot take an epoch, so epochs are handed out in leadership order.
- The lease is renewed by reading this member's own lock node (``exists``) every
  quarter of the session timeout: an answer proves the session, hence the leadership,
  was alive when the request was sent. Session loss (``LOST``) ends the lease at once;
  a ``SUSPENDED`` connection stops renewals, so the lease runs out within
  ``TTL_SHARE`` of the session timeout unless the connection comes back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from pydblog.errors import ConfigError, ElectionUnavailable
from pydblog.ha.lease import TTL_SHARE, DeadlineLease

log = logging.getLogger(__name__)


def _kazoo() -> Any:
    try:
        import kazoo.client
    except ImportError:
        raise ConfigError(
            '[ha] backend "zookeeper" needs the kazoo package',
            hint="pip install 'pydblog[ha]'",
        ) from None
    return kazoo.client


_ONCE = threading.Event()  # never set: "try to connect once"


class ZkElection:
    def __init__(self, hosts: str, path: str, session_timeout_s: float, member: str) -> None:
        kc = _kazoo()
        from kazoo.retry import KazooRetry

        self.hosts = hosts
        self.path = path.rstrip("/") or "/pydblog"
        self.member = member
        self.timeout = session_timeout_s
        self._client = kc.KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
            command_retry=KazooRetry(max_tries=3, delay=0.1, max_delay=1.0),
        )
        self._lock: Any = None
        self._lease: DeadlineLease | None = None
        self._renewer: threading.Thread | None = None
        self._started = False
        self._client.add_listener(self._on_state)

    # -- connection --------------------------------------------------------------
    def _start(self, stop: threading.Event) -> bool:
        """Connect, retrying until ``stop``; ``_ONCE``: one attempt."""
        if self._started:
            return True
        warned = False
        while not stop.is_set():
            try:
                self._client.start(timeout=max(2.0, self.timeout))
                self._started = True
                return True
            except Exception as exc:  # kazoo raises its own timeout type
                if not warned:
                    log.warning("ZooKeeper at %s unreachable (%s); retrying", self.hosts, exc)
                    warned = True
                self._client.stop()
                if stop is _ONCE:
                    return False
                stop.wait(1.0)
        return False

    def _on_state(self, state: str) -> None:
        lease = self._lease
        if lease is not None and state == "LOST":
            lease.lose("the ZooKeeper session expired")

    # -- election ----------------------------------------------------------------
    def campaign(self, stop: Any) -> DeadlineLease | None:
        if not self._start(stop):
            return None
        lock = self._lock = self._client.Lock(f"{self.path}/leader", self.member)
        done = threading.Event()

        def cancel_on_stop() -> None:
            while not done.is_set():
                if stop.wait(0.2):
                    lock.cancel()
                    if not self._client.connected:
                        # kazoo's calls wait for the connection to come back: end them
                        self._drop_session()
                    return

        watcher = threading.Thread(target=cancel_on_stop, name="dblog-ha-cancel", daemon=True)
        watcher.start()
        try:
            while not stop.is_set():
                try:
                    if lock.acquire(blocking=True):
                        break
                except Exception as exc:
                    if stop.is_set():
                        return None
                    log.warning("ZooKeeper election interrupted (%s); retrying", exc)
                    stop.wait(0.5)
            else:
                return None
            if stop.is_set():
                self._safe_release(lock)
                return None
            try:
                confirmed_at = time.monotonic()
                epoch = self._next_epoch(lock)
            except Exception as exc:
                self._safe_release(lock)
                raise ElectionUnavailable(f"could not take a new epoch in ZooKeeper: {exc}") from exc
        finally:
            done.set()
        node = f"{lock.path}/{lock.node}"
        lease = DeadlineLease(epoch, self.timeout * TTL_SHARE, "ZooKeeper",
                              lambda: self._safe_release(lock), confirmed_at)
        self._lease = lease
        self._renewer = threading.Thread(
            target=self._renew, args=(lease, node, self._client.client_id[0]),
            name="dblog-ha-renew", daemon=True,
        )
        self._renewer.start()
        return lease

    def _next_epoch(self, lock: Any) -> int:
        """Increment ``<path>/epoch`` in a transaction that checks our lock node exists."""
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        client = self._client
        epoch_path = f"{self.path}/epoch"
        node = f"{lock.path}/{lock.node}"
        for _ in range(100):
            try:
                data, stat = client.get(epoch_path)
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    client.create(epoch_path, b"0", makepath=True)
                continue
            epoch = int(data or b"0") + 1
            tx = client.transaction()
            tx.check(node, 0)
            tx.set_data(epoch_path, str(epoch).encode(), version=stat.version)
            results = tx.commit()
            errors = [r for r in results if isinstance(r, Exception)]
            if not errors:
                return epoch
            if any(isinstance(r, NoNodeError) for r in errors):
                raise ElectionUnavailable("this member's lock node vanished (session expired)")
            if not any(isinstance(r, BadVersionError) for r in errors):
                raise ElectionUnavailable(f"ZooKeeper refused the epoch update: {errors}")
        raise ElectionUnavailable("could not increment the epoch (too much contention)")

    def _renew(self, lease: DeadlineLease, node: str, session: int) -> None:
        interval = self.timeout / 4
        while not lease.lost:
            started = time.monotonic()
            try:
                stat = self._client.exists(node)
            except Exception:  # suspended or lost: no renewal; the deadline decides
                stat = None
            else:
                if stat is None:
                    lease.lose("this member's lock node is gone (session expired)")
                    return
                if stat.ephemeralOwner != session:
                    lease.lose("the ZooKeeper session changed")
                    return
                lease.renew(started)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))

    def _safe_release(self, lock: Any) -> None:
        if not self._client.connected:
            # a release would wait for the connection; dropping the session (it expires on
            # the server) releases the lock as surely, and shutdown does not hang
            self._drop_session()
            return
        try:
            lock.release()
        except Exception as exc:
            # ZooKeeper unreachable: if the session survives, its node would stay first
            # in line forever. Drop the session (it expires on the server within its
            # timeout, and the node with it); the next campaign starts a new one.
            log.warning("could not release the ZooKeeper lock (%s): dropping the session", exc)
            self._drop_session()

    def _drop_session(self) -> None:
        if self._started:
            try:
                self._client.stop()
            except Exception as exc:
                log.debug("stopping the ZooKeeper client failed: %s", exc)
            self._started = False

    def leader(self) -> str | None:
        if not self._started and not self._start(_ONCE):
            return None
        # async calls with a timeout: kazoo's plain calls wait for a lost connection
        path = f"{self.path}/leader"
        try:
            children = self._client.get_children_async(path).get(timeout=3)
            nodes = sorted((c for c in children if "__lock__" in c),
                           key=lambda c: c.rsplit("__lock__", 1)[1])
            if not nodes:
                return None
            data, _ = self._client.get_async(f"{path}/{nodes[0]}").get(timeout=3)
        except Exception:
            return None
        return bytes(data).decode() or None

    def close(self) -> None:
        lease = self._lease
        if lease is not None:
            lease.release()
        if self._started and not self._client.connected:
            self._drop_session()
        try:
            if self._started:
                self._client.stop()
            self._client.close()  # also after a dropped session: frees kazoo's sockets
        except Exception as exc:
            log.debug("closing the ZooKeeper client failed: %s", exc)
        self._started = False
