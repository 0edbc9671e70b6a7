"""Type mapping: the binlog path and the chunk reader give the same, expected values, on
MariaDB and on MySQL 5.7 (``server``/``db``: where the column names, signedness, charsets
and ENUM/SET members come from information_schema, and JSON is a binary type)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from pydblog.devtools.mariadb import MariaDB
from pydblog.devtools.mysql57 import TestServer
from pydblog.ports import SchemaChanged
from pydblog.sources.mysql.types import decode_time2, float32, time_text
from tests.mysql.helpers import changes, commits, make, read_until

COLUMNS = """
  id INT PRIMARY KEY,
  ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT,
  mu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
  d DECIMAL(20,6), d0 DECIMAL(30,0), f FLOAT, db DOUBLE, b1 BIT(1), b BIT(10), b64 BIT(64),
  dt DATE, tm TIME, tm3 TIME(3), tm6 TIME(6), dtt DATETIME, dtt6 DATETIME(6),
  ts TIMESTAMP NULL, ts3 TIMESTAMP(3) NULL, y YEAR,
  c CHAR(5), v VARCHAR(30), vl VARCHAR(30) CHARACTER SET latin1, tx TEXT, lt LONGTEXT,
  bn BINARY(4), vb VARBINARY(10), bl BLOB,
  e ENUM('a','b','c'), s SET('x','y','z'), j JSON
