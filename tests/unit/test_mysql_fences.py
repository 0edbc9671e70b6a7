"""GtidFence (sources/mysql/fences.py) case by case: visibility by ``low``, closing by the
stream's state against ``high``, forgotten events, MySQL's gtid_owned spelling, and the
fresh-start position that snapshot rows may be placed after."""

from __future__ import annotations

import json

import pytest

from pydblog.core import ChunkRequest, CoreSettings, SnapshotCore, TableStartRequest, parse_signal
from pydblog.core.fence import Floor, Lost
from pydblog.errors import SourceError
from pydblog.events import ChangeEvent, Op, expand
from pydblog.ports import TableInfo
from pydblog.positions import Lsn, PgPosition
from pydblog.sources.mysql import fenced, fences
from pydblog.sources.mysql.fences import GtidFence, parse_owned, union
from pydblog.sources.mysql.gtid import MariaGtidPos, MySqlGtidSet
from pydblog.sources.mysql.position import BEFORE_TX, BinlogPosition

U = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
V = "0b6f3a54-0000-11e1-9e33-c80aa9429562"


def ev(gtid: str | None, before: str = "") -> ChangeEvent:
    state = MariaGtidPos.parse(before) if gtid and ":" not in gtid else MySqlGtidSet.parse(before)
    pos = BinlogPosition("b.000001", 100, 0, gtid, state)
    return ChangeEvent(Op.UPDATE, "db", "t", pos, 0, {"id": 1}, None, {"id": 1})


def test_mysql_fence_visibility_and_closing() -> None:
    fence = GtidFence(MySqlGtidSet.parse(f"{U}:1-10,{V}:1-3"), MySqlGtidSet.parse(f"{U}:1-12,{V}:1-3"))
    assert fence.visible(ev(f"{U}:10")) is True
    assert fence.visible(ev(f"{V}:2")) is True
    assert fence.visible(ev(f"{U}:11")) is None  # in high only: may be visible, drop
    assert fence.visible(ev(f"{U}:13")) is False
    assert fence.visible(ev(None)) is None
    assert fence.settles(ev(f"{U}:3")) and not fence.settles(ev(f"{U}:11"))
    # The stream has passed the fence once its state after a transaction holds high.
    assert not fence.passed(BinlogPosition("b.000001", 500, 1, f"{U}:11", MySqlGtidSet.parse(f"{U}:1-10,{V}:1-3")))
    assert fence.passed(BinlogPosition("b.000001", 600, 1, f"{U}:12", MySqlGtidSet.parse(f"{U}:1-11,{V}:1-3")))
    assert not fence.passed(BinlogPosition("b.000001", 600, 1, f"{U}:12", MySqlGtidSet.parse(f"{U}:1-11")))
    assert not fence.passed(BinlogPosition("b.000001", 600, 1, None, None))  # no GTID state
    with pytest.raises(TypeError):
        fence.passed(PgPosition(Lsn(16), 0))


def test_mariadb_fence_by_domain() -> None:
    s = MariaGtidPos.parse("0-1-57,1-2-9")
    fence = GtidFence(s, s)
    assert fence.visible(ev("0-1-57", "0-1-56,1-2-9")) is True
    assert fence.visible(ev("0-3-58", "0-1-57,1-2-9")) is False
    assert fence.visible(ev("2-1-1", "0-1-57,1-2-9")) is False  # a domain the read never saw
    assert fence.passed(BinlogPosition("f.000002", 9, 0, "1-2-9", MariaGtidPos.parse("0-1-60,1-2-8")))
    assert not fence.passed(BinlogPosition("f.000002", 9, 0, "1-2-8", MariaGtidPos.parse("0-1-60,1-2-7")))
    # A MySQL state never passes a MariaDB fence (nor the other way round).
    assert not fence.passed(BinlogPosition("f.000002", 9, 0, f"{U}:1", MySqlGtidSet.parse(f"{U}:1-5")))


