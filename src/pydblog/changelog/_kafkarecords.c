/* The wire producer's record accumulator (``pydblog.changelog.kafka.producer``).
 *
 * An ``Accumulator`` gathers records per (topic, partition) in Kafka's record format (the
 * records of a v2 RecordBatch, KIP-98: length, attributes, timestamp delta, offset delta,
 * key, value, headers; varints zigzag-encoded) and cuts them into batches of at most
 * ``batch_bytes`` bytes of records (a record larger than that is a batch of its own).
 * ``take`` hands the batches over in order, each with its record count and its first and
 * highest timestamp; the producer adds the batch header, compression and checksum.
 * ``take(sealed_only=True)`` hands over only the batches already cut (full), so the
 * producer can send them while records are still being added; ``ready`` counts them.
 * A handed-out buffer goes back to its partition, or to a small pool of spare buffers
 * the next batch of any partition starts in (a fresh megabyte page-faults ~250 times).
 *
 * Records without a partition go where Kafka's default partitioner (and librdkafka's
 * ``murmur2_random``) puts them: ``(murmur2(key) & 0x7fffffff) % partitions``, a keyless
 * record to any partition. So a key's records land in the same partition whichever
 * producer wrote them.
 *
 * Invariants: within a partition, records keep the order they were added in, and each
 * batch's offset deltas are 0, 1, ... in that order; a record's timestamp delta is its
 * add time (ms, CLOCK_REALTIME) minus its batch's first record's, never negative.
 */
#include "_kafkarecords.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPARE_MAX 8
#define CLOCK_EVERY 64

typedef struct {
    char *data;
    size_t len, cap;
    int32_t count;
    int64_t base_ts, max_ts;
} open_t;

typedef struct {
    char *name;
    int32_t nparts;
    open_t *parts;
} topic_t;

typedef struct {
    size_t topic; /* index into topics */
    int32_t partition;
    int32_t count;
    int64_t base_ts, max_ts;
    char *data;
    size_t len, cap;
} sealed_t;

typedef struct {
    PyObject_HEAD
    topic_t *topics;
    size_t ntopics, captopics;
    sealed_t *sealed;
    size_t nsealed, capsealed;
    size_t batch_bytes;
    int64_t pending;
    int taken; /* the sealed list is what the last take() handed out */
    uint64_t rnd;
    int64_t clock_ms; /* the records' timestamp, read again every CLOCK_EVERY records */
    int clock_left;   /* records that may still take clock_ms; 0: read the clock */
    size_t last; /* the topic found last (+1; 0: none) */
    char *spare[SPARE_MAX]; /* buffers kept for the next batches */
    size_t spare_cap[SPARE_MAX];
    size_t nspare;
} acc_t;

/* Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``). */
static uint32_t murmur2(const unsigned char *data, size_t length) {
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    size_t n4 = length / 4;
    for (size_t i = 0; i < n4; i++) {
        const unsigned char *p = data + i * 4;
        uint32_t k = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                     ((uint32_t)p[3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const unsigned char *t = data + (length & ~(size_t)3);
    switch (length % 4) {
    case 3:
        h ^= (uint32_t)t[2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)t[1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)t[0];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static size_t varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    size_t n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static char *put_varint(char *p, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z >= 0x80) {
        *p++ = (char)((z & 0x7f) | 0x80);
        z >>= 7;
    }
    *p++ = (char)z;
    return p;
}

static topic_t *find_topic(acc_t *a, const char *name) {
    if (a->last && strcmp(a->topics[a->last - 1].name, name) == 0) return &a->topics[a->last - 1];
    for (size_t i = 0; i < a->ntopics; i++) {
        if (strcmp(a->topics[i].name, name) == 0) {
            a->last = i + 1;
            return &a->topics[i];
        }
    }
    return NULL;
}

/* Moves partition ``p`` of topic ``ti``'s open batch (if it holds records) to the sealed
 * list. -1: out of memory. */
static int seal(acc_t *a, size_t ti, int32_t p) {
    open_t *o = &a->topics[ti].parts[p];
    if (o->count == 0) return 0;
    if (a->nsealed == a->capsealed) {
        size_t cap = a->capsealed ? a->capsealed * 2 : 64;
        sealed_t *s = realloc(a->sealed, cap * sizeof(*s));
        if (s == NULL) return -1;
        a->sealed = s;
        a->capsealed = cap;
    }
    sealed_t *s = &a->sealed[a->nsealed++];
    s->topic = ti;
    s->partition = p;
    s->count = o->count;
    s->base_ts = o->base_ts;
    s->max_ts = o->max_ts;
    s->data = o->data;
    s->len = o->len;
    s->cap = o->cap;
    memset(o, 0, sizeof(*o));
    return 0;
}

/* ``data`` (of capacity ``cap``) into the spare pool, or freed if the pool is full. */
static void spare(acc_t *a, char *data, size_t cap) {
    if (a->nspare < SPARE_MAX) {
        a->spare[a->nspare] = data;
        a->spare_cap[a->nspare++] = cap;
    } else {
        free(data);
    }
}

/* The buffers the last take() handed out go back to their partitions (or are freed):
 * the views of that take are invalid from now on. */
static void release(acc_t *a) {
    for (size_t i = 0; i < a->nsealed; i++) {
        sealed_t *s = &a->sealed[i];
        open_t *o = &a->topics[s->topic].parts[s->partition];
        if (o->data == NULL && o->count == 0) {
            o->data = s->data;
            o->cap = s->cap;
            o->len = 0;
        } else {
            spare(a, s->data, s->cap);
        }
    }
    a->nsealed = 0;
    a->taken = 0;
}

/* The default partitioner's partition for ``key`` (NULL: any) in ``t``. */
static int32_t pick(acc_t *a, const topic_t *t, const char *key, size_t key_len) {
    if (key != NULL)
        return (int32_t)((murmur2((const unsigned char *)key, key_len) & 0x7fffffff) %
                         (uint32_t)t->nparts);
    a->rnd ^= a->rnd << 13;
    a->rnd ^= a->rnd >> 7;
    a->rnd ^= a->rnd << 17;
    return (int32_t)(a->rnd % (uint64_t)t->nparts);
}

void acc_clock_reset(PyObject *self) { ((acc_t *)self)->clock_left = 0; }

int acc_append(PyObject *self, const char *topic, int32_t partition, const char *key,
               size_t key_len, const char *value, size_t value_len, int nh,
               const char *const *hname, const char *const *hval, const ssize_t *hval_len,
               char *err, size_t err_len) {
    acc_t *a = (acc_t *)self;
    if (a->taken) release(a);
    topic_t *t = find_topic(a, topic);
    if (t == NULL) {
        snprintf(err, err_len, "topic %s is not known to the producer", topic);
        return -1;
    }
    if (partition < 0) {
        partition = pick(a, t, key, key_len);
    } else if (partition >= t->nparts) {
        snprintf(err, err_len, "%s has %d partitions, not partition %d", topic, (int)t->nparts,
                 (int)partition);
        return -1;
    }
    size_t ti = (size_t)(t - a->topics);
    open_t *o = &t->parts[partition];
    if (a->clock_left <= 0) {
        a->clock_ms = now_ms();
        a->clock_left = CLOCK_EVERY;
    }
    a->clock_left--;
    int64_t ts = a->clock_ms;
    /* the record after its length */
    size_t body = 1; /* attributes */
    int64_t delta = o->count ? ts - o->base_ts : 0;
    if (delta < 0) delta = 0;
    size_t hsize = 0;
    for (int i = 0; i < nh; i++) {
        size_t nl = strlen(hname[i]);
        hsize += varint_size((int64_t)nl) + nl + varint_size(hval[i] ? (int64_t)hval_len[i] : -1) +
                 (hval[i] ? (size_t)hval_len[i] : 0);
    }
    body += varint_size(delta) + varint_size(o->count) +
            varint_size(key ? (int64_t)key_len : -1) + (key ? key_len : 0) +
            varint_size(value ? (int64_t)value_len : -1) + (value ? value_len : 0) +
            varint_size(nh) + hsize;
    size_t need = varint_size((int64_t)body) + body;
    if (o->count > 0 && o->len + need > a->batch_bytes) {
        if (seal(a, ti, partition) < 0) goto nomem;
        delta = 0;
        /* the offset delta (0 now) and the timestamp delta may be shorter */
        body = 1 + varint_size(0) + varint_size(0) + varint_size(key ? (int64_t)key_len : -1) +
               (key ? key_len : 0) + varint_size(value ? (int64_t)value_len : -1) +
               (value ? value_len : 0) + varint_size(nh) + hsize;
        need = varint_size((int64_t)body) + body;
    }
    if (o->data == NULL && a->nspare > 0) {
        o->data = a->spare[--a->nspare];
        o->cap = a->spare_cap[a->nspare];
        o->len = 0;
    }
    if (o->len + need > o->cap) {
        size_t cap = o->cap ? o->cap : 16384;
        while (cap < o->len + need) cap *= 2;
        char *d = realloc(o->data, cap);
        if (d == NULL) goto nomem;
        o->data = d;
        o->cap = cap;
    }
    if (o->count == 0) o->base_ts = o->max_ts = ts;
    if (ts > o->max_ts) o->max_ts = ts;
    char *p = o->data + o->len;
    p = put_varint(p, (int64_t)body);
    *p++ = 0;
    p = put_varint(p, delta);
    p = put_varint(p, o->count);
    p = put_varint(p, key ? (int64_t)key_len : -1);
    if (key) {
        memcpy(p, key, key_len);
        p += key_len;
    }
    p = put_varint(p, value ? (int64_t)value_len : -1);
    if (value) {
        memcpy(p, value, value_len);
        p += value_len;
    }
    p = put_varint(p, nh);
    for (int i = 0; i < nh; i++) {
        size_t nl = strlen(hname[i]);
        p = put_varint(p, (int64_t)nl);
        memcpy(p, hname[i], nl);
        p += nl;
        p = put_varint(p, hval[i] ? (int64_t)hval_len[i] : -1);
        if (hval[i]) {
            memcpy(p, hval[i], (size_t)hval_len[i]);
            p += hval_len[i];
        }
    }
    o->len = (size_t)(p - o->data);
    o->count++;
    a->pending++;
    return 0;
nomem:
    snprintf(err, err_len, "out of memory");
    return -1;
}

/* Drops every record not taken (and the last take's batches); up to ``SPARE_MAX``
 * buffers stay, in the spare pool, the rest are freed (the memory kept does not grow
 * with the number of partitions ever written). */
static void drop_all(acc_t *a) {
    if (a->taken) release(a);
    for (size_t i = 0; i < a->nsealed; i++) spare(a, a->sealed[i].data, a->sealed[i].cap);
    a->nsealed = 0;
    for (size_t i = 0; i < a->ntopics; i++) {
        topic_t *t = &a->topics[i];
        for (int32_t p = 0; p < t->nparts; p++) {
            if (t->parts[p].data != NULL) spare(a, t->parts[p].data, t->parts[p].cap);
            memset(&t->parts[p], 0, sizeof(open_t));
        }
    }
    a->pending = 0;
}

static void free_all(acc_t *a) {
    drop_all(a);
    for (size_t i = 0; i < a->nspare; i++) free(a->spare[i]);
    a->nspare = 0;
}

static int acc_init(PyObject *self, PyObject *args, PyObject *kwds) {
    acc_t *a = (acc_t *)self;
    static char *kwlist[] = {"batch_bytes", NULL};
    Py_ssize_t batch_bytes = 1000000;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n", kwlist, &batch_bytes)) return -1;
    if (batch_bytes < 1024) {
        PyErr_SetString(PyExc_ValueError, "batch_bytes must be at least 1024");
        return -1;
    }
    a->batch_bytes = (size_t)batch_bytes;
    a->rnd = (uint64_t)now_ms() * 2654435761u + (uintptr_t)self;
    if (a->rnd == 0) a->rnd = 1;
    return 0;
}

static void acc_dealloc(PyObject *self) {
    acc_t *a = (acc_t *)self;
    free_all(a);
    for (size_t i = 0; i < a->ntopics; i++) {
        free(a->topics[i].name);
        free(a->topics[i].parts);
    }
    free(a->topics);
    free(a->sealed);
    Py_TYPE(self)->tp_free(self);
}

/* topic(name, partitions): the topic's partition count (it may grow, never shrink). */
static PyObject *acc_topic(PyObject *self, PyObject *args) {
    acc_t *a = (acc_t *)self;
    const char *name;
    int nparts;
    if (!PyArg_ParseTuple(args, "si", &name, &nparts)) return NULL;
    if (nparts < 1) {
        PyErr_SetString(PyExc_ValueError, "a topic has at least one partition");
        return NULL;
    }
    topic_t *t = find_topic(a, name);
    if (t == NULL) {
        if (a->ntopics == a->captopics) {
            size_t cap = a->captopics ? a->captopics * 2 : 16;
            topic_t *ts = realloc(a->topics, cap * sizeof(*ts));
            if (ts == NULL) return PyErr_NoMemory();
            a->topics = ts;
            a->captopics = cap;
        }
        t = &a->topics[a->ntopics];
        t->name = strdup(name);
        t->parts = calloc((size_t)nparts, sizeof(open_t));
        if (t->name == NULL || t->parts == NULL) {
            free(t->name);
            free(t->parts);
            return PyErr_NoMemory();
        }
        t->nparts = nparts;
        a->ntopics++;
    } else if (nparts > t->nparts) {
        open_t *parts = realloc(t->parts, (size_t)nparts * sizeof(open_t));
        if (parts == NULL) return PyErr_NoMemory();
        memset(parts + t->nparts, 0, (size_t)(nparts - t->nparts) * sizeof(open_t));
        t->parts = parts;
        t->nparts = nparts;
    } else if (nparts < t->nparts) {
        PyErr_Format(PyExc_ValueError, "topic %s had %d partitions, now %d: partitions are "
                     "never removed", name, (int)t->nparts, nparts);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* partitions(name) -> int or None */
static PyObject *acc_partitions(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    topic_t *t = find_topic((acc_t *)self, name);
    if (t == NULL) Py_RETURN_NONE;
    return PyLong_FromLong(t->nparts);
}

static const char *bytes_or_text(PyObject *o, Py_ssize_t *len, const char *what) {
    if (o == Py_None) return NULL;
    if (PyBytes_Check(o)) {
        *len = PyBytes_GET_SIZE(o);
        return PyBytes_AS_STRING(o);
    }
    if (PyUnicode_Check(o)) return PyUnicode_AsUTF8AndSize(o, len);
    PyErr_Format(PyExc_TypeError, "a record's %s must be bytes, str or None", what);
    return NULL;
}

#define MAX_HEADERS 8

/* add(topic, partition, key, value, headers) -> partition: one record (partition -1:
 * the default partitioner's); headers a sequence of (name, value) or None. */
static PyObject *acc_add(PyObject *self, PyObject *args) {
    const char *topic;
    int partition;
    PyObject *key_o, *value_o, *headers_o;
    if (!PyArg_ParseTuple(args, "siOOO", &topic, &partition, &key_o, &value_o, &headers_o))
        return NULL;
    Py_ssize_t klen = 0, vlen = 0;
    const char *key = bytes_or_text(key_o, &klen, "key");
    if (key == NULL && PyErr_Occurred()) return NULL;
    const char *value = bytes_or_text(value_o, &vlen, "value");
    if (value == NULL && PyErr_Occurred()) return NULL;
    const char *hname[MAX_HEADERS], *hval[MAX_HEADERS];
    ssize_t hlen[MAX_HEADERS];
    int nh = 0;
    PyObject *seq = NULL;
    if (headers_o != Py_None) {
        seq = PySequence_Fast(headers_o, "headers must be a sequence of (name, value)");
        if (seq == NULL) return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > MAX_HEADERS) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "at most %d headers a record", MAX_HEADERS);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *h = PySequence_Fast_GET_ITEM(seq, i);
            if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2 ||
                !PyUnicode_Check(PyTuple_GET_ITEM(h, 0))) {
                Py_DECREF(seq);
                PyErr_SetString(PyExc_TypeError, "a header is a (str, value) tuple");
                return NULL;
            }
            hname[nh] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(h, 0));
            Py_ssize_t l = 0;
            hval[nh] = bytes_or_text(PyTuple_GET_ITEM(h, 1), &l, "header value");
            if (hname[nh] == NULL || (hval[nh] == NULL && PyErr_Occurred())) {
                Py_DECREF(seq);
                return NULL;
            }
            hlen[nh] = hval[nh] ? (ssize_t)l : -1;
            nh++;
        }
    }
    char err[256];
    acc_t *a = (acc_t *)self;
    topic_t *t = find_topic(a, topic);
    int32_t part = partition;
    if (t != NULL && part < 0) part = pick(a, t, key, (size_t)klen);
    acc_clock_reset(self);
    int rc = acc_append(self, topic, part, key, (size_t)klen, value, (size_t)vlen, nh, hname,
                        hval, hlen, err, sizeof(err));
    Py_XDECREF(seq);
    if (rc != 0) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    return PyLong_FromLong(part);
}

/* take(sealed_only=False) -> [(topic, partition, count, base_ts, max_ts, records)]:
 * every batch, sealed first, in the order each partition's records were added; the
 * accumulator is empty after. ``sealed_only``: only the batches already cut, the
 * partitions' open batches stay (a partition's records still leave in order: its open
 * batch holds only records added after its sealed ones). ``records`` is a read-only
 * memoryview of the accumulator's own buffer (no copy: a fresh copy of a megabyte
 * page-faults ~250 times), valid until the next ``add``, ``take``, ``release`` or
 * ``clear``: copy what must outlive that. */
static PyObject *acc_take(PyObject *self, PyObject *args, PyObject *kwds) {
    acc_t *a = (acc_t *)self;
    static char *kwlist[] = {"sealed_only", NULL};
    int sealed_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p", kwlist, &sealed_only)) return NULL;
    if (a->taken) release(a);
    if (sealed_only) {
        for (size_t i = 0; i < a->nsealed; i++) a->pending -= a->sealed[i].count;
    } else {
        for (size_t i = 0; i < a->ntopics; i++) {
            for (int32_t p = 0; p < a->topics[i].nparts; p++) {
                open_t *o = &a->topics[i].parts[p];
                if (o->count == 0 && o->data != NULL) { /* kept from the last take, unused */
                    spare(a, o->data, o->cap);
                    memset(o, 0, sizeof(*o));
                }
                if (seal(a, i, p) < 0) return PyErr_NoMemory();
            }
        }
        a->pending = 0;
    }
    a->taken = 1;
    PyObject *out = PyList_New((Py_ssize_t)a->nsealed);
    if (out == NULL) return NULL;
    for (size_t i = 0; i < a->nsealed; i++) {
        sealed_t *s = &a->sealed[i];
        PyObject *view = PyMemoryView_FromMemory(s->data, (Py_ssize_t)s->len, PyBUF_READ);
        PyObject *t = view == NULL ? NULL : Py_BuildValue(
            "(siiLLN)", a->topics[s->topic].name, (int)s->partition, (int)s->count,
            (long long)s->base_ts, (long long)s->max_ts, view);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

/* release(): the last take's buffers back to the accumulator (its views are invalid
 * after). */
static PyObject *acc_release(PyObject *self, PyObject *noargs) {
    (void)noargs;
    acc_t *a = (acc_t *)self;
    if (a->taken) release(a);
    Py_RETURN_NONE;
}

/* clear(): drop every record not taken. */
static PyObject *acc_clear(PyObject *self, PyObject *noargs) {
    (void)noargs;
    drop_all((acc_t *)self);
    Py_RETURN_NONE;
}

static PyObject *acc_get_pending(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLongLong(((acc_t *)self)->pending);
}

static PyObject *acc_get_ready(PyObject *self, void *closure) {
    (void)closure;
    acc_t *a = (acc_t *)self;
    return PyLong_FromSize_t(a->taken ? 0 : a->nsealed);
}

static PyMethodDef acc_methods[] = {
    {"topic", acc_topic, METH_VARARGS, "Register a topic and its partition count."},
    {"partitions", acc_partitions, METH_VARARGS, "A registered topic's partition count."},
    {"add", acc_add, METH_VARARGS, "Add one record; its partition."},
    {"take", (PyCFunction)(void (*)(void))acc_take, METH_VARARGS | METH_KEYWORDS,
     "Every batch (or only the sealed ones), in order."},
    {"release", acc_release, METH_NOARGS, "The last take's buffers back (its views invalid)."},
    {"clear", acc_clear, METH_NOARGS, "Drop every record not taken."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef acc_getset[] = {
    {"pending", acc_get_pending, NULL, "Records added and not taken.", NULL},
    {"ready", acc_get_ready, NULL, "Batches cut (full) and not taken.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject AccumulatorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pydblog.changelog._kafkawrite.Accumulator",
    .tp_basicsize = sizeof(acc_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Records per (topic, partition) in Kafka's record format, cut into batches.",
    .tp_new = PyType_GenericNew,
    .tp_init = acc_init,
    .tp_dealloc = acc_dealloc,
    .tp_methods = acc_methods,
    .tp_getset = acc_getset,
};
