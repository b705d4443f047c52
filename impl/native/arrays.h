/* What the C modules of `impl.native` share: the module-name macros, 1-D array views, new int64 arrays, the
 * exact-int read, the blocks a request can hold, the attribute read by interned name, a step's fields read and
 * checked (the step readers') and the module definition.
 * Included by each module's source (every header is part of every module's source stamp: sources.py). */
#ifndef RUNNERCHECK_NATIVE_ARRAYS_H
#define RUNNERCHECK_NATIVE_ARRAYS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#ifndef MODULE_NAME
#error "impl.native builds each module with -DMODULE_NAME"
#endif
/* The stamp of the sources this module is built from (impl/native/sources.py): `load` compares it with the sources
 * beside the built file, so a module built before its C changed is never used. */
#ifndef RUNNERCHECK_SOURCE_SHA
#error "impl.native builds each module with -DRUNNERCHECK_SOURCE_SHA"
#endif
#define CONCAT_(a, b) a##b
#define CONCAT(a, b) CONCAT_(a, b)
#define STRINGIFY_(a) #a
#define STRINGIFY(a) STRINGIFY_(a)

typedef struct {
    const char *data;
    npy_intp len;
    npy_intp stride;
} ArrayView;

#define AT(view, i) (*(const npy_int64 *)((view).data + (npy_intp)(i) * (view).stride))

/* A 1-D array of ``type`` in native byte order, aligned (and writeable when asked): usable in place.
 * 0 for anything else. */
static inline int array_view(PyObject *obj, int type, int writeable, ArrayView *view)
{
    if (!PyArray_Check(obj))
        return 0;
    PyArrayObject *array = (PyArrayObject *)obj;
    if (PyArray_NDIM(array) != 1 || PyArray_TYPE(array) != type || !PyArray_ISALIGNED(array)
        || !PyArray_ISNOTSWAPPED(array) || (writeable && !PyArray_ISWRITEABLE(array)))
        return 0;
    view->data = PyArray_BYTES(array);
    view->len = PyArray_DIM(array, 0);
    view->stride = PyArray_STRIDE(array, 0);
    return 1;
}

static inline int int64_view(PyObject *obj, ArrayView *view)
{
    return array_view(obj, NPY_INT64, 0, view);
}

#define OUT64(view, i) (*(npy_int64 *)((view).data + (npy_intp)(i) * (view).stride))
#define OUT32(view, i) (*(npy_int32 *)((view).data + (npy_intp)(i) * (view).stride))

/* A new 1-D int64 array of ``n`` elements (uninitialised), and the data of an array known to be one. */
static inline PyObject *new_int64(npy_intp n)
{
    return PyArray_SimpleNew(1, &n, NPY_INT64);
}

#define DATA64(array) ((npy_int64 *)PyArray_DATA((PyArrayObject *)(array)))

enum { EXACT_INT = 1, EXACT_INT_TOO_BIG = 2 };

/* An exact int (not a bool or subclass): EXACT_INT with its value, EXACT_INT_TOO_BIG when it does
 * not fit 64 bits (then it equals no mirror value and lies in no bound), 0 for any other object. */
static inline int exact_int(PyObject *obj, long long *value)
{
    if (!PyLong_CheckExact(obj))
        return 0;
    /* The counts a step holds are one-digit ints: read in place, without the general conversion's call. */
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)obj)) {
        *value = (long long)PyUnstable_Long_CompactValue((PyLongObject *)obj);
        return EXACT_INT;
    }
#elif PY_VERSION_HEX >= 0x030B0000
    const Py_ssize_t size = Py_SIZE(obj);
    if (size >= -1 && size <= 1) {
        *value = (long long)size * (long long)((PyLongObject *)obj)->ob_digit[0];
        return EXACT_INT;
    }
#endif
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    return overflow ? EXACT_INT_TOO_BIG : EXACT_INT;
}

/* `impl.interface.blocks_per_request`: the most KV blocks one request can hold (both arguments positive). */
static inline long long blocks_per_request(long long max_model_len, long long block_size)
{
    return (max_model_len + block_size - 1) / block_size;
}

/* An attribute, as a new reference; NULL with an exception set when reading it failed.  The names are
 * interned once (a module lives as long as the interpreter that loaded it). */
static inline PyObject *attr(PyObject *obj, const char *name)
{
    enum { MAX_NAMES = 32 };
    static const char *known[MAX_NAMES];
    static PyObject *interned[MAX_NAMES];
    static int count;
    for (int i = 0; i < count; i++)
        if (known[i] == name)
            return PyObject_GetAttr(obj, interned[i]);
    if (count == MAX_NAMES)
        return PyObject_GetAttrString(obj, name);
    PyObject *key = PyUnicode_InternFromString(name);
    if (!key)
        return NULL;
    known[count] = name;
    interned[count++] = key;
    return PyObject_GetAttr(obj, key);
}

/* The attribute ``name`` of ``obj`` (a new reference, read by interned name: `attr`), or NULL with the error
 * cleared: the caller declines. */
static inline PyObject *attribute(PyObject *obj, const char *name)
{
    PyObject *value = attr(obj, name);
    if (value == NULL)
        PyErr_Clear();
    return value;
}

