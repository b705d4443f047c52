/* The request state table's writes in C (`impl.native`): each function is the twin of a Python method of
 * `impl.state.RequestStateTable` that stays the reference and the fallback, and is called by it.  Each writes
 * only the arrays it is handed, and on any argument it does not take (another type, dtype or shape, a row out
 * of range, a value outside its rule) returns `NotImplemented` before writing anything.
 *
 * advance_decode -- the no-draft branch of `impl.state.RequestStateTable.advance` (its owner's mirror):
 *     num_tokens[rows[i]] = max(known[i], ends[i] + 1); num_computed[rows[i]] = ends[i].
 *     advance_decode(rows, ends, known, num_tokens, num_computed) -> True, or NotImplemented (arrays
 *     of another kind or shape, a row out of range; nothing written).
 *
 * append_counts -- `impl.state.RequestStateTable.append_blocks` (its owner's block counts): the counts of ``rows``
 *     before this step's appends (where each row's new blocks go in the block table), then moved past them:
 *     starts[i] = num_blocks[rows[i]]; num_blocks[rows[i]] += counts[i].
 *     append_counts(num_blocks, rows, counts) -> starts (int64), or NotImplemented (arrays of another kind or
 *     shape, a row out of range; nothing written).  A row named twice gets the reference's result: every start
 *     read before any count moves, the later move wins.
 *
 * admit_row -- `impl.state.RequestStateTable.admit`'s mirror writes for the admitted row: its prefill tokens into
 *     the row of the pinned token table, then one value into each of the per-row columns.
 *     admit_row(prefill, row, tokens, columns, values) -> True, or NotImplemented.  ``prefill`` a C-contiguous,
 *     writeable 2-D int32 array; ``tokens`` an exact tuple or list of exact ints within int32, at most a row of
 *     them; ``columns`` a tuple of at most 16 writeable 1-D int64 arrays, each with a row ``row``; ``values`` a tuple
 *     of exact ints within int64, one per column.
 *
 * swap_row -- `impl.state.RequestStateTable.release`'s mirror writes for the released row: one value into each of
 *     the per-row columns, the values they held returned.
 *     swap_row(row, columns, values) -> the old values (a tuple of ints), or NotImplemented.  ``columns`` a tuple of
 *     writeable 1-D int64 arrays, each with a row ``row``; ``values`` a tuple of exact ints within int64, one per
 *     column.
 *
 * Built at run time by `impl.native`; the planted-bug tests build variants with
 * -DRUNNERCHECK_PLANT_NO_SAMPLE (an advance that forgets the sampled token),
 * -DRUNNERCHECK_PLANT_STARTS_AFTER_APPEND (block appends placed after the counts they moved),
 * -DRUNNERCHECK_PLANT_PREFILL_SHIFTED (an admission whose prefill tokens land one column late) and
 * -DRUNNERCHECK_PLANT_SWAP_RETURNS_NEW (a release that reads the values it wrote, not those the row held).
 */
#include "arrays.h"

static PyObject *advance_decode(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *rows_obj, *ends_obj, *known_obj, *tokens_obj, *computed_obj;
    if (!PyArg_ParseTuple(args, "OOOOO", &rows_obj, &ends_obj, &known_obj, &tokens_obj, &computed_obj))
        return NULL;
    ArrayView rows, ends, known, num_tokens, num_computed;
    if (!int64_view(rows_obj, &rows) || !int64_view(ends_obj, &ends) || !int64_view(known_obj, &known)
        || !array_view(tokens_obj, NPY_INT64, 1, &num_tokens) || !array_view(computed_obj, NPY_INT64, 1, &num_computed))
        Py_RETURN_NOTIMPLEMENTED;
    const npy_intp n = rows.len, num_rows = num_tokens.len;
    if (ends.len != n || known.len != n || num_computed.len != num_rows)
        Py_RETURN_NOTIMPLEMENTED;
    for (npy_intp i = 0; i < n; i++)
        if (AT(rows, i) < 0 || AT(rows, i) >= num_rows)
            Py_RETURN_NOTIMPLEMENTED;
    for (npy_intp i = 0; i < n; i++) {
        npy_int64 row = AT(rows, i), end = AT(ends, i), have = AT(known, i);
#ifdef RUNNERCHECK_PLANT_NO_SAMPLE
        npy_int64 after = end;
#else
        npy_int64 after = end + 1;  /* a request that reached the end of what is known samples one more */
#endif
        OUT64(num_tokens, row) = have > after ? have : after;
        OUT64(num_computed, row) = end;
    }
    Py_RETURN_TRUE;
}

static PyObject *append_counts(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *blocks_obj, *rows_obj, *counts_obj;
    if (!PyArg_ParseTuple(args, "OOO", &blocks_obj, &rows_obj, &counts_obj))
        return NULL;
    ArrayView num_blocks, rows, counts;
    if (!array_view(blocks_obj, NPY_INT64, 1, &num_blocks) || !int64_view(rows_obj, &rows) || !int64_view(counts_obj, &counts))
        Py_RETURN_NOTIMPLEMENTED;
    const npy_intp n = rows.len;
    if (counts.len != n)
        Py_RETURN_NOTIMPLEMENTED;
    for (npy_intp i = 0; i < n; i++)
        if (AT(rows, i) < 0 || AT(rows, i) >= num_blocks.len)
            Py_RETURN_NOTIMPLEMENTED;
    PyObject *starts = new_int64(n);
    if (!starts)
        return NULL;
    /* Every count read before any is moved, then moved in order: the reference's gather, then its scatter. */
    for (npy_intp i = 0; i < n; i++)
        DATA64(starts)[i] = AT(num_blocks, AT(rows, i));
    for (npy_intp i = 0; i < n; i++) {
        OUT64(num_blocks, AT(rows, i)) = DATA64(starts)[i] + AT(counts, i);
#ifdef RUNNERCHECK_PLANT_STARTS_AFTER_APPEND
        DATA64(starts)[i] += AT(counts, i);
#endif
    }
    return starts;
}

