"""Signal parsing: Debezium-compatible data, every error a clear ``SignalError``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pydblog.core.signals import (
    AdditionalCondition,
    Signal,
    SignalType,
    match_tables,
    parse_signal,
    parse_signal_row,
)
from pydblog.errors import SignalError
from pydblog.events import SnapshotKind


def data(**fields: Any) -> str:
    return json.dumps({k.replace("_", "-"): v for k, v in fields.items()})


def test_execute_minimal_defaults_to_incremental() -> None:
    s = parse_signal("1", "execute-snapshot", data(data_collections=["public\\.orders"]))
    assert s == Signal("1", SignalType.EXECUTE_SNAPSHOT, ("public\\.orders",))
    assert s.snapshot_type is SnapshotKind.INCREMENTAL
    assert s.additional_conditions == ()
    assert s.surrogate_key is None


def test_execute_full() -> None:
    s = parse_signal(
        "x",
        "execute-snapshot",
        data(
            data_collections=["public\\..*", "app\\.t"],
            type="BLOCKING",
            additional_conditions=[
                {"data-collection": "public\\.orders", "filter": " status = 'open' "}
            ],
            surrogate_key="created_id",
        ),
    )
    assert s.data_collections == ("public\\..*", "app\\.t")
    assert s.snapshot_type is SnapshotKind.BLOCKING
    assert s.additional_conditions == (AdditionalCondition("public\\.orders", "status = 'open'"),)
    assert s.additional_conditions[0] == ("public\\.orders", "status = 'open'")
    assert s.surrogate_key == "created_id"


def test_condition_for_combines_matching_filters() -> None:
    s = parse_signal(
        "x",
        "execute-snapshot",
        data(
            data_collections=["public\\..*"],
            additional_conditions=[
                {"data-collection": "public\\..*", "filter": "a > 1"},
                {"data-collection": "public\\.orders", "filter": "b = 2"},
            ],
        ),
    )
    assert s.condition_for("public.orders") == "(a > 1) AND (b = 2)"
    assert s.condition_for("public.items") == "a > 1"
    assert s.condition_for("other.items") is None


@pytest.mark.parametrize("type_", ["stop-snapshot", "pause-snapshot", "resume-snapshot"])
@pytest.mark.parametrize("raw", [None, "", "  ", "null", "{}"])
def test_data_optional_for_stop_pause_resume(type_: str, raw: str | None) -> None:
    s = parse_signal("7", type_, raw)
    assert s.type == SignalType(type_)
    assert s.data_collections == ()


def test_stop_some_collections() -> None:
    s = parse_signal("s", "stop-snapshot", data(data_collections=["a\\.b"], type="incremental"))
    assert s.data_collections == ("a\\.b",)


def test_parse_row() -> None:
    row = {"id": "r1", "type": "pause-snapshot", "data": None}
    assert parse_signal_row(row).type is SignalType.PAUSE_SNAPSHOT


@pytest.mark.parametrize(
    ("type_", "raw", "needle"),
    [
        ("snapshot-now", "{}", "unknown signal type 'snapshot-now'"),
        ("log", "{}", "unknown signal type"),
        ("execute-snapshot", "{not json", "not valid JSON"),
        ("execute-snapshot", "[1, 2]", "must be a JSON object, not an array"),
        ("execute-snapshot", '"text"', "must be a JSON object, not a string"),
        ("execute-snapshot", None, "'data-collections' is required"),
        ("execute-snapshot", "{}", "'data-collections' is required"),
        ("execute-snapshot", data(data_collections=[]), "is empty"),
        ("execute-snapshot", data(data_collections="public.t"), "must be an array of strings"),
        ("execute-snapshot", data(data_collections=[1]), "data-collections[0] must be a non-empty"),
        (
            "execute-snapshot",
            data(data_collections=[""]),
            "data-collections[0] must be a non-empty",
        ),
        ("execute-snapshot", data(data_collections=["a("]), "not a valid regular expression"),
        ("execute-snapshot", data(data_collections=["a"], type="full"), "'type' must be"),
        ("execute-snapshot", data(data_collections=["a"], type=1), "'type' must be"),
        ("execute-snapshot", data(data_collections=["a"], surrogate_key=3), "'surrogate-key'"),
        ("execute-snapshot", data(data_collections=["a"], surrogate_key=" "), "'surrogate-key'"),
        (
            "execute-snapshot",
            data(data_collections=["a"], additional_conditions={"x": 1}),
            "'additional-conditions' must be an array of objects, not an object",
        ),
        (
            "execute-snapshot",
            data(data_collections=["a"], additional_conditions=["x"]),
            "additional-conditions[0] must be an object",
        ),
        (
            "execute-snapshot",
            data(data_collections=["a"], additional_conditions=[{"filter": "x=1"}]),
            "additional-conditions[0].data-collection must be a non-empty string",
        ),
        (
            "execute-snapshot",
            data(
                data_collections=["a"],
                additional_conditions=[{"data-collection": "[", "filter": "x"}],
            ),
            "additional-conditions[0].data-collection '[' is not a valid regular expression",
        ),
        (
            "execute-snapshot",
            data(data_collections=["a"], additional_conditions=[{"data-collection": "a"}]),
            "additional-conditions[0].filter must be a non-empty SQL",
        ),
        (
            "execute-snapshot",
            data(
                data_collections=["a"],
                additional_conditions=[{"data-collection": "a", "filter": "x", "y": 1}],
            ),
            "additional-conditions[0] has unknown field(s) y",
        ),
        ("execute-snapshot", data(data_collection=["a"]), "unknown field(s) data-collection"),
        ("pause-snapshot", data(data_collections=["a"]), "unknown field(s) data-collections"),
        ("stop-snapshot", data(data_collections=["("]), "not a valid regular expression"),
    ],
)
def test_errors_are_clear(type_: str, raw: str | None, needle: str) -> None:
    with pytest.raises(SignalError) as info:
        parse_signal("sig-9", type_, raw)
    message = str(info.value)
    assert needle in message
    assert "sig-9" in message or "unknown signal type" in message


def test_error_carries_hint() -> None:
    with pytest.raises(SignalError) as info:
        parse_signal("1", "bogus", None)
    assert info.value.hint is not None and "execute-snapshot" in info.value.hint
    assert not info.value.retriable


@pytest.mark.parametrize(
    "row",
    [
        {"id": 1, "type": "pause-snapshot"},
        {"id": "1", "type": None},
        {"id": "1", "type": "x", "data": 5},
    ],
)
def test_bad_rows(row: dict[str, Any]) -> None:
    with pytest.raises(SignalError):
        parse_signal_row(row)


def test_match_tables_fullmatch_order_and_duplicates() -> None:
    tables = ["public.a", "public.ab", "app.a", "public.b"]
    matched, unknown = match_tables(["public\\.a", "public\\..*", "nope\\..*", "a"], tables)
    assert matched == ["public.a", "public.ab", "public.b"]
    assert unknown == ["nope\\..*", "a"]
