/* dqtool.native._codes: the kernels of transpose.c and lookup.c for Python. Arguments are
 * integers (array addresses included, as NumPy's `ctypes.data` gives them): dqtool.native
 * checks every array's size before it hands one over, as the kernels trust them. The GIL
 * is released around each kernel, so calls on several threads run at once. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "kernels.h"

/* args[0 .. want) as int64 values into out: 0, or -1 with the Python error set. */
static int int64_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                      const char *name, int64_t *out) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want,
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < want; i++) {
        long long v = PyLong_AsLongLong(args[i]);
        if (v == -1 && PyErr_Occurred()) return -1;
        out[i] = (int64_t)v;
    }
    return 0;
}

#define PTR(v) ((void *)(intptr_t)(v))

/* transpose(src, src_stride, dst, dst_stride, wide, s0, s1, bits, flip): 0, or -1 for
 * another width (dq_transpose_codes). */
static PyObject *py_transpose(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t a[9];
    int rc;
    (void)self;
    if (int64_args(args, nargs, 9, "transpose", a) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = dq_transpose_codes(PTR(a[0]), a[1], PTR(a[2]), a[3], a[4], a[5], a[6], (int)a[7],
                            (int)a[8]);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* lut_rows(codes, rows, cols, bits, rpg, cpg, ncg, tables, levels, width, out): 0 or
 * -errno (dq_lut_rows). */
static PyObject *py_lut_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t a[11];
    int rc;
    (void)self;
    if (int64_args(args, nargs, 11, "lut_rows", a) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = dq_lut_rows(PTR(a[0]), a[1], a[2], a[3], a[4], a[5], a[6], PTR(a[7]), a[8], a[9],
                     PTR(a[10]));
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* lut_select(codes, rows, cols, bits, rpg, tables, levels, width, out): 0 or -errno
 * (dq_lut_select). */
static PyObject *py_lut_select(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t a[9];
    int rc;
    (void)self;
    if (int64_args(args, nargs, 9, "lut_select", a) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = dq_lut_select(PTR(a[0]), a[1], a[2], a[3], a[4], PTR(a[5]), a[6], a[7], PTR(a[8]));
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *py_set_wide(PyObject *self, PyObject *arg) {
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    return PyBool_FromLong(dq_set_wide(on));
}

static PyObject *py_select_supported(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(dq_select_supported());
}

/* view(address, nbytes): a writable memoryview of that memory (a band buffer NumPy owns,
 * handed to os.pwrite); the caller keeps its owner alive while the view is used. */
static PyObject *py_view(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t a[2];
    (void)self;
    if (int64_args(args, nargs, 2, "view", a) < 0) return NULL;
    if (a[1] < 0) {
        PyErr_SetString(PyExc_ValueError, "view: a negative size");
        return NULL;
    }
    return PyMemoryView_FromMemory((char *)PTR(a[0]), (Py_ssize_t)a[1], PyBUF_WRITE);
}

static PyMethodDef methods[] = {
    {"transpose", (PyCFunction)(void (*)(void))py_transpose, METH_FASTCALL,
     "The packed-code transpose of a slab of squares (dq_transpose_codes)."},
    {"lut_rows", (PyCFunction)(void (*)(void))py_lut_rows, METH_FASTCALL,
     "Table lookups of a band of rows, tables [group][column group][level]."},
    {"lut_select", (PyCFunction)(void (*)(void))py_lut_select, METH_FASTCALL,
     "Table lookups on AVX-512, tables [group][level][column]; -ENOSYS where not."},
    {"set_wide", py_set_wide, METH_O, "Turn the AVX-512 paths on (where the CPU has them) "
     "or off; returns whether they are on."},
    {"select_supported", py_select_supported, METH_NOARGS, "Whether lut_select runs here."},
    {"view", (PyCFunction)(void (*)(void))py_view, METH_FASTCALL,
     "A writable memoryview of nbytes at an address."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_codes",
    "Transposes and table lookups of packed codes (see dqtool.native).", 0, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__codes(void) { return PyModule_Create(&module); }
