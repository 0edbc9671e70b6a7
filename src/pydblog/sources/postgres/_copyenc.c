/* A snapshot chunk read as COPY text, encoded straight into the fast path's texts.
 *
 * copy_chunk(pgconn_ptr, query, types, keys, tail[, block_rows]) runs ``query`` (a
 * ``COPY (SELECT ...) TO STDOUT``) on psycopg's libpq connection, without the GIL, and
 * turns every COPY text row into the two lines the server-side fast path writes
 * (``pydblog.sources.postgres.chunks``): the chunk key's JSON text and the row tail
 * ``key_json + TAIL_SEP + after_json + "}"``, byte for byte what PostgreSQL's JSON
 * expressions give (``TypeRegistry.json_text_expr``; checked by
 * tests/integration/test_pg_native_chunks.py).
 *
 * Returns (count, keys, tails) with the lines joined by newlines (with ``block_rows``
 * > 0, tails is a list of texts of ``block_rows`` lines each, the last one of 1 to
 * ``block_rows``: the change log's blocks, cut while encoding instead of by splitting
 * and joining the chunk in Python on the capture thread; empty for no rows); or
 * (None, sqlstate, message) when the server failed the query (sqlstate may be None);
 * or (None, None, None, reason) when a value has a form this encoder does not know:
 * the caller then reads the chunk by the SQL path. libpq is not linked: its few
 * functions are looked up in the library psycopg loaded (``init``).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef void PGconn;
typedef void PGresult;
enum { PGRES_COMMAND_OK = 1, PGRES_COPY_OUT = 3, PGRES_COPY_IN = 4, PGRES_COPY_BOTH = 8 };

/* The extended protocol's PQsendQueryParams, not PQexec: it runs exactly one statement
 * (a snapshot filter holding "...; COMMIT; ..." is refused, never run). */
static int (*p_PQsendQueryParams)(PGconn *, const char *, int, const unsigned int *,
                                  const char *const *, const int *, const int *, int);
static int (*p_PQresultStatus)(const PGresult *);
static void (*p_PQclear)(PGresult *);
static int (*p_PQgetCopyData)(PGconn *, char **, int);
static void (*p_PQfreemem)(void *);
static PGresult *(*p_PQgetResult)(PGconn *);
static char *(*p_PQerrorMessage)(const PGconn *);
static char *(*p_PQresultErrorField)(const PGresult *, int);
static char *(*p_PQresultErrorMessage)(const PGresult *);
static int (*p_PQisnonblocking)(const PGconn *);
static int (*p_PQsetnonblocking)(PGconn *, int);

enum {
    T_RAW = 0, T_BOOL, T_QUOTE, T_ESCAPE, T_BPCHAR, T_FLOAT, T_TSTZ, T_TS, T_TIME,
    T_BYTEA, T_JSON, T_JSONB, T_COUNT
};

/* -- growable byte buffer ---------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
    int failed;
} buf_t;

static int buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + extra) cap *= 2;
    char *data = realloc(b->data, cap);
    if (data == NULL) { b->failed = 1; return 0; }
    b->data = data;
    b->cap = cap;
    return 1;
}

static inline void buf_put(buf_t *b, const char *s, size_t n) {
    if (!buf_reserve(b, n)) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static inline void buf_byte(buf_t *b, char c) {
    if (!buf_reserve(b, 1)) return;
    b->data[b->len++] = c;
}

/* -- COPY text fields ------------------------------------------------------------- */

/* The value of a COPY escape ``\c`` (COPY TO writes \b \f \n \r \t \v and \\). */
static inline int copy_unescape(const char *s, size_t n, size_t *i) {
    char c = s[*i + 1];
    *i += 2;
    switch (c) {
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'v': return '\v';
    default:
        if (c >= '0' && c <= '7') { /* octal, up to three digits (COPY FROM's form) */
            int v = c - '0';
            for (int k = 0; k < 2 && *i < n && s[*i] >= '0' && s[*i] <= '7'; k++, (*i)++)
                v = v * 8 + (s[*i] - '0');
            return v & 0xff;
        }
        return (unsigned char)c;
    }
}

static const char HEX[] = "0123456789abcdef";

