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
 * admit_request -- the rest of `impl.state.RequestStateTable.admit` for one request and the row it took: what
 *     `_admit_reference` does (the prefill tokens and the mirror's row as admit_row writes them, the row's
 *     `RowInfo`, ``_prefilling``, ``req_to_row``), reading the request itself.
 *     admit_request(targets, req, seed, row, generation) -> (row-state values, asks logprobs, asks prompt logprobs),
 *     or NotImplemented before writing anything.  ``targets`` the table's (NewRequest type, prefill token array,
 *     mirror columns in `_admitted_columns` order, ``_prefilling``, ``rows``, RowInfo type, ``req_to_row``);
 *     ``req`` an exact NewRequest whose id is an exact str, prompt (not empty), outputs and blocks exact tuples,
 *     tokens exact ints within int32, prefix-cache hit an exact int and logprob asks None or exact ints; ``seed``
 *     and ``generation`` exact ints.  The row-state values are a new list: the row's computed count (the hit),
 *     token count, prompt length, prefill length and last token, as `admit` stages them.
 *
 * admit_staged -- `impl.state.RequestStateTable.admit_staged`: admit_request with the rest of a runner's admission in
 *     the same call, each written as its owner's method writes it: the request's seed (its own, else
 *     ``derive(base_seed, req_id)``: impl/native/seeds.c's derived_seed), noted in ``seeds``; the row-state values
 *     and the block list as `StagedWriteTensor.stage_list` stages them (the tensor joining its group's dirty list when
 *     it had nothing pending); the sampling record and the row's pending admission as `SamplingState.add_request`
 *     with ``checked=True`` writes them.
 *     admit_staged(targets, writers, req, base_seed, derive, row, generation, seeds) -> admit_request's result, or
 *     NotImplemented before writing anything: for what admit_request declines, a seed it cannot read, a tensor
 *     that would take another staging path (deferred writes, cells pending, a list too long for its row), a
 *     sampling parameter that is not an exact float or int (an int field: an exact int).  ``writers`` (row-state
 *     tensor, block-table tensor, sampling state, its admission records, the sampling fields as (name, is int)
 *     pairs from the interface's table): `impl.admission.AdmissionWriters.targets`.
 *
 * end_prefill_reads -- `impl.state.RequestStateTable._end_prefill_reads`: the rows of ``prefilling`` (row -> prefill
 *     length) whose computed count less their unconfirmed drafts reaches that length leave it, each noting ``event`` as
 *     its last reader in ``reads_over``.
 *     end_prefill_reads(prefilling, num_computed, unconfirmed_drafts, reads_over, event) -> True, or NotImplemented
 *     before writing anything (a row or length that is not an exact int, a row out of range, more than 16 rows ended).
 *
 * release_request -- `impl.state.RequestStateTable.release` but its counts: what `_release_reference` does (the id's
 *     look-up and record dropped, the mirror's row freed as swap_row frees it, the row's last reading step noted when
 *     its prefill may still be read, the row appended to the free list).
 *     release_request(targets, req_id, newest_marker, history_reads) -> (row, held logprobs, held prompt logprobs),
 *     or NotImplemented before writing anything (an id that holds no row among them).  ``targets`` the table's
 *     (``req_to_row``, ``rows``, `_released_columns`, `_RELEASED_VALUES`, ``_prefilling``, ``_reads_over``, the free
 *     list's bound ``append``).
 *
 * Built by setup.py as the extension `runnercheck.impl.native._rows` (impl/native/__init__.py says when and how).
 * The tests' planted bugs are not switches in this file: each is a patch applied to a copy of it
 * (tests/impl/native_plants.py).
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
        npy_int64 after = end + 1;  /* a request that reached the end of what is known samples one more */
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

/* Every one of the ``n`` tokens at ``items`` an exact int within int32. */
static int int32_tokens(PyObject *const *items, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        long long token;
        if (exact_int(items[i], &token) != EXACT_INT || token < NPY_MIN_INT32 || token > NPY_MAX_INT32)
            return 0;
    }
    return 1;
}

/* Where row ``row`` of the pinned token table ``prefill`` starts, to take ``n`` tokens; NULL when ``prefill`` is not a
 * C-contiguous, writeable 2-D int32 array in native byte order with that row and room for them.  Writes nothing. */
static npy_int32 *prefill_row(PyObject *prefill_obj, Py_ssize_t row, Py_ssize_t n)
{
    if (!PyArray_Check(prefill_obj))
        return NULL;
    PyArrayObject *prefill = (PyArrayObject *)prefill_obj;
    if (PyArray_NDIM(prefill) != 2 || PyArray_TYPE(prefill) != NPY_INT32 || !PyArray_IS_C_CONTIGUOUS(prefill)
        || !PyArray_ISWRITEABLE(prefill) || !PyArray_ISNOTSWAPPED(prefill) || row < 0 || row >= PyArray_DIM(prefill, 0)
        || n > PyArray_DIM(prefill, 1))
        return NULL;
    npy_int32 *out = (npy_int32 *)PyArray_GETPTR2(prefill, row, 0);
    return out;
}

static PyObject *admit_row(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *prefill_obj, *tokens, *columns, *values;
    Py_ssize_t row;
    ArrayView views[MAX_COLUMNS];
    if (!PyArg_ParseTuple(args, "OnOO!O!", &prefill_obj, &row, &tokens, &PyTuple_Type, &columns, &PyTuple_Type, &values))
        return NULL;
    if (!PyTuple_CheckExact(tokens) && !PyList_CheckExact(tokens))
        Py_RETURN_NOTIMPLEMENTED;
    const Py_ssize_t n = Py_SIZE(tokens), num_columns = PyTuple_GET_SIZE(columns);
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    npy_int32 *out = prefill_row(prefill_obj, row, n);
    if (out == NULL || !row_cells(row, columns, values, views, MAX_COLUMNS) || !int32_tokens(items, n))
        Py_RETURN_NOTIMPLEMENTED;
    for (Py_ssize_t i = 0; i < n; i++)
        out[i] = (npy_int32)PyLong_AsLongLong(items[i]);
    for (Py_ssize_t c = 0; c < num_columns; c++)
        OUT64(views[c], row) = PyLong_AsLongLong(PyTuple_GET_ITEM(values, c));
    Py_RETURN_TRUE;
}

/* Each column's cell of ``row`` (views checked by row_cells) given its value from ``values``, the value it held
 * read into ``held``: swap_row's and release_request's one swap. */
static void swap_cells(ArrayView *views, PyObject *values, Py_ssize_t row, long long *held)
{
    for (Py_ssize_t c = 0; c < PyTuple_GET_SIZE(values); c++) {
        held[c] = OUT64(views[c], row);
        OUT64(views[c], row) = PyLong_AsLongLong(PyTuple_GET_ITEM(values, c));
    }
}

static PyObject *swap_row(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *columns, *values;
    Py_ssize_t row;
    ArrayView views[MAX_COLUMNS];
    long long held[MAX_COLUMNS];
    if (!PyArg_ParseTuple(args, "nO!O!", &row, &PyTuple_Type, &columns, &PyTuple_Type, &values))
        return NULL;
    if (!row_cells(row, columns, values, views, MAX_COLUMNS))
        Py_RETURN_NOTIMPLEMENTED;
    const Py_ssize_t num_columns = PyTuple_GET_SIZE(columns);
    PyObject *old = PyTuple_New(num_columns);
    if (!old)
        return NULL;
    swap_cells(views, values, row, held);
    for (Py_ssize_t c = 0; c < num_columns; c++) {
        PyObject *value = PyLong_FromLongLong(held[c]);
        if (!value) {  /* out of memory: the row as it was */
            for (Py_ssize_t k = 0; k < num_columns; k++)
                OUT64(views[k], row) = held[k];
            Py_DECREF(old);
            return NULL;
        }
        PyTuple_SET_ITEM(old, c, value);
    }
    return old;
}

/* An optional logprob ask of `SamplingParams`: -1 for None, else the exact int >= 0; 0 (decline) for anything else. */
static int logprob_ask(PyObject *params, const char *name, long long *ask)
{
    PyObject *value = attribute(params, name);
    if (value == NULL)
        return 0;
    int ok = 1;
    if (value == Py_None)
        *ask = -1;
    else
        ok = exact_int(value, ask) == EXACT_INT && *ask >= 0;
    Py_DECREF(value);
    return ok;
}

enum { ADMIT_TYPE, ADMIT_PREFILL, ADMIT_COLUMNS, ADMIT_PREFILLING, ADMIT_ROWS, ADMIT_ROW_INFO, ADMIT_REQ_TO_ROW,
       NUM_ADMIT_TARGETS };
enum { NUM_ADMITTED_COLUMNS = 8 };  /* `_admitted_columns`: tokens, computed, blocks, unconfirmed, prompt, two asks, generation */

/* The rest of an admission, written after the table's look-ups are in place and before its infallible writes:
 * admit_staged's stagings.  ``prepare`` reads and checks (0: decline, -1: error; nothing written), ``commit`` writes
 * (-1: out of memory, with its own writes undone), ``release`` drops what ``prepare`` made. */
typedef struct Also {
    int (*prepare)(struct Also *also, PyObject *params, PyObject *prompt, PyObject *blocks, PyObject *outputs, Py_ssize_t row);
    int (*commit)(struct Also *also, PyObject *staged);
    void (*release)(struct Also *also);
} Also;

/* admit_request's body, with ``also`` (may be NULL) prepared before and committed inside its writes. */
static PyObject *admit_core(PyObject *targets, PyObject *req, PyObject *seed, Py_ssize_t row, PyObject *generation_obj,
                            Also *also)
{
    if (PyTuple_GET_SIZE(targets) != NUM_ADMIT_TARGETS || (PyObject *)Py_TYPE(req) != PyTuple_GET_ITEM(targets, ADMIT_TYPE))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *prefill_obj = PyTuple_GET_ITEM(targets, ADMIT_PREFILL), *columns = PyTuple_GET_ITEM(targets, ADMIT_COLUMNS);
    PyObject *prefilling = PyTuple_GET_ITEM(targets, ADMIT_PREFILLING), *rows = PyTuple_GET_ITEM(targets, ADMIT_ROWS);
    PyObject *req_to_row = PyTuple_GET_ITEM(targets, ADMIT_REQ_TO_ROW);
    long long seed_value, generation;
    if (!PyTuple_CheckExact(columns) || PyTuple_GET_SIZE(columns) != NUM_ADMITTED_COLUMNS
        || !PyDict_CheckExact(prefilling) || !PyList_CheckExact(rows) || !PyDict_CheckExact(req_to_row)
        || exact_int(seed, &seed_value) != EXACT_INT || exact_int(generation_obj, &generation) != EXACT_INT
        || row < 0 || row >= PyList_GET_SIZE(rows))
        Py_RETURN_NOTIMPLEMENTED;
    ArrayView views[NUM_ADMITTED_COLUMNS];
    for (Py_ssize_t c = 0; c < NUM_ADMITTED_COLUMNS; c++)
        if (!array_view(PyTuple_GET_ITEM(columns, c), NPY_INT64, 1, &views[c]) || row >= views[c].len)
            Py_RETURN_NOTIMPLEMENTED;

    PyObject *req_id = NULL, *prompt = NULL, *outputs = NULL, *blocks = NULL, *hit_obj = NULL, *params = NULL;
    PyObject *info = NULL, *staged = NULL, *row_obj = NULL, *prefill_len_obj = NULL, *result = NULL;
    long long hit, num_logprobs, prompt_logprobs;
    if (!(req_id = attribute(req, "req_id")) || !PyUnicode_CheckExact(req_id)
        || !(prompt = attribute(req, "prompt_token_ids")) || !PyTuple_CheckExact(prompt) || PyTuple_GET_SIZE(prompt) == 0
        || !(outputs = attribute(req, "output_token_ids")) || !PyTuple_CheckExact(outputs)
        || !(blocks = attribute(req, "block_ids")) || !PyTuple_CheckExact(blocks)
        || !(hit_obj = attribute(req, "num_computed_tokens")) || exact_int(hit_obj, &hit) != EXACT_INT
        || !(params = attribute(req, "sampling_params")) || !logprob_ask(params, "logprobs", &num_logprobs)
        || !logprob_ask(params, "prompt_logprobs", &prompt_logprobs))
        goto decline;
    const Py_ssize_t prompt_len = PyTuple_GET_SIZE(prompt), num_outputs = PyTuple_GET_SIZE(outputs);
    const Py_ssize_t prefill_len = prompt_len + num_outputs;
    npy_int32 *out = prefill_row(prefill_obj, row, prefill_len);
    if (out == NULL || !int32_tokens(PySequence_Fast_ITEMS(prompt), prompt_len)
        || !int32_tokens(PySequence_Fast_ITEMS(outputs), num_outputs))
        goto decline;
    if (also != NULL) {
        const int prepared = also->prepare(also, params, prompt, blocks, outputs, row);
        if (prepared <= 0)
            goto decline;  /* declined, or an error set (returned as it is) */
    }
    const int resumed = num_outputs > 0;
    if (resumed)
        prompt_logprobs = -1;  /* a resumed request's prompt logprobs were reported before its preemption */
    PyObject *last = resumed ? PyTuple_GET_ITEM(outputs, num_outputs - 1) : PyTuple_GET_ITEM(prompt, prompt_len - 1);
    PyObject *info_generation = Py_NewRef(generation_obj);
    /* Everything that can fail is made before anything is written. */
    if (!info_generation || !(row_obj = PyLong_FromSsize_t(row)) || !(prefill_len_obj = PyLong_FromSsize_t(prefill_len)))
        goto fail_generation;
    PyObject *info_args[] = {req_id, info_generation, params, seed, NULL, prefill_len_obj, resumed ? Py_True : Py_False};
    if (!(info_args[4] = PyLong_FromSsize_t(prompt_len)))
        goto fail_generation;
    info = PyObject_Vectorcall(PyTuple_GET_ITEM(targets, ADMIT_ROW_INFO), info_args, 7, NULL);
    staged = info ? Py_BuildValue("[LnnnO]", hit, prefill_len, prompt_len, prefill_len, last) : NULL;
    Py_DECREF(info_args[4]);
    if (!staged)
        goto fail_generation;
    result = Py_BuildValue("(ONN)", staged, PyBool_FromLong(num_logprobs >= 0), PyBool_FromLong(prompt_logprobs >= 0));
    if (!result)
        goto fail_generation;
    if (PyDict_SetItem(prefilling, row_obj, prefill_len_obj) != 0 || PyDict_SetItem(req_to_row, req_id, row_obj) != 0) {
        PyDict_DelItem(prefilling, row_obj);  /* a failed insert (out of memory) leaves the table as it was */
        PyErr_Clear();
        PyErr_NoMemory();
        Py_CLEAR(result);
        goto fail_generation;
    }
    if (also != NULL && also->commit(also, staged) != 0) {  /* out of memory: the look-ups undone, nothing else written */
        PyDict_DelItem(prefilling, row_obj);
        PyDict_DelItem(req_to_row, req_id);
        Py_CLEAR(result);
        goto fail_generation;
    }
    for (Py_ssize_t i = 0; i < prompt_len; i++)
        out[i] = (npy_int32)PyLong_AsLongLong(PyTuple_GET_ITEM(prompt, i));
    for (Py_ssize_t i = 0; i < num_outputs; i++)
        out[prompt_len + i] = (npy_int32)PyLong_AsLongLong(PyTuple_GET_ITEM(outputs, i));
    const long long values[NUM_ADMITTED_COLUMNS] = {prefill_len, hit, PyTuple_GET_SIZE(blocks), 0, prompt_len,
                                                     num_logprobs, prompt_logprobs, generation};
    for (Py_ssize_t c = 0; c < NUM_ADMITTED_COLUMNS; c++)
        OUT64(views[c], row) = values[c];
    PyList_SetItem(rows, row, Py_NewRef(info));  /* steals the new reference; drops the row's old entry */
fail_generation:
    Py_XDECREF(info_generation);
    Py_XDECREF(info);
    Py_XDECREF(staged);
    Py_XDECREF(row_obj);
    Py_XDECREF(prefill_len_obj);
decline:
    if (also != NULL)
        also->release(also);
    Py_XDECREF(req_id);
    Py_XDECREF(prompt);
    Py_XDECREF(outputs);
    Py_XDECREF(blocks);
    Py_XDECREF(hit_obj);
    Py_XDECREF(params);
    if (result == NULL && !PyErr_Occurred())
        result = Py_NewRef(Py_NotImplemented);
    return result;
}

static PyObject *admit_request(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *targets, *req, *seed, *generation_obj;
    Py_ssize_t row;
    if (!PyArg_ParseTuple(args, "O!OOnO", &PyTuple_Type, &targets, &req, &seed, &row, &generation_obj))
        return NULL;
    return admit_core(targets, req, seed, row, generation_obj, NULL);
}

/* A staged-write tensor's fast path of `StagedWriteTensor.stage_list` for ``n`` values into ``row``: its pending and
 * ragged lists, and the group's dirty list, which the tensor joins when it has nothing pending.  ``target`` is
 * (tensor, its pending list, its ragged list, its rows, its columns), ``dirty`` its group's list; 0 when the tensor
 * would take another path (deferred admissions, cells pending, a row or length out of range) or a target is not one
 * this reads. */
typedef struct {
    PyObject *pending, *ragged, *dirty, *tensor;
    int joins;
} StagedList;

enum { LIST_TENSOR, LIST_PENDING, LIST_RAGGED, LIST_ROWS, LIST_COLS, NUM_LIST_TARGETS };

static int staged_list(PyObject *target, PyObject *dirty, Py_ssize_t row, Py_ssize_t n, StagedList *out)
{
    if (!PyTuple_CheckExact(target) || PyTuple_GET_SIZE(target) != NUM_LIST_TARGETS || !PyList_CheckExact(dirty))
        return 0;
    out->tensor = PyTuple_GET_ITEM(target, LIST_TENSOR);
    out->pending = PyTuple_GET_ITEM(target, LIST_PENDING);
    out->ragged = PyTuple_GET_ITEM(target, LIST_RAGGED);
    out->dirty = dirty;
    long long num_rows, num_cols;
    if (!PyList_CheckExact(out->pending) || !PyList_CheckExact(out->ragged)
        || exact_int(PyTuple_GET_ITEM(target, LIST_ROWS), &num_rows) != EXACT_INT || row >= num_rows
        || exact_int(PyTuple_GET_ITEM(target, LIST_COLS), &num_cols) != EXACT_INT || n > num_cols || n <= 0)
        return 0;
    PyObject *deferred = attribute(out->tensor, "_deferred"), *cells = attribute(out->tensor, "_has_cells");
    const int ok = deferred == Py_False && cells == Py_False;
    Py_XDECREF(deferred);
    Py_XDECREF(cells);
    out->joins = PyList_GET_SIZE(out->pending) == 0 && PyList_GET_SIZE(out->ragged) == 0;
    return ok;
}

/* The diff (row, 0, values) appended, the tensor joining the dirty list first when it must: 0, or -1 (out of memory)
 * with nothing appended. */
static int staged_list_append(StagedList *list, PyObject *row_obj, PyObject *values)
{
    PyObject *zero = PyLong_FromLong(0);
    PyObject *diff = zero ? PyTuple_Pack(3, row_obj, zero, values) : NULL;
    Py_XDECREF(zero);
    if (!diff)
        return -1;
    if (list->joins && PyList_Append(list->dirty, list->tensor) != 0) {
        Py_DECREF(diff);
        return -1;
    }
    const int failed = PyList_Append(list->pending, diff);
    Py_DECREF(diff);
    if (failed && list->joins)
        PyList_SetSlice(list->dirty, PyList_GET_SIZE(list->dirty) - 1, PyList_GET_SIZE(list->dirty), NULL);
    return failed ? -1 : 0;
}

/* One of the above undone (the last diff popped, the tensor out of the dirty list if it joined). */
static void staged_list_undo(StagedList *list)
{
    PyList_SetSlice(list->pending, PyList_GET_SIZE(list->pending) - 1, PyList_GET_SIZE(list->pending), NULL);
    if (list->joins)
        PyList_SetSlice(list->dirty, PyList_GET_SIZE(list->dirty) - 1, PyList_GET_SIZE(list->dirty), NULL);
}

enum { NUM_ROW_STATE_VALUES = 5 };  /* the row-state values an admission stages: computed, tokens, prompt, prefill, last */
enum { STAGED_ROW_STATE, STAGED_BLOCKS, STAGED_DIRTY, STAGED_SAMPLING, STAGED_RECORDS, STAGED_FIELDS,
       NUM_STAGED_TARGETS };
/* The sampling fields come from the interface's table, handed over once in the writers (`STAGED_FIELDS`: a tuple of
 * (name, is int) pairs, `impl.admission.ADMISSION_FIELDS`), so nothing here lists them: `SamplingState.add_request`'s
 * values are those fields in that order, each `float(x)` or `int(x)`, then the seed. */
enum { MAX_SAMPLING_FIELDS = 15 };

typedef struct {
    Also base;
    PyObject *writers, *seed, *seeds, *req_id;
    PyObject *row_obj, *values, *prompt, *blocks, *outputs, *records, *pending;
    StagedList row_state, block_list;
    int has_blocks;
} Staged;

/* A parameter as `float(x)` gives it, for an exact float or int (NULL, no error set: declined). */
static PyObject *exact_float(PyObject *value)
{
    if (PyFloat_CheckExact(value))
        return Py_NewRef(value);
    if (!PyLong_CheckExact(value))
        return NULL;
    const double converted = PyLong_AsDouble(value);
    if (converted == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();  /* too big for a float: the reference raises it */
        return NULL;
    }
    return PyFloat_FromDouble(converted);
}

static int staged_prepare(Also *base, PyObject *params, PyObject *prompt, PyObject *blocks, PyObject *outputs, Py_ssize_t row)
{
    Staged *st = (Staged *)base;
    st->records = PyTuple_GET_ITEM(st->writers, STAGED_RECORDS);
    if (!PyDict_CheckExact(st->records) || !(st->pending = attribute(PyTuple_GET_ITEM(st->writers, STAGED_SAMPLING),
                                                                     "_pending_admissions"))
        || !PyDict_CheckExact(st->pending))
        return 0;
    st->prompt = Py_NewRef(prompt);
    st->has_blocks = PyTuple_GET_SIZE(blocks) > 0;
    PyObject *dirty = PyTuple_GET_ITEM(st->writers, STAGED_DIRTY);
    if (!staged_list(PyTuple_GET_ITEM(st->writers, STAGED_ROW_STATE), dirty, row, NUM_ROW_STATE_VALUES, &st->row_state)
        || (st->has_blocks && !staged_list(PyTuple_GET_ITEM(st->writers, STAGED_BLOCKS), dirty, row,
                                           PyTuple_GET_SIZE(blocks), &st->block_list)))
        return 0;
    PyObject *spec = PyTuple_GET_ITEM(st->writers, STAGED_FIELDS);
    if (!PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) > MAX_SAMPLING_FIELDS)
        return 0;
    const Py_ssize_t num_fields = PyTuple_GET_SIZE(spec);
    if (!(st->values = PyTuple_New(num_fields + 1)))
        return -1;
    for (Py_ssize_t k = 0; k < num_fields; k++) {
        PyObject *pair = PyTuple_GET_ITEM(spec, k);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0)))
            return 0;
        PyObject *field = PyObject_GetAttr(params, PyTuple_GET_ITEM(pair, 0));
        if (field == NULL) {
            PyErr_Clear();
            return 0;
        }
        long long as_int;
        PyObject *value = PyTuple_GET_ITEM(pair, 1) == Py_True
                              ? (exact_int(field, &as_int) == EXACT_INT ? Py_NewRef(field) : NULL) : exact_float(field);
        Py_DECREF(field);
        if (value == NULL)
            return PyErr_Occurred() ? -1 : 0;
        PyTuple_SET_ITEM(st->values, k, value);
    }
    PyTuple_SET_ITEM(st->values, num_fields, Py_NewRef(st->seed));
    if (!(st->row_obj = PyLong_FromSsize_t(row)) || !(st->outputs = PySequence_List(outputs))
        || (st->has_blocks && !(st->blocks = PySequence_List(blocks))))
        return -1;
    return 1;
}

