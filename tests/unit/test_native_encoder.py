"""The native chunk encoder without a server: COPY text rows in, key lines and tails out;
values of an unknown form refused (the chunk then takes the SQL path); a missing or
disabled extension is a log line and the SQL path, never an error. (Byte equality with
PostgreSQL's own JSON texts: tests/integration/test_pg_native_chunks.py.)"""

from __future__ import annotations

import logging
import sys

import pytest

from pydblog.sources import postgres
from pydblog.sources.postgres import native

enc = native.encoder()
needs_encoder = pytest.mark.skipif(enc is None, reason="native encoder not built")


def _encode(text: bytes, codes: list[int], pieces: list[str | int], key_raw: bool = True) -> tuple[object, ...]:
    spec = native.build_spec(codes, [0], [key_raw], pieces)
    result: tuple[object, ...] = enc.encode(text, spec.types, spec.keys, spec.tail)
    return result


@needs_encoder
def test_rows_become_key_lines_and_tails() -> None:
    pieces: list[str | int] = ['{"id":', 0, '},"x":{"id":', 0, ',"t":', 1, ',"z":', 2, "}}"]
    codes = [native.RAW, native.ESCAPE, native.TSTZ]
    text = (b"1\ta\\tb\\\\c\"\x01\t2024-01-02 03:04:05.5+00\n"
            b"2\t\\N\tinfinity\n"
            b"3\t\xc3\xbc\t2024-01-02 03:04:05+00\n")
    count, keys, tails = _encode(text, codes, pieces)
    assert count == 3
    assert keys == "1\n2\n3"
    assert str(tails).split("\n") == [
        '{"id":1},"x":{"id":1,"t":"a\\tb\\\\c\\"\\u0001","z":"2024-01-02T03:04:05.500000Z"}}',
        '{"id":2},"x":{"id":2,"t":null,"z":"infinity"}}',
        '{"id":3},"x":{"id":3,"t":"ü","z":"2024-01-02T03:04:05Z"}}',
    ]


@needs_encoder
@pytest.mark.parametrize(("code", "field", "want"), [
    (native.BOOL, b"t", "true"), (native.BPCHAR, b"ab  ", '"ab"'), (native.FLOAT, b"-Infinity", '"-Infinity"'),
    (native.FLOAT, b"1.5e-07", "1.5e-07"), (native.TS, b"0044-03-15 00:00:00 BC", '"0044-03-15 00:00:00 BC"'),
    (native.TS, b"2024-01-02 03:04:05.000001", '"2024-01-02T03:04:05.000001"'),
    (native.TIME, b"12:00:00.5", '"12:00:00.500000"'), (native.BYTEA, b"\\\\x00ff10", '"AP8Q"'),
    (native.BYTEA, b"\\\\x", '""'), (native.JSON, b'{"a":\\n 1}', '{"a":  1}'),
    (native.JSONB, b'{"a": "x\\\\"y"}', '{"a": "x\\"y"}'), (native.QUOTE, b"NaN", '"NaN"'),
])
def test_each_type(code: int, field: bytes, want: str) -> None:
    _, _, tails = _encode(b"1\t" + field + b"\n", [native.RAW, code], ["[", 1, "]"])
    assert tails == f"[{want}]"


@needs_encoder
@pytest.mark.parametrize(("code", "field"), [
    (native.TSTZ, b"2024-01-02 03:04:05+05:30"),  # a session not in UTC
    (native.BOOL, b"yes"),
    (native.BYTEA, b"\\\\001"),  # escape format, not hex
])
def test_unknown_forms_are_refused(code: int, field: bytes) -> None:
    result = _encode(b"1\t" + field + b"\n", [native.RAW, code], ["[", 1, "]"])
    assert result[:3] == (None, None, None) and result[3] == "a value of an unexpected form"


@needs_encoder
def test_a_row_with_the_wrong_number_of_fields_is_refused() -> None:
    result = _encode(b"1\tx\ty\n", [native.RAW, native.ESCAPE], ["[", 1, "]"])
    assert result[3] == "more fields than columns"


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(native, "_state", "unloaded")
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    with caplog.at_level(logging.INFO, logger=native.__name__):
        assert native.encoder() is None
    assert "SQL path" in caplog.text


def test_missing_extension_is_a_log_line(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(native, "_state", "unloaded")
    monkeypatch.delenv(native.DISABLE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "pydblog.sources.postgres._copyenc", None)  # import fails
    monkeypatch.delattr(postgres, "_copyenc", raising=False)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.encoder() is None
        assert native.encoder() is None  # once
    assert caplog.text.count("native chunk encoder not built") == 1


@needs_encoder
@pytest.mark.parametrize("block_rows", [1, 2, 3, 7, 8])
def test_tails_cut_into_blocks(block_rows: int) -> None:
    """With ``block_rows`` the tails come as a list of texts of that many rows (the
    last one 1 to ``block_rows``): the same lines as the joined form, none empty."""
    spec = native.build_spec([native.RAW, native.ESCAPE], [0], [True], ['{"id":', 0, '},"t":', 1, "}"])
    text = b"".join(b"%d\tx%d\n" % (i, i) for i in range(7))
    count, keys, joined = enc.encode(text, spec.types, spec.keys, spec.tail)
    count2, keys2, blocks = enc.encode(text, spec.types, spec.keys, spec.tail, block_rows)
    assert (count2, keys2) == (count, keys) == (7, "0\n1\n2\n3\n4\n5\n6")
    assert isinstance(blocks, list)
    assert [b.count("\n") + 1 for b in blocks] == [min(block_rows, 7 - a) for a in range(0, 7, block_rows)]
    assert "\n".join(blocks) == joined
    assert enc.encode(b"", spec.types, spec.keys, spec.tail, block_rows) == (0, "", [])


def test_type_code_resolves_domains_and_enums_through_the_registry() -> None:
    """``type_code`` asks ``TypeRegistry.base_oid`` (a public method, no private
    attribute of the registry or of psycopg): a domain (of a domain) encodes as its
    base type, an enum as text, an unknown or array type keeps the SQL path."""
    from pydblog.sources.postgres import types as t

    reg = t.TypeRegistry([
        t.PgTypeInfo(t.INT4, "integer", "b", 0, "N", 0),
        t.PgTypeInfo(t.TEXT, "text", "b", 0, "S", 0),
        t.PgTypeInfo(90001, "public.small", "d", 0, "N", t.INT4, "public", "small"),
        t.PgTypeInfo(90002, "public.tiny", "d", 0, "N", 90001, "public", "tiny"),
        t.PgTypeInfo(90003, "public.mood", "e", 0, "E", 0, "public", "mood"),
        t.PgTypeInfo(90004, "integer[]", "b", t.INT4, "A", 0),
    ])
    assert reg.base_oid(90002) == t.INT4
    assert native.type_code(reg, 90002) == native.type_code(reg, t.INT4) == native.RAW
    assert native.type_code(reg, 90003) == native.ESCAPE
    assert native.type_code(reg, 90004) is None
    assert native.type_code(reg, 123456789) is None
