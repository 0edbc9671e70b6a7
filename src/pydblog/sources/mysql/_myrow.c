/* The rows of one binlog rows event decoded straight into pydblog's values.
 *
 * compile(specs) takes one spec per column of a table (``pydblog.sources.mysql.native``
 * builds them from the TABLE_MAP):
 *
 *     (name, read, a, b, encoding, out, extra)
 *
 * ``read`` how the value is stored (R_* below, with its parameters ``a`` and ``b``),
 * ``encoding`` the Python codec of a text column (None: bytes), ``out`` how the value
 * becomes pydblog's (O_* below) and ``extra`` its object (ENUM members, a callable).
 * It returns a plan (a capsule).
 *
 * rows(plan, body, present, present2) decodes a rows event's body (the row images after
 * the event's header and column bitmaps): ``present`` is the columns-present bitmap of
 * its (before) image, ``present2`` that of an update's after image (None for writes and
 * deletes). It returns a list with one dict {column name: value} per row, in column
 * order, or one (before, after) tuple of them per row of an update. A column missing
 * from the image or NULL is None.
 *
 * tails(plan, body, present, key, dumps, sep, present2, kind) encodes the same rows as
 * change-log envelope tails joined by newlines, byte for byte what ``encode_event``
 * writes after ``"key":`` for each row's event (``key``: the key columns' indexes):
 * ``kind`` 0, a write: ``key`` + ``sep`` + row + ``}``; 2, a delete:
 * ``key,"before":row,"after":null}``; 1, an update (``present2`` its after image's
 * bitmap): ``key,"before":before,"after":after}`` with the after image's key. It
 * returns ``(count, text)``, or None where rows() would be inexact or an update changes
 * a key's text (the caller decodes the rows: a key change is a delete and a create).
 *
 * Every value is exactly what ``pydblog.sources.mysql.fastrows``'s reader for the
 * column followed by ``types.BinlogRowMapper.map`` gives. Where that Python path would
 * raise or differ (a truncated body, invalid UTF-8, a date Python's ``datetime``
 * refuses, an ENUM index beyond its members, a converter that raises), rows() returns
 * None and the caller decodes the body in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define VERSION 4

enum { R_INT = 0, R_UINT, R_INT24, R_UINT24, R_FLOAT, R_DOUBLE, R_STR, R_DATETIME2,
       R_TIMESTAMP2, R_DATE, R_DECIMAL, R_YEAR, R_ENUM, R_COUNT };
enum { O_ASIS = 0, O_FLOAT32, O_B64, O_PADDED_B64, O_CALL, O_COUNT };

typedef struct {
    PyObject *name;      /* str */
    int read;
    int a, b;            /* width / prefix, fsp, precision and scale, enum size */
    PyObject *encoding;  /* str or NULL */
    const char *enc;     /* its UTF-8, or NULL */
    int utf8;            /* the encoding is UTF-8 */
    int out;
    PyObject *extra;     /* ENUM members (list), the callable of O_CALL, or NULL */
    char *name_json;     /* "name": as JSON (orjson's escaping) */
    size_t name_json_len;
} col_t;

typedef struct {
    Py_ssize_t n;
    col_t *cols;
} plan_t;

static void plan_free(PyObject *capsule) {
    plan_t *p = PyCapsule_GetPointer(capsule, "pydblog._myrow.plan");
    if (p == NULL) return;
    for (Py_ssize_t i = 0; i < p->n; i++) {
        Py_XDECREF(p->cols[i].name);
        Py_XDECREF(p->cols[i].encoding);
        Py_XDECREF(p->cols[i].extra);
        PyMem_Free(p->cols[i].name_json);
    }
    PyMem_Free(p->cols);
    PyMem_Free(p);
}

/* JSON string escaping as orjson writes it: '"', '\\' and the control characters below
 * 0x20 escaped (\b \f \n \r \t, else \u00xx), everything else as its UTF-8 bytes. */
static size_t escaped_len(const unsigned char *s, size_t n) {
    size_t out = n;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = s[i];
        if (ch == '"' || ch == '\\' || ch == '\b' || ch == '\f' || ch == '\n' || ch == '\r' || ch == '\t') out += 1;
        else if (ch < 0x20) out += 5;
    }
    return out;
}

static char *escape_into(char *o, const unsigned char *s, size_t n) {
    static const char HEX[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = s[i];
        switch (ch) {
        case '"': *o++ = '\\'; *o++ = '"'; break;
        case '\\': *o++ = '\\'; *o++ = '\\'; break;
        case '\b': *o++ = '\\'; *o++ = 'b'; break;
        case '\f': *o++ = '\\'; *o++ = 'f'; break;
        case '\n': *o++ = '\\'; *o++ = 'n'; break;
        case '\r': *o++ = '\\'; *o++ = 'r'; break;
        case '\t': *o++ = '\\'; *o++ = 't'; break;
        default:
            if (ch < 0x20) {
                *o++ = '\\'; *o++ = 'u'; *o++ = '0'; *o++ = '0';
                *o++ = HEX[ch >> 4]; *o++ = HEX[ch & 15];
            } else {
                *o++ = (char)ch;
            }
        }
    }
    return o;
}

