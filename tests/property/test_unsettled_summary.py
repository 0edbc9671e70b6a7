"""``Unsettled.summary`` (persisted with every checkpoint) is kept up to date as events
come instead of walking every held event at each call: after any sequence of events
(with and without transaction ids), fences that settle some of them, overflows past
the limit and clears, it equals the summary computed from scratch."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.core.fence import Lost, Unsettled
from pydblog.events import ChangeEvent, Op
from pydblog.positions import Lsn, PgPosition


@dataclass(frozen=True)
class _Below:
    """Settles every event whose transaction id is below ``tx`` (and a summary whose
    largest id is)."""

    tx: int

    def settles(self, event: ChangeEvent) -> bool:
        t = getattr(event.position, "tx_id", None)
        return isinstance(t, int) and t < self.tx

    def settles_lost(self, lost: Lost) -> bool:
        return lost.max_tx is not None and lost.max_tx < self.tx

    def in_doubt(self) -> None:
        return None

    def in_commit(self) -> None:
        return None


def _from_scratch(u: Unsettled) -> Lost | None:
    if not u.events and u.lost is None:
        return None
    lost = Lost(xids=set())
    if u.lost is not None:
        lost.merge(u.lost)
    lost.add(u.events)
    return lost


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.one_of(st.none(), st.integers(1, 40))),
    st.tuples(st.just("prune"), st.integers(0, 45)),
    st.tuples(st.just("clear"), st.none()),
), max_size=60)


@given(ops, st.integers(2, 9))
@settings(deadline=None)
def test_summary_equals_the_summary_from_scratch(steps: list[tuple[str, int | None]], limit: int) -> None:
    u = Unsettled(limit=limit)
    for n, (op, arg) in enumerate(steps):
        if op == "add":
            u.add(ChangeEvent(Op.UPDATE, "s", "t", PgPosition(Lsn(n + 1), 0, None, arg), 1,
                              {"id": n}, None, {"id": n}))
        elif op == "prune":
            assert arg is not None
            u.prune(_Below(arg))  # type: ignore[arg-type]
        else:
            u.clear()
        got, want = u.summary(), _from_scratch(u)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.to_json() == want.to_json()