/* The fields of a `SchedulerOutput` the step readers read (`read_step_fields`), in this order, and those of its
 * `CachedRequests`. */
static const char *const STEP_FIELDS[] = {"step_id", "new_requests", "cached_requests", "num_scheduled_tokens",
                                          "finished_req_ids", "preempted_req_ids", "draft_token_ids", "num_device_drafts"};
enum { STEP_ID, STEP_NEW, STEP_CACHED, STEP_SCHEDULED, STEP_FINISHED, STEP_PREEMPTED, STEP_DRAFTS, STEP_DEVICE_DRAFTS,
       NUM_STEP_FIELDS };
static const char *const CACHED_FIELDS[] = {"req_ids", "new_block_ids", "num_computed_tokens"};
enum { CACHED_IDS, CACHED_BLOCKS, CACHED_COMPUTED };

/* Whether field ``f`` (from STEP_NEW) has the exact type `impl.boundary.check_containers` names first for it -- a
 * tuple or list, a frozenset or set, a dict -- with *empty set; 0 for any other object. */
static inline int exact_container(int f, PyObject *obj, int *empty)
{
    Py_ssize_t size;
    if (f == STEP_NEW && (PyTuple_CheckExact(obj) || PyList_CheckExact(obj)))
        size = Py_SIZE(obj);
    else if ((f == STEP_FINISHED || f == STEP_PREEMPTED) && PyAnySet_CheckExact(obj))
        size = PySet_GET_SIZE(obj);
    else if ((f == STEP_SCHEDULED || f == STEP_DRAFTS || f == STEP_DEVICE_DRAFTS) && PyDict_CheckExact(obj))
        size = PyDict_GET_SIZE(obj);
    else
        return 0;
    *empty = size == 0;
    return 1;
}

/* A step's fields (new references into ``fields``, STEP_FIELDS order) and its cached requests' three tuples (into
 * ``cached``, CACHED_FIELDS order), checked as `check_containers` and `check_step_id` check them, on their exact
 * types only: the step a ``sched_type``, its containers each the first type check_containers names, the cached
 * requests a ``cached_type`` of three tuples of one length, the step id an exact int >= 0 past ``last_step_id``
 * (None: any).  1 when all hold, with *changes set when the step admits, finishes, preempts or drafts; 0 when one does
 * not (the caller declines, and the Python checks name the error).  The caller releases what was read either way. */
static inline int read_step_fields(PyObject *sched, PyObject *sched_type, PyObject *cached_type, PyObject *last_step_id,
                                   PyObject **fields, PyObject **cached, int *changes)
{
    if ((PyObject *)Py_TYPE(sched) != sched_type)
        return 0;
    for (int f = 0; f < NUM_STEP_FIELDS; f++)
        if (!(fields[f] = attribute(sched, STEP_FIELDS[f])))
            return 0;
    int empty;
    *changes = 0;
    for (int f = STEP_NEW; f < NUM_STEP_FIELDS; f++) {
        if (f == STEP_CACHED)
            continue;
        if (!exact_container(f, fields[f], &empty))
            return 0;
        if (f != STEP_SCHEDULED && !empty)
            *changes = 1;
    }
    if ((PyObject *)Py_TYPE(fields[STEP_CACHED]) != cached_type)
        return 0;
    for (int f = 0; f < 3; f++)
        if (!(cached[f] = attribute(fields[STEP_CACHED], CACHED_FIELDS[f])) || !PyTuple_CheckExact(cached[f])
            || PyTuple_GET_SIZE(cached[f]) != PyTuple_GET_SIZE(cached[CACHED_IDS]))
            return 0;
    long long step_id, last = -1;
    if (exact_int(fields[STEP_ID], &step_id) != EXACT_INT || step_id < 0)
        return 0;
    if (last_step_id != Py_None && (exact_int(last_step_id, &last) != EXACT_INT || step_id <= last))
        return 0;
    return 1;
}

/* What `read_step_fields` read, released (any of it may be NULL). */
static inline void release_step_fields(PyObject **fields, PyObject **cached)
{
    for (int f = 0; f < NUM_STEP_FIELDS; f++)
        Py_XDECREF(fields[f]);
    for (int f = 0; f < 3; f++)
        Py_XDECREF(cached[f]);
}

/* The module object and its init function, for a source whose method table is ``methods``. */
#define RUNNERCHECK_MODULE(doc)                                                                              \
    static struct PyModuleDef module = {                                                                     \
        PyModuleDef_HEAD_INIT, STRINGIFY(MODULE_NAME), doc, -1, methods, NULL, NULL, NULL, NULL,              \
    };                                                                                                       \
    PyMODINIT_FUNC CONCAT(PyInit_, MODULE_NAME)(void)                                                        \
    {                                                                                                        \
        import_array();                                                                                      \
        PyObject *created = PyModule_Create(&module);                                                        \
        if (created != NULL && PyModule_AddStringConstant(created, "source_sha", RUNNERCHECK_SOURCE_SHA) < 0) \
            Py_CLEAR(created);                                                                               \
        return created;                                                                                      \
    }

#endif