static PyObject *compile(PyObject *self, PyObject *args) {
    PyObject *specs;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &specs)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(specs);
    plan_t *p = PyMem_Calloc(1, sizeof(plan_t));
    if (p == NULL) return PyErr_NoMemory();
    p->cols = PyMem_Calloc(n ? (size_t)n : 1, sizeof(col_t));
    if (p->cols == NULL) { PyMem_Free(p); return PyErr_NoMemory(); }
    PyObject *capsule = PyCapsule_New(p, "pydblog._myrow.plan", plan_free);
    if (capsule == NULL) { PyMem_Free(p->cols); PyMem_Free(p); return NULL; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name, *encoding, *extra;
        int read, a, b, out;
        col_t *c = &p->cols[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(specs, i), "UiiiOiO", &name, &read, &a, &b,
                              &encoding, &out, &extra)) {
            Py_DECREF(capsule);
            return NULL;
        }
        p->n = i + 1;
        Py_INCREF(name);
        c->name = name;
        {
            Py_ssize_t nlen;
            const char *utf8 = PyUnicode_AsUTF8AndSize(name, &nlen);
            if (utf8 == NULL) { Py_DECREF(capsule); return NULL; }
            size_t e = escaped_len((const unsigned char *)utf8, (size_t)nlen);
            c->name_json = PyMem_Malloc(e + 3);
            if (c->name_json == NULL) { Py_DECREF(capsule); return PyErr_NoMemory(); }
            char *w = c->name_json;
            *w++ = '"';
            w = escape_into(w, (const unsigned char *)utf8, (size_t)nlen);
            *w++ = '"';
            *w++ = ':';
            c->name_json_len = (size_t)(w - c->name_json);
        }
        if (read < 0 || read >= R_COUNT || out < 0 || out >= O_COUNT) {
            PyErr_Format(PyExc_ValueError, "column %R: unknown read %d or out %d", name, read, out);
            Py_DECREF(capsule);
            return NULL;
        }
        c->read = read;
        c->a = a;
        c->b = b;
        c->out = out;
        if (encoding != Py_None) {
            if (!PyUnicode_Check(encoding)) {
                PyErr_Format(PyExc_TypeError, "column %R: encoding must be str or None", name);
                Py_DECREF(capsule);
                return NULL;
            }
            Py_INCREF(encoding);
            c->encoding = encoding;
            c->enc = PyUnicode_AsUTF8(encoding);
            if (c->enc == NULL) { Py_DECREF(capsule); return NULL; }
            c->utf8 = strcmp(c->enc, "utf8") == 0 || strcmp(c->enc, "utf-8") == 0;
        }
        if (extra != Py_None) {
            Py_INCREF(extra);
            c->extra = extra;
        }
        if ((read == R_ENUM && (c->extra == NULL || !PyList_Check(c->extra))) ||
            (out == O_CALL && (c->extra == NULL || !PyCallable_Check(c->extra)))) {
            PyErr_Format(PyExc_ValueError, "column %R: ENUM needs its members, O_CALL a callable", name);
            Py_DECREF(capsule);
            return NULL;
        }
    }
    return capsule;
}

/* -- values ---------------------------------------------------------------------------- */
typedef struct {
    const unsigned char *buf;
    Py_ssize_t len;
    Py_ssize_t pos;
    int inexact; /* the Python path would raise or differ here: give up (return None) */
} cur_t;

static inline uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

static const int FSP_BYTES[7] = {0, 1, 1, 2, 2, 3, 3};
static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};

/* ``v`` in decimal at ``p`` (printf's %llu); the end. */
static char *digits(char *p, uint64_t v) {
    char tmp[20];
    int n = 0;
    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n) *p++ = tmp[--n];
    return p;
}

/* ``v`` in decimal, zero-padded to at least ``width`` digits (printf's %0*llu); the end. */
static char *padded(char *p, uint64_t v, int width) {
    char tmp[20];
    int n = 0;
    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (width > n) { *p++ = '0'; width--; }
    while (n) *p++ = tmp[--n];
    return p;
}

static int take(cur_t *c, Py_ssize_t n, const unsigned char **at) {
    if (n < 0 || n > c->len - c->pos) { c->inexact = 1; return 0; }
    *at = c->buf + c->pos;
    c->pos += n;
    return 1;
}

/* fastrows._fraction: the fractional seconds' bytes, as microseconds. */
static int fraction(cur_t *c, int fsp, long *micros) {
    if (fsp < 0 || fsp > 6) { c->inexact = 1; return 0; }
    int nbytes = FSP_BYTES[fsp];
    *micros = 0;
    if (!nbytes) return 1;
    const unsigned char *p;
    if (!take(c, nbytes, &p)) return 0;
    int64_t raw = (int64_t)be(p, nbytes);
    if (raw & ((int64_t)1 << (8 * nbytes - 1))) raw -= (int64_t)1 << (8 * nbytes); /* signed */
    if (fsp % 2) raw = raw / 10; /* int(raw / 10): toward zero */
    long scale = 1;
    for (int i = fsp; i < 6; i++) scale *= 10;
    *micros = (long)raw * scale;
    return 1;
}

