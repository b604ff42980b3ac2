/* Test and benchmark entry points of the ring (engine/probe/ring_selftest.c), exposed by
 * the `_probe` module so the ring can be exercised by real threads and real processes
 * without the GIL hooks. module.c adds them with PyModule_AddFunctions. */
#ifndef TANDEM_RING_SELFTEST_H
#define TANDEM_RING_SELFTEST_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyMethodDef tandem_ring_selftest_methods[];

#endif
