"""A chunk reader's DATE, DATETIME, TIMESTAMP and DECIMAL values arrive as the server's
text (``connect(text_values=True)``): the mapping of that text equals the object path's
(pymysql's converter, then the ``*_text`` formatting, a zero or invalid date None) for
every text, plain or odd, and the mapping still takes pymysql's objects."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pymysql import converters

from pydblog.sources.mysql.types import (
    ColumnType,
    date_text,
    datetime_text,
    decimal_text,
    select_column,
    timestamp_text,
)

OLD = {"date": (converters.convert_date, date_text),
       "datetime": (converters.convert_datetime, datetime_text),
       "timestamp": (converters.convert_datetime, timestamp_text)}


def _conv(data_type: str) -> Any:
    col = ColumnType("c", data_type, data_type, True, False)
    conv = select_column(col)[1]
    assert conv is not None
    return conv


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # (text no server sends: both paths must fail alike)
        return ("error", type(exc))


def _old(data_type: str, text: str) -> Any:
    convert, fmt = OLD[data_type]
    value = convert(text)
    return None if isinstance(value, str | bytes) else fmt(value)


fraction = st.text("0123456789", min_size=1, max_size=7)
datetimes = st.one_of(
    st.datetimes(min_value=dt.datetime(1, 1, 1)).map(lambda d: d.isoformat(" ")),
    st.tuples(st.integers(0, 10000), st.integers(0, 13), st.integers(0, 32), st.integers(0, 25),
              st.integers(0, 61), st.integers(0, 61), st.none() | fraction).map(
        lambda t: f"{t[0]:04d}-{t[1]:02d}-{t[2]:02d} {t[3]:02d}:{t[4]:02d}:{t[5]:02d}"
        + ("" if t[6] is None else "." + t[6])),
    st.sampled_from(["0000-00-00 00:00:00", "2024-02-29 00:00:00", "2023-02-29 00:00:00",
                     "1900-02-29 01:02:03", "2000-02-29 01:02:03.5", "2100-02-29 00:00:00",
                     "2023-04-31 00:00:00", "2023-04-30 23:59:59", "2023-12-31 00:00:00.000001",
                     "2024-01-01 00:00:00.000000", "2024-01-01 00:00:00.", "2024-01-01T00:00:00",
                     "2024-01-01", "", "9999-12-31 23:59:59.999999", "1-01-01 00:00:00"]),
    st.text(max_size=30),
)
dates = st.one_of(
    st.dates().map(lambda d: d.isoformat()),
    st.tuples(st.integers(0, 10000), st.integers(0, 13), st.integers(0, 32)).map(
        lambda t: f"{t[0]:04d}-{t[1]:02d}-{t[2]:02d}"),
    st.sampled_from(["0000-00-00", "2024-02-29", "2023-02-29", "1900-02-29", "2000-02-29",
                     "2100-02-29", "2023-06-31", "2023-07-31", "2024-1-1", "",
                     "2024-01-01 00:00:00"]),
    st.text(max_size=12),
)


@settings(max_examples=500, deadline=None)
@given(datetimes)
def test_datetime_and_timestamp_text(text: str) -> None:
    for t in ("datetime", "timestamp"):
        assert _outcome(_conv(t), text) == _outcome(_old, t, text), (t, text)


@settings(max_examples=500, deadline=None)
@given(dates)
def test_date_text(text: str) -> None:
    assert _outcome(_conv("date"), text) == _outcome(_old, "date", text)


@settings(max_examples=300, deadline=None)
@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_decimal_text(value: Decimal) -> None:
    for text in (format(value, "f"), str(value)):
        assert _conv("decimal")(text) == decimal_text(Decimal(text))
    assert _conv("decimal")(value) == decimal_text(value)


@given(st.datetimes(min_value=dt.datetime(1, 1, 1)), st.dates())
def test_objects_map_as_before(when: dt.datetime, day: dt.date) -> None:
    assert _conv("datetime")(when) == datetime_text(when)
    assert _conv("timestamp")(when) == timestamp_text(when)
    assert _conv("date")(day) == date_text(day)
    assert _conv("date")("0000-00-00") is None


MAPPED = ["int", "varchar", "decimal", "date", "datetime", "timestamp", "bit", "time"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(MAPPED), min_size=1, max_size=8).flatmap(
    lambda types: st.tuples(st.just(types), st.lists(st.tuples(*[
        st.none() | {"int": st.integers(), "varchar": st.text(max_size=5),
                     "decimal": st.decimals(allow_nan=False, allow_infinity=False).map(str),
                     "date": dates, "datetime": datetimes, "timestamp": datetimes,
                     "bit": st.integers(0, 9).map(str),
                     "time": st.just(dt.timedelta(seconds=5))}[t]
        for t in types]), max_size=5))))
def test_map_rows_equals_map(case: tuple[list[str], list[tuple[Any, ...]]]) -> None:
    """``SelectMapper.map_rows`` (C, ``_mytext``) gives ``map`` of each row, errors alike."""
    from pydblog.sources.mysql import textrows
    from pydblog.sources.mysql.types import SelectMapper

    types, rows = case
    mapper = SelectMapper.build([ColumnType(f"c{i}", t, t, True, False) for i, t in enumerate(types)])
    if textrows.module() is None:
        return
    assert _outcome(mapper.map_rows, rows) == _outcome(lambda rs: [mapper.map(r) for r in rs], rows)