/* PostgreSQL's escape_json of the field's decoded text, between quotes. */
static void put_json_string(buf_t *b, const char *s, size_t n) {
    buf_byte(b, '"');
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') { i++; continue; }
        buf_put(b, s + run, i - run);
        int v;
        if (c == '\\' && i + 1 < n) v = copy_unescape(s, n, &i);
        else { v = c; i++; }
        switch (v) {
        case '\b': buf_put(b, "\\b", 2); break;
        case '\f': buf_put(b, "\\f", 2); break;
        case '\n': buf_put(b, "\\n", 2); break;
        case '\r': buf_put(b, "\\r", 2); break;
        case '\t': buf_put(b, "\\t", 2); break;
        case '"': buf_put(b, "\\\"", 2); break;
        case '\\': buf_put(b, "\\\\", 2); break;
        default:
            if (v < 0x20) {
                char u[6] = {'\\', 'u', '0', '0', HEX[(v >> 4) & 0xf], HEX[v & 0xf]};
                buf_put(b, u, 6);
            } else {
                buf_byte(b, (char)v);
            }
        }
        run = i;
    }
    buf_put(b, s + run, n - run);
    buf_byte(b, '"');
}

/* The field's decoded text as is (json, jsonb); ``spaces``: newlines and carriage
 * returns become spaces (json keeps its input's whitespace). */
static void put_decoded(buf_t *b, const char *s, size_t n, int spaces) {
    size_t i = 0, run = 0;
    while (i < n) {
        if (s[i] != '\\' || i + 1 >= n) { i++; continue; }
        buf_put(b, s + run, i - run);
        int v = copy_unescape(s, n, &i);
        if (spaces && (v == '\n' || v == '\r')) v = ' ';
        buf_byte(b, (char)v);
        run = i;
    }
    buf_put(b, s + run, n - run);
}

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

/* ``text`` with its fraction of seconds (after the last '.') padded to 6 digits; a
 * fraction of zeros only is dropped (``to_char(..., 'US')`` then ``replace``). */
static void put_time_6(buf_t *b, const char *s, size_t n) {
    const char *dot = memchr(s, '.', n);
    if (dot == NULL) { buf_put(b, s, n); return; }
    size_t frac = n - (size_t)(dot - s) - 1;
    buf_put(b, s, n);
    for (size_t k = frac; k < 6; k++) buf_byte(b, '0');
}

/* A timestamp's "YYYY-MM-DD HH:MM:SS[.f]" as "YYYY-MM-DDTHH:MM:SS.ffffff" (no fraction
 * if zero); 0: not of that form. */
