/* A Kafka read that hands over a consume() batch's values without a Python object per
 * message (``pydblog.changelog.kafka_native``).
 *
 * consume(consumer, client_id, max_messages, timeout_ms) pops up to ``max_messages``
 * messages from the consumer queue of a confluent-kafka ``Consumer`` (waiting at most
 * ``timeout_ms`` for the first ones, as ``Consumer.consume`` does), without the GIL, and
 * returns ``(data, lengths, offsets, partitions, errors)``: the payloads of the data
 * messages joined into one bytes, their lengths (int64, -1 for a null payload, which adds
 * no bytes), Kafka offsets (int64) and partitions (int32) as bytes in message order, and
 * a list of ``(index, code, topic, partition, offset, text)`` for the messages that carry
 * an error (``index``: how many data messages came before it). confluent-kafka made a
 * ``Message`` (three Python objects and a copy of the payload) per message: ~2 us of the
 * reading thread each, most of a ``dblog sync`` read.
 *
 * librdkafka is not linked: its few functions are looked up in the copy confluent-kafka
 * loaded (``init``), and the client handle is the ``rd_kafka_t *`` that confluent-kafka's
 * ``Handle`` holds right after the object header (confluent_kafka.h, unchanged since 0.9;
 * the caller checks the version). ``client_id`` must be the consumer's ``client.id``:
 * the handle's name is checked against it before the queue is touched, so a layout
 * change is an error, never a read of the wrong memory's messages.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KAFKAREAD_VERSION 1

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
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

static const char *(*p_rd_kafka_name)(const rd_kafka_t *);
static int (*p_rd_kafka_type)(const rd_kafka_t *);
static rd_kafka_queue_t *(*p_rd_kafka_queue_get_consumer)(rd_kafka_t *);
static void (*p_rd_kafka_queue_destroy)(rd_kafka_queue_t *);
static ssize_t (*p_rd_kafka_consume_batch_queue)(rd_kafka_queue_t *, int, rd_kafka_message_t **,
                                                 size_t);
static void (*p_rd_kafka_message_destroy)(rd_kafka_message_t *);
static const char *(*p_rd_kafka_err2str)(int);
static const char *(*p_rd_kafka_topic_name)(const rd_kafka_topic_t *);

typedef struct {
    Py_ssize_t index;
    int code;
    int32_t partition;
    int64_t offset;
    char *topic;
    char *text;
} err_t;

typedef struct {
    char *data;
    size_t len, cap;
    int64_t *lengths, *offsets;
    int32_t *partitions;
    size_t n;
    err_t *errors;
    size_t nerr;
    int nomem;
} batch_t;

static void free_batch(batch_t *b) {
    free(b->data);
    free(b->lengths);
    free(b->offsets);
    free(b->partitions);
    for (size_t i = 0; i < b->nerr; i++) {
        free(b->errors[i].topic);
        free(b->errors[i].text);
    }
    free(b->errors);
}

static char *copy_text(const void *p, size_t n) {
    char *s = malloc(n + 1);
    if (s != NULL) {
        memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}

/* Takes every message (and destroys it); runs without the GIL. */
static void take(batch_t *b, rd_kafka_message_t **msgs, size_t count) {
    for (size_t i = 0; i < count; i++) {
        rd_kafka_message_t *m = msgs[i];
        if (b->nomem) {
            p_rd_kafka_message_destroy(m);
            continue;
        }
        if (m->err != 0) {
            err_t *e = &b->errors[b->nerr++];
            e->index = (Py_ssize_t)b->n;
            e->code = m->err;
            e->partition = m->partition;
            e->offset = m->offset;
            const char *topic = m->rkt ? p_rd_kafka_topic_name(m->rkt) : "";
            e->topic = copy_text(topic, strlen(topic));
            /* rd_kafka_message_errstr: the payload holds the text, if any */
            if (m->payload != NULL && m->len > 0) {
                e->text = copy_text(m->payload, m->len);
            } else {
                const char *t = p_rd_kafka_err2str(m->err);
                e->text = copy_text(t, strlen(t));
            }
            if (e->topic == NULL || e->text == NULL) b->nomem = 1;
        } else {
            size_t len = m->payload != NULL ? m->len : 0;
            if (b->len + len > b->cap) {
                size_t cap = b->cap ? b->cap : 1 << 20;
                while (cap < b->len + len) cap *= 2;
                char *d = realloc(b->data, cap);
                if (d == NULL) {
                    b->nomem = 1;
                    p_rd_kafka_message_destroy(m);
                    continue;
                }
                b->data = d;
                b->cap = cap;
            }
            if (len) memcpy(b->data + b->len, m->payload, len);
            b->len += len;
            b->lengths[b->n] = m->payload != NULL ? (int64_t)m->len : -1;
            b->offsets[b->n] = m->offset;
            b->partitions[b->n] = m->partition;
            b->n++;
        }
        p_rd_kafka_message_destroy(m);
    }
}

