/* Rows of MySQL's text protocol (a result set's row packets) into Python tuples, as
 * PyMySQL's MySQLResult._read_row_from_packet builds them.
 *
 * row(data, pos, plan) -> tuple
 *   data: a row packet's payload (bytes), pos: where its first value starts;
 *   plan: one (encoding, conv) pair per column, made by pydblog.sources.mysql.textrows:
 *     encoding: 0 bytes as they are, 1 UTF-8, 2 ASCII, or a codec name (str);
 *     conv: 0 none, 1 int(), 2 float(), or a callable applied to the decoded value.
 *   Each value is a length-coded string (0xFB: NULL, None, no conversion). A packet that
 *   ends before the plan does ends the row there (PyMySQL's IndexError break); a value
 *   whose length runs past the packet raises ValueError.
 *
 * map_rows(rows, names, kinds, convs) -> list of dicts
 *   types.SelectMapper.map of each row: {name: value}, None kept, a value of kind 0 kept,
 *   of kind 1 passed to its converter; kinds 2-5 (DATETIME, TIMESTAMP, DATE, DECIMAL) take
 *   the server's text in its plain shape straight to pydblog's value (the fast paths of
 *   types._plain_datetime, _plain_date and _decimal_of, in C) and anything else to their
 *   converter, which decides.
 *
 * Invariant: for every packet, the tuple equals PyMySQL's (same types, same values, same
 * exceptions' classes for undecodable text and unconvertible numbers), since each value
 * goes through the same CPython constructors: PyUnicode_Decode*, PyLong_FromUnicodeObject
 * (int(str)), PyFloat_FromString (float(str)), or the converter itself.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MYTEXT_VERSION 3

static int read_length(const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos, uint64_t *len,
                       int *null)
{
    Py_ssize_t i = *pos;
    if (i >= n)
        return 0; /* no more columns */
    unsigned char c = p[i++];
    *null = 0;
    if (c < 251) {
        *len = c;
    } else if (c == 251) {
        *null = 1;
        *len = 0;
    } else if (c == 252) {
        if (i + 2 > n) goto short_;
        *len = (uint64_t)p[i] | ((uint64_t)p[i + 1] << 8);
        i += 2;
    } else if (c == 253) {
        if (i + 3 > n) goto short_;
        *len = (uint64_t)p[i] | ((uint64_t)p[i + 1] << 8) | ((uint64_t)p[i + 2] << 16);
        i += 3;
    } else if (c == 254) {
        if (i + 8 > n) goto short_;
        *len = 0;
        for (int k = 7; k >= 0; k--)
            *len = (*len << 8) | p[i + k];
        i += 8;
    } else {
        goto short_; /* 0xFF: not a length */
    }
    if (!*null && *len > (uint64_t)(n - i))
        goto short_;
    *pos = i;
    return 1;
short_:
    PyErr_SetString(PyExc_ValueError, "a row packet's value runs past its end");
    return -1;
}

/* int(text) for plain decimal digits that fit in a long long, else NULL (caller falls back). */
static PyObject *fast_int(const unsigned char *s, Py_ssize_t len)
{
    if (len == 0 || len > 18)
        return NULL;
    Py_ssize_t i = 0;
    int neg = 0;
    if (s[0] == '-') {
        neg = 1;
        i = 1;
        if (len == 1)
            return NULL;
    }
    long long v = 0;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return NULL;
        v = v * 10 + (s[i] - '0');
    }
    return PyLong_FromLongLong(neg ? -v : v);
}

static PyObject *parse_row(const unsigned char *p, Py_ssize_t n, Py_ssize_t pos, PyObject *plan)
{
    Py_ssize_t ncols = PyTuple_GET_SIZE(plan), got = 0;
    PyObject *out = PyTuple_New(ncols);
    if (out == NULL)
        goto fail;
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_ValueError, "position outside the packet");
        goto fail;
    }
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *spec = PyTuple_GET_ITEM(plan, c);
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2) {
            PyErr_SetString(PyExc_TypeError, "plan: (encoding, conv) per column");
            goto fail;
        }
        uint64_t len;
        int null;
        int r = read_length(p, n, &pos, &len, &null);
        if (r < 0)
            goto fail;
        if (r == 0)
            break;
        PyObject *v;
        if (null) {
            v = Py_NewRef(Py_None);
        } else {
            const unsigned char *s = p + pos;
            Py_ssize_t l = (Py_ssize_t)len;
            pos += l;
            PyObject *enc = PyTuple_GET_ITEM(spec, 0), *conv = PyTuple_GET_ITEM(spec, 1);
            long ek = PyLong_Check(enc) ? PyLong_AsLong(enc) : -1;
            long ck = PyLong_Check(conv) ? PyLong_AsLong(conv) : -1;
            v = NULL;
            if (ck == 1 && (ek == 1 || ek == 2)) {
                v = fast_int(s, l);
                if (v != NULL)
                    goto store;
            }
            PyObject *text;
            if (ek == 0)
                text = PyBytes_FromStringAndSize((const char *)s, l);
            else if (ek == 1)
                text = PyUnicode_DecodeUTF8((const char *)s, l, "strict");
            else if (ek == 2)
                text = PyUnicode_DecodeASCII((const char *)s, l, "strict");
            else {
                const char *name = PyUnicode_AsUTF8(enc);
                if (name == NULL)
                    goto fail;
                text = PyUnicode_Decode((const char *)s, l, name, "strict");
            }
            if (text == NULL)
                goto fail;
            if (ck == 0) {
                v = text;
            } else if (ck == 1) {
                v = PyUnicode_Check(text) ? PyLong_FromUnicodeObject(text, 10)
                                          : PyObject_CallOneArg((PyObject *)&PyLong_Type, text);
                Py_DECREF(text);
            } else if (ck == 2) {
                v = PyFloat_FromString(text);
                Py_DECREF(text);
            } else {
                v = PyObject_CallOneArg(conv, text);
                Py_DECREF(text);
            }
            if (v == NULL)
                goto fail;
        }
    store:
        PyTuple_SET_ITEM(out, c, v);
        got++;
    }
    if (got < ncols) {
        PyObject *cut = PyTuple_GetSlice(out, 0, got);
        Py_DECREF(out);
        return cut;
    }
    return out;