def test_forgotten_events_are_settled_by_their_newest_state() -> None:
    fence = GtidFence(MySqlGtidSet.parse(f"{U}:1-10"), MySqlGtidSet.parse(f"{U}:1-10"))
    inside = Lost(BinlogPosition("b.000001", 9, 0, f"{U}:10", MySqlGtidSet.parse(f"{U}:1-9")), None)
    beyond = Lost(BinlogPosition("b.000001", 9, 0, f"{U}:11", MySqlGtidSet.parse(f"{U}:1-10")), None)
    assert fence.settles_lost(inside) and not fence.settles_lost(beyond)
    assert not fence.settles_lost(Lost(None, None))


def test_a_fence_is_low_within_high() -> None:
    with pytest.raises(ValueError):
        GtidFence(MySqlGtidSet.parse(f"{U}:1-10"), MySqlGtidSet.parse(f"{U}:1-9"))
    with pytest.raises(ValueError):
        GtidFence(MariaGtidPos.parse("0-1-1"), MySqlGtidSet.parse(f"{U}:1"))


def test_gtid_owned_spelling() -> None:
    owned = parse_owned(f"{U}:3077#8:3079#11,{V}:4#2")
    assert owned == MySqlGtidSet.parse(f"{U}:3077:3079,{V}:4")
    assert parse_owned("") == MySqlGtidSet()
    assert union(owned, MySqlGtidSet.parse(f"{U}:1-3076")) == MySqlGtidSet.parse(f"{U}:1-3077:3079,{V}:4")


def test_rows_placed_after_a_fresh_start_sort_below_the_next_transaction() -> None:
    start = BinlogPosition("b.000001", 400, BEFORE_TX, None, MySqlGtidSet())
    rows = [start.with_index(start.index + 1 + k) for k in range(1_000_000, 1_000_003)]
    first_event = BinlogPosition("b.000001", 400, 0, f"{U}:1", MySqlGtidSet())
    assert start < rows[0] < rows[-1] < first_event


def _blocking_reads(core: SnapshotCore, fence: GtidFence, limit: int = 20) -> int:
    """Answer the blocking snapshot's table starts (an empty table) with ``fence``;
    how many starts were read before it ended (``limit``: it never did)."""
    starts = 0
    for _ in range(limit):
        if not core.blocking:
            return starts
        req = core.next_request()
        if isinstance(req, TableStartRequest):
            starts += 1
            core.on_table_started(req.id, INFO, None, fence=fence)
    return limit


INFO = TableInfo("public", "t", ("id", "v"), ("int", "text"), ("id",))
BLOCKING = json.dumps({"data-collections": ["public\\.t"], "type": "blocking"})


@pytest.mark.parametrize("gtids", [None, f"{U}:1-50"])
def test_fenced_blocking_floor_without_gtid_state_does_not_stall(gtids: str | None) -> None:
    """A blocking snapshot queued at a position without GTID state (a
    legacy checkpoint, a capture begun with gtid_mode = OFF) has a floor no GTID fence
    can judge: fenced, every table start would be read again forever while the stream
    stays paused. Such a floor is not fenced (a warning says so)."""
    core = SnapshotCore(CoreSettings(chunk_size=4, fenced_blocking=True), instance="t")
    state = None if gtids is None else MySqlGtidSet.parse(gtids)
    pos = BinlogPosition("binlog.000003", 1000, 2, None if state is None else f"{U}:51", state)
    core.on_signal(parse_signal("b1", "execute-snapshot", BLOCKING), ["public.t"], pos, 0)
    core.on_stream_paused(pos, 0)
    everything = MySqlGtidSet.parse(f"{U}:1-100")
    assert _blocking_reads(core, GtidFence(everything, everything)) == 1
    assert core.read_again == 0


def test_fenced_blocking_restored_at_a_floor_without_gtid_state_does_not_stall() -> None:
    """F1, the operator's path: a blocking snapshot begun unfenced (gtid_mode = OFF, so
    its positions have no GTID state), restored after gtid_mode was set ON (fenced)."""
    pos = BinlogPosition("binlog.000003", 1000, 2, None, None)
    before = SnapshotCore(CoreSettings(chunk_size=4), instance="t")
    before.on_signal(parse_signal("b1", "execute-snapshot", BLOCKING), ["public.t"], pos, 0)
    before.on_stream_paused(pos, 0)
    state = before.state()
    assert state is not None and before.blocking
    core = SnapshotCore(CoreSettings(chunk_size=4, fenced_blocking=True), instance="t",
                        state=json.loads(json.dumps(state)))
    core.on_stream_paused(pos, 0)
    everything = MySqlGtidSet.parse(f"{U}:1-100")
    assert _blocking_reads(core, GtidFence(everything, everything)) == 1


