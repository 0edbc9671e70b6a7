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

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Decode a pgoutput Insert/Update/Delete into row dicts."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pgrow", NULL, -1, methods, NULL, NULL, NULL, NULL};

/* The interface version rowdecode.py expects (rowdecode.ABI_VERSION): raise both together
 * whenever the codes, the spec or the result change, so that a stale build is detected
 * (and the Python path used). */
#define PGROW_VERSION 2

PyMODINIT_FUNC PyInit__pgrow(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", PGROW_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