static int put_timestamp(buf_t *b, const char *s, size_t n) {
    const char *sp = memchr(s, ' ', n);
    if (sp == NULL || sp == s || !is_digit(s[0])) return 0;
    size_t d = (size_t)(sp - s);
    size_t rest = n - d - 1;
    if (rest < 8 || memchr(sp + 1, ' ', rest) != NULL) return 0;
    buf_put(b, s, d);
    buf_byte(b, 'T');
    const char *t = sp + 1;
    const char *dot = memchr(t, '.', rest);
    if (dot == NULL) { buf_put(b, t, rest); return 1; }
    size_t frac = rest - (size_t)(dot - t) - 1;
    if (frac > 6) return 0;
    int zero = 1;
    for (size_t k = 0; k < frac; k++) if (dot[1 + k] != '0') zero = 0;
    if (zero) { buf_put(b, t, (size_t)(dot - t)); return 1; }
    buf_put(b, t, rest);
    for (size_t k = frac; k < 6; k++) buf_byte(b, '0');
    return 1;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static inline int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* bytea's COPY text ``\\x0aff`` as quoted base64; 0: not hex output. */
static int put_bytea(buf_t *b, const char *s, size_t n) {
    if (n < 3 || s[0] != '\\' || s[1] != '\\' || s[2] != 'x' || (n - 3) % 2) return 0;
    size_t bytes = (n - 3) / 2;
    const char *h = s + 3;
    if (!buf_reserve(b, 2 + (bytes + 2) / 3 * 4)) return 1;
    char *o = b->data + b->len;
    *o++ = '"';
    size_t k = 0;
    unsigned char in[3];
    while (k < bytes) {
        size_t m = 0;
        for (; m < 3 && k < bytes; m++, k++) {
            int hi = hexval(h[2 * k]), lo = hexval(h[2 * k + 1]);
            if (hi < 0 || lo < 0) return 0;
            in[m] = (unsigned char)(hi << 4 | lo);
        }
        for (size_t z = m; z < 3; z++) in[z] = 0;
        o[0] = B64[in[0] >> 2];
        o[1] = B64[(in[0] & 3) << 4 | in[1] >> 4];
        o[2] = m > 1 ? B64[(in[1] & 0xf) << 2 | in[2] >> 6] : '=';
        o[3] = m > 2 ? B64[in[2] & 0x3f] : '=';
        o += 4;
    }
    *o++ = '"';
    b->len = (size_t)(o - b->data);
    return 1;
}

/* One column's JSON text (as the fast path's expression writes it); 0: unknown form. */
static int put_value(buf_t *b, int type, const char *s, size_t n) {
    if (n == 2 && s[0] == '\\' && s[1] == 'N') { buf_put(b, "null", 4); return 1; }
    switch (type) {
    case T_RAW:
        buf_put(b, s, n);
        return 1;
    case T_BOOL:
        if (n != 1) return 0;
        if (s[0] == 't') buf_put(b, "true", 4);
        else if (s[0] == 'f') buf_put(b, "false", 5);
        else return 0;
        return 1;
    case T_QUOTE:
        buf_byte(b, '"');
        buf_put(b, s, n);
        buf_byte(b, '"');
        return 1;
    case T_ESCAPE:
        put_json_string(b, s, n);
        return 1;
    case T_BPCHAR:
        while (n > 0 && s[n - 1] == ' ') n--;
        put_json_string(b, s, n);
        return 1;
    case T_FLOAT:
        if (n > 0 && (s[0] == 'N' || s[0] == 'I' || (s[0] == '-' && n > 1 && s[1] == 'I'))) {
            buf_byte(b, '"');
            buf_put(b, s, n);
            buf_byte(b, '"');
        } else {
            buf_put(b, s, n);
        }
        return 1;
    case T_TSTZ:
        if (n >= 3 && memcmp(s + n - 3, " BC", 3) == 0) goto quoted;
        if (n > 0 && !is_digit(s[0])) goto quoted; /* infinity, -infinity */
        if (n < 4 || memcmp(s + n - 3, "+00", 3) != 0) return 0;
        buf_byte(b, '"');
        if (!put_timestamp(b, s, n - 3)) return 0;
        buf_put(b, "Z\"", 2);
        return 1;
    case T_TS:
        if (n >= 3 && memcmp(s + n - 3, " BC", 3) == 0) goto quoted;
        if (n > 0 && !is_digit(s[0])) goto quoted;
        buf_byte(b, '"');
        if (!put_timestamp(b, s, n)) return 0;
        buf_byte(b, '"');
        return 1;
    case T_TIME:
        buf_byte(b, '"');
        put_time_6(b, s, n);
        buf_byte(b, '"');
        return 1;
    case T_BYTEA:
        return put_bytea(b, s, n);
    case T_JSON:
        put_decoded(b, s, n, 1);
        return 1;
    case T_JSONB:
        put_decoded(b, s, n, 0);
        return 1;
    default:
        return 0;
    }
quoted:
    buf_byte(b, '"');
    buf_put(b, s, n);
    buf_byte(b, '"');
    return 1;
}

/* -- the spec of a table's rows ---------------------------------------------------- */

typedef struct {
    int ncols;
    unsigned char *types;   /* per column */
    int nkeys;
    int *key_cols;          /* chunk key columns */
    unsigned char *key_raw; /* 1: the key column's text is its JSON (integers) */
    int npieces;
    const char **lits;      /* piece i: literal lits[i] then column cols[i] */
    size_t *lit_lens;
    int *cols;
    const char *final;      /* the tail's last literal */
    size_t final_len;
} spec_t;

typedef struct {
    buf_t keys, tails;
    Py_ssize_t count;
    const char **starts;
    size_t *lens;
    const char *bad; /* why a row could not be encoded */
    Py_ssize_t block_rows; /* > 0: tails cut into blocks of this many rows */
    size_t *cuts;          /* where each block after the first starts in tails */
    size_t ncuts, cap_cuts;
    int cuts_failed;
} out_t;

/* Row ``o->count`` starts a new block at ``at`` (tails' length): recorded instead of a
 * newline. */
static int add_cut(out_t *o, size_t at) {
    if (o->ncuts == o->cap_cuts) {
        size_t cap = o->cap_cuts ? o->cap_cuts * 2 : 64;
        size_t *cuts = realloc(o->cuts, cap * sizeof(size_t));
        if (cuts == NULL) { o->cuts_failed = 1; return 0; }
        o->cuts = cuts;
        o->cap_cuts = cap;
    }
    o->cuts[o->ncuts++] = at;
    return 1;
}

/* One COPY text row (without its newline) into a key line and a tail line. */
static int encode_row(const spec_t *sp, out_t *o, const char *row, size_t n) {
    int col = 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || row[i] == '\t') {
            if (col >= sp->ncols) { o->bad = "more fields than columns"; return 0; }
            o->starts[col] = row + start;
            o->lens[col] = i - start;
            col++;
            start = i + 1;
        }
    }
    if (col != sp->ncols) { o->bad = "fewer fields than columns"; return 0; }
    if (o->count) {
        buf_byte(&o->keys, '\n');
        if (o->block_rows > 0 && o->count % o->block_rows == 0) add_cut(o, o->tails.len);
        else buf_byte(&o->tails, '\n');
    }
    if (sp->nkeys > 1) buf_byte(&o->keys, '[');
    for (int k = 0; k < sp->nkeys; k++) {
        int c = sp->key_cols[k];
        const char *s = o->starts[c];
        size_t len = o->lens[c];
        if (k) buf_byte(&o->keys, ',');
        if (len == 2 && s[0] == '\\' && s[1] == 'N') buf_put(&o->keys, "null", 4);
        else if (sp->key_raw[k]) buf_put(&o->keys, s, len);
        else put_json_string(&o->keys, s, len);
    }
    if (sp->nkeys > 1) buf_byte(&o->keys, ']');
    for (int p = 0; p < sp->npieces; p++) {
        buf_put(&o->tails, sp->lits[p], sp->lit_lens[p]);
        int c = sp->cols[p];
        if (!put_value(&o->tails, sp->types[c], o->starts[c], o->lens[c])) {
            o->bad = "a value of an unexpected form";
            return 0;
        }
    }
    buf_put(&o->tails, sp->final, sp->final_len);
    o->count++;
    return 1;
}

