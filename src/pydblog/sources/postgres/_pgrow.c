/* A pgoutput row change (Insert, Update, Delete) decoded straight into row dicts.
 *
 * decode(buf, specs, unchanged) takes one pgoutput (protocol 1) message and
 * ``specs``, a dict {relation oid: (rel, names, codes, converters, key)} of the captured
 * relations (``pydblog.sources.postgres.rowdecode``). For an Insert, Update or Delete of
 * a relation in ``specs`` it returns
 *
 *     (kind, rel, new, old, old_is_key_only, unchanged_count, insert_key)
 *
 * with ``kind`` the message byte ('I', 'U', 'D'), ``rel`` the spec's first item, ``new``
 * and ``old`` dicts {column name: value} in column order (or None where the message has
 * no such tuple), each value mapped as ``converters[i]`` maps the column's text (NULL is
 * None, an unchanged TOAST value is ``unchanged``) and ``unchanged_count`` the number of
 * unchanged values in ``new``; ``insert_key`` is an Insert's event key, {names[i]: new's
 * value for i in key} (the same objects), None for the others. ``codes[i]`` names a converter the module writes in C
 * (the same function of the text: ``rowdecode.CODES``); any other column calls its
 * converter.
 *
 * It returns None for every other message, an unknown relation, and anything it does
 * not decode exactly as the Python path would: a message of the wrong form, a tuple of
 * another column count, invalid UTF-8, a value kind other than 't', 'n', 'u', a
 * converter that raises. The caller then decodes the message in Python (which raises
 * the error naming the problem, if there is one).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { C_STR = 0, C_INT, C_BPCHAR, C_BOOL, C_TSTZ, C_TS, C_TIME, C_FLOAT, C_CALL, C_COUNT };

typedef struct {
    const unsigned char *buf;
    size_t len;
} msg_t;

static inline uint32_t rd32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Checks the TupleData at ``*pos`` has ``ncols`` values of known kinds within the
 * buffer; moves ``*pos`` past it. 0: not so. */
static int scan_tuple(const msg_t *m, size_t *pos, Py_ssize_t ncols) {
    size_t p = *pos;
    if (p + 2 > m->len) return 0;
    Py_ssize_t count = (Py_ssize_t)(((unsigned)m->buf[p] << 8) | m->buf[p + 1]);
    if (count != ncols) return 0;
    p += 2;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (p >= m->len) return 0;
        unsigned char kind = m->buf[p];
        if (kind == 't') {
            if (p + 5 > m->len) return 0;
            size_t size = rd32(m->buf + p + 1);
            p += 5;
            if (size > m->len - p) return 0;
            p += size;
        } else if (kind == 'n' || kind == 'u') {
            p += 1;
        } else {
            return 0;
        }
    }
    *pos = p;
    return 1;
}

static int all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

static inline int ends_with(const char *s, size_t n, const char *tail, size_t t) {
    return n >= t && memcmp(s + n - t, tail, t) == 0;
}

/* ``_pad_fraction`` of the ASCII text ``s`` (``n`` bytes) with ``suffix`` after it:
 * text + "0" * (7 - (len - dot)) when it holds a '.'. ``t_at``: the index of the first
 * space to write as 'T' (-1: none). */
static PyObject *padded(const char *s, size_t n, Py_ssize_t t_at, const char *suffix, size_t sn) {
    const char *dot = memchr(s, '.', n);
    size_t zeros = 0;
    if (dot != NULL) {
        size_t after = n - (size_t)(dot - s); /* len(text) - dot */
        if (after < 7) zeros = 7 - after;
    }
    char small[96];
    size_t total = n + zeros + sn;
    char *out = total <= sizeof(small) ? small : PyMem_Malloc(total);
    if (out == NULL) return PyErr_NoMemory();
    memcpy(out, s, n);
    if (t_at >= 0) out[t_at] = 'T';
    memset(out + n, '0', zeros);
    memcpy(out + n + zeros, suffix, sn);
    PyObject *r = PyUnicode_FromStringAndSize(out, (Py_ssize_t)total);
    if (out != small) PyMem_Free(out);
    return r;
}

static inline Py_ssize_t first_space(const char *s, size_t n) {
    const char *sp = memchr(s, ' ', n);
    return sp ? (Py_ssize_t)(sp - s) : -1;
}