static int days_in(long y, long m) {
    static const int d[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
    return d[m - 1];
}

/* A value read as text (TEXT_*): ``buf`` holds ``n`` ASCII bytes. */
enum { TEXT_FAIL = -1, TEXT_NULL = 0, TEXT_OK = 1 };
#define TEXT_MAX 260

/* datetime.isoformat() of a valid naive datetime (+ "Z") into ``text``; its length. */
static int iso(char *text, long y, long mo, long d, long h, long mi, long s, long us, int z) {
    char *p = text;
    p = padded(p, (uint64_t)y, 4); *p++ = '-';
    p = padded(p, (uint64_t)mo, 2); *p++ = '-';
    p = padded(p, (uint64_t)d, 2); *p++ = 'T';
    p = padded(p, (uint64_t)h, 2); *p++ = ':';
    p = padded(p, (uint64_t)mi, 2); *p++ = ':';
    p = padded(p, (uint64_t)s, 2);
    if (us) { *p++ = '.'; p = padded(p, (uint64_t)us, 6); }
    if (z) *p++ = 'Z';
    return (int)(p - text);
}

static int text_datetime2(cur_t *c, int fsp, char *text, int *n) {
    const unsigned char *p;
    if (!take(c, 5, &p)) return TEXT_FAIL;
    uint64_t data = be(p, 5);
    long ym = (long)((data >> 22) & 0x1FFFF);
    long y = ym / 13, mo = ym % 13, d = (long)((data >> 17) & 0x1F);
    long h = (long)((data >> 12) & 0x1F), mi = (long)((data >> 6) & 0x3F), s = (long)(data & 0x3F);
    long us;
    if (!fraction(c, fsp, &us)) return TEXT_FAIL;
    if (y < 1 || y > 9999 || mo < 1 || mo > 12 || d < 1 || d > days_in(y, mo) || h > 23 ||
        mi > 59 || s > 59)
        return TEXT_NULL; /* datetime() refuses it: a zero date, None */
    if (us > 999999) { c->inexact = 1; return TEXT_FAIL; }
    *n = iso(text, y, mo, d, h, mi, s, us > 0 ? us : 0, 0);
    return TEXT_OK;
}

/* days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's civil_from_days). */
static void civil(int64_t z, long *y, long *m, long *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t yy = yoe + era * 400;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (long)(doy - (153 * mp + 2) / 5 + 1);
    *m = (long)(mp < 10 ? mp + 3 : mp - 9);
    *y = (long)(yy + (*m <= 2));
}

static int text_timestamp2(cur_t *c, int fsp, char *text, int *n) {
    const unsigned char *p;
    if (!take(c, 4, &p)) return TEXT_FAIL;
    int64_t secs = (int32_t)(uint32_t)be(p, 4);
    long us;
    if (!fraction(c, fsp, &us)) return TEXT_FAIL;
    if (us > 999999) { c->inexact = 1; return TEXT_FAIL; }
    int64_t days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
    int64_t rem = secs - days * 86400;
    long y, m, d;
    civil(days, &y, &m, &d);
    *n = iso(text, y, m, d, (long)(rem / 3600), (long)(rem % 3600 / 60), (long)(rem % 60),
             us > 0 ? us : 0, 1);
    return TEXT_OK;
}

static int text_date(cur_t *c, char *text, int *n) {
    const unsigned char *p;
    if (!take(c, 3, &p)) return TEXT_FAIL;
    uint32_t raw = (uint32_t)le(p, 3);
    long y = (long)((raw >> 9) & 0x7FFF), m = (long)((raw >> 5) & 0xF), d = (long)(raw & 0x1F);
    if (!(raw && y && m && d)) return TEXT_NULL;
    if (y > 9999 || m > 12 || d > days_in(y, m)) { c->inexact = 1; return TEXT_FAIL; } /* date() raises */
    char *w = text;
    w = padded(w, (uint64_t)y, 4); *w++ = '-';
    w = padded(w, (uint64_t)m, 2); *w++ = '-';
    w = padded(w, (uint64_t)d, 2);
    *n = (int)(w - text);
    return TEXT_OK;
}

/* fastrows._decimal then format(Decimal(text), "f"): the sign, the integral digits
 * without leading zeros (at least one digit), and the fractional digits as stored. */
static int text_decimal(cur_t *c, int precision, int scale, char *text, int *len) {
    if (precision < 0 || scale < 0 || scale > precision || precision > 81) { c->inexact = 1; return TEXT_FAIL; }
    int uncomp_int = (precision - scale) / 9, comp_int = (precision - scale) % 9;
    int uncomp_frac = scale / 9, comp_frac = scale % 9;
    int first = DIG2BYTES[comp_int], last = DIG2BYTES[comp_frac];
    int size = first + 4 * uncomp_int + 4 * uncomp_frac + last;
    const unsigned char *p;
    if (!take(c, size, &p)) return TEXT_FAIL;
    unsigned char raw[48];
    memcpy(raw, p, (size_t)size);
    int negative = !(raw[0] & 0x80);
    raw[0] ^= 0x80;
    if (negative)
        for (int i = 0; i < size; i++) raw[i] ^= 0xFF;
    char ip[128], fp[128];
    int in = 0, fn = 0, pos = 0;
    if (first) {
        in = (int)(digits(ip, be(raw, first)) - ip);
        pos = first;
    }
    for (int i = 0; i < uncomp_int; i++, pos += 4)
        in = (int)(padded(ip + in, be(raw + pos, 4), 9) - ip);
    for (int i = 0; i < uncomp_frac; i++, pos += 4)
        fn = (int)(padded(fp + fn, be(raw + pos, 4), 9) - fp);
    if (last)
        fn = (int)(padded(fp + fn, be(raw + pos, last), comp_frac) - fp);
    int n = 0;
    if (negative) text[n++] = '-';
    int skip = 0;
    while (skip < in && ip[skip] == '0') skip++;
    if (skip == in) text[n++] = '0';
    else { memcpy(text + n, ip + skip, (size_t)(in - skip)); n += in - skip; }
    if (fn) {
        text[n++] = '.';
        memcpy(text + n, fp, (size_t)fn);
        n += fn;
    }
    *len = n;
    return TEXT_OK;
}

/* The value of a text-formed column (DATETIME2, TIMESTAMP2, DATE, DECIMAL) at c->pos:
 * TEXT_OK with its text, TEXT_NULL (None), or TEXT_FAIL (c->inexact). */
static int read_text(cur_t *c, int read, int a, int b, char *text, int *n) {
    switch (read) {
    case R_DATETIME2: return text_datetime2(c, a, text, n);
    case R_TIMESTAMP2: return text_timestamp2(c, a, text, n);
    case R_DATE: return text_date(c, text, n);
    default: return text_decimal(c, a, b, text, n);
    }
}

static PyObject *text_value(cur_t *c, int read, int a, int b) {
    char text[TEXT_MAX];
    int n = 0;
    int found = read_text(c, read, a, b, text, &n);
    if (found == TEXT_FAIL) return NULL;
    if (found == TEXT_NULL) Py_RETURN_NONE;
    return PyUnicode_FromStringAndSize(text, n);
}

/* types.float32: the shortest %g text (6 to 9 digits) that reads back as the same
 * 32-bit float, else the float's double. */
static PyObject *float32(float f) {
    double value = (double)f;
    for (int digits = 6; digits < 10; digits++) {
        char *text = PyOS_double_to_string(value, 'g', digits, 0, NULL);
        if (text == NULL) return NULL;
        double candidate = PyOS_string_to_double(text, NULL, NULL);
        PyMem_Free(text);
        if (candidate == -1.0 && PyErr_Occurred()) return NULL;
        float back = (float)candidate;
        if (memcmp(&back, &f, sizeof f) == 0) return PyFloat_FromDouble(candidate);
    }
    return PyFloat_FromDouble(value);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static PyObject *b64(const unsigned char *s, Py_ssize_t n, Py_ssize_t pad_to) {
    Py_ssize_t total = n > pad_to ? n : pad_to;
    Py_ssize_t out_len = (total + 2) / 3 * 4;
    PyObject *out = PyUnicode_New(out_len, 127);
    if (out == NULL) return NULL;
    Py_UCS1 *o = PyUnicode_1BYTE_DATA(out);
    Py_ssize_t i = 0, k = 0;
#define AT(j) ((j) < n ? s[j] : 0)
    for (; i + 2 < total; i += 3) {
        uint32_t v = ((uint32_t)AT(i) << 16) | ((uint32_t)AT(i + 1) << 8) | AT(i + 2);
        o[k++] = B64[v >> 18]; o[k++] = B64[(v >> 12) & 63]; o[k++] = B64[(v >> 6) & 63]; o[k++] = B64[v & 63];
    }
    if (total - i == 1) {
        uint32_t v = (uint32_t)AT(i) << 16;
        o[k++] = B64[v >> 18]; o[k++] = B64[(v >> 12) & 63]; o[k++] = '='; o[k++] = '=';
    } else if (total - i == 2) {
        uint32_t v = ((uint32_t)AT(i) << 16) | ((uint32_t)AT(i + 1) << 8);
        o[k++] = B64[v >> 18]; o[k++] = B64[(v >> 12) & 63]; o[k++] = B64[(v >> 6) & 63]; o[k++] = '=';
    }
#undef AT
    return out;
}

/* A value whose decoding raised: clear it and give up on the event (inexact). */
static PyObject *inexact(cur_t *c) {
    PyErr_Clear();
    c->inexact = 1;
    return NULL;
}

static PyObject *read_str(cur_t *c, const col_t *col) {
    const unsigned char *p, *s;
    if (!take(c, col->a, &p)) return NULL;
    Py_ssize_t n = (Py_ssize_t)le(p, col->a);
    if (!take(c, n, &s)) return NULL;
    if (col->out == O_B64 || col->out == O_PADDED_B64) /* a binary column: base64 */
        return b64(s, n, col->out == O_PADDED_B64 ? col->b : 0);
    PyObject *v;
    if (col->encoding == NULL) {
        if (n == 0) return PyUnicode_New(0, 0); /* the library's b"".decode("binary") */
        v = PyBytes_FromStringAndSize((const char *)s, n);
    } else if (col->utf8) {
        v = PyUnicode_DecodeUTF8((const char *)s, n, "strict");
    } else {
        v = PyUnicode_Decode((const char *)s, n, col->enc, "strict");
    }
    if (v == NULL) return inexact(c);
    return v;
}

/* One present, non-NULL value of ``col``; NULL with c->inexact (give up) or an error. */
static PyObject *value(cur_t *c, const col_t *col) {
    const unsigned char *p;
    PyObject *v;
    switch (col->read) {
    case R_INT:
    case R_UINT:
        if (!take(c, col->a, &p)) return NULL;
        if (col->read == R_UINT) return PyLong_FromUnsignedLongLong(le(p, col->a));
        {
            uint64_t u = le(p, col->a);
            int bits = 8 * col->a;
            int64_t s = bits == 64 ? (int64_t)u
                        : ((u >> (bits - 1)) & 1) ? (int64_t)u - ((int64_t)1 << bits) : (int64_t)u;
            return PyLong_FromLongLong(s);
        }
    case R_INT24:
    case R_UINT24:
        if (!take(c, 3, &p)) return NULL;
        {
            int64_t u = (int64_t)le(p, 3);
            if (col->read == R_INT24 && (u & 0x800000)) u -= 0x1000000;
            return PyLong_FromLongLong(u);
        }
    case R_FLOAT:
        if (!take(c, 4, &p)) return NULL;
        {
            float f;
            memcpy(&f, p, 4);
            if (col->out == O_FLOAT32) return float32(f);
            return PyFloat_FromDouble((double)f);
        }
    case R_DOUBLE:
        if (!take(c, 8, &p)) return NULL;
        {
            double d;
            memcpy(&d, p, 8);
            return PyFloat_FromDouble(d);
        }
    case R_STR:
        v = read_str(c, col);
        break;
    case R_DATETIME2:
    case R_TIMESTAMP2:
    case R_DATE:
    case R_DECIMAL:
        return text_value(c, col->read, col->a, col->b);
    case R_YEAR:
        if (!take(c, 1, &p)) return NULL;
        return PyLong_FromLong((long)p[0] + 1900);
    case R_ENUM:
        if (!take(c, col->a, &p)) return NULL;
        {
            Py_ssize_t index = (Py_ssize_t)le(p, col->a), size = PyList_GET_SIZE(col->extra);
            if (size == 0) Py_RETURN_NONE;
            if (index >= size) { c->inexact = 1; return NULL; }
            v = PyList_GET_ITEM(col->extra, index);
            Py_INCREF(v);
        }
        break;
    default:
        c->inexact = 1;
        return NULL;
    }
    if (v == NULL || col->out != O_CALL) return v;
    PyObject *mapped = PyObject_CallOneArg(col->extra, v);
    Py_DECREF(v);
    if (mapped == NULL) return inexact(c);
    return mapped;
}

/* One row image at c->pos: a dict, or NULL (c->inexact: give up; else an error). */
static PyObject *image(cur_t *c, const plan_t *plan, const unsigned char *present) {
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < plan->n; i++)
        if (present[i >> 3] & (1 << (i & 7))) count++;
    const unsigned char *nulls;
    if (!take(c, (count + 7) / 8, &nulls)) return NULL;
    PyObject *row = _PyDict_NewPresized(plan->n);
    if (row == NULL) return NULL;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < plan->n; i++) {
        const col_t *col = &plan->cols[i];
        PyObject *v;
        if (!(present[i >> 3] & (1 << (i & 7)))) {
            v = Py_NewRef(Py_None);
        } else {
            if (nulls[k >> 3] & (1 << (k & 7))) v = Py_NewRef(Py_None);
            else v = value(c, col);
            k++;
        }
        if (v == NULL || PyDict_SetItem(row, col->name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(row);
            return NULL;
        }
        Py_DECREF(v);
    }
    return row;
}

static PyObject *rows(PyObject *self, PyObject *args) {
    PyObject *capsule;
    Py_buffer body, present, present2 = {0};
    PyObject *second;
    if (!PyArg_ParseTuple(args, "Oy*y*O", &capsule, &body, &present, &second)) return NULL;
    PyObject *out = NULL;
    plan_t *plan = PyCapsule_GetPointer(capsule, "pydblog._myrow.plan");
    if (plan == NULL) goto done;
    int update = second != Py_None;
    if (update && PyObject_GetBuffer(second, &present2, PyBUF_SIMPLE) < 0) goto done;
    Py_ssize_t need = (plan->n + 7) / 8;
    if (present.len < need || (update && present2.len < need)) {
        PyErr_SetString(PyExc_ValueError, "a columns-present bitmap shorter than the plan's columns");
        goto done;
    }
    cur_t c = {body.buf, body.len, 0, 0};
    out = PyList_New(0);
    if (out == NULL) goto done;
    while (c.pos < c.len) {
        PyObject *item = image(&c, plan, present.buf);
        if (item != NULL && update) {
            PyObject *after = image(&c, plan, present2.buf);
            if (after == NULL) {
                Py_CLEAR(item);
            } else {
                PyObject *pair = PyTuple_Pack(2, item, after);
                Py_DECREF(item);
                Py_DECREF(after);
                item = pair;
            }
        }
        if (item == NULL) {
            Py_CLEAR(out);
            if (c.inexact && !PyErr_Occurred()) out = Py_NewRef(Py_None);
            goto done;
        }
        int failed = PyList_Append(out, item);
        Py_DECREF(item);
        if (failed) { Py_CLEAR(out); goto done; }
    }
done:
    PyBuffer_Release(&body);
    PyBuffer_Release(&present);
    if (present2.obj != NULL) PyBuffer_Release(&present2);
    return out;
}

typedef struct {
    char *buf;
    size_t len, cap;
} out_t;

static inline int put(out_t *o, const char *s, size_t n) {
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->len + n) cap *= 2;
        char *grown = PyMem_Realloc(o->buf, cap);
        if (grown == NULL) { PyErr_NoMemory(); return 0; }
        o->buf = grown;
        o->cap = cap;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    return 1;
}