fail:
    Py_XDECREF(out);
    return NULL;
}

static PyObject *row(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t pos;
    PyObject *plan;
    if (!PyArg_ParseTuple(args, "y*nO!", &buf, &pos, &PyTuple_Type, &plan))
        return NULL;
    PyObject *out = parse_row(buf.buf, buf.len, pos, plan);
    PyBuffer_Release(&buf);
    return out;
}

/* rows(buf, seq, plan, out) -> (used, seq): the complete row packets at the start of
 * buf (bytes a connection has buffered), each header's sequence id the next expected,
 * parsed with parse_row and appended to the list out. Stops before the first packet that
 * is incomplete, out of sequence, 16 MiB or more (a row in several packets), an EOF packet
 * (0xFE, under 9 bytes) or an error packet (0xFF), and leaves it to PyMySQL. used: the
 * bytes of the packets taken; seq: the sequence id expected after them. */
static PyObject *rows(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    int seq;
    PyObject *plan, *out;
    if (!PyArg_ParseTuple(args, "y*iO!O!", &buf, &seq, &PyTuple_Type, &plan, &PyList_Type, &out))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t n = buf.len, at = 0;
    while (n - at >= 4) {
        Py_ssize_t len = (Py_ssize_t)p[at] | ((Py_ssize_t)p[at + 1] << 8) |
                         ((Py_ssize_t)p[at + 2] << 16);
        if (p[at + 3] != (unsigned char)seq || len >= 0xFFFFFF || n - at - 4 < len || len == 0)
            break;
        const unsigned char *body = p + at + 4;
        if ((body[0] == 0xFE && len < 9) || body[0] == 0xFF)
            break;
        PyObject *r = parse_row(body, len, 0, plan);
        if (r == NULL)
            goto fail;
        int bad = PyList_Append(out, r);
        Py_DECREF(r);
        if (bad < 0)
            goto fail;
        at += 4 + len;
        seq = (seq + 1) & 0xFF;
    }
    PyBuffer_Release(&buf);
    return Py_BuildValue("(ni)", at, seq);
fail:
    PyBuffer_Release(&buf);
    return NULL;
}

/* -- mapping rows to pydblog's values (types.SelectMapper.map) ------------------------- */

enum { K_PLAIN = 0, K_CONV = 1, K_DATETIME = 2, K_TIMESTAMP = 3, K_DATE = 4, K_DECIMAL = 5 };