"""

ROWS: list[tuple[str, dict[str, Any]]] = [
    (
        "(1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295, "
        "-9223372036854775808, 18446744073709551615, -123.450000, 123456789012345678901234567890, "
        "1.1, 2.25, b'1', b'1010101010', b'1111111111111111111111111111111111111111111111111111111111111111', "
        "'2024-02-29', '-838:59:59', '-12:34:56.789', '-00:00:00.000001', '1000-01-01 00:00:00', "
        "'2024-01-02 03:04:05.123456', '2038-01-19 03:14:07', '1970-01-01 00:00:01.5', 2155, "
        "'ab', 'héllo ✓ 😀', 'Grüße', 'text', REPEAT('x', 70000), 'ab', x'00ff', x'deadbeef', "
        '\'c\', \'x,z\', \'{"a": [1, 2.5, "x", null, true], "b": {"c": "d"}}\')',
        {
            "id": 1,
            "ti": -128,
            "tu": 255,
            "si": -32768,
            "su": 65535,
            "mi": -8388608,
            "mu": 16777215,
            "i": -2147483648,
            "iu": 4294967295,
            "bi": -9223372036854775808,
            "bu": 18446744073709551615,
            "d": "-123.450000",
            "d0": "123456789012345678901234567890",
            "f": 1.1,
            "db": 2.25,
            "b1": 1,
            "b": 682,
            "b64": 2**64 - 1,
            "dt": "2024-02-29",
            "tm": "-838:59:59",
            "tm3": "-12:34:56.789000",
            "tm6": "-00:00:00.000001",
            "dtt": "1000-01-01T00:00:00",
            "dtt6": "2024-01-02T03:04:05.123456",
            "ts": "2038-01-19T03:14:07Z",
            "ts3": "1970-01-01T00:00:01.500000Z",
            "y": 2155,
            "c": "ab",
            "v": "héllo ✓ 😀",
            "vl": "Grüße",
            "tx": "text",
            "lt": "x" * 70000,
            "bn": "YWIAAA==",
            "vb": "AP8=",
            "bl": "3q2+7w==",
            "e": "c",
            "s": ["x", "z"],
            "j": {"a": [1, 2.5, "x", None, True], "b": {"c": "d"}},
        },
    ),
    (
        "(2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.000001, 0, -3.4e38, -1.7976931348623157e308, b'0', "
        "b'0', b'0', '1000-01-01', '00:00:00', '838:59:58.999', '12:00:00.5', "
        "'9999-12-31 23:59:59', '9999-12-31 23:59:59.999999', '2024-06-01 12:00:00', "
        "'2024-06-01 12:00:00.001', 1901, '', '', '', '', '', x'00000000', '', '', 'a', '', "
        "'[]')",
        {
            "id": 2,
            "ti": 0,
            "tu": 0,
            "si": 0,
            "su": 0,
            "mi": 0,
            "mu": 0,
            "i": 0,
            "iu": 0,
            "bi": 0,
            "bu": 0,
            "d": "0.000001",
            "d0": "0",
            "f": -3.4e38,
            "db": -1.7976931348623157e308,
            "b1": 0,
            "b": 0,
            "b64": 0,
            "dt": "1000-01-01",
            "tm": "00:00:00",
            "tm3": "838:59:58.999000",
            "tm6": "12:00:00.500000",
            "dtt": "9999-12-31T23:59:59",
            "dtt6": "9999-12-31T23:59:59.999999",
            "ts": "2024-06-01T12:00:00Z",
            "ts3": "2024-06-01T12:00:00.001000Z",
            "y": 1901,
            "c": "",
            "v": "",
            "vl": "",
            "tx": "",
            "lt": "",
            "bn": "AAAAAA==",
            "vb": "",
            "bl": "",
            "e": "a",
            "s": [],
            "j": [],
        },
    ),
    ("(3" + ", NULL" * 37 + ")", {"id": 3}),
]


def _expected(row: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {n: row.get(n) for n in names}


def test_binlog_and_chunks_map_every_type_the_same(server: TestServer, db: str) -> None:
    server.execute(f"CREATE TABLE types ({COLUMNS})", db)
    names = [r[0] for r in server.execute("SHOW COLUMNS FROM types", db)]
    src, reader = make(server, db)
    src.open(None)
    try:
        stream = src.stream()
        conn = server.connect(db)
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = 'STRICT_ALL_TABLES'")
            for values, _ in ROWS:
                cur.execute(f"INSERT INTO types VALUES {values}")
        conn.close()
        items = read_until(stream, commits(len(ROWS)))
        info = reader.table_info(f"{db}.types")
        assert info is not None and info.key == ("id",)
        chunk = reader.read_chunk(info, None, (3,), 10, None)
    finally:
        src.close()
        reader.close()
    from_binlog = [e.after for e in changes(items)]
    expected = [_expected(row, names) for _, row in ROWS]
    for got, want in zip(from_binlog, expected, strict=True):
        assert got == want
    assert chunk == expected
    schema = next(i.table_schema for i in items if isinstance(i, SchemaChanged))
    logical = {c.name: c.logical for c in schema.columns}
    assert logical["bu"] == "int64" and logical["iu"] == "int64" and logical["d"] == "decimal"
    assert logical["j"] == "json" and logical["s"] == "array<string>" and logical["bl"] == "bytes"
    assert logical["ts"] == "timestamptz" and logical["dtt"] == "timestamp"
    assert reader.table_schema(f"{db}.types") is not None


def test_update_carries_full_before_image(server: TestServer, db: str) -> None:
    server.execute(f"CREATE TABLE types ({COLUMNS})", db)
    server.execute(f"INSERT INTO types VALUES {ROWS[0][0]}", db)
    src, _ = make(server, db)
    src.open(None)
    try:
        stream = src.stream()
        server.execute("UPDATE types SET i = 5, s = '' WHERE id = 1", db)
        items = read_until(stream, commits(1))
    finally:
        src.close()
    (ev,) = changes(items)
    names = list(ROWS[0][1])
    assert ev.before == _expected(ROWS[0][1], names)
    assert ev.after == {**_expected(ROWS[0][1], names), "i": 5, "s": []}


@pytest.mark.parametrize(
    ("text", "fsp"),
    [
        ("-12:34:56.789123", 6),
        ("-00:00:00.000001", 6),
        ("-01:00:00.001", 3),
        ("-00:00:01.5", 1),
        ("838:59:59", 0),
        ("-838:59:59", 0),
        ("00:00:00.99", 2),
        ("-00:00:00.5", 4),
    ],
)
def test_time2_decoder(mariadb: MariaDB, text: str, fsp: int) -> None:
    """Our TIME2 decoder against the server's own packing (HEX of the binary form is not
    exposed, so compare the round trip through a binlog-free path: SELECT)."""
    (row,) = mariadb.execute(f"SELECT CAST('{text}' AS TIME({fsp}))")
    want = time_text(row[0])
    # pack like the server: intpart/frac with the offsets of my_time_packed_to_binary
    sign = -1 if row[0] < dt.timedelta(0) else 1
    micros = abs(row[0]) // dt.timedelta(microseconds=1)
    secs, us = divmod(micros, 1_000_000)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    packed = sign * ((((h << 12) | (m << 6) | s) << 24) + us)
    nbytes = {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3}[fsp]
    if fsp == 0:
        data = ((packed >> 24) + 0x800000).to_bytes(3, "big")
    elif fsp >= 5:
        data = (packed + 0x800000000000).to_bytes(6, "big")
    else:
        intpart, frac = packed >> 24, packed % (1 << 24)
        unit = 10_000 if nbytes == 1 else 100
        frac_units = frac // unit
        if intpart < 0 and frac_units:
            frac_units = (1 << (8 * nbytes)) - ((1 << 24) - frac) // unit
        data = (intpart + 0x800000).to_bytes(3, "big") + (
            frac_units % (1 << (8 * nbytes))
        ).to_bytes(nbytes, "big")
    assert time_text(decode_time2(data, fsp)) == want


def test_float32_shortest() -> None:
    assert float32(1.100000023841858) == 1.1
    assert float32(3.4027999387901484e38) == 3.4028e38
    assert float32(0.0) == 0.0


def _decode_both(server: MariaDB, db: str, file: str, pos: int) -> tuple[list[Any], list[Any]]:
    """The rows of the row events from ``(file, pos)``: (the library's own decoder,
    pydblog's: ``fastrows`` as installed)."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import (
        DeleteRowsEvent,
        RowsEvent,
        UpdateRowsEvent,
        WriteRowsEvent,
    )

    from pydblog.sources.mysql import fastrows

    def decode() -> list[Any]:
        settings = {"host": "127.0.0.1", "port": server.port, "user": "root", "password": "root"}
        reader = BinLogStreamReader(
            connection_settings=settings,
            server_id=4343,
            blocking=False,
            resume_stream=True,
            log_file=file,
            log_pos=pos,
            only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
            only_schemas=[db],
            enable_logging=False,
        )
        try:
            return [(type(event).__name__, row) for event in reader for row in event.rows]
        finally:
            reader.close()

    saved = RowsEvent._read_column_data, RowsEvent._fetch_rows
    try:
        RowsEvent._read_column_data = fastrows._ORIGINAL
        RowsEvent._fetch_rows = fastrows._ORIGINAL_FETCH
        library = decode()
        RowsEvent._read_column_data = fastrows._read_column_data
        RowsEvent._fetch_rows = fastrows._fetch_rows
        fast = decode()
    finally:
        RowsEvent._read_column_data, RowsEvent._fetch_rows = saved
    return library, fast