/* Appends dumps(value)'s bytes; 0 on an error (c->inexact where dumps raised). */
static int put_dumped(out_t *o, cur_t *c, PyObject *dumps, PyObject *value) {
    PyObject *b = PyObject_CallOneArg(dumps, value);
    if (b == NULL) { inexact(c); return 0; }
    int ok = PyBytes_Check(b) && put(o, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
    if (!PyBytes_Check(b)) c->inexact = 1;
    Py_DECREF(b);
    return ok;
}

static int put_escaped(out_t *o, const char *s, size_t n) {
    size_t e = escaped_len((const unsigned char *)s, n);
    if (!put(o, "\"", 1)) return 0;
    if (e == n) {
        if (!put(o, s, n)) return 0;
    } else {
        /* grow to fit, then escape in place */
        while (o->len + e > o->cap) {
            size_t cap = o->cap ? o->cap * 2 : 4096;
            char *grown = PyMem_Realloc(o->buf, cap);
            if (grown == NULL) { PyErr_NoMemory(); return 0; }
            o->buf = grown;
            o->cap = cap;
        }
        escape_into(o->buf + o->len, (const unsigned char *)s, n);
        o->len += e;
    }
    return put(o, "\"", 1);
}

/* ``value`` as orjson writes it: integers and text here, anything else by ``dumps``. */
static int put_json(out_t *o, cur_t *c, PyObject *dumps, PyObject *value) {
    if (value == Py_None) return put(o, "null", 4);
    if (PyLong_CheckExact(value)) {
        char text[32], *p = text;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow == 0) {
            if (v == -1 && PyErr_Occurred()) return 0;
            if (v < 0) { *p++ = '-'; p = digits(p, (uint64_t)0 - (uint64_t)v); }
            else p = digits(p, (uint64_t)v);
        } else {
            unsigned long long u = PyLong_AsUnsignedLongLong(value);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return put_dumped(o, c, dumps, value); }
            p = digits(p, (uint64_t)u);
        }
        return put(o, text, (size_t)(p - text));
    }
    if (PyUnicode_CheckExact(value)) {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(value, &n);
        if (utf8 == NULL) { inexact(c); return 0; }
        return put_escaped(o, utf8, (size_t)n);
    }
    return put_dumped(o, c, dumps, value);
}