static void free_spec(spec_t *sp) {
    free(sp->key_cols);
    free(sp->key_raw);
    free(sp->lits);
    free(sp->lit_lens);
    free(sp->cols);
}

/* types: bytes; keys: ((col, raw), ...); tail: (((literal bytes, col), ...), final bytes) */
static int parse_spec(spec_t *sp, PyObject *types, PyObject *keys, PyObject *tail) {
    memset(sp, 0, sizeof(*sp));
    char *tb;
    Py_ssize_t tn;
    if (PyBytes_AsStringAndSize(types, &tb, &tn) < 0) return 0;
    sp->ncols = (int)tn;
    sp->types = (unsigned char *)tb;
    for (Py_ssize_t i = 0; i < tn; i++)
        if (sp->types[i] >= T_COUNT) { PyErr_SetString(PyExc_ValueError, "unknown type code"); return 0; }
    if (!PyTuple_Check(keys) || !PyTuple_Check(tail) || PyTuple_GET_SIZE(tail) != 2) {
        PyErr_SetString(PyExc_TypeError, "keys and tail must be tuples");
        return 0;
    }
    sp->nkeys = (int)PyTuple_GET_SIZE(keys);
    sp->key_cols = calloc((size_t)sp->nkeys + 1, sizeof(int));
    sp->key_raw = calloc((size_t)sp->nkeys + 1, 1);
    PyObject *pieces = PyTuple_GET_ITEM(tail, 0);
    PyObject *final = PyTuple_GET_ITEM(tail, 1);
    if (!PyTuple_Check(pieces) || !PyBytes_Check(final)) {
        PyErr_SetString(PyExc_TypeError, "tail must be (tuple, bytes)");
        return 0;
    }
    sp->npieces = (int)PyTuple_GET_SIZE(pieces);
    sp->lits = calloc((size_t)sp->npieces + 1, sizeof(char *));
    sp->lit_lens = calloc((size_t)sp->npieces + 1, sizeof(size_t));
    sp->cols = calloc((size_t)sp->npieces + 1, sizeof(int));
    if (!sp->key_cols || !sp->key_raw || !sp->lits || !sp->lit_lens || !sp->cols) {
        PyErr_NoMemory();
        return 0;
    }
    for (int k = 0; k < sp->nkeys; k++) {
        int c, raw;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(keys, k), "ii", &c, &raw)) return 0;
        if (c < 0 || c >= sp->ncols) { PyErr_SetString(PyExc_ValueError, "key column out of range"); return 0; }
        sp->key_cols[k] = c;
        sp->key_raw[k] = (unsigned char)(raw != 0);
    }
    for (int p = 0; p < sp->npieces; p++) {
        const char *lit;
        Py_ssize_t litn;
        int c;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(pieces, p), "y#i", &lit, &litn, &c)) return 0;
        if (c < 0 || c >= sp->ncols) { PyErr_SetString(PyExc_ValueError, "tail column out of range"); return 0; }
        sp->lits[p] = lit;
        sp->lit_lens[p] = (size_t)litn;
        sp->cols[p] = c;
    }
    sp->final = PyBytes_AS_STRING(final);
    sp->final_len = (size_t)PyBytes_GET_SIZE(final);
    return 1;
}

