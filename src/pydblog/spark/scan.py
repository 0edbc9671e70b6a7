"""The envelope scanner: one compiled pass over a batch of change-log bodies that finds
the mirror fields (``decode.decode_fast``'s fast path) without a regex or a JSON parse.

Compiled with numba (``pip install 'pydblog[spark]'``) on first use and cached beside
this file (or in numba's user cache); a process loads the machine code instead of
compiling again.

What it accepts is exactly the *strict form* ``decode.decode_fast`` documents (orjson's
compact envelope whose ``source``, ``key`` and ``before`` are flat objects and whose
schema/table names need no unescaping), decided per body by a deterministic parse of
the same grammar:

    {["offset":N,]"op":"[cudrt]","ts_ms":INT,"source":{"connector":(S|null),
     "db":(S|null),"schema":NAME,"table":NAME<flat>},"key":(FLAT|null),
     "before":(null|FLAT),"after":<tail>

where the part before the body's *first* ``,"after":`` must be everything up to
``before`` (so no key or before field named ``after`` is taken for the envelope's), and
the tail is ``null}``, ``{..}}`` or ``{..},"unchanged":[S,..]}``. S is a JSON string
(no raw control character; a backslash escapes the next character, not a newline),
NAME a string without escapes, FLAT an object holding no ``{``, ``}``, ``[`` or ``]``
outside strings, INT ``-?(0|[1-9][0-9]{0,17})`` (an int64). A body of any other form is
reported not ok and takes the full decode. Byte-level: the input is valid UTF-8 (an
Arrow string array), whose multi-byte sequences hold no ASCII byte.

Invariants: spans are absolute positions in the data buffer, ``start <= end``; a row
not ok has no meaningful field; same input, same output (no state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from pydblog.errors import ChangeLogError

njit: Any
try:
    from numba import njit
except ImportError:  # pragma: no cover - the spark extra installs it
    njit = None

F = TypeVar("F", bound=Callable[..., Any])


def _jit(fn: F) -> F:
    """Compiled (``nogil``: Arrow-style, other threads run meanwhile), cached on disk;
    without numba the plain function (``scan`` refuses to run it)."""
    if njit is None:
        return fn
    jitted: F = njit(cache=True, nogil=True, boundscheck=False)(fn)
    return jitted

# -- field indexes of the scanner's int64 output (one row per body) --------------------
OK, OFFSET, OP, TS, SCHEMA_A, SCHEMA_B, TABLE_A, TABLE_B, KEY_A, KEY_B, AFTER_A, AFTER_B, \
    UNCH_A, UNCH_B, SRC_TS_OK, SRC_TS = range(16)
FIELDS = 16
"""``OK``: 1 if the body has the strict form. ``OFFSET``: the ``offset`` field (own
offsets). ``OP``: the op's byte. ``TS``: ``ts_ms``. ``*_A``/``*_B``: the span of the
schema name, table name (without quotes), key text (``KEY_A = -1``: ``null``), after
text (``AFTER_A = -1``: ``null``) and the unchanged list text ``[..]`` (``UNCH_A = -1``:
none). ``SRC_TS_OK``: 1 if the source object's members after ``table`` hold
``"ts_ms":INT`` (its first such member, followed by ``,`` or ``}``), whose value is
``SRC_TS``; 0: the caller reads it from the parsed body (absent, or another form)."""

_AFTER = np.frombuffer(b',"after":', np.uint8)
_UNCH = np.frombuffer(b',"unchanged":[', np.uint8)
_P_OFFSET = np.frombuffer(b'{"offset":', np.uint8)
_P_OP = np.frombuffer(b'"op":"', np.uint8)
_P_TS = np.frombuffer(b'","ts_ms":', np.uint8)
_P_SOURCE = np.frombuffer(b',"source":{"connector":', np.uint8)
_P_DB = np.frombuffer(b',"db":', np.uint8)
_P_SCHEMA = np.frombuffer(b',"schema":', np.uint8)
_P_TABLE = np.frombuffer(b',"table":', np.uint8)
_P_KEY = np.frombuffer(b',"key":', np.uint8)
_P_BEFORE = np.frombuffer(b',"before":', np.uint8)
_P_SRC_TS = np.frombuffer(b',"ts_ms":', np.uint8)
_P_NULL = np.frombuffer(b"null", np.uint8)


def _missing() -> ChangeLogError:
    return ChangeLogError(
        "dblog sync needs numba to decode the change log (not installed)",
        hint="pip install 'pydblog[spark]'",
    )


@_jit
def lit(d: Any, i: int, end: int, p: np.ndarray) -> int:
    """``i + len(p)`` if ``d[i:end]`` starts with ``p``, else -1."""
    m: int = p.shape[0]
    if i < 0 or i + m > end:
        return -1
    for k in range(m):
        if d[i + k] != p[k]:
            return -1
    return i + m


@_jit
def string(d: Any, i: int, end: int, plain: bool) -> int:
    """The position after the JSON string at ``i`` (``plain``: no escapes), or -1."""
    if i < 0 or i >= end or d[i] != 34:  # "
        return -1
    i += 1
    while i < end:
        c = d[i]
        if c == 34:
            return i + 1
        if c < 32:
            return -1
        if c == 92:  # backslash: escapes the next character (RE2's '.': not \n)
            if plain or i + 1 >= end or d[i + 1] == 10:
                return -1
            i += 2
            continue
        i += 1
    return -1


@_jit
def flat_rest(d: Any, i: int, end: int) -> int:
    """Skip ``(?:[^{}\\[\\]"]|S)*``: the position of the first bracket outside a
    string, or -1 (a bad string, or none before ``end``)."""
    while i < end:
        c = d[i]
        if c == 34:
            i = string(d, i, end, False)
            if i < 0:
                return -1
        elif c == 123 or c == 125 or c == 91 or c == 93:
            return i
        else:
            i += 1
    return -1


@_jit
def flat(d: Any, i: int, end: int) -> int:
    """The position after the flat object at ``i``, or -1."""
    if i < 0 or i >= end or d[i] != 123:
        return -1
    j = flat_rest(d, i + 1, end)
    if j < 0 or d[j] != 125:
        return -1
    return j + 1


@_jit
def integer(d: Any, i: int, end: int, signed: bool, out: Any, row: int, col: int) -> int:
    """``-?(0|[1-9][0-9]{0,17})`` at ``i`` into ``out[row, col]``; the position after."""
    neg = False
    if signed and i < end and d[i] == 45:
        neg = True
        i += 1
    if i >= end or d[i] < 48 or d[i] > 57:
        return -1
    v = 0
    if d[i] == 48:
        i += 1
    else:
        k = 0
        while i < end and 48 <= d[i] <= 57:
            if k == 18:
                return -1
            v = v * 10 + (d[i] - 48)
            i += 1
            k += 1
    out[col, row] = -v if neg else v
    return i


@_jit
def string_or_null(d: Any, i: int, end: int) -> int:
    j = lit(d, i, end, _P_NULL)
    return j if j >= 0 else string(d, i, end, False)


@_jit
def find(d: Any, i: int, end: int, p: np.ndarray) -> int:
    """The first position of ``p`` in ``d[i:end]``, or -1."""
    m = p.shape[0]
    first = p[0]
    last = end - m
    while i <= last:
        if d[i] == first:
            k = 1
            while k < m and d[i + k] == p[k]:
                k += 1
            if k == m:
                return i
        i += 1
    return -1


@_jit
def _scan(data: Any, offsets: Any, own_offsets: bool) -> Any:
    n = offsets.shape[0] - 1
    out = np.zeros((16, n), np.int64)
    for row in range(n):
        s = offsets[row]
        e = offsets[row + 1]
        p = find(data, s, e, _AFTER)  # the first ,"after":
        if p < 0:
            continue
        if own_offsets:
            i = lit(data, s, p, _P_OFFSET)
            i = integer(data, i, p, False, out, row, 1) if i >= 0 else -1
            if i < 0 or i >= p or data[i] != 44:  # ,
                continue
            i += 1
        else:
            i = s + 1 if data[s] == 123 else -1
        i = lit(data, i, p, _P_OP)
        if i < 0 or i >= p:
            continue
        op = data[i]
        if op != 99 and op != 117 and op != 100 and op != 114 and op != 116:  # cudrt
            continue
        out[2, row] = op
        i = lit(data, i + 1, p, _P_TS)
        i = integer(data, i, p, True, out, row, 3) if i >= 0 else -1
        i = lit(data, i, p, _P_SOURCE)
        i = string_or_null(data, i, p) if i >= 0 else -1
        i = lit(data, i, p, _P_DB)
        i = string_or_null(data, i, p) if i >= 0 else -1
        i = lit(data, i, p, _P_SCHEMA)
        a = i
        i = string(data, i, p, True) if i >= 0 else -1
        out[4, row] = a + 1
        out[5, row] = i - 1
        i = lit(data, i, p, _P_TABLE)
        a = i
        i = string(data, i, p, True) if i >= 0 else -1
        out[6, row] = a + 1
        out[7, row] = i - 1
        r = i
        i = flat_rest(data, i, p) if i >= 0 else -1
        if i < 0 or data[i] != 125:  # the source's }
            continue
        # The source's own ts_ms among its flat members after table: a bare quote
        # preceded by a comma never occurs inside a JSON string, so the first
        # ,"ts_ms": there is a member's name.
        q = find(data, r, i, _P_SRC_TS)
        if q >= 0:
            v = integer(data, q + _P_SRC_TS.shape[0], i + 1, True, out, row, 15)
            if v >= 0 and (data[v] == 44 or data[v] == 125):
                out[14, row] = 1
            else:
                out[15, row] = 0
        i = lit(data, i + 1, p, _P_KEY)
        if i < 0:
            continue
        j = lit(data, i, p, _P_NULL)
        if j >= 0:
            out[8, row] = -1
        else:
            j = flat(data, i, p)
            out[8, row] = i
            out[9, row] = j
        i = lit(data, j, p, _P_BEFORE) if j >= 0 else -1
        if i < 0:
            continue
        j = lit(data, i, p, _P_NULL)
        if j < 0:
            j = flat(data, i, p)
        if j != p:  # before must end the part before the first ,"after":
            continue
        t = p + 9  # the tail
        if e - t == 5 and lit(data, t, e, _P_NULL) == t + 4 and data[e - 1] == 125:
            out[10, row] = -1
        elif e - t >= 2 and data[t] == 123 and data[e - 1] == 125 and data[e - 2] == 125:
            out[10, row] = t
            out[11, row] = e - 1
        elif e - t >= 2 and data[t] == 123 and data[e - 1] == 125 and data[e - 2] == 93:
            # ,"unchanged":[S,..]} : its last occurrence (an earlier one cannot be
            # followed by strings only), after it strings up to ]} and the end.
            u = -1
            k = e - _UNCH.shape[0]
            while k >= t:
                if lit(data, k, e, _UNCH) >= 0:
                    u = k
                    break
                k -= 1
            if u < t + 1 or data[u - 1] != 125:
                continue
            bad = False
            for k in range(t, u):  # the regex's '.' matches no newline
                if data[k] == 10:
                    bad = True
                    break
            if bad:
                continue
            i = u + _UNCH.shape[0]
            if i < e - 2:
                while True:
                    i = string(data, i, e - 2, False)
                    if i < 0 or i == e - 2:
                        break
                    if data[i] != 44:
                        i = -1
                        break
                    i += 1
            if i != e - 2:
                continue
            out[10, row] = t
            out[11, row] = u
            out[12, row] = u + _UNCH.shape[0] - 1
            out[13, row] = e - 1
        else:
            continue
        out[0, row] = 1
    return out


@_jit
def plain_value(d: Any, i: int, end: int) -> int:
    """The position after ``-?(0|[1-9][0-9]{0,17})`` or a string without escapes at
    ``i``, or -1."""
    if i < end and d[i] == 34:
        return string(d, i, end, True)
    if i < end and d[i] == 45:
        i += 1
    if i >= end or d[i] < 48 or d[i] > 57:
        return -1
    if d[i] == 48:
        return i + 1
    k = 0
    while i < end and 48 <= d[i] <= 57:
        i += 1
        k += 1
    return i if k <= 18 else -1


@_jit
def key_form(d: Any, a: int, b: int) -> tuple[int, int]:
    """How the key text ``d[a:b]`` becomes its sorted orjson form: (1, -1) as it is (one
    field, or two in order, of plain values: names and strings without escapes,
    integers), (2, comma) two such fields to swap, (3, -1) parsed by the caller."""
    if b - a < 2 or d[a] != 123 or d[b - 1] != 125:
        return 3, -1
    n1 = string(d, a + 1, b, True)
    if n1 < 0 or n1 >= b or d[n1] != 58:
        return 3, -1
    i = plain_value(d, n1 + 1, b)
    if i < 0:
        return 3, -1
    if i == b - 1:
        return 1, -1
    if d[i] != 44:
        return 3, -1
    c = i
    n2 = string(d, c + 1, b, True)
    if n2 < 0 or n2 >= b or d[n2] != 58:
        return 3, -1
    if plain_value(d, n2 + 1, b) != b - 1:
        return 3, -1
    # compare the names' texts (without quotes) byte by byte: UTF-8 keeps code point order
    x, xe, y, ye = a + 2, n1 - 1, c + 2, n2 - 1
    while x < xe and y < ye:
        if d[x] != d[y]:
            return (1, -1) if d[x] < d[y] else (2, c)
        x += 1
        y += 1
    if xe - x == ye - y:  # the same name twice
        return 3, -1
    return (1, -1) if x == xe else (2, c)


@_jit
def _keys(data: Any, starts: Any, ends: Any) -> Any:
    """Arrow string buffers of the keys ``data[starts[i]:ends[i]]`` in sorted orjson form
    (``starts[i] < 0``: null), and per row ``key_form``'s kind (3: left empty for the
    caller)."""
    n = starts.shape[0]
    offs = np.empty(n + 1, np.int32)
    kind = np.zeros(n, np.int8)
    comma = np.zeros(n, np.int64)
    total = 0
    offs[0] = 0
    for i in range(n):
        if starts[i] >= 0:
            k, c = key_form(data, starts[i], ends[i])
            kind[i] = k
            comma[i] = c
            if k != 3:
                total += ends[i] - starts[i]
        offs[i + 1] = total
    buf = np.empty(total, np.uint8)
    for i in range(n):
        o = offs[i]
        a = starts[i]
        b = ends[i]
        if kind[i] == 1:
            buf[o:o + b - a] = data[a:b]
        elif kind[i] == 2:  # {second,first}
            c = comma[i]
            buf[o] = 123
            m = b - 1 - (c + 1)
            buf[o + 1:o + 1 + m] = data[c + 1:b - 1]
            buf[o + 1 + m] = 44
            buf[o + 2 + m:o + 2 + m + c - a - 1] = data[a + 1:c]
            buf[o + b - a - 1] = 125
    return offs, buf, kind


@_jit
def _gather(data: Any, starts: Any, ends: Any, mask: Any) -> Any:
    """Arrow string buffers (int32 offsets, data) of ``data[starts[i]:ends[i]]``
    for the rows in ``mask`` (the others empty)."""
    n = starts.shape[0]
    offs = np.empty(n + 1, np.int32)
    total = 0
    offs[0] = 0
    for i in range(n):
        if mask[i]:
            total += ends[i] - starts[i]
        offs[i + 1] = total
    buf = np.empty(total, np.uint8)
    for i in range(n):
        if mask[i]:
            o = offs[i]
            buf[o:o + ends[i] - starts[i]] = data[starts[i]:ends[i]]
    return offs, buf


def buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The data buffer (uint8, read-only) and the row offsets (int64, ``len(arr) + 1``)
    of a string array (sliced or not) without copying the data.

    The data is always a read-only view: numba compiles (and caches, and loads) one
    machine-code version per argument type, and a writable and a read-only array are two
    types. Arrow buffers built by ``pa.array`` are writable, those over ``bytes`` (the
    Kafka source's values) are not: without this the first Kafka batch of a process
    loaded (or, after a source change, compiled: ~30 s on a busy machine) a second
    version of every kernel, which the start-up warm-up had not."""
    if arr.type != pa.string():
        arr = arr.cast(pa.string())
    _, offs, data = arr.buffers()
    offsets = np.frombuffer(offs, np.int32)[arr.offset: arr.offset + len(arr) + 1].astype(np.int64)
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    raw.flags.writeable = False
    return raw, offsets


def scan(arr: pa.Array, own_offsets: bool) -> tuple[np.ndarray, np.ndarray]:
    """(data buffer, the ``FIELDS`` columns per row) of the bodies in ``arr`` (no nulls)."""
    data, offsets = buffers(arr)
    if njit is None:
        raise _missing()
    return data, _scan(data, offsets, own_offsets)


def strings(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, valid: np.ndarray) -> pa.Array:
    """An Arrow string array of ``data[starts[i]:ends[i]]``, null where not ``valid``."""
    n = len(starts)
    valid = np.ascontiguousarray(valid, dtype=np.bool_)
    starts, ends = np.ascontiguousarray(starts), np.ascontiguousarray(ends)
    offs, buf = _gather(data, starts, ends, valid)
    nulls = n - int(valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.StringArray.from_buffers(n, pa.py_buffer(offs), pa.py_buffer(buf), bitmap, nulls)


def keys(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The keys ``data[starts[i]:ends[i]]`` (null where ``starts[i] < 0``) in sorted
    orjson form where ``key_form`` could make it, and the rows it could not (empty
    there: the caller parses those)."""
    n = len(starts)
    starts, ends = np.ascontiguousarray(starts), np.ascontiguousarray(ends)
    offs, buf, kind = _keys(data, starts, ends)
    valid = starts >= 0
    nulls = n - int(valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    arr = pa.StringArray.from_buffers(n, pa.py_buffer(offs), pa.py_buffer(buf), bitmap, nulls)
    return arr, np.flatnonzero(kind == 3)