enum { MAX_COLUMNS = 16 };  /* the per-row columns admit_row and swap_row write, at most */

/* The row's cell in each column, checked before any is written: 1 with the views filled, 0 when a column or value is
 * not one admit_row and swap_row take. */
static int row_cells(Py_ssize_t row, PyObject *columns, PyObject *values, ArrayView *views, Py_ssize_t room)
{
    const Py_ssize_t num_columns = PyTuple_GET_SIZE(columns);
    if (row < 0 || num_columns > room || PyTuple_GET_SIZE(values) != num_columns)
        return 0;
    for (Py_ssize_t c = 0; c < num_columns; c++) {
        long long value;
        if (!array_view(PyTuple_GET_ITEM(columns, c), NPY_INT64, 1, &views[c]) || row >= views[c].len
            || exact_int(PyTuple_GET_ITEM(values, c), &value) != EXACT_INT)
            return 0;
    }
    return 1;
}

static PyObject *admit_row(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *prefill_obj, *tokens, *columns, *values;
    Py_ssize_t row;
    ArrayView views[MAX_COLUMNS];
    if (!PyArg_ParseTuple(args, "OnOO!O!", &prefill_obj, &row, &tokens, &PyTuple_Type, &columns, &PyTuple_Type, &values))
        return NULL;
    if (!PyArray_Check(prefill_obj) || (!PyTuple_CheckExact(tokens) && !PyList_CheckExact(tokens)))
        Py_RETURN_NOTIMPLEMENTED;
    PyArrayObject *prefill = (PyArrayObject *)prefill_obj;
    if (PyArray_NDIM(prefill) != 2 || PyArray_TYPE(prefill) != NPY_INT32 || !PyArray_IS_C_CONTIGUOUS(prefill)
        || !PyArray_ISWRITEABLE(prefill) || !PyArray_ISNOTSWAPPED(prefill) || row < 0 || row >= PyArray_DIM(prefill, 0))
        Py_RETURN_NOTIMPLEMENTED;
    const Py_ssize_t n = Py_SIZE(tokens), num_columns = PyTuple_GET_SIZE(columns);
    if (n > PyArray_DIM(prefill, 1) || !row_cells(row, columns, values, views, MAX_COLUMNS))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long token;
        if (exact_int(items[i], &token) != EXACT_INT || token < NPY_MIN_INT32 || token > NPY_MAX_INT32)
            Py_RETURN_NOTIMPLEMENTED;
    }
    npy_int32 *out = (npy_int32 *)PyArray_GETPTR2(prefill, row, 0);
#ifdef RUNNERCHECK_PLANT_PREFILL_SHIFTED
    if (n < PyArray_DIM(prefill, 1))
        out++;
#endif
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = (npy_int32)PyLong_AsLongLong(items[i]);
    for (Py_ssize_t c = 0; c < num_columns; c++)
        OUT64(views[c], row) = PyLong_AsLongLong(PyTuple_GET_ITEM(values, c));
    Py_RETURN_TRUE;
}

static PyObject *swap_row(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *columns, *values;
    Py_ssize_t row;
    ArrayView views[MAX_COLUMNS];
    if (!PyArg_ParseTuple(args, "nO!O!", &row, &PyTuple_Type, &columns, &PyTuple_Type, &values))
        return NULL;
    if (!row_cells(row, columns, values, views, MAX_COLUMNS))
        Py_RETURN_NOTIMPLEMENTED;
    const Py_ssize_t num_columns = PyTuple_GET_SIZE(columns);
    PyObject *old = PyTuple_New(num_columns);
    if (!old)
        return NULL;
    for (Py_ssize_t c = 0; c < num_columns; c++) {
#ifdef RUNNERCHECK_PLANT_SWAP_RETURNS_NEW
        OUT64(views[c], row) = PyLong_AsLongLong(PyTuple_GET_ITEM(values, c));
#endif
        PyObject *held = PyLong_FromLongLong(OUT64(views[c], row));
        if (!held) {  /* nothing written yet */
            Py_DECREF(old);
            return NULL;
        }
        PyTuple_SET_ITEM(old, c, held);
    }
    for (Py_ssize_t c = 0; c < num_columns; c++)
        OUT64(views[c], row) = PyLong_AsLongLong(PyTuple_GET_ITEM(values, c));
    return old;
}

static PyMethodDef methods[] = {
    {"advance_decode", advance_decode, METH_VARARGS, "The mirror's advance past a decode step without drafts."},
    {"append_counts", append_counts, METH_VARARGS, "The block counts of rows before their appends, moved past them."},
    {"admit_row", admit_row, METH_VARARGS, "An admitted row's prefill tokens and per-row mirror values."},
    {"swap_row", swap_row, METH_VARARGS, "A row's per-row mirror values written, the old ones returned."},
    {NULL, NULL, 0, NULL},
};

RUNNERCHECK_MODULE("The request state table's writes, in C.")