static int staged_commit(Also *base, PyObject *staged)
{
    Staged *st = (Staged *)base;
    PyObject *record = PyTuple_Pack(2, st->values, st->prompt);
    if (!record)
        return -1;
    int step = 0;  /* the writes done, undone in reverse order on a failure */
    if (staged_list_append(&st->row_state, st->row_obj, staged) == 0 && ++step
        && (!st->has_blocks || staged_list_append(&st->block_list, st->row_obj, st->blocks) == 0) && ++step
        && PyDict_SetItem(st->records, st->row_obj, record) == 0 && ++step
        && PyDict_SetItem(st->pending, st->row_obj, st->outputs) == 0 && ++step
        && PyDict_SetItem(st->seeds, st->req_id, st->seed) == 0) {
        Py_DECREF(record);
        return 0;
    }
    Py_DECREF(record);
    if (step >= 4)
        PyDict_DelItem(st->pending, st->row_obj);
    if (step >= 3)
        PyDict_DelItem(st->records, st->row_obj);
    if (step >= 2 && st->has_blocks)
        staged_list_undo(&st->block_list);
    if (step >= 1)
        staged_list_undo(&st->row_state);
    PyErr_Clear();
    PyErr_NoMemory();
    return -1;
}

static void staged_release(Also *base)
{
    Staged *st = (Staged *)base;
    Py_CLEAR(st->row_obj);
    Py_CLEAR(st->values);
    Py_CLEAR(st->prompt);
    Py_CLEAR(st->blocks);
    Py_CLEAR(st->outputs);
    Py_CLEAR(st->pending);
}