/* The column's value from its text; NULL with an exception set on failure. */
static PyObject *convert(int code, PyObject *conv, const char *s, size_t n) {
    switch (code) {
    case C_INT: {
        /* int(text): a plain decimal of up to 18 digits in C, anything else by int() */
        size_t i = (n > 0 && s[0] == '-') ? 1 : 0;
        if (n > i && n - i <= 18) {
            long long v = 0;
            size_t k = i;
            for (; k < n && s[k] >= '0' && s[k] <= '9'; k++) v = v * 10 + (s[k] - '0');
            if (k == n) return PyLong_FromLongLong(i ? -v : v);
        }
        break;
    }
    case C_BPCHAR:
        while (n > 0 && s[n - 1] == ' ') n--;
        return PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict");
    case C_BOOL:
        if ((n == 1 && s[0] == 't') || (n == 4 && memcmp(s, "true", 4) == 0)) Py_RETURN_TRUE;
        if ((n == 1 && s[0] == 'f') || (n == 5 && memcmp(s, "false", 5) == 0)) Py_RETURN_FALSE;
        break;
    case C_TSTZ:
        if (!all_ascii(s, n)) break;
        if (ends_with(s, n, "+00", 3)) {
            if (n < 22) return PyUnicode_FromStringAndSize(s, (Py_ssize_t)n);
            return padded(s, n - 3, first_space(s, n - 3), "Z", 1);
        }
        if (n < 22 || ends_with(s, n, " BC", 3)) return PyUnicode_FromStringAndSize(s, (Py_ssize_t)n);
        break; /* another offset: datetime's conversion, in Python */
    case C_TS:
        if (!all_ascii(s, n)) break;
        if (n < 19 || ends_with(s, n, " BC", 3)) return PyUnicode_FromStringAndSize(s, (Py_ssize_t)n);
        return padded(s, n, first_space(s, n), "", 0);
    case C_TIME:
        if (!all_ascii(s, n)) break;
        return padded(s, n, -1, "", 0);
    case C_FLOAT: {
        PyObject *text = PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict");
        if (text == NULL) return NULL;
        if ((n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0) ||
            (n == 9 && memcmp(s, "-Infinity", 9) == 0))
            return text;
        PyObject *f = PyFloat_FromString(text);
        Py_DECREF(text);
        return f;
    }
    case C_STR:
        return PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict");
    default:
        break;
    }
    PyObject *text = PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict");
    if (text == NULL) return NULL;
    PyObject *r = PyObject_CallOneArg(conv, text);
    Py_DECREF(text);
    return r;
}