/* -- the COPY itself --------------------------------------------------------------- */

typedef struct {
    char sqlstate[6];
    char *message; /* malloc'd, or NULL */
} pgerr_t;

static void set_err(pgerr_t *e, PGconn *conn, PGresult *res) {
    const char *state = res ? p_PQresultErrorField(res, 'C') : NULL;
    /* the primary message ('M', as psycopg's errors carry it), not "ERROR:  ..." */
    const char *msg = res ? p_PQresultErrorField(res, 'M') : NULL;
    if ((msg == NULL || !*msg) && res) msg = p_PQresultErrorMessage(res);
    if (msg == NULL || !*msg) msg = p_PQerrorMessage(conn);
    if (state) { strncpy(e->sqlstate, state, 5); e->sqlstate[5] = 0; }
    e->message = strdup(msg ? msg : "unknown libpq error");
}

/* Reads the results up to the end of the query; 0 if libpq cannot get there: a COPY_*
 * result means the COPY was not ended (PQgetCopyData returned -2 for want of memory for
 * a row, say, and every PQgetResult returns another COPY result: looping would spin
 * forever holding the connection). Then the caller's connection is unusable; Python
 * closes it. Sets ``err`` from the first error (if not set yet). */
static int finish_results(PGconn *conn, int *ok, int *completed, pgerr_t *err) {
    PGresult *res;
    while ((res = p_PQgetResult(conn)) != NULL) {
        int status = p_PQresultStatus(res);
        if (status == PGRES_COPY_OUT || status == PGRES_COPY_IN || status == PGRES_COPY_BOTH) {
            p_PQclear(res);
            if (*ok) {
                set_err(err, conn, NULL);
                *ok = 0;
            }
            return 0;
        }
        if (status == PGRES_COMMAND_OK) {
            *completed = 1;
        } else if (*ok) {
            set_err(err, conn, res);
            *ok = 0;
        }
        p_PQclear(res);
    }
    return 1;
}

/* Runs the COPY and encodes every row; the GIL is not held. Returns 1 if the server's
 * part succeeded (o->bad may still be set), 0 with ``err`` set otherwise. */