def _assert_same(library: list[Any], fast: list[Any]) -> None:
    """The same rows; a zero date's none_source is plain "null" in pydblog's decoder (its
    documented exception: the library says "out of date(time2) range")."""
    assert [k for k, _ in fast] == [k for k, _ in library]
    for (_, f), (_, lib) in zip(fast, library, strict=True):
        assert set(f) == set(lib)
        for part in lib:
            diff = {k: (f[part].get(k), v) for k, v in lib[part].items() if f[part].get(k) != v
                    and not (part.endswith("none_sources") and f[part].get(k) == "null"
                             and str(v).startswith("out of"))}
            assert not diff and set(f[part]) == set(lib[part]), (part, diff)


def test_fast_decoder_equals_the_library(mariadb: MariaDB, my_db: str) -> None:
    """pydblog's row decoder gives the library's values and none_sources, row by row."""
    mariadb.execute(f"CREATE TABLE types ({COLUMNS})", my_db)
    file, pos = mariadb.execute("SHOW MASTER STATUS")[0][:2]
    for values, _ in ROWS:
        mariadb.execute(f"INSERT INTO types VALUES {values}", my_db)
    mariadb.execute("UPDATE types SET i = i + 1, s = '', v = NULL", my_db)
    library, fast = _decode_both(mariadb, my_db, file, pos)
    assert len(library) == len(ROWS) * 2
    _assert_same(library, fast)


BUFFERED = """
  id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, mi MEDIUMINT, mu MEDIUMINT UNSIGNED,
  bi BIGINT, bu BIGINT UNSIGNED, d1 DECIMAL(5,2), d2 DECIMAL(20,6), d3 DECIMAL(30,0),
  d4 DECIMAL(10,10), d5 DECIMAL(65,30), f FLOAT, db DOUBLE, dt DATE, dtt DATETIME,
  dt1 DATETIME(1), dt3 DATETIME(3), dt6 DATETIME(6), ts TIMESTAMP NULL, ts2 TIMESTAMP(2) NULL,
  v VARCHAR(30), vl VARCHAR(300) CHARACTER SET latin1, tx TEXT, bl BLOB, vb VARBINARY(8),
  y YEAR, e ENUM('a', 'b', 'ü'), ch CHAR(5), cu CHAR(200) CHARACTER SET utf8mb4, bn BINARY(4)
"""