/* The already scanned TupleData at ``*pos`` as a dict; NULL with an exception set. */
static PyObject *tuple_dict(const msg_t *m, size_t *pos, PyObject *names, const unsigned char *codes,
                            PyObject *convs, PyObject *unchanged, Py_ssize_t *n_unchanged) {
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    size_t p = *pos + 2;
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        unsigned char kind = m->buf[p];
        PyObject *v;
        if (kind == 't') {
            size_t size = rd32(m->buf + p + 1);
            p += 5;
            v = convert(codes[i], PyTuple_GET_ITEM(convs, i), (const char *)m->buf + p, size);
            p += size;
            if (v == NULL) { Py_DECREF(d); return NULL; }
        } else if (kind == 'n') {
            p += 1;
            v = Py_NewRef(Py_None);
        } else {
            p += 1;
            v = Py_NewRef(unchanged);
            if (n_unchanged) (*n_unchanged)++;
        }
        int rc = PyDict_SetItem(d, PyTuple_GET_ITEM(names, i), v);
        Py_DECREF(v);
        if (rc < 0) { Py_DECREF(d); return NULL; }
    }
    *pos = p;
    return d;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyObject *specs, *unchanged;
    if (!PyArg_ParseTuple(args, "y*O!O", &view, &PyDict_Type, &specs, &unchanged)) return NULL;
    msg_t m = {(const unsigned char *)view.buf, (size_t)view.len};
    PyObject *result = NULL, *new = NULL, *old = NULL, *spec = NULL;
    if (m.len < 6) goto none;
    unsigned char type = m.buf[0];
    if (type != 'I' && type != 'U' && type != 'D') goto none;
    PyObject *oid = PyLong_FromUnsignedLong(rd32(m.buf + 1));
    if (oid == NULL) goto fail;
    spec = PyDict_GetItemWithError(specs, oid);
    Py_DECREF(oid);
    if (spec == NULL) {
        if (PyErr_Occurred()) goto fail;
        goto none;
    }
    Py_INCREF(spec); /* held: a converter called below runs Python code */
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) {
        PyErr_SetString(PyExc_TypeError, "a spec is (rel, names, codes, converters, key)");
        goto fail;
    }
    PyObject *names = PyTuple_GET_ITEM(spec, 1), *codes = PyTuple_GET_ITEM(spec, 2);
    PyObject *convs = PyTuple_GET_ITEM(spec, 3), *keycols = PyTuple_GET_ITEM(spec, 4);
    if (!PyTuple_Check(names) || !PyBytes_Check(codes) || !PyTuple_Check(convs) || !PyTuple_Check(keycols) ||
        PyBytes_GET_SIZE(codes) != PyTuple_GET_SIZE(names) ||
        PyTuple_GET_SIZE(convs) != PyTuple_GET_SIZE(names)) {
        PyErr_SetString(PyExc_TypeError, "names, codes and converters of one length");
        goto fail;
    }
    const unsigned char *cs = (const unsigned char *)PyBytes_AS_STRING(codes);
    Py_ssize_t ncols = PyTuple_GET_SIZE(names);
    for (Py_ssize_t i = 0; i < ncols; i++)
        if (cs[i] >= C_COUNT) { PyErr_SetString(PyExc_ValueError, "unknown converter code"); goto fail; }

    /* The message's form first, as the Python decoder checks it before mapping values. */
    unsigned char marker = m.buf[5];
    size_t pos = 6, old_at = 0, new_at = 0;
    int has_old = 0, has_new = 0, key_only = 0;
    if (type == 'I') {
        if (marker != 'N') goto none;
        new_at = pos;
        has_new = 1;
        if (!scan_tuple(&m, &pos, ncols)) goto none;
    } else if (type == 'U') {
        if (marker == 'K' || marker == 'O') {
            old_at = pos;
            has_old = 1;
            key_only = marker == 'K';
            if (!scan_tuple(&m, &pos, ncols)) goto none;
            if (pos >= m.len || m.buf[pos] != 'N') goto none;
            pos += 1;
        } else if (marker != 'N') {
            goto none;
        }
        new_at = pos;
        has_new = 1;
        if (!scan_tuple(&m, &pos, ncols)) goto none;
    } else {
        if (marker != 'K' && marker != 'O') goto none;
        old_at = pos;
        has_old = 1;
        key_only = marker == 'K';
        if (!scan_tuple(&m, &pos, ncols)) goto none;
    }
    if (pos != m.len) goto none;
    /* The Python decoder decodes every text value before any is mapped: any invalid
     * UTF-8 is its error, not a converter's. */
    Py_ssize_t n_unchanged = 0;
    if (has_old) {
        size_t p = old_at;
        old = tuple_dict(&m, &p, names, cs, convs, unchanged, NULL);
        if (old == NULL) goto fallback;
    }
    if (has_new) {
        size_t p = new_at;
        new = tuple_dict(&m, &p, names, cs, convs, unchanged, &n_unchanged);
        if (new == NULL) goto fallback;
    }
    PyObject *key = Py_NewRef(Py_None);
    if (type == 'I') {
        Py_DECREF(key);
        key = PyDict_New();
        if (key == NULL) goto fail;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keycols); k++) {
            Py_ssize_t c = PyLong_AsSsize_t(PyTuple_GET_ITEM(keycols, k));
            if (c < 0 || c >= ncols) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "key column out of range");
                Py_DECREF(key);
                goto fail;
            }
            PyObject *name = PyTuple_GET_ITEM(names, c);
            PyObject *value = PyDict_GetItemWithError(new, name); /* borrowed */
            if (value == NULL || PyDict_SetItem(key, name, value) < 0) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_KeyError, "key column");
                Py_DECREF(key);
                goto fail;
            }
        }
    }
    result = Py_BuildValue("(iONNOnN)", (int)type, PyTuple_GET_ITEM(spec, 0),
                           new ? new : Py_NewRef(Py_None), old ? old : Py_NewRef(Py_None),
                           key_only ? Py_True : Py_False, n_unchanged, key);
    new = old = NULL;
    Py_DECREF(spec);
    PyBuffer_Release(&view);
    return result;
fallback:
    /* A converter raised, or invalid UTF-8: the Python path decides what that is. A
     * MemoryError is not the data's fault, nor is anything that is not an Exception
     * (KeyboardInterrupt): those stay. */
    if (PyErr_ExceptionMatches(PyExc_MemoryError) || !PyErr_ExceptionMatches(PyExc_Exception))
        goto fail;
    PyErr_Clear();
none:
    Py_XDECREF(new);
    Py_XDECREF(old);
    Py_XDECREF(spec);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(new);
    Py_XDECREF(old);
    Py_XDECREF(spec);
    PyBuffer_Release(&view);
    return NULL;
}


