"""The events a fenced snapshot keeps while no fence settles them (``core.fence.Unsettled``)
are bounded in bytes, not only in number: a paused snapshot of a table of wide rows under
write load kept up to ``MAX_UNSETTLED`` (200,000) whole events, gigabytes at 10 KB a row
(invariant 6 of docs/architecture.md: memory bounded by chunk and batch sizes)."""

from __future__ import annotations

import json
import tracemalloc

from pydblog.core.fence import MAX_UNSETTLED_BYTES, Unsettled
from pydblog.core.signals import parse_signal
from pydblog.core.sizing import CoreSettings
from pydblog.core.snapshot import SnapshotCore
from pydblog.events import ChangeEvent, Op
from pydblog.positions import Lsn, PgPosition

WIDE = 100_000  # bytes of text per row


def wide_update(k: int, tx: int, *, full_identity: bool = False) -> ChangeEvent:
    after = {"id": k, "doc": chr(97 + k % 26) * WIDE}  # a fresh string each time
    key = dict(after) if full_identity else {"id": k}
    return ChangeEvent(Op.UPDATE, "public", "t", PgPosition(Lsn(10 + tx), 0, None, tx), 0,
                       key=key, before=dict(after), after=after)


def retained(run: object) -> int:
    """Bytes still allocated after ``run()`` (what it kept)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        keep = run()  # type: ignore[operator]
        after = tracemalloc.get_traced_memory()[0]
        del keep
    finally:
        tracemalloc.stop()
    return after - before


def test_a_paused_read_only_snapshot_keeps_no_wide_row_images() -> None:
    """Windows need of a kept event only its key and its images' identity values."""
    core = SnapshotCore(CoreSettings(chunk_size=4, read_only=True, read_ahead=False), instance="t")
    for i, (kind, data) in enumerate((("execute-snapshot", {"data-collections": ["public\\.t"]}),
                                      ("pause-snapshot", {}))):
        signal = parse_signal(f"s{i}", kind, json.dumps(data))
        core.on_signal(signal, ["public.t"], PgPosition(Lsn(1)), 0)

    def feed() -> SnapshotCore:
        for n in range(2_000):  # 200 MB of row images if kept whole
            core.on_event(wide_update(n % 500, 100 + n))
        return core

    assert retained(feed) < 5_000_000
    assert core.state() is not None and core.state()["unsettled"]["max_tx"] == 2_099  # type: ignore[index]


def test_kept_events_are_bounded_in_bytes() -> None:
    """A table whose identity is the whole row (REPLICA IDENTITY FULL, no key): the kept
    key itself is wide. Past ``MAX_UNSETTLED_BYTES`` the oldest are forgotten into
    ``lost`` (windows then stay inconclusive until a fence settles them), as past the
    count."""
    u = Unsettled()

    def feed() -> Unsettled:
        for n in range(2_000):
            u.add(wide_update(n, 100 + n, full_identity=True))
        return u

    kept = retained(feed)
    assert u.lost is not None and u.lost.max_tx is not None and u.lost.max_tx >= 100
    assert 0 < u.weight <= MAX_UNSETTLED_BYTES
    assert kept < 2 * MAX_UNSETTLED_BYTES
    assert [e.position.tx_id for e in u.events] == list(range(2_100 - len(u.events), 2_100))  # type: ignore[attr-defined]
