/* Instances of a `dataclass(slots=True)` made in C without its __init__ (impl/native/general.c's StepArrays,
 * plans.c's StepPlan): each field's value stored straight into its slot.  Only for a dataclass whose __init__
 * stores its fields and nothing else (no __post_init__, no default factory) -- its Python module checks that at
 * import -- and only when the type's slots are exactly the fields the C side names, in that order; else the
 * caller declines.  Included after arrays.h by the modules that make such instances. */
#ifndef RUNNERCHECK_NATIVE_SLOTS_H
#define RUNNERCHECK_NATIVE_SLOTS_H

#include <string.h>
#include <structmember.h>  /* T_OBJECT_EX, READONLY: what a __slots__ member is */

enum { MAX_SLOTS = 32 };

typedef struct {
    PyTypeObject *type;  /* the type the offsets were read from (a reference kept); NULL before */
    Py_ssize_t offsets[MAX_SLOTS];
} SlotsLayout;

/* ``layout`` read for ``type_obj`` (once per type): 1 when it is a heap type with exactly ``n`` writable object slots,
 * no instance dict, and ``fields`` (its dataclass fields, a tuple of str in order) are ``names``; else 0. */
static inline int slots_layout(SlotsLayout *layout, PyObject *type_obj, PyObject *fields, const char *const *names, int n)
{
    if ((PyTypeObject *)type_obj == layout->type)
        return 1;
    if (n > MAX_SLOTS || !PyType_Check(type_obj) || !PyTuple_CheckExact(fields) || PyTuple_GET_SIZE(fields) != n)
        return 0;
    PyTypeObject *type = (PyTypeObject *)type_obj;
    if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || type->tp_dictoffset != 0 || type->tp_members == NULL)
        return 0;
    int count = 0;
    for (PyMemberDef *m = type->tp_members; m->name != NULL; m++)
        count++;
    if (count != n)
        return 0;
    Py_ssize_t offsets[MAX_SLOTS];
    for (int k = 0; k < n; k++) {
        PyObject *field = PyTuple_GET_ITEM(fields, k);
        const char *name = PyUnicode_Check(field) ? PyUnicode_AsUTF8(field) : NULL;
        if (name == NULL || strcmp(name, names[k]) != 0) {
            PyErr_Clear();
            return 0;
        }
        offsets[k] = -1;
        for (PyMemberDef *m = type->tp_members; m->name != NULL; m++)
            if (strcmp(m->name, name) == 0 && m->type == T_OBJECT_EX && !(m->flags & READONLY))
                offsets[k] = m->offset;
        if (offsets[k] < 0)
            return 0;
    }
    memcpy(layout->offsets, offsets, sizeof(Py_ssize_t) * (size_t)n);
    Py_XSETREF(layout->type, (PyTypeObject *)Py_NewRef(type_obj));
    return 1;
}

/* A new instance of the layout's type with field k holding ``values[k]`` (a new reference each); NULL on an error. */
static inline PyObject *slots_new(const SlotsLayout *layout, PyObject *const *values, int n)
{
    PyObject *obj = layout->type->tp_alloc(layout->type, 0);
    if (obj != NULL)
        for (int k = 0; k < n; k++)
            *(PyObject **)((char *)obj + layout->offsets[k]) = Py_NewRef(values[k]);
    return obj;
}

/* Field k of an instance of the layout's type (borrowed; NULL for an unset slot). */
static inline PyObject *slot_get(const SlotsLayout *layout, PyObject *obj, int k)
{
    return *(PyObject **)((char *)obj + layout->offsets[k]);
}

#endif