/* -- Inserts and Updates encoded straight into change-log tails -------------------- *
 *
 * Tails(dumps, max_rows): an accumulator of consecutive row changes of one kind of one
 * captured relation: Inserts, Updates that carry no old tuple (pgoutput sends one only
 * when the update changed the row's key or the relation's replica identity is FULL:
 * without one the event's key is the new row's and its ``before`` null, as for an
 * Insert), Deletes that carry the old key only (``K``: the event's key and ``before``
 * are that key, its ``after`` null; the tail is ``key_json + ',"before":' + key_json +
 * ',"after":null}'``), and, replica identity FULL (``O``, the old row), Updates that
 * keep the key's text (the tail ``key_json + ',"before":' + old_json + ',"after":' +
 * new_json + "}"``, an unchanged TOAST value the old row's; a key column whose text is
 * ``NaN`` leaves it to the Python path, which compares values) and Deletes (``key_json + ',"before":' + old_json +
 * ',"after":null}'``). Each is encoded straight from its pgoutput bytes into its event's envelope
 * tail, an Insert's ``key_json + ',"before":null,"after":' + after_json + "}"`` (``events.TAIL_SEP``),
 * byte for byte what ``orjson.dumps`` of the Python path's key and row dicts gives
 * (``dumps`` is ``orjson.dumps``: every value the C code does not write itself is
 * converted by its column's converter and written by it). No Python object is built
 * per row for the columns written in C.
 *
 * add(buf, fast_specs) with ``fast_specs`` {oid: (rel, name_json, codes, converters,
 * key)} (``name_json[i]``: ``orjson.dumps(names[i]) + b":"``) returns
 *   n > 0: the message was an Insert (or such an Update or Delete) of that relation,
 *          appended (n rows held now);
 *   0:     anything else (another message, a relation not in ``fast_specs``, an
 *          unchanged value, a value this encoder does not write exactly as the Python
 *          path would, a converter that raises): nothing appended, the caller decodes
 *          the message by the other paths (after taking what is held: order);
 *   -1:    such a message of another relation, or of another kind, while rows are
 *          held: take them first.
 * take() returns (rel, count, text, kind) (the tails joined by newlines; ``kind`` the
 * held messages' byte, "I", "U" or "D", or "u" / "d" for those with the old row) and
 * empties the accumulator, or None when it holds nothing.
 */

typedef struct {
    char *data;
    size_t len, cap;
} wbuf_t;

static int wb_reserve(wbuf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) { PyErr_NoMemory(); return 0; }
    b->data = data;
    b->cap = cap;
    return 1;
}

static inline int wb_put(wbuf_t *b, const char *s, size_t n) {
    if (!wb_reserve(b, n)) return 0;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 1;
}

static inline int wb_byte(wbuf_t *b, char c) {
    if (!wb_reserve(b, 1)) return 0;
    b->data[b->len++] = c;
    return 1;
}

/* Whether ``s`` is UTF-8 as Python's strict decoder takes it (no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t need;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { need = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; cp = c & 0x07; }
        else return 0;
        if (i + need >= n) return 0;
        for (size_t k = 1; k <= need; k++) {
            unsigned char d = s[i + k];
            if ((d & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (d & 0x3F);
        }
        if ((need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += need + 1;
    }
    return 1;
}

static const char HEXD[] = "0123456789abcdef";

/* ``s`` as a JSON string, escaped as orjson escapes (the text is valid UTF-8). */
static int wb_json_string(wbuf_t *b, const char *s, size_t n) {
    if (!wb_reserve(b, n + 2)) return 0;
    b->data[b->len++] = '"';
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        if (!wb_put(b, s + run, i - run)) return 0;
        run = i + 1;
        char esc[6];
        size_t en = 2;
        esc[0] = '\\';
        switch (c) {
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        default:
            esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
            esc[4] = HEXD[(c >> 4) & 0xf]; esc[5] = HEXD[c & 0xf];
            en = 6;
        }
        if (!wb_put(b, esc, en)) return 0;
    }
    if (!wb_put(b, s + run, n - run)) return 0;
    return wb_byte(b, '"');
}

/* ``padded``'s text (see above) as a JSON string. */
static int wb_padded(wbuf_t *b, const char *s, size_t n, Py_ssize_t t_at, const char *suffix, size_t sn) {
    const char *dot = memchr(s, '.', n);
    size_t zeros = 0;
    if (dot != NULL) {
        size_t after = n - (size_t)(dot - s);
        if (after < 7) zeros = 7 - after;
    }
    char small[128];
    size_t total = n + zeros + sn;
    if (total > sizeof(small)) return -1; /* not a timestamp's text: the converter's */
    memcpy(small, s, n);
    if (t_at >= 0) small[t_at] = 'T';
    memset(small + n, '0', zeros);
    memcpy(small + n + zeros, suffix, sn);
    return wb_json_string(b, small, total);
}

