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
 * Invariant: for every packet, the tuple equals PyMySQL's (same types, same values, same
 * exceptions' classes for undecodable text and unconvertible numbers), since each value
 * goes through the same CPython constructors: PyUnicode_Decode*, PyLong_FromUnicodeObject
 * (int(str)), PyFloat_FromString (float(str)), or the converter itself.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MYTEXT_VERSION 1

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

static PyObject *row(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t pos;
    PyObject *plan;
    if (!PyArg_ParseTuple(args, "y*nO!", &buf, &pos, &PyTuple_Type, &plan))
        return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t n = buf.len, ncols = PyTuple_GET_SIZE(plan), got = 0;
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
    PyBuffer_Release(&buf);
    if (got < ncols) {
        PyObject *cut = PyTuple_GetSlice(out, 0, got);
        Py_DECREF(out);
        return cut;
    }
    return out;
fail:
    PyBuffer_Release(&buf);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"row", row, METH_VARARGS, "A text-protocol row packet's values as a tuple."},
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