/* The request's seed: its own (an exact int), else derived from the base seed by the given ``derived_seed``;
 * NULL with no error set when neither can be read here (declined). */
static PyObject *admission_seed(PyObject *params, PyObject *req_id, PyObject *base_seed, PyObject *derive)
{
    PyObject *own = attribute(params, "seed");
    if (own == NULL)
        return NULL;
    long long value;
    if (own != Py_None) {
        if (exact_int(own, &value) == EXACT_INT)
            return own;
        Py_DECREF(own);
        return NULL;
    }
    Py_DECREF(own);
    PyObject *call_args[] = {base_seed, req_id};
    PyObject *seed = PyObject_Vectorcall(derive, call_args, 2, NULL);
    if (seed == NULL || exact_int(seed, &value) != EXACT_INT) {
        Py_XDECREF(seed);
        PyErr_Clear();
        return NULL;
    }
    return seed;
}

static PyObject *admit_staged(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *targets, *writers, *req, *base_seed, *derive, *generation_obj, *seeds;
    Py_ssize_t row;
    if (!PyArg_ParseTuple(args, "O!O!OOOnOO!", &PyTuple_Type, &targets, &PyTuple_Type, &writers, &req, &base_seed,
                          &derive, &row, &generation_obj, &PyDict_Type, &seeds))
        return NULL;
    if (PyTuple_GET_SIZE(writers) != NUM_STAGED_TARGETS || (PyObject *)Py_TYPE(req) != PyTuple_GET_ITEM(targets, ADMIT_TYPE)
        || !PyDict_CheckExact(seeds))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *params = attribute(req, "sampling_params"), *req_id = attribute(req, "req_id");
    PyObject *seed = params && req_id && PyUnicode_CheckExact(req_id) ? admission_seed(params, req_id, base_seed, derive) : NULL;
    Py_XDECREF(params);
    if (seed == NULL) {
        Py_XDECREF(req_id);
        Py_RETURN_NOTIMPLEMENTED;
    }
    Staged staged = {.base = {staged_prepare, staged_commit, staged_release}, .writers = writers, .seed = seed,
                     .seeds = seeds, .req_id = req_id};
    PyObject *result = admit_core(targets, req, seed, row, generation_obj, &staged.base);
    Py_DECREF(seed);
    Py_DECREF(req_id);
    return result;
}