/* One 't' value's JSON: 1 written, 0 not exactly (the caller's fallback), -1 error. */
static int wb_value(wbuf_t *b, int code, PyObject *conv, PyObject *dumps, const char *s, size_t n) {
    switch (code) {
    case C_INT: {
        size_t i = (n > 0 && s[0] == '-') ? 1 : 0;
        if (n > i && n - i <= 18) {
            long long v = 0;
            size_t k = i;
            for (; k < n && s[k] >= '0' && s[k] <= '9'; k++) v = v * 10 + (s[k] - '0');
            if (k == n) {
                char num[24];
                int len = snprintf(num, sizeof(num), "%lld", i ? -v : v);
                return wb_put(b, num, (size_t)len) ? 1 : -1;
            }
        }
        break;
    }
    case C_STR:
        if (!valid_utf8((const unsigned char *)s, n)) return 0;
        return wb_json_string(b, s, n) ? 1 : -1;
    case C_BPCHAR:
        while (n > 0 && s[n - 1] == ' ') n--;
        if (!valid_utf8((const unsigned char *)s, n)) return 0;
        return wb_json_string(b, s, n) ? 1 : -1;
    case C_BOOL:
        if ((n == 1 && s[0] == 't') || (n == 4 && memcmp(s, "true", 4) == 0)) return wb_put(b, "true", 4) ? 1 : -1;
        if ((n == 1 && s[0] == 'f') || (n == 5 && memcmp(s, "false", 5) == 0)) return wb_put(b, "false", 5) ? 1 : -1;
        break;
    case C_TSTZ:
        if (!all_ascii(s, n)) break;
        if (ends_with(s, n, "+00", 3)) {
            if (n < 22) return wb_json_string(b, s, n) ? 1 : -1;
            int r = wb_padded(b, s, n - 3, first_space(s, n - 3), "Z", 1);
            if (r >= 0) return r ? 1 : -1;
            break;
        }
        if (n < 22 || ends_with(s, n, " BC", 3)) return wb_json_string(b, s, n) ? 1 : -1;
        break;
    case C_TS: {
        if (!all_ascii(s, n)) break;
        if (n < 19 || ends_with(s, n, " BC", 3)) return wb_json_string(b, s, n) ? 1 : -1;
        int r = wb_padded(b, s, n, first_space(s, n), "", 0);
        if (r >= 0) return r ? 1 : -1;
        break;
    }
    case C_TIME: {
        if (!all_ascii(s, n)) break;
        int r = wb_padded(b, s, n, -1, "", 0);
        if (r >= 0) return r ? 1 : -1;
        break;
    }
    case C_FLOAT:
        if ((n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0) ||
            (n == 9 && memcmp(s, "-Infinity", 9) == 0))
            return wb_json_string(b, s, n) ? 1 : -1;
        break;
    default:
        break;
    }
    /* The converter's value, written by orjson. */
    if (!valid_utf8((const unsigned char *)s, n)) return 0;
    PyObject *text = PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict");
    if (text == NULL) return -1;
    PyObject *v = PyObject_CallOneArg(conv, text);
    Py_DECREF(text);
    if (v == NULL) return -1;
    PyObject *out = PyObject_CallOneArg(dumps, v);
    Py_DECREF(v);
    if (out == NULL) return -1;
    int ok = PyBytes_Check(out) && wb_put(b, PyBytes_AS_STRING(out), (size_t)PyBytes_GET_SIZE(out));
    if (!PyBytes_Check(out)) PyErr_SetString(PyExc_TypeError, "dumps must return bytes");
    Py_DECREF(out);
    return ok ? 1 : -1;
}

typedef struct {
    PyObject_HEAD
    wbuf_t out;        /* the tails held, joined by newlines */
    wbuf_t row;        /* one row's after JSON (a Delete's: its old row or key) */
    wbuf_t old;        /* an Update's old row JSON (replica identity FULL) */
    size_t *vstart, *vlen, *ostart, *olen; /* each column's value in row / old */
    Py_ssize_t vcap;
    Py_ssize_t count;
    uint32_t oid;
    unsigned char kind; /* the held rows' kind (count > 0): the message byte 'I', 'U' or 'D',
                           or 'u' / 'd' for an Update / Delete with its old row ('O') */
    PyObject *spec;    /* the held rows' spec (count > 0) */
    PyObject *dumps;
    Py_ssize_t max_rows;
} TailsObject;

