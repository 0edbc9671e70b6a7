"""Resuming a MySQL/MariaDB binlog stream (``sources.mysql.resume``) against a model
binlog: every row and ``Commit`` reaches the change log exactly once, in binlog order,
whatever lost connections (``plan_reconnect``) and restarts from the last logged
position (``plan_resume``) cut the reading, with GTIDs (MariaDB, MySQL) or without.

The model server holds transactions ``T0 .. Tn-1``, each ``GTID; rows; XID`` (``BEGIN``
instead of the GTID event where GTIDs are off), one event per row, ``Ti`` starting at
offset ``start(i)`` of one binlog file. Its GTID dump sends the transactions not in the
requested state, its file dump every event from an offset. The reader follows the
source's rules (``binlog.py``): the GTID state moves at each GTID event, a transaction
opens at its first event, every item passes ``Delivered.drop``. A restart keeps only
the change log (a fresh ``Delivered`` from the plan); a reconnect keeps the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.sources.mysql.dumpstart import DumpStart
from pydblog.sources.mysql.gtid import GtidState, MariaGtidPos, MySqlGtidSet
from pydblog.sources.mysql.position import BinlogPosition, OpenTx
from pydblog.sources.mysql.resume import (
    Delivered,
    FileResume,
    GtidResume,
    StreamAt,
    plan_reconnect,
    plan_resume,
)

FILE = "binlog.000001"
UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


def start(i: int) -> int:
    return 4 + 100 * i


@dataclass
class Model:
    flavour: str  # "mariadb" | "mysql" | "off"
    sizes: list[int]  # rows of each transaction

    @property
    def gtid_mode(self) -> bool:
        return self.flavour != "off"

    def gtid(self, i: int) -> str | None:
        if self.flavour == "mariadb":
            return f"0-1-{i + 1}"
        return f"{UUID}:{i + 1}" if self.flavour == "mysql" else None

    def empty(self) -> GtidState | None:
        if self.flavour == "off":
            return None
        return MariaGtidPos() if self.flavour == "mariadb" else MySqlGtidSet()

    def state_before(self, i: int) -> GtidState | None:
        state = self.empty()
        for j in range(i):
            gtid = self.gtid(j)
            if state is not None and gtid is not None:
                state = state.advance(gtid)
        return state

    def events(self) -> list[tuple[int, str, int]]:
        """``(transaction, kind, row)``: kind "open" (GTID or BEGIN), "row", "commit"."""
        out = []
        for i, n in enumerate(self.sizes):
            out.append((i, "open", 0))
            out += [(i, "row", r) for r in range(n)]
            out.append((i, "commit", n))
        return out


@dataclass
class Reader:
    """The stream's state (``MySqlLogSource``'s fields that resuming reads)."""

    model: Model
    delivered: Delivered
    epoch: int
    gtids: GtidState | None
    events: list[tuple[int, str, int]]  # still to come from the current dump
    file: str = FILE
    last_end: int = 4
    tx: OpenTx | None = None
    last_done: BinlogPosition | None = None
    log: list[tuple[int, int]] = field(default_factory=list)  # (transaction, index)
    positions: list[BinlogPosition] = field(default_factory=list)

    def follow(self, plan: GtidResume | FileResume) -> None:
        """Start the dump ``plan`` says (the model server's answer to it)."""
        m = self.model
        self.epoch = plan.epoch
        self.tx = None
        if isinstance(plan, GtidResume):
            self.delivered.tx = dict(plan.skip_tx)
            self.delivered.upto = None
            self.gtids = plan.state
            first = next(
                (i for i in range(len(m.sizes)) if not plan.state.covers(m.gtid(i) or "")),
                len(m.sizes),
            )
            if plan.start is not None:
                # Coordinates only at a transaction whose every predecessor is in the
                # state (dumpstart.py's exactness condition).
                j = (plan.start.offset - 4) // 100
                assert plan.start == DumpStart(FILE, start(j), m.gtid(j), UUID)
                assert all(plan.state.covers(m.gtid(k) or "") for k in range(j))
        else:
            self.delivered.upto = plan.skip_upto
            self.gtids = plan.state
            first = (plan.offset - 4) // 100
            self.last_end = plan.offset
        self.events = [e for e in m.events() if e[0] >= first]

    def step(self) -> None:
        """Read one event from the dump."""
        m = self.model
        i, kind, row = self.events.pop(0)
        if kind == "open":
            before = self.gtids
            gtid = m.gtid(i)
            if gtid is not None and before is not None:
                self.gtids = before.advance(gtid)
            self.tx = OpenTx(FILE, start(i), gtid, True, 0, before, self.epoch)
            return
        tx = self.tx
        assert tx is not None
        self.emit(i, row, tx.position(row))
        if kind == "row":
            tx.count += 1
        else:
            self.tx = None
            self.last_done = tx.position(row)
            self.last_end = start(i + 1)

    def emit(self, i: int, index: int, pos: BinlogPosition) -> None:
        if not self.delivered.drop(pos):
            self.log.append((i, index))
            self.positions.append(pos)

    def at(self) -> StreamAt:
        m = self.model
        mysql_gtid_dump = m.flavour == "mysql" and self.epoch > 0
        return StreamAt(
            gtid_mode=m.gtid_mode, mariadb=m.flavour == "mariadb", epoch=self.epoch,
            file=self.file, last_end=self.last_end, gtids=self.gtids, tx=self.tx,
            last_done=self.last_done, server_uuid=UUID if mysql_gtid_dump else None,
        )


cuts = st.lists(
    st.tuples(st.integers(0, 12), st.sampled_from(["reconnect", "restart", "legacy restart"])),
    max_size=6,
)
"""After how many more events the dump is lost, and how: a reconnect, or a restart from
the change log's last position (a legacy one: a position without its GTID state, as
change logs written before GTID resume have)."""


@settings(max_examples=300, deadline=None)
@given(
    flavour=st.sampled_from(["mariadb", "mysql", "off"]),
    sizes=st.lists(st.integers(1, 3), min_size=1, max_size=6),
    cuts=cuts,
)
def test_every_item_is_logged_once_in_order(flavour: str, sizes: list[int],
                                            cuts: list[tuple[int, str]]) -> None:
    model = Model(flavour, sizes)
    empty = model.empty()
    reader = Reader(model, Delivered(), 0, empty, model.events())
    for after, how in cuts:
        for _ in range(min(after, len(reader.events))):
            reader.step()
        if how != "reconnect" and reader.positions:
            # A new process: the change log's last position is the checkpoint.
            pos = reader.positions[-1]
            if how == "legacy restart":
                pos = BinlogPosition(pos.file, pos.pos, pos.index, pos.gtid, None, pos.epoch)
            state = None
            if model.gtid_mode and pos.gtids is not None:
                state = pos.gtids if pos.gtids else empty
            plan = plan_resume(pos, state, mariadb=flavour == "mariadb", dump_record=None)
            if isinstance(plan, FileResume) and plan.state is None:
                plan = FileResume(plan.file, plan.offset, plan.epoch, plan.skip_upto,
                                  model.state_before((plan.offset - 4) // 100))
            fresh = Reader(model, Delivered(), 0, None, [], log=reader.log,
                           positions=reader.positions)
            fresh.last_done = pos if isinstance(plan, FileResume) else plan.delivered
            fresh.follow(plan)
            reader = fresh
        else:
            reader.follow(plan_reconnect(reader.at(), reader.delivered))
    while reader.events:
        reader.step()
    expected = [(i, k) for i, n in enumerate(sizes) for k in range(n + 1)]
    assert reader.log == expected
    assert reader.positions == sorted(reader.positions)  # the runner's order


@settings(max_examples=200, deadline=None)
@given(
    flavour=st.sampled_from(["mariadb", "mysql", "off"]),
    sizes=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    after=st.integers(0, 20),
)
def test_a_reconnect_plan_drops_exactly_what_was_delivered(
    flavour: str, sizes: list[int], after: int
) -> None:
    """What ``plan_reconnect`` says to drop (the open transaction's delivered part, or
    everything up to the last delivered position) is what was delivered of the
    transactions it reads again, and nothing else."""
    model = Model(flavour, sizes)
    reader = Reader(model, Delivered(), 0, model.empty(), model.events())
    for _ in range(min(after, len(reader.events))):
        reader.step()
    plan = plan_reconnect(reader.at(), reader.delivered)
    check = Delivered()
    if isinstance(plan, GtidResume):
        assert plan.epoch == reader.epoch + 1
        check.tx = dict(plan.skip_tx)
        tx = reader.tx
        assert tx is not None or not plan.skip_tx  # (no resumed transaction here)
    else:
        assert plan.epoch == reader.epoch
        check.upto = plan.skip_upto
    # Read again from the plan: the items dropped are exactly those logged already.
    again = Reader(model, check, 0, None, [])
    again.follow(plan)
    while again.events:
        again.step()
    assert reader.log + again.log == [(i, k) for i, n in enumerate(sizes) for k in range(n + 1)]


@given(st.integers(0, 6), st.integers(1, 6), st.one_of(st.none(), st.integers(-1, 8)),
       st.one_of(st.none(), st.integers(-1, 8)), st.sampled_from([None, "0-1-7", "0-1-8"]))
@settings(max_examples=300, deadline=None)
def test_a_run_is_dropped_as_its_events_one_by_one(first: int, size: int, upto: int | None,
                                                   limit: int | None, gtid: str | None) -> None:
    """``Delivered.run`` keeps what ``drop`` of each of the run's events keeps, and
    leaves ``Delivered`` as those drops leave it."""
    from pydblog.events import RowRun

    base = BinlogPosition(FILE, 104, first, gtid)
    tails = "\n".join(f'{{"id":{i}}},"before":null,"after":{{"id":{i}}}}}' for i in range(size))
    run = RowRun("s", "t", base, 5, size, tails)

    def fresh() -> Delivered:
        d = Delivered()
        d.upto = BinlogPosition(FILE, 104, upto, gtid) if upto is not None else None
        d.tx = {"0-1-7": limit} if limit is not None else {}
        return d

    one_by_one = fresh()
    kept = [e.position for e in run.events() if not one_by_one.drop(e.position)]
    as_run = fresh()
    rest = as_run.run(run)
    assert ([e.position for e in rest.events()] if rest is not None else []) == kept
    assert (as_run.upto, as_run.tx, as_run.last) == (one_by_one.upto, one_by_one.tx,
                                                     one_by_one.last)