/* Whether ``s`` is UTF-8 that Python's strict decoder takes (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF). */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char b = s[i];
        if (b < 0x80) { i++; continue; }
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) need = 1;
        else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            if (b == 0xE0) lo = 0xA0;
            else if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            if (b == 0xF0) lo = 0x90;
            else if (b == 0xF4) hi = 0x8F;
        } else return 0;
        if (n - i <= need) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += need + 1;
    }
    return 1;
}


/* A present, non-NULL value of ``col`` written straight as JSON where it needs no Python
 * object (integers, UTF-8 text, the text of dates, times and decimals; not doubles:
 * orjson's shortest form is faster than PyOS_double_to_string's): 1 written, 0 an error
 * or c->inexact, -1 not this column's path (nothing read). */
static int put_direct(out_t *o, cur_t *c, const col_t *col) {
    const unsigned char *p;
    char text[TEXT_MAX + 2], *w = text;
    Py_ssize_t at = c->pos;
    if (col->out != O_ASIS) return -1;
    switch (col->read) {
    case R_STR:
        if (!col->utf8 || col->encoding == NULL) return -1;
        {
            const unsigned char *s;
            if (!take(c, col->a, &p)) return 0;
            Py_ssize_t n = (Py_ssize_t)le(p, col->a);
            if (!take(c, n, &s)) return 0;
            if (!utf8_valid(s, (size_t)n)) { c->pos = at; return -1; }
            return put_escaped(o, (const char *)s, (size_t)n);
        }
    case R_INT:
    case R_UINT:
        if (!take(c, col->a, &p)) return 0;
        {
            uint64_t u = le(p, col->a);
            int bits = 8 * col->a;
            if (col->read == R_INT && ((u >> (bits - 1)) & 1)) {
                /* negative: two's complement within ``bits`` */
                uint64_t mag = bits == 64 ? (uint64_t)0 - u : ((uint64_t)1 << bits) - u;
                *w++ = '-';
                w = digits(w, mag);
            } else {
                w = digits(w, u);
            }
        }
        return put(o, text, (size_t)(w - text));
    case R_INT24:
    case R_UINT24:
        if (!take(c, 3, &p)) return 0;
        {
            int64_t u = (int64_t)le(p, 3);
            if (col->read == R_INT24 && (u & 0x800000)) u -= 0x1000000;
            if (u < 0) { *w++ = '-'; w = digits(w, (uint64_t)(-u)); }
            else w = digits(w, (uint64_t)u);
        }
        return put(o, text, (size_t)(w - text));
    case R_YEAR:
        if (!take(c, 1, &p)) return 0;
        w = digits(w, (uint64_t)p[0] + 1900);
        return put(o, text, (size_t)(w - text));
    case R_DATETIME2:
    case R_TIMESTAMP2:
    case R_DATE:
    case R_DECIMAL: {
        int n = 0;
        int found = read_text(c, col->read, col->a, col->b, text + 1, &n);
        if (found == TEXT_FAIL) return 0;
        if (found == TEXT_NULL) return put(o, "null", 4);
        text[0] = '"';
        text[n + 1] = '"';
        return put(o, text, (size_t)n + 2); /* ASCII digits and separators: nothing to escape */
    }
    default:
        return -1;
    }
}

