/* What the module (_hotpath.c) takes from chain.c, lru.c and solve.c. */
#ifndef PREFIXROUTE_HOTPATH_H
#define PREFIXROUTE_HOTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyMethodDef chain_methods[]; /* chain_xxh3, pack_u32 */
extern PyTypeObject LRU_type;       /* one replica's LRU */
extern PyMethodDef lru_methods[];   /* match_each (one chain against many LRUs) */
extern PyMethodDef solve_methods[]; /* add_observations (the speed model's normal equations) */

#endif