static void Tails_dealloc(TailsObject *self) {
    PyMem_Free(self->out.data);
    PyMem_Free(self->row.data);
    PyMem_Free(self->old.data);
    PyMem_Free(self->vstart);
    PyMem_Free(self->vlen);
    PyMem_Free(self->ostart);
    PyMem_Free(self->olen);
    Py_XDECREF(self->spec);
    Py_XDECREF(self->dumps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Tails_init(TailsObject *self, PyObject *args, PyObject *kwds) {
    PyObject *dumps;
    Py_ssize_t max_rows = 1024;
    if (!PyArg_ParseTuple(args, "O|n", &dumps, &max_rows)) return -1;
    if (!PyCallable_Check(dumps)) { PyErr_SetString(PyExc_TypeError, "dumps must be callable"); return -1; }
    Py_XSETREF(self->dumps, Py_NewRef(dumps));
    self->max_rows = max_rows > 0 ? max_rows : 1;
    return 0;
}

/* A fast spec's parts, checked; 0 with an exception set when it has another form. */
static int fast_parts(PyObject *spec, PyObject **names, const unsigned char **codes, PyObject **convs,
                      PyObject **keys) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) {
        PyErr_SetString(PyExc_TypeError, "a fast spec is (rel, name_json, codes, converters, key)");
        return 0;
    }
    *names = PyTuple_GET_ITEM(spec, 1);
    PyObject *c = PyTuple_GET_ITEM(spec, 2);
    *convs = PyTuple_GET_ITEM(spec, 3);
    *keys = PyTuple_GET_ITEM(spec, 4);
    if (!PyTuple_Check(*names) || !PyBytes_Check(c) || !PyTuple_Check(*convs) || !PyTuple_Check(*keys) ||
        PyBytes_GET_SIZE(c) != PyTuple_GET_SIZE(*names) || PyTuple_GET_SIZE(*convs) != PyTuple_GET_SIZE(*names)) {
        PyErr_SetString(PyExc_TypeError, "name_json, codes and converters of one length");
        return 0;
    }
    *codes = (const unsigned char *)PyBytes_AS_STRING(c);
    Py_ssize_t ncols = PyTuple_GET_SIZE(*names);
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if ((*codes)[i] >= C_COUNT) { PyErr_SetString(PyExc_ValueError, "unknown converter code"); return 0; }
        if (!PyBytes_Check(PyTuple_GET_ITEM(*names, i))) { PyErr_SetString(PyExc_TypeError, "name_json holds bytes"); return 0; }
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(*keys); k++) {
        Py_ssize_t col = PyLong_AsSsize_t(PyTuple_GET_ITEM(*keys, k));
        if (col < 0 || col >= ncols) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "key column out of range");
            return 0;
        }
    }
    return 1;
}

/* Whether column ``col`` is one of the (checked) key columns ``keys``. */
static int key_has(PyObject *keys, Py_ssize_t col) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++)
        if (PyLong_AsSsize_t(PyTuple_GET_ITEM(keys, k)) == col) return 1;
    return 0;
}

enum { ROW_OK = 1, ROW_NONE = 0, ROW_FALLBACK = -1, ROW_FAIL = -2 };

/* The tuple at buf[*p] (its column count read, scanned already) as the JSON object of
 * its row in ``row``, each column's value at [start[i], start[i] + len[i]); ``key_only``:
 * a Delete's old key (only the key columns may hold values). ROW_OK, or ROW_NONE (an
 * unchanged TOAST value, a value not written exactly: the message is not this path's),
 * ROW_FALLBACK (a converter raised an Exception: cleared, not this path's either), or
 * ROW_FAIL (an error set). ``*nan_key``: a key column's text is ``NaN`` (NaN is not equal
 * to itself: whether such a key changed is the Python path's to say). */
static int encode_tuple(TailsObject *self, const unsigned char *buf, size_t *p, Py_ssize_t ncols,
                        PyObject *names, const unsigned char *codes, PyObject *convs, PyObject *keys,
                        int key_only, wbuf_t *row, size_t *start, size_t *len, int *nan_key,
                        const wbuf_t *fill) {
    row->len = 0;
    if (!wb_byte(row, '{')) return ROW_FAIL;
    size_t at = *p;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        PyObject *nj = PyTuple_GET_ITEM(names, i);
        if ((i && !wb_byte(row, ',')) || !wb_put(row, PyBytes_AS_STRING(nj), (size_t)PyBytes_GET_SIZE(nj)))
            return ROW_FAIL;
        start[i] = row->len;
        unsigned char kind = buf[at];
        if (kind == 't') {
            int is_key = key_has(keys, i);
            if (key_only && !is_key) return ROW_NONE;
            size_t size = rd32(buf + at + 1);
            at += 5;
            if (is_key && size == 3 && memcmp(buf + at, "NaN", 3) == 0) *nan_key = 1;
            int r = wb_value(row, codes[i], PyTuple_GET_ITEM(convs, i), self->dumps, (const char *)buf + at, size);
            at += size;
            if (r < 0) {
                if (PyErr_ExceptionMatches(PyExc_MemoryError) || !PyErr_ExceptionMatches(PyExc_Exception))
                    return ROW_FAIL;
                PyErr_Clear();
                return ROW_FALLBACK;
            }
            if (r == 0) return ROW_NONE;
        } else if (kind == 'n') {
            at += 1;
            if (!wb_put(row, "null", 4)) return ROW_FAIL;
        } else if (kind == 'u' && fill != NULL) {
            /* an unchanged TOAST value, the old row's (its every value encoded) */
            at += 1;
            if (!wb_put(row, fill->data + self->ostart[i], self->olen[i])) return ROW_FAIL;
        } else {
            return ROW_NONE; /* an unchanged TOAST value without the old row: the Python path's */
        }
        len[i] = row->len - start[i];
    }
    if (!wb_byte(row, '}')) return ROW_FAIL;
    *p = at;
    return ROW_OK;
}

