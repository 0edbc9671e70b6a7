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


def test_rows_of_a_table_without_key_compare_as_distinct_rows() -> None:
    """Equal rows cannot be told apart (a mirror keeps one): only distinct rows count;
    JSON values (unhashable as parsed) compare by their canonical text."""
    from pydblog.verifier.ranges import diff_distinct

    src = [(1, {"b": 2, "a": 1}), (1, {"a": 1, "b": 2}), (2, None), (3, [1, 2])]
    same = [(3, [1, 2]), (2, None), (1, {"a": 1, "b": 2})]
    d = diff_distinct(src, same)
    assert not d
    d = diff_distinct(src, [(2, None), (9, {"x": 1})])
    assert d.missing == [(1, '{"a":1,"b":2}'), (3, "[1,2]")]
    assert d.extra == [(9, '{"x":1}')]


def test_frozen_keys_are_hashable_and_canonical() -> None:
    from pydblog.core.repair import freeze

    a = freeze([1, {"b": [2], "a": None}, "x", None])
    b = freeze((1, {"a": None, "b": [2]}, "x", None))
    assert a == b and hash(a) == hash(b) and a[1] == '{"a":null,"b":[2]}'


def test_repairs_body_takes_a_surrogate_key_for_whole_tables_only() -> None:
    import pytest

    from pydblog.api.capture import repair_signal_data
    from pydblog.config import Config
    from pydblog.errors import SignalError

    cfg = Config.model_validate({"source": {"type": "postgres", "dsn": "postgresql://u@h/db"}})
    data = repair_signal_data(cfg, b'{"tables": ["public\\\\.bag"], "surrogate-key": "a"}')
    assert data["surrogate-key"] == "a"
    assert data["repair"] == [{"data-collection": "public\\.bag", "ranges": None}]
    for bad in (b'{"tables": ["t"], "surrogate-key": 3}',
                b'{"ranges": {"public.t": [{"lo": null, "hi": null}]}, "surrogate-key": "a"}',
                b'{"surrogate-key": "a"}'):
        with pytest.raises(SignalError):
            repair_signal_data(cfg, bad)