def test_a_position_without_gtid_state_is_not_judged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The floor's or the forgotten events' position has no GTID state: a fence cannot
    judge it, and does not hold the read back for it (see the test above), with a
    warning; a position with GTID state is judged, an unknown one is not covered."""
    monkeypatch.setattr(fences, "_warned", False)
    fence = GtidFence(MySqlGtidSet.parse(f"{U}:1-10"), MySqlGtidSet.parse(f"{U}:1-10"))
    legacy = BinlogPosition("b.000001", 9, 0, None, None)
    assert fence.covers(Floor(legacy)) and fence.settles_lost(Lost(legacy, None))
    assert not fence.covers(Floor(None)) and not fence.settles_lost(Lost(None, None))
    beyond = BinlogPosition("b.000001", 9, 0, f"{U}:11", MySqlGtidSet.parse(f"{U}:1-10"))
    assert not fence.covers(Floor(beyond))
    assert "no GTID state" in caplog.text and "not fenced" in caplog.text


class _Cursor:
    """Answers ``open_fenced``'s reads as a MySQL server whose gtid_mode is ``mode``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sql: list[str] = []

    def execute(self, sql: str) -> None:
        self.sql.append(sql)

    def fetchone(self) -> tuple[str, ...]:
        return (self.mode, f"{U}:1-10") if "gtid_mode" in self.sql[-1] else (f"{U}:1-10",)


def test_a_blocking_read_after_gtid_mode_was_lowered_falls_back_unfenced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """gtid_mode lowered from ON at runtime (``fences_blocking_reads`` said yes at the
    start). A blocking read is read unfenced, as a capture begun without GTIDs reads,
    with a warning naming blocking snapshots, the cause and the fix (not failed with the
    read-only mode's message, the table ending REJECTED). Read-only
    (and fenced watermark) chunks still need GTIDs."""
    monkeypatch.setattr(fenced, "_warned", False)
    cur = _Cursor("ON_PERMISSIVE")
    assert fenced.open_fenced(cur, False, "db:3306", blocking_only=True) is fences.UNFENCED
    assert any(s.startswith("START TRANSACTION WITH CONSISTENT SNAPSHOT") for s in cur.sql)
    assert "blocking snapshot reads are no longer fenced: gtid_mode is ON_PERMISSIVE" in caplog.text
    assert "set gtid_mode = ON again" in caplog.text
    with pytest.raises(SourceError, match='watermark = "read-only" needs GTIDs'):
        fenced.open_fenced(_Cursor("OFF"), False, "db:3306")
    assert isinstance(fenced.open_fenced(_Cursor("ON"), False, "db:3306", blocking_only=True),
                      GtidFence)


def test_an_unfenced_blocking_read_is_decided_as_before_fencing() -> None:
    """The ``UNFENCED`` answer to a fenced blocking start and chunk: the snapshot ends
    (no read again), its rows as read, at a floor no fence could judge either."""
    core = SnapshotCore(CoreSettings(chunk_size=4, fenced_blocking=True), instance="t")
    pos = BinlogPosition("binlog.000003", 1000, 2, f"{U}:51", MySqlGtidSet.parse(f"{U}:1-50"))
    core.on_signal(parse_signal("b1", "execute-snapshot", BLOCKING), ["public.t"], pos, 0)
    core.on_stream_paused(pos, 0)
    start = core.next_request()
    assert isinstance(start, TableStartRequest) and start.fenced
    core.on_table_started(start.id, INFO, (2,), fence=fences.UNFENCED)
    chunk = core.next_request()
    assert isinstance(chunk, ChunkRequest) and chunk.fenced
    out = expand(core.on_chunk_read(chunk.id, [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}], 1.0,
                                    fence=fences.UNFENCED))
    assert [e.after["id"] for e in out if e.op is Op.READ and e.after] == [1, 2]
    assert core.read_again == 0
