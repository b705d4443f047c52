/* The steady step's reading in C (`impl.native`): the twin of a Python method that stays the reference and
 * the fallback, called by that method's owner.  The general step's reading lives in general.c.
 *
 * read_steady   -- `impl.step_reader.read_steady_step` (its container and step-id checks, its "is this a
 *     steady step" test, and `_read_steady`), through `impl.step_reader.read_steady_native`.
 *     It decides the same verdict as the Python reader on the steps whose every inspected object
 *     has its exact expected type (the step a `SchedulerOutput`, its containers the exact types
 *     `impl.boundary.check_containers` names first, request ids `str`, counts, block ids and the step
 *     id `int`, block lists `tuple` or `list`): then no comparison can call user code or raise, and
 *     the verdict is a pure function of the values.  On any other step -- and on a bad step id, which
 *     the Python checks name -- it returns `NotImplemented` before deciding anything, and the Python
 *     reader decides.  It only reads.
 *
 *     read_steady(sched, SchedulerOutput, CachedRequests, last_step_id | None, last_ids | None, rows | None,
 *                 num_computed, num_blocks, num_tokens,
 *                 block_size, num_kv_blocks, max_model_len, max_num_batched_tokens)
 *       -> NotImplemented | None | (starts, ends, known, appends, max_end)
 *     None: not a steady step (no last decode batch, or something admitted, finished, preempted or drafted),
 *     or a rule fails.
 *     appends: None, or (rows, counts, block ids) of the requests that appended blocks, in batch order;
 *     max_end: the largest end (0 for no requests).
 *
 * Built by setup.py as the extension `runnercheck.impl.native._steady` (impl/native/__init__.py says when and how).
 * The tests' planted bugs are not switches in this file: each is a patch applied to a copy of it
 * (tests/impl/native_plants.py).
 * The general step's reading lives in general.c, the staged writes' packing in staging.c, the request state
 * table's writes in rows.c.
 */
#include "arrays.h"

#include <string.h>

/* Two exact strs: equal?  (Identity first, as a tuple comparison does.) */
static int same_id(PyObject *a, PyObject *b)
{
    return a == b || PyUnicode_Compare(a, b) == 0;
}