static int run_copy(PGconn *conn, const char *query, const spec_t *sp, out_t *o, pgerr_t *err) {
    int nonblocking = p_PQisnonblocking(conn);
    if (nonblocking) p_PQsetnonblocking(conn, 0);
    int ok = 1;
    PGresult *res = NULL;
    if (!p_PQsendQueryParams(conn, query, 0, NULL, NULL, NULL, NULL, 0)) {
        set_err(err, conn, NULL);
        ok = 0;
        goto done;
    }
    res = p_PQgetResult(conn);
    if (res == NULL || p_PQresultStatus(res) != PGRES_COPY_OUT) {
        set_err(err, conn, res);
        if (res) p_PQclear(res);
        ok = 0;
        /* an error: read the results up to the end of the query */
        int ignored = 0, unused = 0;
        finish_results(conn, &ignored, &unused, err);
        goto done;
    }
    p_PQclear(res);
    for (;;) {
        char *line = NULL;
        int n = p_PQgetCopyData(conn, &line, 0);
        if (n > 0) {
            size_t len = (size_t)n;
            if (len && line[len - 1] == '\n') len--;
            if (o->bad == NULL && !o->keys.failed && !o->tails.failed)
                encode_row(sp, o, line, len);
            p_PQfreemem(line);
            continue;
        }
        if (line) p_PQfreemem(line);
        if (n == -2) { /* an error (the connection was closed, no memory): rows are missing */
            set_err(err, conn, NULL);
            ok = 0;
        }
        break; /* -1: done (the result follows) */
    }
    /* Success only with the COPY's PGRES_COMMAND_OK: a chunk cut short must never be
     * taken for a complete one (fewer rows than asked means "the table's end"). */
    int completed = 0;
    finish_results(conn, &ok, &completed, err);
    if (ok && !completed) {
        set_err(err, conn, NULL);
        ok = 0;
    }
done:
    if (nonblocking) p_PQsetnonblocking(conn, 1);
    return ok;
}

/* The tails cut at ``o->cuts``: a list of texts (none for no rows). */
static PyObject *tail_blocks(const out_t *o) {
    size_t n = o->count ? o->ncuts + 1 : 0;
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        size_t a = i ? o->cuts[i - 1] : 0, b = i < o->ncuts ? o->cuts[i] : o->tails.len;
        PyObject *t = PyUnicode_DecodeUTF8(o->tails.data + a, (Py_ssize_t)(b - a), "strict");
        if (t == NULL) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    return list;
}

/* The Python answer for an encoded chunk: (count, keys, tails); (None, None, None,
 * reason) when a value had an unknown form; NULL with an exception when memory ran out. */
static PyObject *chunk_result(const out_t *o) {
    if (o->keys.failed || o->tails.failed || o->cuts_failed) return PyErr_NoMemory();
    if (o->bad != NULL) return Py_BuildValue("(OOOs)", Py_None, Py_None, Py_None, o->bad);
    PyObject *k = PyUnicode_DecodeUTF8(o->keys.data ? o->keys.data : "", (Py_ssize_t)o->keys.len, "strict");
    PyObject *t = !k ? NULL : o->block_rows > 0 ? tail_blocks(o)
        : PyUnicode_DecodeUTF8(o->tails.data ? o->tails.data : "", (Py_ssize_t)o->tails.len, "strict");
    if (k && t) return Py_BuildValue("(nNN)", o->count, k, t);
    Py_XDECREF(k);
    Py_XDECREF(t);
    return NULL;
}

static void free_out(out_t *o) {
    free(o->keys.data);
    free(o->tails.data);
    free(o->starts);
    free(o->lens);
    free(o->cuts);
}

static PyObject *copy_chunk(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long ptr;
    const char *query;
    PyObject *types, *keys, *tail;
    Py_ssize_t block_rows = 0;
    if (!PyArg_ParseTuple(args, "KyO!OO|n", &ptr, &query, &PyBytes_Type, &types, &keys, &tail,
                          &block_rows))
        return NULL;
    if (p_PQsendQueryParams == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libpq not bound: call init() first");
        return NULL;
    }
    spec_t sp;
    if (!parse_spec(&sp, types, keys, tail)) { free_spec(&sp); return NULL; }
    out_t o;
    memset(&o, 0, sizeof(o));
    o.block_rows = block_rows;
    o.starts = calloc((size_t)sp.ncols + 1, sizeof(char *));
    o.lens = calloc((size_t)sp.ncols + 1, sizeof(size_t));
    pgerr_t err;
    memset(&err, 0, sizeof(err));
    PyObject *result = NULL;
    if (o.starts == NULL || o.lens == NULL) { PyErr_NoMemory(); goto out; }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = run_copy((PGconn *)(uintptr_t)ptr, query, &sp, &o, &err);
    Py_END_ALLOW_THREADS
    if (!ok) {
        result = Py_BuildValue("(Os#s)", Py_None, err.sqlstate[0] ? err.sqlstate : NULL,
                               (Py_ssize_t)(err.sqlstate[0] ? 5 : 0), err.message);
        goto out;
    }
    result = chunk_result(&o);
out:
    free(err.message);
    free_out(&o);
    free_spec(&sp);
    return result;
}