/* One row image at c->pos written as the JSON object orjson writes for its dict, each
 * column's value's [start, end) in ``o`` kept in ``spans``; 0: c->inexact or an error. */
static int json_image(cur_t *c, const plan_t *plan, const unsigned char *present, out_t *o,
                      PyObject *dumps, size_t *spans) {
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < plan->n; i++)
        if (present[i >> 3] & (1 << (i & 7))) count++;
    const unsigned char *nulls;
    if (!take(c, (count + 7) / 8, &nulls)) return 0;
    if (!put(o, "{", 1)) return 0;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < plan->n; i++) {
        const col_t *col = &plan->cols[i];
        if ((i && !put(o, ",", 1)) || !put(o, col->name_json, col->name_json_len)) return 0;
        spans[2 * i] = o->len;
        int null = 1;
        if (present[i >> 3] & (1 << (i & 7))) {
            null = (nulls[k >> 3] & (1 << (k & 7))) != 0;
            k++;
        }
        if (null) {
            if (!put(o, "null", 4)) return 0;
        } else {
            int direct = put_direct(o, c, col);
            if (direct == 0) return 0;
            if (direct == 1) { spans[2 * i + 1] = o->len; continue; }
            PyObject *v = value(c, col);
            if (v == NULL) return 0;
            int ok = put_json(o, c, dumps, v);
            Py_DECREF(v);
            if (!ok) return 0;
        }
        spans[2 * i + 1] = o->len;
    }
    return put(o, "}", 1);
}

