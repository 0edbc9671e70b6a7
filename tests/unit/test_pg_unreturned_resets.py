"""``sources.postgres.resets.Unreturned``: table resets logged and not seen back in the
stream yet, kept in the checkpoint, logged again at open, each yielded once."""

from __future__ import annotations

from pydblog.sources.postgres.resets import KEEP, Reset, Unreturned


def _r(rid: str, table: str = "public.t", kind: str = "gone") -> Reset:
    return Reset(rid, table, kind)


def test_a_reset_that_comes_back_is_no_longer_kept() -> None:
    u = Unreturned()
    u.logged([_r("a"), _r("b", kind="recreated")])
    assert u.came_back("a") == (True, True)
    assert [r.id for r in u.pending] == ["b"]
    assert u.came_back("b") == (True, True)
    assert u.pending == [] and u.returned == []  # no copy was logged: nothing to skip
    assert u.dump() == {}


def test_the_checkpoint_round_trip() -> None:
    u = Unreturned()
    u.logged([_r("a"), _r("b", "public.u", "recreated")])
    u.to_log_again()
    u.logged([_r("c")])
    raw = u.dump()
    assert raw == {"resets": [["a", "public.t", "gone", True],
                              ["b", "public.u", "recreated", True],
                              ["c", "public.t", "gone", False]]}
    back = Unreturned.load({"captured": [], **raw})
    assert back.pending == u.pending
    assert Unreturned.load({"captured": []}).pending == []  # an older checkpoint


def test_a_copy_after_its_original_is_skipped() -> None:
    """Logged again at open, and the original came through the stream after all: the
    copy (later in the stream) is skipped, also after a restart (``returned`` is in
    the checkpoint), and every copy of several opens."""
    u = Unreturned()
    u.logged([_r("a"), _r("b")])
    assert [r.id for r in u.to_log_again()] == ["a", "b"]
    assert u.came_back("a") == (True, True)
    u = Unreturned.load(u.dump())  # a restart
    assert u.came_back("b") == (True, True)
    assert u.returned == ["a", "b"]
    for _ in range(2):
        assert u.came_back("a") == (False, False)
        assert u.came_back("b") == (False, False)


def test_a_copy_when_the_original_was_lost_is_yielded_once() -> None:
    u = Unreturned()
    u.logged([_r("a")])
    u.to_log_again()
    assert u.came_back("a") == (True, True)  # the copy: the original never comes
    assert u.came_back("a") == (False, False)  # a second open's copy


def test_a_reset_coming_back_drops_the_ones_kept_before_it() -> None:
    """Messages come back in the order logged: one coming back means those before it
    came back (their copies, if any, are skipped); none is logged again after it."""
    u = Unreturned()
    u.logged([_r("a", kind="gone"), _r("b", kind="recreated")])
    u.to_log_again()
    assert u.came_back("b") == (True, True)
    assert u.pending == []
    assert u.to_log_again() == []
    assert u.came_back("a") == (False, False)


def test_an_unknown_or_old_reset_is_always_yielded() -> None:
    """No id kept: logged by a refresh whose checkpoint was never written (open logs
    that change again), or by an older version: yielded (a second reset is a truncate
    and a snapshot more, never a loss)."""
    u = Unreturned()
    u.logged([_r("a")])
    assert u.came_back("zzz") == (True, False)
    assert [r.id for r in u.pending] == ["a"]


def test_the_ids_remembered_are_bounded() -> None:
    u = Unreturned()
    u.logged([_r(str(i)) for i in range(KEEP + 10)])
    u.to_log_again()
    assert u.came_back(str(KEEP + 9)) == (True, True)
    assert len(u.returned) == KEEP and u.returned[-1] == str(KEEP + 9)
