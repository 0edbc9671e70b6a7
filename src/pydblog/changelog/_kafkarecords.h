/* The wire producer's record accumulator (``_kafkarecords.c``), shared with
 * ``_kafkawrite.c``'s envelope cutting. */
#ifndef PYDBLOG_KAFKARECORDS_H
#define PYDBLOG_KAFKARECORDS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

extern PyTypeObject AccumulatorType;

#define Accumulator_Check(o) (Py_TYPE(o) == &AccumulatorType)

/* One record into ``acc`` (an ``Accumulator``): into ``partition`` of ``topic``, or, if
 * ``partition`` < 0, the one Kafka's default partitioner picks (murmur2 of the key;
 * no key: any). ``key``/``value`` NULL: null. Headers: ``nh`` pairs, a value NULL with
 * size -1 is null. 0, or -1 with ``err`` set (an unregistered topic, a partition out of
 * range, out of memory). Needs no GIL: touches no Python object; the caller holds the
 * accumulator (one thread at a time). */
int acc_append(PyObject *acc, const char *topic, int32_t partition, const char *key,
               size_t key_len, const char *value, size_t value_len, int nh,
               const char *const *hname, const char *const *hval, const ssize_t *hval_len,
               char *err, size_t err_len);

/* The next record appended to ``acc`` reads the clock. Records take their timestamp from
 * a clock read every few records (a read costs as much as the rest of a short record), so
 * whoever appends a run of records without pause calls this before it: no record takes
 * a time from before the run. */
void acc_clock_reset(PyObject *acc);

#endif