static int grow_spans(size_t **a, Py_ssize_t n) {
    size_t *grown = PyMem_Realloc(*a, (size_t)n * sizeof(size_t));
    if (grown == NULL) { PyErr_NoMemory(); return 0; }
    *a = grown;
    return 1;
}

static PyObject *Tails_add(TailsObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *specs;
    if (!PyArg_ParseTuple(args, "y*O!", &view, &PyDict_Type, &specs)) return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    size_t len = (size_t)view.len;
    long answer = 0;
    PyObject *spec = NULL;
    if (len < 6) goto done;
    /* the run kind: 'I'/'U' + new tuple, 'D' + old key; 'u' ('U' + old row + new tuple),
     * 'd' ('D' + old row) */
    unsigned char kind;
    if ((buf[0] == 'I' || buf[0] == 'U') && buf[5] == 'N') kind = buf[0];
    else if (buf[0] == 'D' && buf[5] == 'K') kind = 'D';
    else if (buf[0] == 'U' && buf[5] == 'O') kind = 'u';
    else if (buf[0] == 'D' && buf[5] == 'O') kind = 'd';
    else goto done;
    uint32_t oid = rd32(buf + 1);
    if (self->count > 0) {
        if (oid != self->oid || kind != self->kind) { answer = -1; goto done; }
        spec = Py_NewRef(self->spec);
    } else {
        PyObject *key = PyLong_FromUnsignedLong(oid);
        if (key == NULL) goto fail;
        spec = PyDict_GetItemWithError(specs, key);
        Py_DECREF(key);
        if (spec == NULL) {
            if (PyErr_Occurred()) goto fail;
            goto done;
        }
        Py_INCREF(spec); /* held: a converter called below runs Python code */
    }
    PyObject *names, *convs, *keys;
    const unsigned char *codes;
    if (!fast_parts(spec, &names, &codes, &convs, &keys)) goto fail;
    Py_ssize_t ncols = PyTuple_GET_SIZE(names);
    msg_t m = {buf, len};
    size_t pos = 6;
    if (!scan_tuple(&m, &pos, ncols)) goto done;
    size_t new_at = 6; /* where the tuple of the row encoded last begins */
    if (kind == 'u') {
        if (pos >= len || buf[pos] != 'N') goto done;
        new_at = pos + 1;
        pos = new_at;
        if (!scan_tuple(&m, &pos, ncols)) goto done;
    }
    if (pos != len) goto done;
    if (ncols > self->vcap) {
        if (!grow_spans(&self->vstart, ncols) || !grow_spans(&self->vlen, ncols) ||
            !grow_spans(&self->ostart, ncols) || !grow_spans(&self->olen, ncols))
            goto fail;
        self->vcap = ncols;
    }
    int nan_key = 0, r;
    if (kind == 'u') { /* the old row first: it is the event's before */
        size_t p = 8;
        r = encode_tuple(self, buf, &p, ncols, names, codes, convs, keys, 0, &self->old,
                         self->ostart, self->olen, &nan_key, NULL);
        if (r == ROW_FAIL) goto fail;
        if (r != ROW_OK) goto done;
    }
    {
        size_t p = new_at + 2;
        r = encode_tuple(self, buf, &p, ncols, names, codes, convs, keys, kind == 'D', &self->row,
                         self->vstart, self->vlen, &nan_key, kind == 'u' ? &self->old : NULL);
        if (r == ROW_FAIL) goto fail;
        if (r != ROW_OK) goto done;
    }
    wbuf_t *row = &self->row;
    if (kind == 'u') {
        /* the key kept (its text, column by column), else a delete and a create */
        if (nan_key) goto done;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
            Py_ssize_t c = PyLong_AsSsize_t(PyTuple_GET_ITEM(keys, k));
            if (self->vlen[c] != self->olen[c] ||
                memcmp(row->data + self->vstart[c], self->old.data + self->ostart[c], self->vlen[c]) != 0)
                goto done;
        }
    }
    /* key_json, then the rest of the tail by kind */
    wbuf_t *out = &self->out;
    size_t mark = out->len;
    if (self->count && !wb_byte(out, '\n')) goto fail;
    size_t key_at = out->len; /* the key's text, without its closing brace, from here */
    if (!wb_byte(out, '{')) goto undo;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(keys); k++) {
        Py_ssize_t c = PyLong_AsSsize_t(PyTuple_GET_ITEM(keys, k));
        PyObject *nj = PyTuple_GET_ITEM(names, c);
        if ((k && !wb_byte(out, ',')) || !wb_put(out, PyBytes_AS_STRING(nj), (size_t)PyBytes_GET_SIZE(nj)) ||
            !wb_put(out, row->data + self->vstart[c], self->vlen[c]))
            goto undo;
    }
    static const char BEFORE[] = "},\"before\":", AFTER[] = ",\"after\":", END[] = ",\"after\":null}";
    if (kind == 'D') { /* key_json + ',"before":' + key_json + ',"after":null}' */
        size_t key_len = out->len - key_at;
        /* reserved first: the copy's source is the buffer itself */
        if (!wb_put(out, BEFORE, sizeof(BEFORE) - 1) || !wb_reserve(out, key_len)) goto undo;
        memcpy(out->data + out->len, out->data + key_at, key_len);
        out->len += key_len;
        if (!wb_put(out, "}", 1) || !wb_put(out, END, sizeof(END) - 1)) goto undo;
    } else if (kind == 'd') { /* key_json + ',"before":' + old_json + ',"after":null}' */
        if (!wb_put(out, BEFORE, sizeof(BEFORE) - 1) || !wb_put(out, row->data, row->len) ||
            !wb_put(out, END, sizeof(END) - 1))
            goto undo;
    } else if (kind == 'u') { /* key_json + ',"before":' + old_json + ',"after":' + new_json + "}" */
        if (!wb_put(out, BEFORE, sizeof(BEFORE) - 1) || !wb_put(out, self->old.data, self->old.len) ||
            !wb_put(out, AFTER, sizeof(AFTER) - 1) || !wb_put(out, row->data, row->len) ||
            !wb_byte(out, '}'))
            goto undo;
    } else {
        static const char SEP[] = "},\"before\":null,\"after\":";
        if (!wb_put(out, SEP, sizeof(SEP) - 1) || !wb_put(out, row->data, row->len) || !wb_byte(out, '}'))
            goto undo;
    }
    if (self->count == 0) {
        self->oid = oid;
        self->kind = kind;
        Py_XSETREF(self->spec, Py_NewRef(spec));
    }
    self->count++;
    answer = (long)self->count;
    goto done;