/* `_read_steady` on a step whose containers `read_steady` checked: the cached tuples, the scheduled dict. */
static PyObject *read_steady_batch(PyObject *cached_ids, PyObject *scheduled, PyObject *computed, PyObject *block_lists,
                                   PyObject *last_ids, PyObject *rows_obj, PyObject *num_computed_obj,
                                   PyObject *num_blocks_obj, PyObject *num_tokens_obj, long long block_size,
                                   long long num_kv_blocks, long long max_model_len, long long max_num_batched_tokens)
{
    if (!PyTuple_CheckExact(last_ids) || block_size <= 0 || max_model_len <= 0)
        Py_RETURN_NOTIMPLEMENTED;
    const long long max_blocks = blocks_per_request(max_model_len, block_size);
    ArrayView rows, mirror_computed, mirror_blocks, mirror_tokens;
    if (!int64_view(rows_obj, &rows) || !int64_view(num_computed_obj, &mirror_computed)
        || !int64_view(num_blocks_obj, &mirror_blocks) || !int64_view(num_tokens_obj, &mirror_tokens))
        Py_RETURN_NOTIMPLEMENTED;
    const Py_ssize_t n = PyTuple_GET_SIZE(last_ids);
    /* Shapes the Python reader would compare element by element before finding the difference. */
    if (n == 0 || rows.len != n || PyTuple_GET_SIZE(cached_ids) != n || PyTuple_GET_SIZE(computed) != n
        || PyTuple_GET_SIZE(block_lists) != n || PyDict_GET_SIZE(scheduled) != n)
        Py_RETURN_NOTIMPLEMENTED;
    const npy_intp num_rows = mirror_computed.len;
    if (mirror_blocks.len != num_rows || mirror_tokens.len != num_rows)
        Py_RETURN_NOTIMPLEMENTED;

    /* One pass: every object's exact type (any other: NotImplemented, whatever the values say), and
     * whether a value fails a rule (then None).  Appended blocks are counted for the second pass. */
    int mismatch = 0;
    Py_ssize_t num_appending = 0, num_appended = 0, pos = 0;
    PyObject *key, *value;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rid = PyTuple_GET_ITEM(last_ids, i), *cached_rid = PyTuple_GET_ITEM(cached_ids, i);
        if (!PyDict_Next(scheduled, &pos, &key, &value))
            Py_RETURN_NOTIMPLEMENTED;  /* the dict changed size: not a state the reader should see */
        if (!PyUnicode_CheckExact(rid) || !PyUnicode_CheckExact(cached_rid) || !PyUnicode_CheckExact(key))
            Py_RETURN_NOTIMPLEMENTED;
        if (!same_id(cached_rid, rid) || !same_id(key, rid))
            mismatch = 1;
        long long count, claimed;
        int kind = exact_int(value, &count);
        if (!kind)
            Py_RETURN_NOTIMPLEMENTED;
        if (kind != EXACT_INT || count != 1)
            mismatch = 1;
        npy_int64 row = AT(rows, i);
        if (row < 0 || row >= num_rows)
            Py_RETURN_NOTIMPLEMENTED;
        kind = exact_int(PyTuple_GET_ITEM(computed, i), &claimed);
        if (!kind)
            Py_RETURN_NOTIMPLEMENTED;
        if (kind != EXACT_INT || claimed != AT(mirror_computed, row))
            mismatch = 1;
        PyObject *blocks = PyTuple_GET_ITEM(block_lists, i);
        Py_ssize_t num_new;
        if (PyTuple_CheckExact(blocks))
            num_new = PyTuple_GET_SIZE(blocks);
        else if (PyList_CheckExact(blocks)) {
            num_new = PyList_GET_SIZE(blocks);
            if (num_new == 0)
                mismatch = 1;  /* an empty list is neither ``()`` nor an append */
        }
        else
            Py_RETURN_NOTIMPLEMENTED;
        if (num_new) {
            PyObject **items = PySequence_Fast_ITEMS(blocks);
            for (Py_ssize_t j = 0; j < num_new; j++) {
                long long block;
                kind = exact_int(items[j], &block);
                if (!kind)
                    Py_RETURN_NOTIMPLEMENTED;
                if (kind != EXACT_INT || block < 0 || block >= num_kv_blocks)
                    mismatch = 1;
            }
            num_appending++;
            num_appended += num_new;
        }
    }
    if (mismatch || n > max_num_batched_tokens)
        Py_RETURN_NONE;

    /* Second pass: the arrays, and the bounds after this step's appends. */
    PyObject *starts = new_int64(n), *ends = new_int64(n), *known = new_int64(n);
    PyObject *append_rows = NULL, *append_counts = NULL, *append_ids = NULL, *appends = NULL;
    if (!starts || !ends || !known)
        goto fail;
    if (num_appending) {
        append_rows = new_int64(num_appending);
        append_counts = new_int64(num_appending);
        append_ids = new_int64(num_appended);
        if (!append_rows || !append_counts || !append_ids)
            goto fail;
    }
    npy_int64 *starts_out = DATA64(starts), *ends_out = DATA64(ends), *known_out = DATA64(known);
    npy_int64 max_end = 0;
    Py_ssize_t a = 0, b = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        npy_int64 row = AT(rows, i), start = AT(mirror_computed, row), blocks_held = AT(mirror_blocks, row);
        PyObject *blocks = PyTuple_GET_ITEM(block_lists, i);
        Py_ssize_t num_new = Py_SIZE(blocks);
        if (num_new) {
            blocks_held += num_new;
            if (blocks_held > max_blocks) {
                mismatch = 1;
                break;
            }
            DATA64(append_rows)[a] = row;
            DATA64(append_counts)[a++] = num_new;
            PyObject **items = PySequence_Fast_ITEMS(blocks);
            for (Py_ssize_t j = 0; j < num_new; j++)
                DATA64(append_ids)[b++] = PyLong_AsLongLong(items[j]);
        }
        /* Past what the blocks hold, or past the model's length (ends = starts + 1). */
        if (start >= blocks_held * block_size || start + 1 > max_model_len) {
            mismatch = 1;
            break;
        }
        starts_out[i] = start;
        ends_out[i] = start + 1;
        if (start + 1 > max_end)
            max_end = start + 1;
        known_out[i] = AT(mirror_tokens, row);
    }
    if (mismatch) {
        Py_DECREF(starts);
        Py_DECREF(ends);
        Py_DECREF(known);
        Py_XDECREF(append_rows);
        Py_XDECREF(append_counts);
        Py_XDECREF(append_ids);
        Py_RETURN_NONE;
    }
    if (num_appending) {
        appends = PyTuple_Pack(3, append_rows, append_counts, append_ids);
        if (!appends)
            goto fail;
        Py_DECREF(append_rows);
        Py_DECREF(append_counts);
        Py_DECREF(append_ids);
    }
    else {
        appends = Py_NewRef(Py_None);
    }
    PyObject *result = Py_BuildValue("(OOOOL)", starts, ends, known, appends, (long long)max_end);
    Py_DECREF(starts);
    Py_DECREF(ends);
    Py_DECREF(known);
    Py_DECREF(appends);
    return result;