/* Whether the key columns' values of two encoded images are the same text. */
static int same_key(const out_t *a, const size_t *sa, const out_t *b, const size_t *sb,
                    const Py_ssize_t *keys, Py_ssize_t nkey) {
    for (Py_ssize_t j = 0; j < nkey; j++) {
        size_t af = sa[2 * keys[j]], at = sa[2 * keys[j] + 1];
        size_t bf = sb[2 * keys[j]], bt = sb[2 * keys[j] + 1];
        if (at - af != bt - bf || memcmp(a->buf + af, b->buf + bf, at - af) != 0) return 0;
    }
    return 1;
}

enum { K_WRITE = 0, K_UPDATE, K_DELETE };

static PyObject *tails(PyObject *self, PyObject *args) {
    PyObject *capsule, *key, *dumps, *second;
    Py_buffer body, present, sep, present2 = {0};
    int kind;
    if (!PyArg_ParseTuple(args, "Oy*y*O!Oy*Oi", &capsule, &body, &present, &PyTuple_Type, &key,
                          &dumps, &sep, &second, &kind))
        return NULL;
    PyObject *result = NULL;
    out_t o = {NULL, 0, 0}, r = {NULL, 0, 0}, r2 = {NULL, 0, 0};
    size_t *spans = NULL, *spans2 = NULL;
    Py_ssize_t *keys = NULL;
    plan_t *plan = PyCapsule_GetPointer(capsule, "pydblog._myrow.plan");
    if (plan == NULL) goto done;
    if (kind < K_WRITE || kind > K_DELETE) {
        PyErr_SetString(PyExc_ValueError, "kind: 0 (write), 1 (update) or 2 (delete)");
        goto done;
    }
    if ((kind == K_UPDATE) != (second != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "an update needs its after image's bitmap, the others none");
        goto done;
    }
    if (kind == K_UPDATE && PyObject_GetBuffer(second, &present2, PyBUF_SIMPLE) < 0) goto done;
    Py_ssize_t need = (plan->n + 7) / 8;
    if (present.len < need || (kind == K_UPDATE && present2.len < need)) {
        PyErr_SetString(PyExc_ValueError, "a columns-present bitmap shorter than the plan's columns");
        goto done;
    }
    Py_ssize_t nkey = PyTuple_GET_SIZE(key);
    spans = PyMem_Calloc(2 * (size_t)(plan->n ? plan->n : 1), sizeof(size_t));
    spans2 = PyMem_Calloc(2 * (size_t)(plan->n ? plan->n : 1), sizeof(size_t));
    keys = PyMem_Calloc((size_t)(nkey ? nkey : 1), sizeof(Py_ssize_t));
    if (spans == NULL || spans2 == NULL || keys == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t j = 0; j < nkey; j++) {
        Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, j));
        if (index == -1 && PyErr_Occurred()) goto done;
        if (index < 0 || index >= plan->n) {
            PyErr_SetString(PyExc_ValueError, "a key column index outside the plan's columns");
            goto done;
        }
        keys[j] = index;
    }
    static const char BEFORE[] = ",\"before\":", AFTER[] = ",\"after\":", NULL_END[] = ",\"after\":null}";
    cur_t c = {body.buf, body.len, 0, 0};
    Py_ssize_t count = 0;
    while (c.pos < c.len) {
        r.len = 0;
        if (!json_image(&c, plan, present.buf, &r, dumps, spans)) goto failed;
        /* the key from the row the event leaves: an update's after image */
        const out_t *kr = &r;
        const size_t *ks = spans;
        if (kind == K_UPDATE) {
            r2.len = 0;
            if (!json_image(&c, plan, present2.buf, &r2, dumps, spans2)) goto failed;
            if (!same_key(&r, spans, &r2, spans2, keys, nkey)) {
                /* a key change: a delete and a create (the caller's event path) */
                result = Py_NewRef(Py_None);
                goto done;
            }
            kr = &r2;
            ks = spans2;
        }
        int ok = (count == 0 || put(&o, "\n", 1)) && put(&o, "{", 1);
        for (Py_ssize_t j = 0; ok && j < nkey; j++) {
            const col_t *col = &plan->cols[keys[j]];
            size_t from = ks[2 * keys[j]], to = ks[2 * keys[j] + 1];
            ok = (j == 0 || put(&o, ",", 1)) && put(&o, col->name_json, col->name_json_len) &&
                 put(&o, kr->buf + from, to - from);
        }
        ok = ok && put(&o, "}", 1);
        if (kind == K_WRITE)
            ok = ok && put(&o, sep.buf, (size_t)sep.len) && put(&o, r.buf, r.len) && put(&o, "}", 1);
        else if (kind == K_DELETE)
            ok = ok && put(&o, BEFORE, sizeof(BEFORE) - 1) && put(&o, r.buf, r.len) &&
                 put(&o, NULL_END, sizeof(NULL_END) - 1);
        else
            ok = ok && put(&o, BEFORE, sizeof(BEFORE) - 1) && put(&o, r.buf, r.len) &&
                 put(&o, AFTER, sizeof(AFTER) - 1) && put(&o, r2.buf, r2.len) && put(&o, "}", 1);
        if (!ok) goto failed;
        count++;
    }
    {
        PyObject *text = PyUnicode_DecodeUTF8(o.buf ? o.buf : "", (Py_ssize_t)o.len, "strict");
        if (text == NULL) goto done;
        result = Py_BuildValue("(nN)", count, text);
    }
    goto done;
failed:
    if (c.inexact && !PyErr_Occurred()) result = Py_NewRef(Py_None);
done:
    PyMem_Free(o.buf);
    PyMem_Free(r.buf);
    PyMem_Free(r2.buf);
    PyMem_Free(spans);
    PyMem_Free(spans2);
    PyMem_Free(keys);
    PyBuffer_Release(&body);
    PyBuffer_Release(&present);
    PyBuffer_Release(&sep);
    if (present2.obj != NULL) PyBuffer_Release(&present2);
    return result;
}

static PyMethodDef methods[] = {
    {"compile", compile, METH_VARARGS, "A table's plan from its columns' specs."},
    {"rows", rows, METH_VARARGS, "The rows of a rows event's body, or None (decode in Python)."},
    {"tails", tails, METH_VARARGS, "A rows event's change-log tails, or None (decode in Python)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_myrow", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__myrow(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "VERSION", VERSION) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