enum { RELEASE_REQ_TO_ROW, RELEASE_ROWS, RELEASE_COLUMNS, RELEASE_VALUES, RELEASE_PREFILLING, RELEASE_READS_OVER,
       RELEASE_FREE, NUM_RELEASE_TARGETS };

static PyObject *release_request(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *targets, *req_id, *newest, *history_reads;
    ArrayView views[MAX_COLUMNS];
    if (!PyArg_ParseTuple(args, "O!OOO", &PyTuple_Type, &targets, &req_id, &newest, &history_reads))
        return NULL;
    if (PyTuple_GET_SIZE(targets) != NUM_RELEASE_TARGETS || !PyUnicode_CheckExact(req_id) || !PyBool_Check(history_reads))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *req_to_row = PyTuple_GET_ITEM(targets, RELEASE_REQ_TO_ROW), *rows = PyTuple_GET_ITEM(targets, RELEASE_ROWS);
    PyObject *columns = PyTuple_GET_ITEM(targets, RELEASE_COLUMNS), *values = PyTuple_GET_ITEM(targets, RELEASE_VALUES);
    PyObject *prefilling = PyTuple_GET_ITEM(targets, RELEASE_PREFILLING);
    PyObject *reads_over = PyTuple_GET_ITEM(targets, RELEASE_READS_OVER), *append_free = PyTuple_GET_ITEM(targets, RELEASE_FREE);
    if (!PyDict_CheckExact(req_to_row) || !PyList_CheckExact(rows) || !PyTuple_CheckExact(columns)
        || !PyTuple_CheckExact(values) || PyTuple_GET_SIZE(columns) != 3 || !PyDict_CheckExact(prefilling)
        || !PyList_CheckExact(reads_over))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *row_obj = PyDict_GetItemWithError(req_to_row, req_id);  /* borrowed */
    long long row;
    if (row_obj == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NOTIMPLEMENTED;  /* no row: the reference names the misuse */
    }
    if (exact_int(row_obj, &row) != EXACT_INT || row >= PyList_GET_SIZE(rows) || row >= PyList_GET_SIZE(reads_over)
        || !row_cells(row, columns, values, views, 3))
        Py_RETURN_NOTIMPLEMENTED;
    Py_INCREF(row_obj);
    /* The free list first: the one write that can fail (out of memory) leaves the table as it was. */
    PyObject *appended = PyObject_CallOneArg(append_free, row_obj);
    if (!appended) {
        Py_DECREF(row_obj);
        return NULL;
    }
    Py_DECREF(appended);
    long long held[3];
    swap_cells(views, values, row, held);
    PyDict_DelItem(req_to_row, req_id);  /* found above: an exact str's cached hash, no error */
    PyList_SetItem(rows, row, Py_NewRef(Py_None));
    int was_prefilling = 0;
    PyObject *length = PyDict_GetItemWithError(prefilling, row_obj);
    if (length != NULL) {
        was_prefilling = 1;
        PyDict_DelItem(prefilling, row_obj);
    }
    if (history_reads == Py_True || was_prefilling)  /* the newest marked step may have read its tokens */
        PyList_SetItem(reads_over, row, Py_NewRef(newest));
    return Py_BuildValue("(NNN)", row_obj, PyBool_FromLong(held[1] >= 0), PyBool_FromLong(held[2] >= 0));
}

