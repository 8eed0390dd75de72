/* The compiled hot path of prefixroute.core: chained block hashing, one replica's LRU, and the
 * speed model's normal equations (solve.c, whose reference is core/_solve.py).
 *
 * The readable reference for both is Python: BlockHasher._hash_bytes (core/hashing.py) and
 * ReplicaLRU (core/_lru.py); lrus.c is PrefixIndex's loops over many of them. chain.c, lru.c and
 * lrus.c must give exactly their results; the tests feed both the same operations and compare
 * every answer (tests/core/test_native.py).
 *
 * Why C: the profile of Router.route at 8k tokens and a 1M-block index is memory-bound Python
 * work per block. Hashing spends ~150 ns per block calling xxh3 from Python and boxing each
 * hash; the index spends ~160 ns per block in dict.update, because a dict entry points to a
 * separate int object per key (two cache misses per probe) in tables of ~60k entries. Here a
 * block costs one xxh3 call, and a table slot holds the 64-bit key inline, so a touch is one
 * probe, and the probes of a whole chain are prefetched ahead so their misses overlap.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "glue.h"
#include "hotpath.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "prefixroute.core._native._hotpath",
    .m_doc = "The compiled hot path: chained xxh3 block hashing, a per-replica LRU and the "
             "speed model's normal equations.",
    .m_size = -1,
    .m_methods = chain_methods,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    PyObject *m = module_of_type(&module, "LRU", &LRU_type);
    if (m != NULL
        && (PyModule_AddFunctions(m, solve_methods) < 0
            || PyModule_AddFunctions(m, lru_methods) < 0))
        Py_CLEAR(m);
    return m;
}