@pytest.mark.parametrize("path", ["buffer", "packet"])
def test_whole_event_decoding_equals_the_library(mariadb: MariaDB, my_db: str, path: str) -> None:
    """A table whose every column the readers decode: multi-row inserts, updates (before
    and after images) and deletes, extreme and negative values, every fraction
    precision, NULLs, a zero date, a YEAR 0, an invalid ENUM value (index 0), give the
    library's values and none_sources; decoded from one buffer (``fastrows._fetch_rows``),
    and row by row from the packet (``packet``: one more column, a TIME(3), which only
    the library decodes, keeps the table off the buffer path)."""
    extra = ", tm TIME(3) DEFAULT '-01:02:03.456'" if path == "packet" else ""
    mariadb.execute(f"CREATE TABLE buf ({BUFFERED}{extra})", my_db)
    mariadb.execute("SET SESSION sql_mode = ''", my_db)
    file, pos = mariadb.execute("SHOW MASTER STATUS")[0][:2]
    rows = [
        "(1, -128, 255, -8388608, 16777215, -9223372036854775808, 18446744073709551615, "
        "-999.99, -12345678901234.123456, 123456789012345678901234567890, -0.0000000001, "
        "-12345678901234567890123456789012345.123456789012345678901234567890, -1.5, 1e300, "
        "'1000-01-01', '1000-01-01 00:00:00', '2024-01-02 03:04:05.1', '2024-01-02 03:04:05.123', "
        "'9999-12-31 23:59:59.999999', '1970-01-01 00:00:01', '2038-01-19 03:14:07.99', "
        "'héllo ✓ 😀', 'Grüße', REPEAT('t', 300), x'00ff00', x'', 1901, 'ü', 'ab', REPEAT('é', 200), x'00ff')",
        "(2, 127, 0, 8388607, 0, 9223372036854775807, 0, 0.00, 0.000001, 0, 0.9999999999, "
        "0.000000000000000000000000000001, 0, -2.2250738585072014e-308, '2024-02-29', "
        "'2024-02-29 23:59:59', '2024-02-29 23:59:59.9', '0000-00-00 00:00:00.000', "
        "'2000-01-01 00:00:00.000001', NULL, NULL, '', '', '', '', NULL, 2155, 'x', '', '', x'')",
        "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
        "'0000-00-00', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL)",
    ]
    with mariadb.admin(my_db) as cur:
        cur.execute("SET SESSION sql_mode = ''")
        names = ", ".join(re.findall(r"(?:^|,)\s*([a-z]\w*)\s+[A-Z]", BUFFERED.strip()))
        cur.execute(f"INSERT INTO buf ({names}) VALUES {', '.join(rows)}")
        cur.execute("UPDATE buf SET d2 = -d2, dt6 = NULL, v = CONCAT(v, 'x'), ti = 1, e = 'a'")
        cur.execute("DELETE FROM buf WHERE id >= 2")
    library, fast = _decode_both(mariadb, my_db, file, pos)
    assert [k for k, _ in library] == ["WriteRowsEvent"] * 3 + ["UpdateRowsEvent"] * 3 + [
        "DeleteRowsEvent"] * 2
    _assert_same(library, fast)


