"""Normalized values of ``dblog verify``'s row comparison."""

from __future__ import annotations

from pydblog.verifier.ranges import diff_rows, value


def test_nan_rows_compare_equal() -> None:
    """A NaN on both sides is the same value (as in PostgreSQL, where NaN = NaN), not a
    difference: every NaN normalizes to one object, which tuples compare as equal."""
    src = {(1,): (value("float32", "NaN"), value("float64", float("nan")))}
    mirror = {(1,): (value("float32", float("nan")), value("float64", "NaN"))}
    assert not diff_rows(src, mirror)
    assert diff_rows(src, {(1,): (value("float32", 1.0), value("float64", "NaN"))}).different == [(1,)]
