"""Key ranges of a single-column integer chunk key, cut by arithmetic (``core.flight``).

Boundary queries (``BoundsRequest``) find the key of every ``n``-th row by walking the
index: one query per range, in all about one more pass over the key index of the table.
For a single-column integer key the ranges can be cut by arithmetic instead: a range
``(a, a + w]`` holds about ``w · d`` rows, ``d`` the table's density there (rows per key
unit), so a range planned for ``target`` rows is ``w = ceil(target / d)`` keys wide.

Where ``d`` comes from (``Density``): the first bounds query of a table's flight (the
flight still asks one, which also tells it that the key is an integer: ``calibrate``),
then every range read (``observe``): the density of the last ``HISTORY`` ranges read
predicts the next ones. After a range that read no row at all (a gap in the keys, of
unknown size) the next range reaches the max key: a keyset chunk, whose ``LIMIT`` stops
it at the next keys wherever they are (measured on a skewed 5M-row table: 6 empty
windows in 79 instead of 63 in 136 when widths only grew by ``GROW`` per empty range).

Exactness never depends on the estimate. Ranges only partition the key space: each
range ``(a, u]`` is read with ``LIMIT cap(target)``; a read that returns ``cap`` rows
and stopped at a key ``last < u`` (a dense region: the estimate was low, or rows were
inserted since) covers ``(a, last]`` only, and its rest ``(last, u]`` is cut again
(``rest``) at the density that read just measured: no key is skipped, none is read by
two ranges, and no chunk holds more than ``cap`` rows.

Integer arithmetic only (Python ints: no float rounding near 2**63, no overflow): every
upper lies in ``(start, top]``, between a key that was read (or the progress) and the
table's max key, so it is a value of the column's type, whatever its width or sign
(PostgreSQL's bigint -2**63 .. 2**63-1, MySQL's unsigned bigint up to 2**64-1).
"""

from __future__ import annotations

from collections import deque

HISTORY = 4
"""Ranges whose rows and spans predict the next range's width."""

GROW = 4
"""After ranges that read no row: the next width is this times the widest of them."""


def cap(target: int) -> int:
    """The ``LIMIT`` of a range planned for ``target`` rows: 1.5 x (at least one more),
    so that the noise of a sparse key's density rarely splits a range, while a dense
    region still cannot grow a chunk past it."""
    return target + max(1, target // 2)


def as_planned(planned: int, read: int, elapsed_ms: float) -> tuple[int, float]:
    """A range's read as the adaptive chunk size sees it (``sizing.next_chunk_size``):
    arithmetic ranges return about ``planned`` rows, rarely exactly; a read of at least
    half of them counts as a full chunk, its time scaled to ``planned`` rows."""
    if read > 0 and 2 * read >= planned:
        return planned, elapsed_ms * planned / read
    return read, elapsed_ms


class Density:
    """Rows per key unit of the last ``HISTORY`` ranges read (or bounds found)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: deque[tuple[int, int]] = deque(maxlen=HISTORY)  # (rows, key span)

    @property
    def calibrated(self) -> bool:
        return bool(self._seen)

    def observe(self, rows: int, span: int, *, full: bool = False) -> None:
        """``rows`` were found in ``span`` key units. ``full``: a read that hit its
        ``LIMIT`` below its upper (the density rose): the older ranges are forgotten."""
        if span <= 0:
            return
        if full:
            self._seen.clear()
        self._seen.append((rows, span))

    def calibrate(self, after: int | None, keys: list[int], step: int) -> None:
        """Bounds ``keys`` (the ``step``-th, ``2·step``-th, ... key after ``after``)."""
        if not keys:
            return
        if after is not None:
            self.observe(len(keys) * step, keys[-1] - after)
        elif len(keys) > 1:
            self.observe((len(keys) - 1) * step, keys[-1] - keys[0])

    def width(self, target: int) -> int:
        """The key span expected to hold ``target`` rows (at least 1)."""
        rows = sum(r for r, _ in self._seen)
        span = sum(s for _, s in self._seen)
        if rows == 0:
            return max(1, GROW * max((s for _, s in self._seen), default=1))
        return max(1, -(-target * span // rows))

    def plan(self, start: int, top: int, target: int, count: int) -> list[int]:
        """The uppers of up to ``count`` ranges after ``start``, each ``width(target)``
        wide: ``start < u1 < u2 < ... <= top``; the last is ``top`` iff they reach it.
        After a range that read no row (a gap in the keys, of unknown size): one range
        to ``top``, a keyset chunk whose ``LIMIT`` stops it at the next keys, wherever
        they are (``after_read`` then measures their density and cuts the rest)."""
        if self._seen and self._seen[-1][0] == 0:
            return [top] if start < top else []
        w = self.width(target)
        out: list[int] = []
        at = start
        while len(out) < count and at < top:
            at = min(top, at + w)
            out.append(at)
        return out

    def rest(self, last: int, upper: int, target: int, count: int) -> list[int]:
        """The uppers cutting ``(last, upper]`` (the rest of a range whose read stopped
        at ``last``): up to ``count`` ranges of the current width, then one to ``upper``."""
        out = self.plan(last, upper, target, count)
        if not out or out[-1] != upper:
            out.append(upper)
        return out

    def after_read(
        self, after: int | None, upper: int, read: int, first: int | None, last: int | None,
        limit: int,
    ) -> bool:
        """Take a range's read into account: ``read`` rows of ``(after, upper]`` under
        ``LIMIT limit``, the first at ``first``, the last at ``last``. True if the read
        stopped below ``upper`` (full): the range covers ``(after, last]`` only and its
        rest must be cut again (``rest``), at the density of the rows read (from the
        first to the last: a gap before them says nothing of the keys after them)."""
        full = read >= limit and last is not None and last < upper
        if full and first is not None and last is not None and last > first:
            self.observe(read - 1, last - first, full=True)
        elif after is not None:
            end = last if full and last is not None else upper
            self.observe(read, end - after, full=full)
        return full