def test_native_rows_equal_the_python_path(server: TestServer, db: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The same binlog read three times through the source, with the native rows decoder
    (``_myrow``) giving events, giving encoded runs (``RowRun``, as the capture reads),
    and without it: the change events (inserts of extreme values, NULLs and zero dates,
    updates with before images, a key change, deletes) are equal, types included; the
    table went the native way only in the first two reads; the runs held every insert,
    every update that kept its key and every delete, the key change came as events; the
    rows events after the first were read past the library (``rawrows``) when encoding."""
    from pydblog.events import RowRun
    from pydblog.ports import Checkpoint
    from pydblog.sources.mysql import native
    from pydblog.sources.mysql.position import BinlogPosition
    from pydblog.sources.mysql.rawrows import RawRows, TableMap
    from tests.unit.test_native_binlog import typed

    if native.module() is None:
        pytest.skip("native binlog decoder not built")
    server.execute(f"CREATE TABLE buf ({BUFFERED})", db)
    file, pos = server.execute("SHOW MASTER STATUS")[0][:2]
    names = ", ".join(re.findall(r"(?:^|,)\s*([a-z]\w*)\s+[A-Z]", BUFFERED.strip()))
    conn = server.connect(db)
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(f"INSERT INTO buf ({names}) VALUES {', '.join(NATIVE_ROWS)}")
        cur.execute("UPDATE buf SET d2 = -d2, dt6 = NULL, v = CONCAT(v, 'x'), ti = 1, e = 'a'")
        cur.execute("UPDATE buf SET id = id + 10 WHERE id = 1")
        cur.execute("DELETE FROM buf WHERE id = 2")
    conn.commit()
    conn.close()

    runs: list[Any] = []
    raw: list[Any] = []  # the events read past the library (``rawrows``)

    def read(enabled: bool, run_rows: int = 0) -> tuple[list[Any], list[Any]]:
        monkeypatch.setenv(native.DISABLE_ENV, "1" if enabled else "0")
        native.reset()
        src, _ = make(server, db)
        src.run_rows = run_rows
        fetch = src._raw_rows

        def spy() -> Any:
            found = fetch()
            if found is not None:
                raw.append(found)
            return found

        src._raw_rows = spy  # type: ignore[method-assign]
        src.open(Checkpoint(BinlogPosition(str(file), int(pos), -1)))
        try:
            items = read_until(src.stream(), commits(4))
            plans = [m.native for m in src._rows.mappers.values() if m.kind == "captured"]
        finally:
            src.close()
            native.reset()
        runs.extend(i for i in items if type(i) is RowRun)
        flat = [e for i in items for e in (i.events() if type(i) is RowRun else [i])]
        events = [(e.op, e.key, e.before, e.after, e.position) for e in changes(flat)]
        return events, plans

    fast, fast_plans = read(True)
    slow, slow_plans = read(False)
    encoded, _ = read(True, run_rows=2)
    assert fast_plans and all(p is not None for p in fast_plans)
    assert slow_plans and all(p is None for p in slow_plans)
    assert len(fast) == 3 + 3 + 2 + 1
    assert typed(fast) == typed(slow) == typed(encoded)
    # 3 inserts (runs of at most 2), 3 updates, the key change's rows as events, 1 delete
    assert [(r.op.value, r.size) for r in runs] == [("c", 2), ("c", 1), ("u", 2), ("u", 1),
                                                     ("d", 1)]
    # Each statement's TABLE_MAP is of the same table: the ones after the first were not
    # read again and their rows events were read past the library, in the encoded read only.
    assert [r.kind for r in raw if type(r) is RawRows] == [1, 1, 2]
    assert sum(type(r) is TableMap for r in raw) == 3


NATIVE_ROWS = [
    "(1, -128, 255, -8388608, 16777215, -9223372036854775808, 18446744073709551615, "
    "-999.99, -12345678901234.123456, 123456789012345678901234567890, -0.0000000001, "
    "-12345678901234567890123456789012345.123456789012345678901234567890, -1.5, 1e300, "
    "'1000-01-01', '1000-01-01 00:00:00', '2024-01-02 03:04:05.1', '2024-01-02 03:04:05.123', "
    "'9999-12-31 23:59:59.999999', '1970-01-01 00:00:01', '2038-01-19 03:14:07.99', "
    "'héllo ✓ 😀', 'Grüße', REPEAT('t', 300), x'00ff00', x'', 1901, 'ü', 'ab', REPEAT('é', 200), x'00ff')",
    "(2, 127, 0, 8388607, 0, 9223372036854775807, 0, 0.00, 0.000001, 0, 0.9999999999, "
    "0.000000000000000000000000000001, 0.1, -2.2250738585072014e-308, '2024-02-29', "
    "'2024-02-29 23:59:59', '2024-02-29 23:59:59.9', '0000-00-00 00:00:00.000', "
    "'2000-01-01 00:00:00.000001', NULL, NULL, '', '', '', '', NULL, 2155, 'x', '', '', x'')",
    "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "'0000-00-00', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL)",
]