/* encode(copy_text, types, keys, tail[, block_rows]): the same encoding of COPY text rows
 * already received (tests, benchmarks); returns (count, keys, tails) or (None, None, None,
 * reason). */
static PyObject *encode(PyObject *self, PyObject *args) {
    (void)self;
    const char *text;
    Py_ssize_t n;
    PyObject *types, *keys, *tail;
    Py_ssize_t block_rows = 0;
    if (!PyArg_ParseTuple(args, "y#O!OO|n", &text, &n, &PyBytes_Type, &types, &keys, &tail,
                          &block_rows))
        return NULL;
    spec_t sp;
    if (!parse_spec(&sp, types, keys, tail)) { free_spec(&sp); return NULL; }
    out_t o;
    memset(&o, 0, sizeof(o));
    o.block_rows = block_rows;
    o.starts = calloc((size_t)sp.ncols + 1, sizeof(char *));
    o.lens = calloc((size_t)sp.ncols + 1, sizeof(size_t));
    PyObject *result = NULL;
    if (o.starts == NULL || o.lens == NULL) { PyErr_NoMemory(); goto out; }
    Py_BEGIN_ALLOW_THREADS
    size_t a = 0;
    while (a < (size_t)n && o.bad == NULL) {
        const char *nl = memchr(text + a, '\n', (size_t)n - a);
        size_t end = nl ? (size_t)(nl - text) : (size_t)n;
        encode_row(&sp, &o, text + a, end - a);
        a = end + 1;
    }
    Py_END_ALLOW_THREADS
    result = chunk_result(&o);
out:
    free_out(&o);
    free_spec(&sp);
    return result;
}

#define BIND(name)                                                             \
    do {                                                                       \
        *(void **)(&p_##name) = dlsym(handle, #name);                          \
        if (p_##name == NULL) {                                                \
            PyErr_Format(PyExc_OSError, "libpq at %s has no %s", path, #name); \
            p_PQsendQueryParams = NULL;                                        \
            return NULL;                                                       \
        }                                                                      \
    } while (0)

/* init(path): bind libpq's functions from the library at ``path`` (already loaded by
 * psycopg: the same copy of libpq must serve its connections). */
static PyObject *init(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    /* RTLD_NOLOAD only: the library psycopg already loaded, never a second copy of
     * libpq (two copies' PGconn structures are not interchangeable). */
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError, "libpq at %s is not loaded in this process (%s)", path,
                     why ? why : "RTLD_NOLOAD");
        return NULL;
    }
    BIND(PQresultStatus);
    BIND(PQclear);
    BIND(PQgetCopyData);
    BIND(PQfreemem);
    BIND(PQgetResult);
    BIND(PQerrorMessage);
    BIND(PQresultErrorField);
    BIND(PQresultErrorMessage);
    BIND(PQisnonblocking);
    BIND(PQsetnonblocking);
    BIND(PQsendQueryParams); /* last: non-NULL means bound */
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "Bind libpq's functions from the library at this path."},
    {"copy_chunk", copy_chunk, METH_VARARGS, "Run a COPY TO STDOUT and encode its rows."},
    {"encode", encode, METH_VARARGS, "Encode COPY text rows already received."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_copyenc", NULL, -1, methods, NULL, NULL, NULL, NULL};

/* The interface version native.py expects (native.ABI_VERSION): raise both together
 * whenever the type codes, the spec or the results change, so that a stale build is
 * detected (and the SQL path used) instead of failing every chunk. */
#define COPYENC_VERSION 3

PyMODINIT_FUNC PyInit__copyenc(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", COPYENC_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