static PyObject *consume(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *consumer;
    const char *client_id;
    Py_ssize_t max_messages;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "Osni", &consumer, &client_id, &max_messages, &timeout_ms))
        return NULL;
    if (p_rd_kafka_consume_batch_queue == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka not bound: call init() first");
        return NULL;
    }
    if (max_messages < 1) {
        PyErr_SetString(PyExc_ValueError, "max_messages must be positive");
        return NULL;
    }
    rd_kafka_t *rk = *(rd_kafka_t **)((char *)consumer + sizeof(PyObject));
    const char *name = rk != NULL ? p_rd_kafka_name(rk) : NULL;
    size_t idlen = strlen(client_id);
    if (name == NULL || strncmp(name, client_id, idlen) != 0 || name[idlen] != '#' ||
        p_rd_kafka_type(rk) != 1 /* RD_KAFKA_CONSUMER */) {
        PyErr_SetString(PyExc_RuntimeError,
                        "not a confluent-kafka consumer with this client.id (or an "
                        "unknown confluent-kafka object layout)");
        return NULL;
    }
    batch_t b;
    memset(&b, 0, sizeof(b));
    rd_kafka_message_t **msgs = malloc((size_t)max_messages * sizeof(*msgs));
    b.lengths = malloc((size_t)max_messages * sizeof(int64_t));
    b.offsets = malloc((size_t)max_messages * sizeof(int64_t));
    b.partitions = malloc((size_t)max_messages * sizeof(int32_t));
    b.errors = calloc((size_t)max_messages, sizeof(err_t));
    PyObject *result = NULL;
    if (msgs == NULL || b.lengths == NULL || b.offsets == NULL || b.partitions == NULL ||
        b.errors == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    ssize_t got;
    Py_BEGIN_ALLOW_THREADS
    rd_kafka_queue_t *q = p_rd_kafka_queue_get_consumer(rk);
    got = q != NULL ? p_rd_kafka_consume_batch_queue(q, timeout_ms, msgs, (size_t)max_messages) : -2;
    if (got > 0) take(&b, msgs, (size_t)got);
    if (q != NULL) p_rd_kafka_queue_destroy(q);
    Py_END_ALLOW_THREADS
    if (got == -2) {
        PyErr_SetString(PyExc_RuntimeError, "the consumer has no consumer queue");
        goto out;
    }
    if (got < 0) {
        PyErr_SetString(PyExc_RuntimeError, "rd_kafka_consume_batch_queue failed");
        goto out;
    }
    if (b.nomem) {
        PyErr_NoMemory();
        goto out;
    }
    PyObject *errors = PyList_New((Py_ssize_t)b.nerr);
    if (errors == NULL) goto out;
    for (size_t i = 0; i < b.nerr; i++) {
        err_t *e = &b.errors[i];
        PyObject *t = Py_BuildValue("(nisiLs)", e->index, e->code, e->topic, (int)e->partition,
                                    (long long)e->offset, e->text);
        if (t == NULL) {
            Py_DECREF(errors);
            goto out;
        }
        PyList_SET_ITEM(errors, (Py_ssize_t)i, t);
    }
    result = Py_BuildValue("(y#y#y#y#N)", b.data ? b.data : "", (Py_ssize_t)b.len,
                           (const char *)b.lengths, (Py_ssize_t)(b.n * sizeof(int64_t)),
                           (const char *)b.offsets, (Py_ssize_t)(b.n * sizeof(int64_t)),
                           (const char *)b.partitions, (Py_ssize_t)(b.n * sizeof(int32_t)),
                           errors);
out:
    free(msgs);
    free_batch(&b);
    return result;
}

#define BIND(name)                                                                  \
    do {                                                                            \
        *(void **)(&p_##name) = dlsym(handle, #name);                               \
        if (p_##name == NULL) {                                                     \
            PyErr_Format(PyExc_OSError, "librdkafka at %s has no %s", path, #name); \
            p_rd_kafka_consume_batch_queue = NULL;                                  \
            return NULL;                                                            \
        }                                                                           \
    } while (0)

/* init(path): bind librdkafka's functions from the library at ``path`` (the copy
 * confluent-kafka loaded: its handles must be served by the same code). */
static PyObject *init(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError, "librdkafka at %s is not loaded in this process (%s)", path,
                     why ? why : "RTLD_NOLOAD");
        return NULL;
    }
    BIND(rd_kafka_name);
    BIND(rd_kafka_type);
    BIND(rd_kafka_queue_get_consumer);
    BIND(rd_kafka_queue_destroy);
    BIND(rd_kafka_message_destroy);
    BIND(rd_kafka_err2str);
    BIND(rd_kafka_topic_name);
    BIND(rd_kafka_consume_batch_queue); /* last: non-NULL means bound */
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "Bind librdkafka's functions from the library at this path."},
    {"consume", consume, METH_VARARGS, "A consume() batch's values without Message objects."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kafkaread",
    "Kafka values without a Python object per message (see the C source).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kafkaread(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", KAFKAREAD_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
