/* The Kafka change-log writer's per-event work in C (``pydblog.changelog.kafka_native``).
 *
 * Two parts, both on the writer's own confluent-kafka ``Producer``:
 *
 * 1. A librdkafka interceptor plugin. The producer is made with ``plugin.library.paths``
 *    naming this very file, so librdkafka calls ``conf_init`` below, which adds an
 *    ``on_new`` interceptor; that adds an ``on_acknowledgement`` interceptor to the new
 *    client. Every acknowledgement (a delivered record with its offset, or a failed one)
 *    is counted per (topic, partition): lowest and highest offset and the number of
 *    records; an offset below 0 (acknowledged without one) makes the partition's entry
 *    ``(-1, -1, 0)`` for good, as the writer's Python delivery callback did. ``take_acks``
 *    hands them over and starts afresh. No Python delivery callback runs: the writer's
 *    messages carry no confluent-kafka message state, so confluent-kafka's delivery-report
 *    callback returns at once for them. librdkafka calls the interceptor before it queues
 *    the delivery report, and ``flush`` returns only once every report was served: after a
 *    ``flush`` that returned 0, every record produced before it is counted.
 *
 * 2. ``produce_events``: the envelope work of ``KafkaChangeLog._produce`` for a run of
 *    ``EncodedEvent``s (the stream's events): the value ``{"offset":<seq>,`` + the
 *    envelope after its ``{``, the key (the envelope's ``key`` text, partitioned by
 *    librdkafka's configured partitioner exactly as ``Producer.produce`` would), the
 *    header ``dblog.writer`` (the session tag) and, if asked (``source_header``),
 *    ``dblog.source`` (the envelope's ``source`` object text), a tombstone after a delete
 *    if asked. It stops, leaving the
 *    event to Python, at anything else: another type, a truncate or notification (fanned
 *    out), an envelope whose fields are not where the fast path looks (a second
 *    ``,"before":``, as ``kafka._key_of`` says). Records are byte for byte those the
 *    Python path produces. ``produce_template`` does the same for a template
 *    ``EncodedBlock`` (a snapshot chunk's rows).
 *
 * librdkafka is not linked: its functions are looked up in the copy confluent-kafka loaded
 * (``init``), and the client handle is the ``rd_kafka_t *`` that confluent-kafka's
 * ``Handle`` holds right after the object header (as ``_kafkaread`` reads it). The
 * handle's name is checked against the producer's unique ``client.id`` before it is used.
 */
#include "_kafkarecords.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* ``v`` in decimal at ``out`` (at least 21 bytes), no terminator; its length. What
   snprintf's "%lld" writes, without its per-call cost (a record's offset and row index). */
static int dec_ll(char *out, long long v) {
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u != 0);
    int len = 0;
    if (v < 0) out[len++] = '-';
    while (n > 0) out[len++] = tmp[--n];
    return len;
}

/* ``{"offset":<v>,`` at ``out`` (at least 32 bytes); its length. */
static int offset_head(char *out, long long v) {
    memcpy(out, "{\"offset\":", 10);
    int len = 10 + dec_ll(out + 10, v);
    out[len++] = ',';
    return len;
}