/* Its prefill length, and the row's computed count less its unconfirmed drafts: 1 when read, 0 when not (a row or
 * length that is not an exact int in range). */
static int prefill_ended(PyObject *row_obj, PyObject *length_obj, const ArrayView *computed, const ArrayView *unconfirmed,
                         Py_ssize_t num_over, int *ended)
{
    long long row, length;
    if (exact_int(row_obj, &row) != EXACT_INT || exact_int(length_obj, &length) != EXACT_INT || row < 0
        || row >= computed->len || row >= unconfirmed->len || row >= num_over)
        return 0;
    *ended = AT(*computed, row) - AT(*unconfirmed, row) >= length;
    return 1;
}

static PyObject *end_prefill_reads(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *prefilling, *computed_obj, *unconfirmed_obj, *reads_over, *event;
    if (!PyArg_ParseTuple(args, "O!OOO!O", &PyDict_Type, &prefilling, &computed_obj, &unconfirmed_obj, &PyList_Type,
                          &reads_over, &event))
        return NULL;
    ArrayView computed, unconfirmed;
    if (!PyDict_CheckExact(prefilling) || !PyList_CheckExact(reads_over) || !int64_view(computed_obj, &computed)
        || !int64_view(unconfirmed_obj, &unconfirmed))
        Py_RETURN_NOTIMPLEMENTED;
    enum { FEW = 16 };  /* rows ended in one step, at most, without a list (usually one) */
    PyObject *few[FEW];
    Py_ssize_t num_ended = 0, pos = 0;
    PyObject *row_obj, *length_obj;
    const Py_ssize_t num_over = PyList_GET_SIZE(reads_over);
    /* Every row read first (any doubt: nothing written), then the ended ones moved out in the dict's order. */
    while (PyDict_Next(prefilling, &pos, &row_obj, &length_obj)) {
        int ended;
        if (!prefill_ended(row_obj, length_obj, &computed, &unconfirmed, num_over, &ended) || (ended && num_ended == FEW))
            Py_RETURN_NOTIMPLEMENTED;
        if (ended)
            few[num_ended++] = row_obj;
    }
    for (Py_ssize_t i = 0; i < num_ended; i++) {
        long long row;
        exact_int(few[i], &row);
        PyList_SetItem(reads_over, (Py_ssize_t)row, Py_NewRef(event));
    }
    for (Py_ssize_t i = 0; i < num_ended; i++) {
        Py_INCREF(few[i]);  /* borrowed from the dict, which the deletion would drop */
        const int failed = PyDict_DelItem(prefilling, few[i]);
        Py_DECREF(few[i]);
        if (failed)
            return NULL;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"advance_decode", advance_decode, METH_VARARGS, "The mirror's advance past a decode step without drafts."},
    {"append_counts", append_counts, METH_VARARGS, "The block counts of rows before their appends, moved past them."},
    {"admit_row", admit_row, METH_VARARGS, "An admitted row's prefill tokens and per-row mirror values."},
    {"swap_row", swap_row, METH_VARARGS, "A row's per-row mirror values written, the old ones returned."},
    {"admit_request", admit_request, METH_VARARGS, "An admission's writes into the table for one request and its row."},
    {"admit_staged", admit_staged, METH_VARARGS, "admit_request with the admission's seed, block list and sampling record."},
    {"end_prefill_reads", end_prefill_reads, METH_VARARGS, "The rows whose prefill is computed leave the prefilling rows."},
    {"release_request", release_request, METH_VARARGS, "A release's writes into the table for one request."},
    {NULL, NULL, 0, NULL},
};

RUNNERCHECK_MODULE("The request state table's writes, in C.")
