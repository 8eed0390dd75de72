/* The Python side both compiled modules share (_hotpath: lru.c; _kvcache: kvcache.c), written
 * once: a sequence of block hashes read as a C array, the arguments that bring one, a slice
 * bound, and a module whose whole content is one type.
 *
 * Static inline functions, as in oatable.h: each translation unit that includes this file gets
 * its own copy, so the two extension modules stay independent of each other.
 */
#ifndef PREFIXROUTE_GLUE_H
#define PREFIXROUTE_GLUE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A sequence of block hashes: its items as a C array, borrowed from a fast sequence that
 * hashes_close releases. */
typedef struct {
    PyObject *seq;
    PyObject **items;
    Py_ssize_t n;
} Hashes;

/* 0 with TypeError set when obj is not a sequence. */
static inline int
hashes_open(Hashes *h, PyObject *obj)
{
    h->seq = PySequence_Fast(obj, "block hashes must be a sequence");
    if (h->seq == NULL)
        return 0;
    h->items = PySequence_Fast_ITEMS(h->seq);
    h->n = PySequence_Fast_GET_SIZE(h->seq);
    return 1;
}

static inline void
hashes_close(Hashes *h)
{
    Py_DECREF(h->seq);
}

/* Arguments that are a sequence of block hashes, then up to two Py_ssize_t (`format` is "O"
 * then their codes, e.g. "On:lookup"; pass NULL for one it does not name): parsed, and the
 * sequence opened. 0 with the error set, and nothing to close, when either step fails. */
static inline int
hashes_args(PyObject *args, const char *format, Hashes *h, Py_ssize_t *a, Py_ssize_t *b)
{
    PyObject *obj;
    return PyArg_ParseTuple(args, format, &obj, a, b) && hashes_open(h, obj);
}

/* How many of n items `items[:stop]` takes, a negative stop counting from the end as a Python
 * slice reads it. */
static inline Py_ssize_t
slice_stop(Py_ssize_t stop, Py_ssize_t n)
{
    if (stop < 0)
        stop = stop + n < 0 ? 0 : stop + n;
    return stop > n ? n : stop;
}

/* A module PyInit function's whole job when the module holds one type: ready the type, create
 * the module, add the type under `name`. NULL with an error set. */
static inline PyObject *
module_of_type(struct PyModuleDef *def, const char *name, PyTypeObject *type)
{
    if (PyType_Ready(type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(def);
    if (m != NULL && PyModule_AddObjectRef(m, name, (PyObject *)type) < 0)
        Py_CLEAR(m);
    return m;
}

#endif
