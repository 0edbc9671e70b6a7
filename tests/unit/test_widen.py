"""The sinks' in-place column widening rule (``spark/sinks/widen.py``)."""

from __future__ import annotations

import pytest

from pydblog.spark.sinks.widen import widens


@pytest.mark.parametrize("have, want", [
    ("integer", "bigint"), ("smallint", "integer"), ("int(11)", "BIGINT"), ("INT", "BIGINT"),
    ("smallint", "double precision"), ("real", "double precision"), ("FLOAT", "DOUBLE"),
    ("integer", "numeric"), ("bigint", "numeric(20,0)"), ("numeric(10,2)", "numeric(20,4)"),
    ("decimal(10,2)", "DECIMAL(12,2)"), ("numeric(10,2)", "numeric"), ("tinyint", "mediumint"),
])
def test_widens(have: str, want: str) -> None:
    assert widens(have, want)


@pytest.mark.parametrize("have, want", [
    ("bigint", "integer"), ("bigint", "double precision"), ("integer", "integer"),
    ("int(11)", "INT"), ("numeric(10,2)", "numeric(10,3)"), ("numeric(10,2)", "numeric(11,1)"),
    ("numeric", "numeric(38,10)"), ("int unsigned", "bigint"), ("integer", "bigint unsigned"),
    ("text", "bigint"), ("integer", "text"), ("bigint", "numeric(18,0)"), ("double", "numeric"),
])
def test_does_not_widen(have: str, want: str) -> None:
    assert not widens(have, want)