undo:
    out->len = mark;
    goto fail;
done:
    Py_XDECREF(spec);
    PyBuffer_Release(&view);
    return PyLong_FromLong(answer);
fail:
    Py_XDECREF(spec);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *Tails_take(TailsObject *self, PyObject *unused) {
    if (self->count == 0) Py_RETURN_NONE;
    PyObject *text = PyUnicode_DecodeUTF8(self->out.data, (Py_ssize_t)self->out.len, "strict");
    if (text == NULL) return NULL;
    PyObject *r = Py_BuildValue("(OnNC)", PyTuple_GET_ITEM(self->spec, 0), self->count, text,
                                (int)self->kind);
    if (r == NULL) return NULL;
    self->count = 0;
    self->out.len = 0;
    Py_CLEAR(self->spec);
    return r;
}

static PyObject *Tails_len(TailsObject *self, void *closure) {
    return PyLong_FromSsize_t(self->count);
}

static PyObject *Tails_full(TailsObject *self, void *closure) {
    return PyBool_FromLong(self->count >= self->max_rows);
}

static PyMethodDef Tails_methods[] = {
    {"add", (PyCFunction)Tails_add, METH_VARARGS, "Append an Insert's tail (see the module)."},
    {"take", (PyCFunction)Tails_take, METH_NOARGS, "(rel, count, text) of the held rows, or None."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Tails_getset[] = {
    {"count", (getter)Tails_len, NULL, "rows held", NULL},
    {"full", (getter)Tails_full, NULL, "whether max_rows are held", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TailsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pydblog.sources.postgres._pgrow.Tails",
    .tp_basicsize = sizeof(TailsObject),
    .tp_dealloc = (destructor)Tails_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Consecutive Inserts of one relation encoded into change-log tails.",
    .tp_methods = Tails_methods,
    .tp_getset = Tails_getset,
    .tp_init = (initproc)Tails_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Decode a pgoutput Insert/Update/Delete into row dicts."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pgrow", NULL, -1, methods, NULL, NULL, NULL, NULL};

/* The interface version rowdecode.py expects (rowdecode.ABI_VERSION): raise both together
 * whenever the codes, the spec or the result change, so that a stale build is detected
 * (and the Python path used). */
#define PGROW_VERSION 4

PyMODINIT_FUNC PyInit__pgrow(void) {
    if (PyType_Ready(&TailsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "VERSION", PGROW_VERSION) < 0 ||
        PyModule_AddObjectRef(m, "Tails", (PyObject *)&TailsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