fail:
    Py_XDECREF(starts);
    Py_XDECREF(ends);
    Py_XDECREF(known);
    Py_XDECREF(append_rows);
    Py_XDECREF(append_counts);
    Py_XDECREF(append_ids);
    return NULL;
}

static PyObject *read_steady(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *sched, *sched_type, *cached_type, *last_step_id, *last_ids;
    PyObject *rows_obj, *num_computed_obj, *num_blocks_obj, *num_tokens_obj;
    long long block_size, num_kv_blocks, max_model_len, max_num_batched_tokens;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOLLLL", &sched, &sched_type, &cached_type, &last_step_id, &last_ids, &rows_obj,
                          &num_computed_obj, &num_blocks_obj, &num_tokens_obj, &block_size, &num_kv_blocks, &max_model_len,
                          &max_num_batched_tokens))
        return NULL;
    PyObject *fields[NUM_STEP_FIELDS] = {NULL}, *cached[3] = {NULL}, *result = NULL;
    /* `check_containers`' exact types, `check_step_id`'s rule: anything else is the Python checks' to name. */
    int changes;
    if (!read_step_fields(sched, sched_type, cached_type, last_step_id, fields, cached, &changes))
        goto decline;
    const int steady = !changes;  /* admitted, finished, preempted or drafted: not a steady step */
    if (!steady || last_ids == Py_None)  /* nothing to repeat: the checks alone */
        result = Py_NewRef(Py_None);
    else
        result = read_steady_batch(cached[CACHED_IDS], fields[STEP_SCHEDULED], cached[CACHED_COMPUTED],
                                   cached[CACHED_BLOCKS], last_ids, rows_obj, num_computed_obj,
                                   num_blocks_obj, num_tokens_obj, block_size, num_kv_blocks, max_model_len,
                                   max_num_batched_tokens);
    release_step_fields(fields, cached);
    return result;
decline:
    release_step_fields(fields, cached);
    Py_RETURN_NOTIMPLEMENTED;
}


static PyMethodDef methods[] = {
    {"read_steady", read_steady, METH_VARARGS, "The steady decode step's reader (see the module's source header)."},
    {NULL, NULL, 0, NULL},
};

RUNNERCHECK_MODULE("The steady step's reading, in C.")
