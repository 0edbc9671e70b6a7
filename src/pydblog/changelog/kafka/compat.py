"""The one seam for Kafka-protocol brokers that are weaker than Apache Kafka (Tansu 0.6,
docs/kafka.md "Brokers other than Apache Kafka"). Nothing here changes what a read or a
commit does on Apache Kafka: a broker that answers a fetch as soon as it has records
never reaches a storage stall, and its reads keep the shortest fetch wait.

What the rest of the Kafka change log does without help from here, on every broker (so
it is no workaround): readers never rely on the broker's transaction filtering (the
commit protocol, ``protocol``, decides which records count); the writer checks its
delivery reports against the partitions (``writer.KafkaChangeLog._copies``: exactly once
does not rest on the broker's idempotent-producer deduplication); end offsets come from
delivery reports and fetches, not list-offsets answers; a read held by an open
transaction waits for it (``client.Client._stalled``).

What is here:

- **Fetch waits** (``FetchWaits``): a broker that answers a fetch with only what it
  gathered within the fetch's wait, and with nothing for good when its storage is slower
  than the wait (Tansu on S3 after a restart), gets the next longer wait
  (``FETCH_WAITS_MS``) once a read has had nothing for a while although the partition
  has records past its position; the first step is kept for the process and the broker
  (``_LEARNED_WAITS``). Bulk reads start at ``BULK_FETCH_WAIT_MS``.
- **Topic metadata** (``topic_partitions``): all topics are listed, never one by name: a
  metadata request naming a topic creates it on some brokers (Tansu).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

FETCH_WAITS_MS = (5, 100, 500, 2000, 5000)
"""A read that gets nothing for ``client.STALL_S`` although the partition has records
past its position reads on with the next of these fetch waits (``client.Client.
_storage_stall``); a bounded read (every partition's end known) that got no record at
all since it began gives up the shortest wait after ``FIRST_STALL_S`` already (the
storage stall answers a read's first fetch with nothing, for good; a broker that is
merely slow rarely takes that long for a first fetch: up to ~1.1 s seen at a load of 9
on 2 cores). The first step is kept for the process and the broker
(``_LEARNED_WAITS``), and only the time spent waiting for the broker counts: not the
time the read's caller held it (a ``dblog sync`` reader waiting for the decode to catch
up)."""
FIRST_STALL_S = 1.0
_LEARNED_WAITS: dict[str, int] = {}
"""The fetch wait each broker (bootstrap servers) is read with in this process, once a
read found the shortest too short (every reader thread and Spark task makes its own
client: each paid the stall again before). Only the first step is shared
(``FETCH_WAITS_MS[1]``): a client that needs longer waits steps on by itself, so that
one slow spell of the broker's storage does not leave every later read of the process
waiting seconds per fetch (Tansu answers a fetch with no records only after its whole
wait: the end of every read)."""
_LEARNED_LOCK = threading.Lock()
BULK_FETCH_WAIT_MS = 100
"""The fetch wait of a client made for bulk reads (``Client(bulk=True)``: a ``dblog
sync`` task reading committed ranges, every record of which the broker holds). A fetch
wait only delays a fetch that finds no records, so with a broker that answers as soon as
it has records (Apache Kafka) it costs nothing here. A broker that answers a fetch with
only what it gathered within the wait (Tansu 0.6, ~5-7 ms of its CPU per fetch of a
large partition) is asked far fewer times: with 5 ms most fetches of a 333k-record
partition came back with nothing or one record batch."""


class FetchWaits:
    """One client's fetch wait: ``FETCH_WAITS_MS[0]`` (``BULK_FETCH_WAIT_MS`` for a bulk
    client) until a read of this client steps it up, or a read of the process learned a
    longer one for the same broker. Invariant: ``current`` never goes down."""

    def __init__(self, servers: str, bulk: bool = False) -> None:
        self.servers = servers
        self.base = BULK_FETCH_WAIT_MS if bulk else FETCH_WAITS_MS[0]
        self.own = 0  # a longer wait this client stepped to (``step``)

    @property
    def current(self) -> int:
        """The fetch wait a new consumer gets."""
        return max(self.own, self.base, _LEARNED_WAITS.get(self.servers, FETCH_WAITS_MS[0]))

    def first_stall_s(self, bounded: bool, consumer_wait: int, stall_s: float) -> float:
        """How long a read that got no record yet reads nothing before it looks for a
        stall: ``FIRST_STALL_S`` for a bounded read with the shortest wait, else
        ``stall_s``."""
        return FIRST_STALL_S if bounded and consumer_wait == FETCH_WAITS_MS[0] else stall_s

    def next_wait(self, consumer_wait: int) -> int:
        """The wait a stalled read of a consumer made with ``consumer_wait`` reads on
        with: one learned meanwhile, else the next step (0: none left)."""
        learned = self.current
        if learned > consumer_wait:
            return learned
        longer = [w for w in FETCH_WAITS_MS if w > consumer_wait]
        return longer[0] if longer else 0

    def step(self, wait: int, consumer_wait: int, stuck: Sequence[Any]) -> None:
        """Take ``wait`` (``next_wait``) for a read that got nothing from ``stuck``
        although they have records: said once per step, and the first step shared
        with the process's other clients of the broker."""
        if wait <= self.current:
            return
        log.warning("Kafka at %s sends no records of %s although it has some (a fetch wait "
                    "of %d ms is too short for its storage): reading with %d ms",
                    self.servers, sorted(stuck)[:3], consumer_wait, wait)
        self.own = wait
        with _LEARNED_LOCK:
            _LEARNED_WAITS[self.servers] = max(min(wait, FETCH_WAITS_MS[1]),
                                               _LEARNED_WAITS.get(self.servers, 0))


def topic_partitions(admin: Any, timeout: float) -> dict[str, int]:
    """Every topic's partition count, from one metadata request for all topics: asking
    for a topic by name makes some brokers (Tansu) create it."""
    md = admin.list_topics(timeout=timeout)
    return {name: len(t.partitions) for name, t in md.topics.items()
            if t.error is None and t.partitions}
