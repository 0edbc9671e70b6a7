"""GTID states: where a server's binlog stands, in terms a failover target understands.

Two flavours, both immutable values with a text form that round-trips exactly:

- ``MariaGtidPos``: MariaDB's ``gtid_binlog_pos`` shape, one ``domain-server-seq`` per
  replication domain (``"0-1-57,1-2-9"``, sorted by domain). It is what
  ``@slave_connect_state`` takes: "send me every event group after these".
- ``MySqlGtidSet``: MySQL's executed GTID set, ``uuid:interval[:interval...]`` per source
  (``"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-57:60,…"``, uuids lower case and sorted,
  intervals inclusive, disjoint, non-adjacent and sorted). It is what COM_BINLOG_DUMP_GTID
  takes: "send me every transaction not in this set". Tagged GTIDs (MySQL 8.3+,
  ``uuid:tag:n``) are not supported and are rejected by ``parse``.

Invariants:
- ``parse_gtid_state(str(s)) == s`` for every non-empty state ``s`` (the empty text reads
  as MariaDB's empty state; the source converts it to its server's flavour); text in the
  server's own
  spelling (upper-case uuids, newlines after commas, unsorted or overlapping intervals)
  parses to the same normalised value.
- ``s.advance(g)`` is the state once transaction ``g`` (``"d-s-n"`` or ``"uuid:n"``) has
  been applied: it ``covers`` ``g``. MySQL: it is ``s`` plus ``g``, so ``>= s``. MariaDB
  keeps one GTID per domain, so advancing domain ``d`` replaces its entry: ``>= s`` for a
  GTID later in its domain, which is what the binlog gives (the order within a domain is
  the order the server applied them in).
- ``<=`` is a *partial* order ("everything in the left state is also in the right one";
  MariaDB: per domain, a sequence number not larger). Two states of unrelated domains or
  sources are incomparable. This order is used to check a state against a server (is it
  behind us? has it purged what we need?), never to order events: positions stay ordered
  by binlog coordinates (see ``position.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Interval = tuple[int, int]  # inclusive


@dataclass(frozen=True, slots=True)
class MariaGtidPos:
    """MariaDB: the last GTID of each replication domain, as ``(domain, server, seq)``
    sorted by domain, one per domain."""

    domains: tuple[tuple[int, int, int], ...] = ()

    flavour = "mariadb"

    @classmethod
    def parse(cls, text: str) -> MariaGtidPos:
        found: dict[int, tuple[int, int]] = {}
        for part in text.replace("\n", "").split(","):
            part = part.strip()
            if not part:
                continue
            d, s, n = _mariadb_gtid(part)
            if d in found and found[d][1] >= n:
                continue  # gtid_binlog_state lists one per (domain, server): keep the last
            found[d] = (s, n)
        return cls(tuple((d, s, n) for d, (s, n) in sorted(found.items())))

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{n}" for d, s, n in self.domains)

    def __bool__(self) -> bool:
        return bool(self.domains)

    def seq(self, domain: int) -> int | None:
        for d, _, n in self.domains:
            if d == domain:
                return n
        return None

    def advance(self, gtid: str) -> MariaGtidPos:
        d, s, n = _mariadb_gtid(gtid)
        rest = [x for x in self.domains if x[0] != d]
        rest.append((d, s, n))
        rest.sort()
        return MariaGtidPos(tuple(rest))

    def covers(self, gtid: str) -> bool:
        d, _, n = _mariadb_gtid(gtid)
        have = self.seq(d)
        return have is not None and have >= n

    def __le__(self, other: Any) -> bool:
        if not isinstance(other, MariaGtidPos):
            return NotImplemented
        for d, _, n in self.domains:
            theirs = other.seq(d)
            if theirs is None or theirs < n:
                return False
        return True

    def __ge__(self, other: Any) -> bool:
        if not isinstance(other, MariaGtidPos):
            return NotImplemented
        return other.__le__(self)

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, MariaGtidPos):
            return NotImplemented
        return self <= other and self != other

    def __gt__(self, other: Any) -> bool:
        if not isinstance(other, MariaGtidPos):
            return NotImplemented
        return other < self


def _mariadb_gtid(text: str) -> tuple[int, int, int]:
    parts = text.strip().split("-")
    if len(parts) != 3:
        raise ValueError(f"not a MariaDB GTID: {text!r} (expected domain-server-seq, e.g. 0-1-57)")
    try:
        d, s, n = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"not a MariaDB GTID: {text!r}") from None
    if min(d, s, n) < 0:
        raise ValueError(f"not a MariaDB GTID: {text!r}")
    return d, s, n


@dataclass(frozen=True, slots=True)
class MySqlGtidSet:
    """MySQL: a GTID set, ``(uuid, intervals)`` sorted by uuid, intervals normalised."""

    sources: tuple[tuple[str, tuple[Interval, ...]], ...] = ()

    flavour = "mysql"

    @classmethod
    def parse(cls, text: str) -> MySqlGtidSet:
        found: dict[str, list[Interval]] = {}
        for part in text.replace("\n", "").split(","):
            part = part.strip()
            if not part:
                continue
            uuid, *ranges = part.split(":")
            uuid = _uuid(uuid, part)
            if not ranges:
                raise ValueError(f"not a MySQL GTID set member: {part!r} (expected uuid:1-5)")
            for r in ranges:
                lo, _, hi = r.partition("-")
                try:
                    a, b = int(lo), int(hi) if hi else int(lo)
                except ValueError:
                    raise ValueError(
                        f"not a MySQL GTID set member: {part!r} (tagged GTIDs are not supported)"
                    ) from None
                if a < 1 or b < a:
                    raise ValueError(f"not a MySQL GTID interval: {r!r} in {part!r}")
                found.setdefault(uuid, []).append((a, b))
        return cls(tuple((u, _normalise(iv)) for u, iv in sorted(found.items())))

    def __str__(self) -> str:
        return ",".join(
            u + "".join(f":{a}" if a == b else f":{a}-{b}" for a, b in iv) for u, iv in self.sources
        )

    def __bool__(self) -> bool:
        return bool(self.sources)

    def intervals(self, uuid: str) -> tuple[Interval, ...]:
        for u, iv in self.sources:
            if u == uuid:
                return iv
        return ()

    def advance(self, gtid: str) -> MySqlGtidSet:
        uuid, n = _mysql_gtid(gtid)
        out = dict(self.sources)
        out[uuid] = _normalise([*out.get(uuid, ()), (n, n)])
        return MySqlGtidSet(tuple(sorted(out.items())))

    def covers(self, gtid: str) -> bool:
        uuid, n = _mysql_gtid(gtid)
        return any(a <= n <= b for a, b in self.intervals(uuid))

    def __le__(self, other: Any) -> bool:
        if not isinstance(other, MySqlGtidSet):
            return NotImplemented
        for uuid, iv in self.sources:
            theirs = other.intervals(uuid)
            for a, b in iv:
                if not any(c <= a and b <= d for c, d in theirs):
                    return False
        return True

    def __ge__(self, other: Any) -> bool:
        if not isinstance(other, MySqlGtidSet):
            return NotImplemented
        return other.__le__(self)

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, MySqlGtidSet):
            return NotImplemented
        return self <= other and self != other

    def __gt__(self, other: Any) -> bool:
        if not isinstance(other, MySqlGtidSet):
            return NotImplemented
        return other < self


def _uuid(text: str, part: str) -> str:
    u = text.strip().lower()
    hexdigits = u.replace("-", "")
    if len(u) != 36 or len(hexdigits) != 32 or any(c not in "0123456789abcdef" for c in hexdigits):
        raise ValueError(f"not a MySQL GTID set member: {part!r} (bad server uuid)")
    return u


def _mysql_gtid(text: str) -> tuple[str, int]:
    uuid, sep, n = text.strip().rpartition(":")
    if not sep:
        raise ValueError(f"not a MySQL GTID: {text!r} (expected uuid:n)")
    try:
        num = int(n)
    except ValueError:
        raise ValueError(f"not a MySQL GTID: {text!r}") from None
    if num < 1:
        raise ValueError(f"not a MySQL GTID: {text!r}")
    return _uuid(uuid, text), num


def _normalise(intervals: Any) -> tuple[Interval, ...]:
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


GtidState = MariaGtidPos | MySqlGtidSet


def parse_gtid_state(text: str) -> GtidState:
    """A state in either flavour, told apart by its syntax (MySQL members have a ``:``).
    An empty text is an empty MariaDB state."""
    return MySqlGtidSet.parse(text) if ":" in text else MariaGtidPos.parse(text)
