"""Fencing of the embedded change log under random interleavings of several writers'
claims and appends (each writer a separate connection to one log, as separate
processes would be): the log only ever accepts appends of the newest claimed epoch,
epochs never go backwards along the offsets, and a refused append leaves no trace."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pydblog.changelog.sqlite import SqliteChangeLog, SqliteChangeLogReader
from pydblog.errors import Fenced
from pydblog.events import EncodedEvent
from pydblog.ports import Checkpoint
from pydblog.positions import Lsn, PgPosition

WRITERS = 3
ops = st.lists(
    st.tuples(st.sampled_from(["claim", "append"]), st.integers(0, WRITERS - 1),
              st.integers(1, 6)),
    min_size=1, max_size=40,
)


@settings(max_examples=30, deadline=None)
@given(ops)
def test_only_the_newest_epoch_appends(script: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        logs = [SqliteChangeLog(Path(tmp)) for _ in range(WRITERS)]
        epoch: list[int | None] = [None] * WRITERS
        fence: int | None = None  # the model: the newest claimed epoch
        expected: list[int | None] = []  # the epoch of each accepted event, by offset
        seq = 0
        try:
            for op, w, k in script:
                e = k * WRITERS + w  # the election never gives two members one epoch
                if op == "claim":
                    if fence is not None and e < fence:
                        try:
                            logs[w].claim(e)
                            raise AssertionError("an older epoch claimed the log back")
                        except Fenced:
                            continue
                    logs[w].claim(e)
                    epoch[w], fence = e, e
                    continue
                if epoch[w] is None:
                    continue  # only members that claimed write ([ha]: one writer per term)
                seq += 1
                ev = EncodedEvent("public.t", "c", 1, f'{{"epoch":{epoch[w]},"seq":{seq}}}')
                cp = Checkpoint(PgPosition(Lsn(seq), 0, Lsn(seq)))
                if epoch[w] == fence:
                    logs[w].append([ev], cp)
                    expected.append(fence)
                else:
                    try:
                        logs[w].append([ev], cp)
                        raise AssertionError(f"writer of epoch {epoch[w]} appended under {fence}")
                    except Fenced:
                        pass
            reader = SqliteChangeLogReader(Path(tmp))
            try:
                import orjson

                got = [orjson.loads(r.body)["epoch"] for r in reader.read(0, 10_000)]
                assert [r.offset for r in reader.read(0, 10_000)] == list(range(len(got)))
            finally:
                reader.close()
            assert got == expected
            assert got == sorted(got)  # epochs never go backwards along the log
        finally:
            for log in logs:
                log.close()
