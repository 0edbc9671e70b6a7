"""``sources.postgres.resets.Unreturned``: table resets logged and not seen back in the
stream yet, kept in the checkpoint, logged again at open, each yielded once."""

from __future__ import annotations

from pydblog.sources.postgres.resets import Reset, Unreturned


def _r(rid: str, table: str = "public.t", kind: str = "gone") -> Reset:
    return Reset(rid, table, kind)


def test_a_reset_that_comes_back_is_no_longer_kept() -> None:
    u = Unreturned()
    u.logged([_r("a"), _r("b", kind="recreated")])
    assert u.came_back("a") == (True, True)
    assert [r.id for r in u.pending] == ["b"]
    assert u.came_back("b") == (True, True)
    assert u.pending == []
    assert u.dump() == {}


def test_the_checkpoint_round_trip() -> None:
    u = Unreturned()
    u.logged([_r("a"), _r("b", "public.u", "recreated")])
    u.to_log_again()
    u.logged([_r("c")])
    raw = u.dump()
    assert raw == {"resets": [["a", "public.t", "gone"],
                              ["b", "public.u", "recreated"],
                              ["c", "public.t", "gone"]]}
    back = Unreturned.load({"captured": [], **raw})
    assert back.pending == u.pending
    assert Unreturned.load({"captured": []}).pending == []  # an older checkpoint


def test_a_copy_after_its_original_is_skipped() -> None:
    """Logged again at open, and the original came through the stream after all: the
    copy (later in the stream) is skipped, also after a restart, and every copy of
    several opens."""
    u = Unreturned()
    u.logged([_r("a"), _r("b")])
    assert [r.id for r in u.to_log_again()] == ["a", "b"]
    assert u.came_back("a") == (True, True)
    u = Unreturned.load(u.dump())  # a restart
    assert u.came_back("b") == (True, True)
    for _ in range(2):
        assert u.came_back("a", copy=True) == (False, False)
        assert u.came_back("b", copy=True) == (False, False)


def test_a_copy_when_the_original_was_lost_is_yielded_once() -> None:
    u = Unreturned()
    u.logged([_r("a")])
    u.to_log_again()
    assert u.came_back("a", copy=True) == (True, True)  # the original never comes
    assert u.came_back("a", copy=True) == (False, False)  # a second open's copy


def test_a_reset_coming_back_drops_the_ones_kept_before_it() -> None:
    """Messages come back in the order logged: one coming back means those before it
    came back (their copies, if any, are skipped); none is logged again after it."""
    u = Unreturned()
    u.logged([_r("a", kind="gone"), _r("b", kind="recreated")])
    u.to_log_again()
    assert u.came_back("b") == (True, True)
    assert u.pending == []
    assert u.to_log_again() == []
    assert u.came_back("a", copy=True) == (False, False)


def test_an_unknown_or_old_reset_is_always_yielded() -> None:
    """No id kept: logged by a refresh whose checkpoint was never written (open logs
    that change again), or by an older version: yielded (a second reset is a truncate
    and a snapshot more, never a loss)."""
    u = Unreturned()
    u.logged([_r("a")])
    assert u.came_back("zzz") == (True, False)
    assert [r.id for r in u.pending] == ["a"]


def test_copies_of_many_resets_after_their_originals_are_all_skipped() -> None:
    """More resets kept at an open than any bounded memory of ids come back
    (``pg_restore --clean`` of a 40-table schema: 40 GONE, then 40 RECREATED, a reopen
    while the stream is behind): the originals come back, then every copy. No copy is
    yielded: a GONE copy after its table's RECREATED would truncate the mirror's rows
    for good (GONE queues no snapshot)."""
    u = Unreturned()
    gone = [_r(f"g{i}", f"app.t{i}", "gone") for i in range(40)]
    recreated = [_r(f"r{i}", f"app.t{i}", "recreated") for i in range(40)]
    u.logged(gone)
    u.logged(recreated)
    copies = u.to_log_again()
    assert [r.id for r in copies] == [r.id for r in gone + recreated]
    last = {}
    for r in gone + recreated:
        assert u.came_back(r.id)[0]
        last[r.table] = r.kind
    u = Unreturned.load(u.dump())  # a restart between them
    for r in copies:
        if u.came_back(r.id, copy=True)[0]:
            last[r.table] = r.kind
    assert set(last.values()) == {"recreated"}, last


def test_copies_logged_at_open_are_marked_and_skipped_through_the_source() -> None:
    """The same through ``PgLogSource``: the messages ``open`` logs again (read from
    the SQL it runs) are marked as copies, and the stream skips every one whose
    original came back, however many."""
    from typing import Any

    from pydblog.config import parse_config
    from pydblog.ports import RelationReset
    from pydblog.sources.postgres import pgoutput as po
    from pydblog.sources.postgres.source import RESET_PREFIX, PgLogSource

    class Writes:
        def __init__(self) -> None:
            self.payloads: list[bytes] = []

        def execute(self, sql: str, args: tuple[str, str]) -> None:
            assert args[0] == RESET_PREFIX
            self.payloads.append(args[1].encode())

    src = PgLogSource(parse_config({"source": {"dsn": "postgresql://x@127.0.0.1/db",
                                               "tables": ["app.*"]}}))
    writes = Writes()
    src._meta = writes  # type: ignore[assignment]  # (``_writes``: the source itself)
    gone = [_r(f"g{i}", f"app.t{i}", "gone") for i in range(40)]
    recreated = [_r(f"r{i}", f"app.t{i}", "recreated") for i in range(40)]
    for reset in gone + recreated:
        src._emit_reset(reset)
    src._unreturned.logged(gone + recreated)
    assert src._log_again()
    assert len(writes.payloads) == 160
    last: dict[str, Any] = {}
    for lsn, payload in enumerate(writes.payloads, 100):  # originals, then the copies
        msg = po.Message(True, 1, RESET_PREFIX, payload)
        for item in src._on_message(msg, lsn, 0, 0, 7, True, 0):  # type: ignore[arg-type]
            assert isinstance(item, RelationReset)
            last[f"{item.event.schema}.{item.event.table}"] = item.kind.value
    assert len(last) == 40 and set(last.values()) == {"recreated"}, last
    assert src._unreturned.pending == []
