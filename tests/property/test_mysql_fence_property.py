"""Read-only snapshots on MySQL/MariaDB: the GTID fences (``sources.mysql.fences``) under
random interleavings of transactions around the reads, through the real snapshot core.

A model server commits each transaction in steps, interleaved at random with each other,
with the chunk reads' steps and with the binlog stream:

- MySQL: begin (row locks on its keys, held until the engine commit); binlog write (the
  GTID is assigned and *owned*; the stream may deliver the transaction from now on);
  engine commit (its rows become visible), in any order among written transactions;
  the GTID update (owned -> ``gtid_executed``), any time after the engine commit. A
  chunk read is four steps: read ``gtid_executed`` (low), create the read view, read
  ``gtid_owned``, read ``gtid_executed`` (high = their union).
- MariaDB (GTIDs in two domains): begin; binlog write (the domain's next sequence
  number; ``gtid_binlog_pos`` moves here); engine commit strictly in binlog order. A
  chunk read is: read ``gtid_binlog_pos`` (low), read the binlog's end E, take the
  snapshot (its binlog position P is the committed prefix) and read ``gtid_binlog_pos``
  again (high); if P < E the reads start over, and after three tries low is empty.

Transactions of another table (nothing captured, only GTIDs) are mixed in. The core
gets the stream's events, ``on_progress`` at each commit (and at idle moments), and the
fences the reader builds with ``GtidFence``. Checked: every fence's claims against the
model at read time (low only holds visible transactions; every visible one is in high),
the materialized log equals the server's table, and per key no log entry is older than
one before it (a snapshot row may only repeat the version of the event before it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pydblog.core import (
    ChunkRequest,
    CoreSettings,
    Signal,
    SignalType,
    SnapshotCore,
    TableStartRequest,
)
from pydblog.events import ChangeEvent, Emitted, Op, expand
from pydblog.ports import TableInfo
from pydblog.sources.mysql.fences import GtidFence, parse_owned, union
from pydblog.sources.mysql.gtid import GtidState, MariaGtidPos, MySqlGtidSet
from pydblog.sources.mysql.position import BEFORE_TX, BinlogPosition

KEYS = 6
UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
OLD_UUID = "0b6f3a54-0000-11e1-9e33-c80aa9429562"  # history from an earlier primary
INFO = TableInfo("db", "t", ("id", "v"), ("int", "int"), ("id",), ("id",))


@dataclass
class Tx:
    writes: list[tuple[int, str, int]]  # (key, op c/u/d, version)
    captured: bool
    phase: str = "running"  # running -> written -> committed -> done (gtid updated)
    gtid: str | None = None


@dataclass
class Read:
    """A chunk read in progress (its request, and what each step saw)."""

    request: ChunkRequest
    step: int = 0
    low: GtidState | None = None
    visible: dict[int, int] | None = None  # key -> version, at the read view
    committed: set[str] = field(default_factory=set)  # GTIDs visible to the read view
    owned: MySqlGtidSet | None = None
    end: int = 0  # MariaDB: the binlog's end read before the snapshot
    attempts: int = 0


class Sim:
    def __init__(self, data: st.DataObject, mariadb: bool) -> None:
        self.data = data
        self.mariadb = mariadb
        self.versions = 0
        self.table: dict[int, int] = {}  # key -> version (committed, visible)
        for k in range(KEYS):
            self.table[k] = self.new_version()
        self.locks: dict[int, Tx] = {}
        self.txs: list[Tx] = []
        self.binlog: list[Tx] = []
        self.seq = 5  # MySQL: next gno; MariaDB: per domain below
        self.domain_seq = {0: 7, 1: 3}
        history = "0-1-7,1-2-3" if mariadb else f"{OLD_UUID}:1-20,{UUID}:1-5"
        self.executed: GtidState = (
            MariaGtidPos.parse(history) if mariadb else MySqlGtidSet.parse(history)
        )
        self.owned: set[str] = set()
        self.committed_gtids: set[str] = set()
        self.states: list[GtidState] = [self.executed]  # stream state before binlog[i]
        self.cursor = 0  # binlog transactions delivered
        self.delivered_state: GtidState = self.executed
        self.last_commit: BinlogPosition = BinlogPosition("b.000001", 4, BEFORE_TX, None, self.executed)
        self.logged: BinlogPosition = self.last_commit  # the highest position logged
        self.out: list[ChangeEvent] = []
        self.core = SnapshotCore(CoreSettings(chunk_size=2, read_only=True))
        self.read: Read | None = None
        self.checked_fences = 0

    def new_version(self) -> int:
        self.versions += 1
        return self.versions

    def emit(self, items: list[Emitted]) -> None:
        for e in expand(items):
            self.out.append(e)
            if isinstance(e.position, BinlogPosition) and self.logged < e.position:
                self.logged = e.position

    # -- the server --------------------------------------------------------------------
    def begin(self) -> None:
        free = [k for k in range(KEYS) if k not in self.locks]
        captured = self.data.draw(st.integers(0, 4), label="captured?") > 0
        tx = Tx([], captured)
        if captured and free:
            for k in self.data.draw(st.lists(st.sampled_from(free), min_size=1, max_size=2,
                                             unique=True), label="keys"):
                self.locks[k] = tx
                op = ("u" if self.data.draw(st.booleans(), label="update?") else "d") \
                    if k in self.table else "c"
                tx.writes.append((k, op, self.new_version()))
        else:
            tx.captured = False
        self.txs.append(tx)

    def write_binlog(self) -> None:
        running = [t for t in self.txs if t.phase == "running"]
        if not running:
            return
        tx = self.data.draw(st.sampled_from(running), label="binlog write")
        if self.mariadb:
            d = self.data.draw(st.sampled_from([0, 1]), label="domain")
            self.domain_seq[d] += 1
            tx.gtid = f"{d}-1-{self.domain_seq[d]}"
        else:
            self.seq += 1
            tx.gtid = f"{UUID}:{self.seq}"
            self.owned.add(tx.gtid)
        tx.phase = "written"
        self.states.append(self.states[-1].advance(tx.gtid))
        self.binlog.append(tx)

    def commit(self) -> None:
        written = [t for t in self.binlog if t.phase == "written"]
        if not written:
            return
        tx = written[0] if self.mariadb else self.data.draw(st.sampled_from(written),
                                                             label="engine commit")
        for k, op, version in tx.writes:
            if op == "d":
                self.table.pop(k, None)
            else:
                self.table[k] = version
            del self.locks[k]
        assert tx.gtid is not None
        self.committed_gtids.add(tx.gtid)
        tx.phase = "committed"
        if self.mariadb:  # MariaDB's binlog state moved at the binlog write already
            tx.phase = "done"
            self.executed = self.executed.advance(tx.gtid)

    def update_gtid(self) -> None:
        committed = [t for t in self.binlog if t.phase == "committed"]
        if self.mariadb or not committed:
            return
        tx = self.data.draw(st.sampled_from(committed), label="gtid update")
        assert tx.gtid is not None
        self.owned.discard(tx.gtid)
        self.executed = self.executed.advance(tx.gtid)
        tx.phase = "done"

    # -- the stream ----------------------------------------------------------------------
    def deliver(self) -> None:
        if self.cursor >= len(self.binlog):
            return
        i = self.cursor
        tx, before = self.binlog[i], self.states[i]
        self.cursor += 1
        self.delivered_state = self.states[i + 1]
        pos = 4 + 100 * (i + 1)
        index = 0
        for k, op, version in tx.writes:
            at = BinlogPosition("b.000001", pos, index, tx.gtid, before)
            index += 1
            row = {"id": k, "v": version}
            e = ChangeEvent(
                {"c": Op.CREATE, "u": Op.UPDATE, "d": Op.DELETE}[op], "db", "t", at, 0,
                {"id": k}, None if op == "c" else {"id": k, "v": -1},
                None if op == "d" else row,
            )
            self.out.append(e)
            self.logged = at
            self.core.on_event(e)
        end = BinlogPosition("b.000001", pos, index, tx.gtid, before)
        if tx.writes:  # a Commit (only transactions with captured rows have one)
            self.logged = end
            self.emit(self.core.on_progress(self.logged, end, 0))
        self.last_commit = end

    def idle_progress(self) -> None:
        """StreamPassed: outside a transaction, at the last transaction the stream read."""
        self.emit(self.core.on_progress(self.logged, self.last_commit, 0))

    # -- the worker ------------------------------------------------------------------------
    def work(self) -> None:
        if self.read is not None:
            self.read_step(self.read)
            return
        request = self.core.next_request()
        if isinstance(request, TableStartRequest):
            self.emit(self.core.on_table_started(request.id, INFO, (KEYS - 1,)))
        elif isinstance(request, ChunkRequest):
            assert request.fenced
            self.read = Read(request)
        else:
            assert request is None, request

    def read_step(self, r: Read) -> None:
        if self.mariadb:
            self.maria_step(r)
            return
        if r.step == 0:
            r.low = self.executed
        elif r.step == 1:
            r.visible = dict(self.table)
            r.committed = set(self.committed_gtids)
        elif r.step == 2:
            r.owned = parse_owned(
                ",".join(f"{g}#{n}" for n, g in enumerate(sorted(self.owned))))
        else:
            assert r.low is not None and r.owned is not None
            executed = self.executed
            assert isinstance(executed, MySqlGtidSet)
            self.answer(r, GtidFence(r.low, union(r.owned, executed)))
            return
        r.step += 1

    def maria_step(self, r: Read) -> None:
        if r.step == 0:
            r.low = self.states[len(self.binlog)]  # gtid_binlog_pos: what is written
        elif r.step == 1:
            r.end = len(self.binlog)  # SHOW MASTER STATUS
        else:  # the snapshot (binlog position: the committed prefix), then high
            done = 0
            while done < len(self.binlog) and self.binlog[done].phase == "done":
                done += 1
            r.visible = dict(self.table)
            r.committed = set(self.committed_gtids)
            high = self.states[len(self.binlog)]
            assert r.low is not None
            if done >= r.end:
                self.answer(r, GtidFence(r.low, high))
                return
            r.attempts += 1
            if r.attempts == 3:
                self.answer(r, GtidFence(MariaGtidPos(), high))
                return
            r.step = 0
            return
        r.step += 1

    def answer(self, r: Read, fence: GtidFence) -> None:
        self.read = None
        for tx in self.binlog:  # the fence's claims, against the model
            assert tx.gtid is not None
            if fence.low.covers(tx.gtid):
                assert tx.gtid in r.committed, f"{tx.gtid} in low but not visible"
            if tx.gtid in r.committed:
                assert fence.high.covers(tx.gtid), f"{tx.gtid} visible but not in high"
        self.checked_fences += 1
        assert r.visible is not None
        req = r.request
        after = req.after_key[0] if req.after_key is not None else -1
        keys = sorted(k for k in r.visible if after < k <= req.max_key[0])[: req.limit]
        rows = [{"id": k, "v": r.visible[k]} for k in keys]
        self.emit(self.core.on_chunk_read(req.id, rows, 1.0, fence=fence))

    def restart(self) -> None:
        """A crash at a transaction boundary: the core comes back from its state; the
        read in flight is lost (the stream goes on exactly where it was)."""
        self.core = SnapshotCore(CoreSettings(chunk_size=2, read_only=True), self.core.state())
        self.read = None

    # -- driving ---------------------------------------------------------------------------
    def step(self) -> None:
        choice = self.data.draw(st.sampled_from(
            ["begin", "write", "commit", "gtid", "deliver", "deliver", "work", "work",
             "work", "idle", "restart"]), label="step")
        if choice == "begin" and len([t for t in self.txs if t.phase == "running"]) < 3:
            self.begin()
        elif choice == "write":
            self.write_binlog()
        elif choice == "commit":
            self.commit()
        elif choice == "gtid":
            self.update_gtid()
        elif choice == "deliver":
            self.deliver()
        elif choice == "work":
            self.work()
        elif choice == "idle" and self.cursor == len(self.binlog):
            self.idle_progress()
        elif choice == "restart" and self.data.draw(st.integers(0, 5), label="crash") == 0:
            self.restart()

    def finish(self) -> None:
        while any(t.phase == "running" for t in self.txs):
            self.write_binlog()
        while any(t.phase == "written" for t in self.binlog):
            self.commit()
        while any(t.phase == "committed" for t in self.binlog):
            self.update_gtid()
        while self.cursor < len(self.binlog):
            self.deliver()
        for _ in range(10_000):
            if not self.core.active and self.read is None:
                return
            self.work()
            self.idle_progress()
        raise AssertionError("the snapshot did not finish")


def materialize(out: list[ChangeEvent]) -> dict[int, int]:
    rows: dict[int, int] = {}
    for e in out:
        if e.op is Op.NOTIFICATION:
            continue
        assert e.key is not None or e.after is not None
        if e.op is Op.DELETE:
            assert e.key is not None
            rows.pop(e.key["id"], None)
        else:
            assert e.after is not None
            rows[e.after["id"]] = e.after["v"]
    return rows


def assert_no_time_travel(sim: Sim) -> None:
    """Per key: every stream event is newer than everything logged before it; a snapshot
    row is at least as new (it may repeat the version of the event just before it)."""
    deleted: dict[Any, int] = {}
    for tx in sim.binlog:
        for index, (_k, op, version) in enumerate(tx.writes):
            if op == "d":
                deleted[(tx.gtid, index)] = version
    last: dict[int, int] = {}
    for e in sim.out:
        if e.op is Op.NOTIFICATION:
            continue
        if e.op is Op.DELETE:
            assert e.key is not None and isinstance(e.position, BinlogPosition)
            key, version = e.key["id"], deleted[(e.position.gtid, e.position.index)]
        else:
            assert e.after is not None
            key, version = e.after["id"], e.after["v"]
        if e.op is Op.READ:
            assert version >= last.get(key, 0), f"row {key} v{version} after v{last[key]}"
        else:
            assert version > last.get(key, 0), f"event {key} v{version} after v{last[key]}"
        last[key] = version


PROFILE = settings(
    max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@PROFILE
@given(st.data(), st.booleans())
def test_gtid_fenced_snapshots_materialize_without_time_travel(
    data: st.DataObject, mariadb: bool
) -> None:
    sim = Sim(data, mariadb)
    signal = Signal("s1", SignalType.EXECUTE_SNAPSHOT, ("db\\.t",))
    sim.emit(sim.core.on_signal(signal, ["db.t"], sim.logged, 0))
    for _ in range(data.draw(st.integers(10, 150), label="steps")):
        sim.step()
    sim.finish()
    reads = sum(1 for e in sim.out if e.op is Op.READ)
    event(f"{'mariadb' if mariadb else 'mysql'}: fences {min(sim.checked_fences, 5)}"
          f"{'+' if sim.checked_fences > 5 else ''}, rows {'0' if not reads else '1+'}")
    assert materialize(sim.out) == sim.table
    assert_no_time_travel(sim)