#define KAFKAWRITE_VERSION 5

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
/* rdkafka.h's public rd_kafka_message_t (stable ABI). */
typedef struct {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

/* rdkafka.h's rd_kafka_vtype_t and rd_kafka_vu_t (stable ABI since 1.4). */
enum {
    VT_END = 0,
    VT_TOPIC = 1,
    VT_VALUE = 4,
    VT_KEY = 5,
    VT_MSGFLAGS = 7,
    VT_HEADER = 9,
};
typedef struct {
    int vtype;
    union {
        const char *cstr;
        int i;
        struct {
            const void *ptr;
            size_t size;
        } mem;
        struct {
            const char *name;
            const void *val;
            ssize_t size;
        } header;
        char _pad[64];
    } u;
} vu_t;

#define MSG_F_COPY 0x2
#define RUN_MAX 2048
#define ERR_QUEUE_FULL (-184)

typedef int (*on_new_f)(rd_kafka_t *, const rd_kafka_conf_t *, void *, char *, size_t);
typedef int (*on_ack_f)(rd_kafka_t *, rd_kafka_message_t *, void *);
typedef int (*on_destroy_f)(rd_kafka_t *, void *);

static const char *(*p_rd_kafka_name)(const rd_kafka_t *);
static int (*p_rd_kafka_type)(const rd_kafka_t *);
static const char *(*p_rd_kafka_topic_name)(const rd_kafka_topic_t *);
static const char *(*p_rd_kafka_err2str)(int);
static rd_kafka_error_t *(*p_rd_kafka_produceva)(rd_kafka_t *, const vu_t *, size_t);
static int (*p_rd_kafka_error_code)(const rd_kafka_error_t *);
static const char *(*p_rd_kafka_error_string)(const rd_kafka_error_t *);
static void (*p_rd_kafka_error_destroy)(rd_kafka_error_t *);
static int (*p_rd_kafka_conf_interceptor_add_on_new)(rd_kafka_conf_t *, const char *, on_new_f,
                                                     void *);
static int (*p_rd_kafka_interceptor_add_on_acknowledgement)(rd_kafka_t *, const char *,
                                                            on_ack_f, void *);
static int (*p_rd_kafka_interceptor_add_on_destroy)(rd_kafka_t *, const char *, on_destroy_f,
                                                    void *);
static volatile int bound = 0;

/* -- acknowledgements ------------------------------------------------------------------ */

typedef struct {
    char *topic;
    int32_t partition;
    int64_t first, last, count;
} ack_t;

typedef struct acks_s {
    rd_kafka_t *rk;
    pthread_mutex_t lock;
    ack_t *items;
    size_t n, cap;
    int err;        /* the first failed record's error code (0: none) */
    int nomem;
    struct acks_s *next;
} acks_t;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static acks_t *registry = NULL;

static int on_ack(rd_kafka_t *rk, rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    acks_t *a = opaque;
    const char *topic = m->rkt ? p_rd_kafka_topic_name(m->rkt) : "";
    pthread_mutex_lock(&a->lock);
    if (m->err != 0) {
        if (a->err == 0) a->err = m->err;
        pthread_mutex_unlock(&a->lock);
        return 0;
    }
    ack_t *e = NULL;
    for (size_t i = a->n; i-- > 0;) {
        if (a->items[i].partition == m->partition && strcmp(a->items[i].topic, topic) == 0) {
            e = &a->items[i];
            break;
        }
    }
    if (e == NULL) {
        if (a->n == a->cap) {
            size_t cap = a->cap ? a->cap * 2 : 16;
            ack_t *items = realloc(a->items, cap * sizeof(*items));
            if (items == NULL) {
                a->nomem = 1;
                pthread_mutex_unlock(&a->lock);
                return 0;
            }
            a->items = items;
            a->cap = cap;
        }
        char *name = strdup(topic);
        if (name == NULL) {
            a->nomem = 1;
            pthread_mutex_unlock(&a->lock);
            return 0;
        }
        e = &a->items[a->n++];
        e->topic = name;
        e->partition = m->partition;
        if (m->offset < 0) {
            e->first = e->last = -1;
            e->count = 0;
        } else {
            e->first = e->last = m->offset;
            e->count = 1;
        }
    } else if (e->first >= 0) {
        if (m->offset < 0) {
            e->first = e->last = -1;
            e->count = 0;
        } else {
            e->count++;
            if (m->offset > e->last) e->last = m->offset;
            if (m->offset < e->first) e->first = m->offset;
        }
    }
    pthread_mutex_unlock(&a->lock);
    return 0;
}

static void clear_items(acks_t *a) {
    for (size_t i = 0; i < a->n; i++) free(a->items[i].topic);
    a->n = 0;
    a->err = 0;
    a->nomem = 0;
}

static int on_destroy(rd_kafka_t *rk, void *opaque) {
    acks_t *a = opaque;
    pthread_mutex_lock(&registry_lock);
    for (acks_t **p = &registry; *p != NULL; p = &(*p)->next) {
        if (*p == a) {
            *p = a->next;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    clear_items(a);
    free(a->items);
    pthread_mutex_destroy(&a->lock);
    free(a);
    (void)rk;
    return 0;
}

static int on_new(rd_kafka_t *rk, const rd_kafka_conf_t *conf, void *opaque, char *errstr,
                  size_t errstr_size) {
    (void)conf;
    (void)opaque;
    acks_t *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        snprintf(errstr, errstr_size, "pydblog acks: out of memory");
        return -1;
    }
    a->rk = rk;
    pthread_mutex_init(&a->lock, NULL);
    if (p_rd_kafka_interceptor_add_on_acknowledgement(rk, "pydblog-acks", on_ack, a) != 0 ||
        p_rd_kafka_interceptor_add_on_destroy(rk, "pydblog-acks", on_destroy, a) != 0) {
        snprintf(errstr, errstr_size, "pydblog acks: cannot add the interceptors");
        pthread_mutex_destroy(&a->lock);
        free(a);
        return -1;
    }
    pthread_mutex_lock(&registry_lock);
    a->next = registry;
    registry = a;
    pthread_mutex_unlock(&registry_lock);
    return 0;
}

/* The plugin entry point librdkafka looks up (``plugin.library.paths``). */
__attribute__((visibility("default"))) int conf_init(rd_kafka_conf_t *conf, void **plug_opaquep,
                                                     char *errstr, size_t errstr_size) {
    (void)plug_opaquep;
    if (!bound) {
        snprintf(errstr, errstr_size,
                 "pydblog's _kafkawrite plugin is not bound to librdkafka (init() first)");
        return -1;
    }
    int err = p_rd_kafka_conf_interceptor_add_on_new(conf, "pydblog-acks", on_new, NULL);
    if (err != 0 && err != -173 /* RD_KAFKA_RESP_ERR__CONFLICT: added already */) {
        snprintf(errstr, errstr_size, "pydblog acks: cannot add the on_new interceptor");
        return err;
    }
    return 0;
}

/* The client handle of ``producer`` if its name says it is the producer made with
 * ``client_id`` (else a Python error and NULL). */
static rd_kafka_t *producer_handle(PyObject *producer, const char *client_id) {
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka not bound: call init() first");
        return NULL;
    }
    rd_kafka_t *rk = *(rd_kafka_t **)((char *)producer + sizeof(PyObject));
    const char *name = rk != NULL ? p_rd_kafka_name(rk) : NULL;
    size_t idlen = strlen(client_id);
    if (name == NULL || strncmp(name, client_id, idlen) != 0 || name[idlen] != '#' ||
        p_rd_kafka_type(rk) != 0 /* RD_KAFKA_PRODUCER */) {
        PyErr_SetString(PyExc_RuntimeError,
                        "not a confluent-kafka producer with this client.id (or an "
                        "unknown confluent-kafka object layout)");
        return NULL;
    }
    return rk;
}

static acks_t *find_acks(rd_kafka_t *rk) {
    pthread_mutex_lock(&registry_lock);
    acks_t *a = registry;
    while (a != NULL && a->rk != rk) a = a->next;
    pthread_mutex_unlock(&registry_lock);
    return a;
}

/* take_acks(producer, client_id) -> (entries, error_code): entries are
 * (topic, partition, first, last, count) of the records acknowledged since the last call;
 * error_code is the first failed record's (0: none). Both start afresh. */
static PyObject *take_acks(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *producer;
    const char *client_id;
    if (!PyArg_ParseTuple(args, "Os", &producer, &client_id)) return NULL;
    rd_kafka_t *rk = producer_handle(producer, client_id);
    if (rk == NULL) return NULL;
    acks_t *a = find_acks(rk);
    if (a == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the producer has no pydblog acknowledgement interceptor (made without "
                        "plugin.library.paths?)");
        return NULL;
    }
    pthread_mutex_lock(&a->lock);
    if (a->nomem) {
        clear_items(a);
        pthread_mutex_unlock(&a->lock);
        return PyErr_NoMemory();
    }
    PyObject *list = PyList_New((Py_ssize_t)a->n);
    PyObject *result = NULL;
    if (list != NULL) {
        size_t i;
        for (i = 0; i < a->n; i++) {
            ack_t *e = &a->items[i];
            PyObject *t = Py_BuildValue("(siLLL)", e->topic, (int)e->partition,
                                        (long long)e->first, (long long)e->last,
                                        (long long)e->count);
            if (t == NULL) break;
            PyList_SET_ITEM(list, (Py_ssize_t)i, t);
        }
        if (i == a->n) result = Py_BuildValue("(Ni)", list, a->err);
        else Py_DECREF(list);
    }
    clear_items(a);
    pthread_mutex_unlock(&a->lock);
    return result;
}

/* -- producing ------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t cap;
} buf_t;

static int reserve(buf_t *b, size_t n) {
    if (n <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < n) cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static const char *find(const char *s, size_t n, size_t from, const char *needle,
                        size_t needle_len) {
    if (from > n || n - from < needle_len) return NULL;
    return memmem(s + from, n - from, needle, needle_len);
}

/* UTF-8 text of a str (cached by CPython) or bytes; NULL with a Python error if neither. */
static const char *text_of(PyObject *o, Py_ssize_t *len) {
    if (PyUnicode_Check(o)) return PyUnicode_AsUTF8AndSize(o, len);
    if (PyBytes_Check(o)) {
        *len = PyBytes_GET_SIZE(o);
        return PyBytes_AS_STRING(o);
    }
    PyErr_SetString(PyExc_TypeError, "an event body must be str or bytes");
    return NULL;
}

/* One record, into librdkafka's ``rk`` or, if ``acc`` is not NULL, into that
 * ``Accumulator`` (the wire producer's); 0, or librdkafka's error code (queue full
 * included; -1: the accumulator's error). */
static int produce_one(rd_kafka_t *rk, PyObject *acc, const char *topic, const char *value, size_t value_len,
                       const char *key, size_t key_len, const char *tag, size_t tag_len,
                       const char *source, size_t source_len, char *errbuf, size_t errbuf_len) {
    if (acc != NULL) {
        const char *names[2] = {"dblog.writer", "dblog.source"};
        const char *vals[2] = {tag, source};
        ssize_t lens[2] = {(ssize_t)tag_len, (ssize_t)source_len};
        return acc_append(acc, topic, -1, key, key_len, value, value_len,
                          source != NULL ? 2 : 1, names, vals, lens, errbuf, errbuf_len);
    }
    vu_t vus[7];
    size_t n = 0;
    memset(vus, 0, sizeof(vus));
    vus[n].vtype = VT_TOPIC;
    vus[n++].u.cstr = topic;
    if (value != NULL) { /* NULL: a tombstone */
        vus[n].vtype = VT_VALUE;
        vus[n].u.mem.ptr = value;
        vus[n++].u.mem.size = value_len;
    }
    if (key != NULL) {
        vus[n].vtype = VT_KEY;
        vus[n].u.mem.ptr = key;
        vus[n++].u.mem.size = key_len;
    }
    vus[n].vtype = VT_HEADER;
    vus[n].u.header.name = "dblog.writer";
    vus[n].u.header.val = tag;
    vus[n++].u.header.size = (ssize_t)tag_len;
    if (source != NULL) { /* NULL: no ``dblog.source`` header */
        vus[n].vtype = VT_HEADER;
        vus[n].u.header.name = "dblog.source";
        vus[n].u.header.val = source;
        vus[n++].u.header.size = (ssize_t)source_len;
    }
    vus[n].vtype = VT_MSGFLAGS;
    vus[n++].u.i = MSG_F_COPY;
    rd_kafka_error_t *error = p_rd_kafka_produceva(rk, vus, n);
    if (error == NULL) return 0;
    int code = p_rd_kafka_error_code(error);
    snprintf(errbuf, errbuf_len, "%s", p_rd_kafka_error_string(error));
    p_rd_kafka_error_destroy(error);
    return code;
}

static const char SOURCE_AT[] = "\"source\":";
static const char KEY_AT[] = "},\"key\":";
static const char BEFORE_AT[] = ",\"before\":";

/* The length of the JSON value ``s`` starts with (an object, array, string or scalar, no
 * whitespace around it: the envelopes' compact JSON), or 0 if ``s`` holds no whole one. */
static size_t json_len(const char *s, size_t n) {
    size_t i = 0;
    int depth = 0;
    while (i < n) {
        char c = s[i];
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\') i++;
            if (i >= n) return 0;
            i++;
        } else if (c == '{' || c == '[') {
            depth++;
            i++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return i; /* a scalar's end */
            depth--;
            i++;
        } else if (c == ',' && depth == 0) {
            return i;
        } else {
            i++;
        }
        if (depth == 0 && (c == '"' || c == '}' || c == ']')) return i;
    }
    return depth == 0 ? i : 0;
}