static int digits(const Py_UCS1 *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static int two_le(const Py_UCS1 *s, const char *lo, const char *hi)
{
    /* lo <= s[0:2] <= hi, as strings of two digits */
    int v = (s[0] - '0') * 10 + (s[1] - '0');
    int l = (lo[0] - '0') * 10 + (lo[1] - '0'), h = (hi[0] - '0') * 10 + (hi[1] - '0');
    return v >= l && v <= h;
}

/* types._plain_date: YYYY-MM-DD, a real date of years 1-9999 */
static int plain_date(const Py_UCS1 *s, Py_ssize_t n)
{
    static const int month_days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (!(n == 10 && s[4] == '-' && s[7] == '-' && digits(s, 4) && digits(s + 5, 2) &&
          digits(s + 8, 2) && !(s[0] == '0' && s[1] == '0' && s[2] == '0' && s[3] == '0') &&
          two_le(s + 5, "01", "12") && two_le(s + 8, "01", "31")))
        return 0;
    int year = (s[0] - '0') * 1000 + (s[1] - '0') * 100 + (s[2] - '0') * 10 + (s[3] - '0');
    int month = (s[5] - '0') * 10 + (s[6] - '0'), day = (s[8] - '0') * 10 + (s[9] - '0');
    if (day <= 28)
        return 1;
    int leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    return day <= month_days[month - 1] + (month == 2 && leap);
}

/* types._plain_datetime (with "Z" for a TIMESTAMP), or NULL without an error when the
 * text is not in the plain shape (the caller then calls the Python converter). */
static PyObject *plain_datetime(const Py_UCS1 *s, Py_ssize_t n, int zulu)
{
    if (!(n == 19 || (n >= 21 && n <= 26)) || !plain_date(s, 10))
        return NULL;
    if (!(s[10] == ' ' && s[13] == ':' && s[16] == ':' && digits(s + 11, 2) &&
          digits(s + 14, 2) && digits(s + 17, 2) && two_le(s + 11, "00", "23") &&
          two_le(s + 14, "00", "59") && two_le(s + 17, "00", "59")))
        return NULL;
    char out[32];
    memcpy(out, s, 10);
    out[10] = 'T';
    memcpy(out + 11, s + 11, 8);
    Py_ssize_t len = 19;
    if (n > 19) {
        if (s[19] != '.' || !digits(s + 20, n - 20))
            return NULL;
        int nonzero = 0;
        for (Py_ssize_t i = 20; i < n; i++)
            nonzero |= s[i] != '0';
        if (nonzero) {
            out[19] = '.';
            Py_ssize_t f = n - 20;
            memcpy(out + 20, s + 20, f);
            for (Py_ssize_t i = f; i < 6; i++)
                out[20 + i] = '0';
            len = 26;
        }
    }
    if (zulu)
        out[len++] = 'Z';
    return PyUnicode_FromStringAndSize(out, len);
}

/* types._decimal_of's plain shape: -?digits(.digits)? */
static int plain_decimal(const Py_UCS1 *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    if (n > 0 && s[0] == '-')
        i = 1;
    Py_ssize_t w = i;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++;
    if (i == w)
        return 0;
    if (i == n)
        return 1;
    if (s[i] != '.' || i + 1 == n)
        return 0;
    return digits(s + i + 1, n - i - 1);
}

static PyObject *map_value(PyObject *v, long kind, PyObject *conv)
{
    if (v == Py_None || kind == K_PLAIN)
        return Py_NewRef(v);
    if (kind >= K_DATETIME && PyUnicode_CheckExact(v) && PyUnicode_IS_ASCII(v)) {
        const Py_UCS1 *s = PyUnicode_1BYTE_DATA(v);
        Py_ssize_t n = PyUnicode_GET_LENGTH(v);
        if (kind == K_DATE && plain_date(s, n))
            return Py_NewRef(v);
        if (kind == K_DECIMAL && plain_decimal(s, n))
            return Py_NewRef(v);
        if (kind == K_DATETIME || kind == K_TIMESTAMP) {
            PyObject *got = plain_datetime(s, n, kind == K_TIMESTAMP);
            if (got != NULL || PyErr_Occurred())
                return got;
        }
    }
    return PyObject_CallOneArg(conv, v);
}

static PyObject *map_rows(PyObject *self, PyObject *args)
{
    PyObject *rows, *names, *kinds, *convs;
    if (!PyArg_ParseTuple(args, "OO!O!O!", &rows, &PyTuple_Type, &names, &PyTuple_Type, &kinds,
                          &PyTuple_Type, &convs))
        return NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(kinds) != ncols || PyTuple_GET_SIZE(convs) != ncols) {
        PyErr_SetString(PyExc_ValueError, "names, kinds and convs differ in length");
        return NULL;
    }
    long kind[ncols > 0 ? ncols : 1];
    for (Py_ssize_t c = 0; c < ncols; c++) {
        kind[c] = PyLong_AsLong(PyTuple_GET_ITEM(kinds, c));
        if (kind[c] == -1 && PyErr_Occurred())
            return NULL;
        if (kind[c] != K_PLAIN && PyTuple_GET_ITEM(convs, c) == Py_None) {
            PyErr_SetString(PyExc_ValueError, "a mapped column needs its converter");
            return NULL;
        }
    }
    PyObject *seq = PySequence_Fast(rows, "rows must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nrows = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(nrows);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, r);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != ncols) {
            PyErr_SetString(PyExc_ValueError, "a row's length is not the mapping's");
            goto fail;
        }
        PyObject *d = _PyDict_NewPresized(ncols);
        if (d == NULL)
            goto fail;
        PyList_SET_ITEM(out, r, d);
        for (Py_ssize_t c = 0; c < ncols; c++) {
            PyObject *v = map_value(PyTuple_GET_ITEM(row, c), kind[c], PyTuple_GET_ITEM(convs, c));
            if (v == NULL)
                goto fail;
            int bad = PyDict_SetItem(d, PyTuple_GET_ITEM(names, c), v);
            Py_DECREF(v);
            if (bad < 0)
                goto fail;
        }
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"row", row, METH_VARARGS, "A text-protocol row packet's values as a tuple."},
    {"rows", rows, METH_VARARGS,
     "rows(buf, seq, plan, out): the buffered complete row packets appended to out."},
    {"map_rows", map_rows, METH_VARARGS,
     "map_rows(rows, names, kinds, convs): SelectMapper.map of each row (a list of dicts)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mytext", NULL, -1, methods};

PyMODINIT_FUNC PyInit__mytext(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", MYTEXT_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