/* The key's length in ``text`` (just after ``,"key":``): its JSON value, which the
 * envelope follows with ``,"before":`` (``kafka._key_of``'s rule); 0: not so. */
static size_t key_len_at(const char *text, size_t n) {
    size_t k = json_len(text, n);
    if (k == 0 || n - k < sizeof(BEFORE_AT) - 1 ||
        memcmp(text + k, BEFORE_AT, sizeof(BEFORE_AT) - 1) != 0)
        return 0;
    return k;
}

/* produce_events(producer, client_id, events, start, seq, topics, tag, tombstones,
 *                event_type, source_header) -> (index, seq, status, error_code, error_text)
 *
 * Produces events[start:] while each is exactly ``event_type`` (EncodedEvent) of an op
 * other than "t" and "n" whose envelope the fast path can cut. ``index``: the first event
 * not (wholly) produced; ``seq``: its global offset. ``status``: 0 all produced, 1 the
 * event at ``index`` is Python's, 2 the queue was full before it (nothing of it produced:
 * serve delivery reports, call again), 3 its record was produced but the queue was full
 * for its tombstone (Python sends the tombstone; ``index``/``seq`` are the event's own),
 * 4 librdkafka refused a record (``error_code``, ``error_text``). At most ``RUN_MAX``
 * events a call (status 0 then with ``index`` short of the end). The envelopes are cut
 * with the GIL held; the records are produced with it released, so the stream's decoding
 * thread runs meanwhile (librdkafka is thread-safe; no Python object is touched). */
/* One stream event's record, cut from its envelope while the GIL is held; produced after
 * it is released (the texts belong to ``str``/``bytes`` objects the events list holds,
 * each also referenced by ``obj`` until the call ends). */
typedef struct {
    PyObject *obj;
    const char *text;
    size_t len;
    const char *topic;
    const char *key;
    size_t key_len;
    size_t src_start, src_end;
    int tombstone;
} job_t;

static PyObject *produce_events(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *producer, *events, *topics, *event_type;
    const char *client_id;
    Py_ssize_t start;
    long long seq;
    const char *tag;
    Py_ssize_t tag_len;
    int tombstones, source_header;
    if (!PyArg_ParseTuple(args, "OsO!nLO!y#pOp", &producer, &client_id, &PyList_Type, &events,
                          &start, &seq, &PyDict_Type, &topics, &tag, &tag_len, &tombstones,
                          &event_type, &source_header))
        return NULL;
    rd_kafka_t *rk = NULL;
    PyObject *acc = Accumulator_Check(producer) ? producer : NULL;
    if (acc == NULL && (rk = producer_handle(producer, client_id)) == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(events);
    if (start < 0 || start > n) {
        PyErr_SetString(PyExc_ValueError, "start out of range");
        return NULL;
    }
    if (n - start > RUN_MAX) n = start + RUN_MAX;
    job_t *jobs = malloc(((size_t)(n - start) + 1) * sizeof(job_t));
    if (jobs == NULL) return PyErr_NoMemory();
    /* 1. with the GIL: which events the fast path takes, and where their parts are */
    int status = 0;
    size_t m = 0;
    PyObject *last_table = NULL;
    const char *topic = NULL;
    for (Py_ssize_t i = start; i < n; i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        if ((PyObject *)Py_TYPE(ev) != event_type || PyTuple_GET_SIZE(ev) != 4) {
            status = 1;
            break;
        }
        PyObject *table = PyTuple_GET_ITEM(ev, 0), *op = PyTuple_GET_ITEM(ev, 1);
        Py_ssize_t op_len;
        const char *op_s = PyUnicode_Check(op) ? PyUnicode_AsUTF8AndSize(op, &op_len) : NULL;
        if (op_s == NULL || op_len != 1 || op_s[0] == 't' || op_s[0] == 'n') {
            PyErr_Clear();
            status = 1;
            break;
        }
        if (table != last_table) {
            PyObject *t = PyDict_GetItemWithError(topics, table);
            Py_ssize_t tl;
            topic = t != NULL && PyUnicode_Check(t) ? PyUnicode_AsUTF8AndSize(t, &tl) : NULL;
            if (topic == NULL) {
                PyErr_Clear();
                status = 1;
                break;
            }
            last_table = table;
        }
        PyObject *body = PyTuple_GET_ITEM(ev, 3);
        Py_ssize_t len;
        const char *text = text_of(body, &len);
        if (text == NULL) {
            PyErr_Clear();
            status = 1;
            break;
        }
        size_t L = (size_t)len;
        const char *s = find(text, L, 0, SOURCE_AT, sizeof(SOURCE_AT) - 1);
        if (s == NULL) {
            status = 1;
            break;
        }
        size_t src_start = (size_t)(s - text) + sizeof(SOURCE_AT) - 1;
        const char *k = find(text, L, src_start, KEY_AT, sizeof(KEY_AT) - 1);
        if (k == NULL) {
            status = 1;
            break;
        }
        size_t src_end = (size_t)(k - text) + 1;
        size_t key_start = src_end + sizeof(KEY_AT) - 2; /* just after ,"key": */
        /* kafka._key_of: the key is the JSON value before ,"before": */
        size_t klen = key_start <= L ? key_len_at(text + key_start, L - key_start) : 0;
        if (klen == 0) {
            status = 1;
            break;
        }
        job_t *j = &jobs[m++];
        j->obj = body;
        Py_INCREF(body);
        j->text = text;
        j->len = L;
        j->topic = topic;
        j->key = text + key_start;
        j->key_len = klen;
        if (j->key_len == 4 && memcmp(j->key, "null", 4) == 0) j->key = NULL;
        j->src_start = src_start;
        j->src_end = src_end;
        j->tombstone = op_s[0] == 'd' && tombstones;
    }
    /* 2. without the GIL: the records (the stream's decoding runs meanwhile) */
    buf_t buf = {NULL, 0};
    char head[32];
    char errbuf[512];
    errbuf[0] = 0;
    int code = 0, nomem = 0, failed = 0;
    size_t done = 0; /* events wholly produced */
    if (acc != NULL) acc_clock_reset(acc);
    Py_BEGIN_ALLOW_THREADS
    for (; done < m; done++) {
        job_t *j = &jobs[done];
        int hl = offset_head(head, seq + (long long)done);
        size_t value_len = (size_t)hl + j->len - 1;
        if (reserve(&buf, value_len) < 0) {
            nomem = 1;
            break;
        }
        memcpy(buf.p, head, (size_t)hl);
        memcpy(buf.p + hl, j->text + 1, j->len - 1);
        const char *src = source_header ? j->text + j->src_start : NULL;
        code = produce_one(rk, acc, j->topic, buf.p, value_len, j->key, j->key_len, tag,
                           (size_t)tag_len, src, j->src_end - j->src_start, errbuf,
                           sizeof(errbuf));
        if (code != 0) {
            failed = code == ERR_QUEUE_FULL ? 2 : 4;
            break;
        }
        if (j->tombstone) {
            code = produce_one(rk, acc, j->topic, NULL, 0, j->key, j->key_len, tag, (size_t)tag_len,
                               src, j->src_end - j->src_start, errbuf, sizeof(errbuf));
            if (code != 0) {
                failed = code == ERR_QUEUE_FULL ? 3 : 4;
                if (failed == 4) done++; /* the event's record is produced: report past it */
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    free(buf.p);
    for (size_t j = 0; j < m; j++) Py_DECREF(jobs[j].obj);
    free(jobs);
    if (nomem) return PyErr_NoMemory();
    if (failed) status = failed;
    return Py_BuildValue("(nLiis)", start + (Py_ssize_t)done, seq + (long long)done, status,
                         code, errbuf);
}

/* produce_template(producer, client_id, topic, head, mid, body, first_index, seq, tag,
 *                  start, tombstones, half, source_header)
 *     -> (row, seq, status, error_code, error_text)
 *
 * A template ``EncodedBlock``'s rows from row ``start`` (0-based; ``body``'s lines): row
 * i's envelope is head + str(first_index + i) + mid + tail_i, its source header the
 * head's text after ``"source":`` + the index + the mid's text up to its ``},"key":``.
 * Its key: the tail's text before its only ``,"before":`` (``kafka._key_of``'s rule; a
 * tail with none or two, where a column or a JSON value is named ``before``, stops the
 * fast path there), ``null`` meaning no key. ``tombstones``: each record is followed by a
 * tombstone of its key (a block of deletes). ``half``: row ``start``'s record is in
 * already, only its tombstone is due. ``status``: 0 every row produced, 2 the queue was
 * full at ``row`` (call again from it), 3 row ``row``'s record is in and its tombstone
 * is not (call again from it with ``half``), 4 librdkafka refused a record, 1 the fast
 * path does not cut the block from ``row`` on (nothing of that row produced: the
 * caller's Python path does the rest). ``seq`` counts the rows wholly produced. */
static PyObject *produce_template(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *producer;
    const char *client_id, *topic, *head, *mid, *body, *tag;
    Py_ssize_t head_len, mid_len, body_len, tag_len, start;
    long long first_index, seq;
    int tombstones, half, source_header;
    if (!PyArg_ParseTuple(args, "Osss#s#s#LLy#nppp", &producer, &client_id, &topic, &head,
                          &head_len, &mid, &mid_len, &body, &body_len, &first_index, &seq,
                          &tag, &tag_len, &start, &tombstones, &half, &source_header))
        return NULL;
    rd_kafka_t *rk = NULL;
    PyObject *acc = Accumulator_Check(producer) ? producer : NULL;
    if (acc == NULL && (rk = producer_handle(producer, client_id)) == NULL) return NULL;
    const char *s = find(head, (size_t)head_len, 0, SOURCE_AT, sizeof(SOURCE_AT) - 1);
    const char *k = find(mid, (size_t)mid_len, 0, KEY_AT, sizeof(KEY_AT) - 1);
    if (s == NULL || k == NULL || head_len < 1)
        return Py_BuildValue("(nLiis)", start, seq, 1, 0, "");
    const char *src_head = s + sizeof(SOURCE_AT) - 1;
    size_t src_head_len = (size_t)(head + head_len - src_head);
    size_t src_tail_len = (size_t)(k - mid) + 1;
    buf_t value = {NULL, 0}, source = {NULL, 0};
    char num[24], pre[32];
    char errbuf[512];
    errbuf[0] = 0;
    int status = 0, code = 0, nomem = 0;
    Py_ssize_t row = 0;
    size_t pos = 0, L = (size_t)body_len;
    /* The texts are the arguments' (the caller holds them): no Python object is touched. */
    if (acc != NULL) acc_clock_reset(acc);
    Py_BEGIN_ALLOW_THREADS
    while (pos <= L) {
        const char *nl = memchr(body + pos, '\n', L - pos);
        size_t end = nl != NULL ? (size_t)(nl - body) : L;
        if (row >= start) {
            const char *tail = body + pos;
            size_t tail_len = end - pos;
            const char *key = tail;
            size_t key_len = key_len_at(tail, tail_len);
            if (key_len == 0) {
                status = 1;
                break;
            }
            if (key_len == 4 && memcmp(tail, "null", 4) == 0) key = NULL;
            int nl_len = dec_ll(num, first_index + row);
            size_t slen = src_head_len + (size_t)nl_len + src_tail_len;
            if (source_header) {
                if (reserve(&source, slen) < 0) {
                    nomem = 1;
                    break;
                }
                char *sp = source.p;
                memcpy(sp, src_head, src_head_len);
                sp += src_head_len;
                memcpy(sp, num, (size_t)nl_len);
                sp += nl_len;
                memcpy(sp, mid, src_tail_len);
            }
            const char *src = source_header ? source.p : NULL;
            if (!(half && row == start)) {
                int pl = offset_head(pre, seq);
                size_t vlen = (size_t)pl + (size_t)head_len - 1 + (size_t)nl_len +
                              (size_t)mid_len + tail_len;
                if (reserve(&value, vlen) < 0) {
                    nomem = 1;
                    break;
                }
                char *v = value.p;
                memcpy(v, pre, (size_t)pl);
                v += pl;
                memcpy(v, head + 1, (size_t)head_len - 1);
                v += head_len - 1;
                memcpy(v, num, (size_t)nl_len);
                v += nl_len;
                memcpy(v, mid, (size_t)mid_len);
                v += mid_len;
                memcpy(v, tail, tail_len);
                code = produce_one(rk, acc, topic, value.p, vlen, key, key_len, tag, (size_t)tag_len,
                                   src, slen, errbuf, sizeof(errbuf));
                if (code != 0) {
                    status = code == ERR_QUEUE_FULL ? 2 : 4;
                    break;
                }
            }
            if (tombstones) {
                code = produce_one(rk, acc, topic, NULL, 0, key, key_len, tag, (size_t)tag_len,
                                   src, slen, errbuf, sizeof(errbuf));
                if (code != 0) {
                    status = code == ERR_QUEUE_FULL ? 3 : 4;
                    if (status == 4) { seq++; row++; } /* its record is in: report past it */
                    break;
                }
            }
            seq++;
        }
        row++;
        if (nl == NULL) break;
        pos = end + 1;
    }
    Py_END_ALLOW_THREADS
    free(value.p);
    free(source.p);
    if (nomem) return PyErr_NoMemory();
    return Py_BuildValue("(nLiis)", row, seq, status, code, errbuf);
}

#define BIND(name)                                                                  \
    do {                                                                            \
        *(void **)(&p_##name) = dlsym(handle, #name);                               \
        if (p_##name == NULL) {                                                     \
            PyErr_Format(PyExc_OSError, "librdkafka at %s has no %s", path, #name); \
            return NULL;                                                            \
        }                                                                           \
    } while (0)

/* init(path): bind librdkafka's functions from the library at ``path`` (the copy
 * confluent-kafka loaded: its handles must be served by the same code). */
static PyObject *init(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    if (bound) Py_RETURN_NONE;
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError, "librdkafka at %s is not loaded in this process (%s)", path,
                     why ? why : "RTLD_NOLOAD");
        return NULL;
    }
    BIND(rd_kafka_name);
    BIND(rd_kafka_type);
    BIND(rd_kafka_topic_name);
    BIND(rd_kafka_err2str);
    BIND(rd_kafka_produceva);
    BIND(rd_kafka_error_code);
    BIND(rd_kafka_error_string);
    BIND(rd_kafka_error_destroy);
    BIND(rd_kafka_conf_interceptor_add_on_new);
    BIND(rd_kafka_interceptor_add_on_acknowledgement);
    BIND(rd_kafka_interceptor_add_on_destroy);
    bound = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "Bind librdkafka's functions from the library at this path."},
    {"take_acks", take_acks, METH_VARARGS, "Acknowledged records per partition since the last call."},
    {"produce_events", produce_events, METH_VARARGS, "Produce a run of EncodedEvents."},
    {"produce_template", produce_template, METH_VARARGS, "Produce a template block's rows."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kafkawrite",
    "The Kafka writer's per-event work in C (see the C source).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kafkawrite(void) {
    if (PyType_Ready(&AccumulatorType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "VERSION", KAFKAWRITE_VERSION) < 0 ||
                      PyModule_AddObjectRef(m, "Accumulator", (PyObject *)&AccumulatorType) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
