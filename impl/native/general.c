/* The general step's reading in C (`impl.native`): each function is the twin of a Python method of
 * `impl.step_reader` that stays the reference and the fallback, and each is called by that method's owner.
 * The same exact-type rule as the steady reader (steady.c): on an object of another type a function returns
 * `NotImplemented` before deciding anything, and the Python reader decides.
 *
 * read_cached   -- the cached requests' block of `impl.step_reader.read_step` (`_read_cached`), for a
 *     step that admits, finishes or preempts (the general reader).  The same exact-type rule as
 *     read_steady: NotImplemented whenever an object it reads is of another type; else None when a
 *     rule fails or a computed count differs from the mirror's (a rejected draft: the Python reader
 *     reads the shift), else what `_read_cached` returns for an accepted step without shifts.
 *
 *     read_cached(req_ids, computed, block_lists, req_to_row, gone_rows, num_computed, num_blocks,
 *                 max_blocks, num_kv_blocks[, hint_ids, hint_rows])
 *       -> NotImplemented | None | (rows, new_block_counts, appends)
 *     hint_ids, hint_rows (None: no hint): the last planned batch's ids and rows while every one of them still holds
 *     its row (`impl.state.RequestStateTable.batch_hint`); a cached id that is the same object as one of the hint's
 *     next few (HINT_REACH) takes that row instead of a look-up in req_to_row -- the same row, found cheaper.  When the
 *     hint is the batch the one pass accepted last (`checked_batch`), such an id is not read for its type either.
 *
 * read_scheduled -- `impl.step_reader._read_scheduled`: the batch's ids, query lengths, rows (-1 for an
 *     id that holds none) and the mirror's tokens known, computed and blocks of each row (0 for -1), from
 *     the scheduled counts; None when a scheduled row is one of ``gone_rows``; NotImplemented for a key
 *     that is not an exact str or a count that is not an exact int of 64 bits.  Only reads.
 *     read_scheduled(scheduled, req_to_row, gone_rows, num_tokens, num_computed, num_blocks)
 *       -> NotImplemented | None | (req_ids, query_lens, rows, known, starts, blocks)
 *
 * check_batch -- `impl.step_reader._check_batch`: every scheduled count >= 1, inside the tokens known
 *     (exactly to their end with drafts), the blocks held, the model's length, and a total inside the
 *     token budget.  check_batch(query_lens, starts, known, blocks, num_drafts | None, block_size,
 *     max_model_len, max_num_batched_tokens)
 *       -> NotImplemented | None | (ends, total, query_starts, max_query_len, max_end, uniform_query_len)
 *     The plan's summaries come from the same pass: query_starts int32 [n + 1] (the counts' running sum from 0),
 *     the largest count and end (0 for no requests), and the count every request shares (-1: they differ, or none).
 *
 * read_general -- `impl.step_reader.read_step` for a step without drafts, in one call, on the `SchedulerOutput`
 *     itself: first `impl.boundary.check_containers`' exact types (the step a ``SchedulerOutput``, the cached requests
 *     a ``CachedRequests`` of three tuples of one length, the other containers each the first type that check names),
 *     `check_step_id`'s rule (an exact int >= 0 past ``last_step_id``; None: any) and no drafts (arrays.h
 *     `read_step_fields`, the steady reader's checks too); then the leaving ids (`check_gone`), the new requests
 *     (each checked by ``check``, `impl/native/boundary.c`'s check_new_request, with ``check_args`` after it) and the
 *     live count, read_cached, the blocks each row holds after the appends, read_scheduled, the new requests' facts
 *     filled in, check_batch.
 *     read_general(sched, SchedulerOutput, CachedRequests, last_step_id | None, req_to_row, check, check_args,
 *                  max_num_reqs, num_computed, num_blocks, num_tokens, block_size, max_model_len,
 *                  max_num_batched_tokens, num_kv_blocks[, hint_ids, hint_rows])
 *       -> NotImplemented | (gone, cached_rows, new_block_counts, appends, req_ids, query_lens, rows, known, starts,
 *                            ends, total, query_starts, max_query_len, max_end, uniform_query_len, new_positions)
 *     gone: the leaving ids, sorted; new_positions: ((batch index, id), ...) of the new ids, whose rows stay -1.
 *     NotImplemented whenever one of the first checks does not pass, a leaving id is not an exact non-empty str
 *     holding a row named once, a new request is not accepted by ``check`` or its id is live, leaving or repeated, the
 *     live requests would outnumber ``max_num_reqs``, or one of the parts declines or rejects (or reads a shift):
 *     `read_step` then runs its own checks and parts, and names any error.  Only reads (the blocks after the appends
 *     are a copy).  A step that admits, or has no decode step before it to repeat, is read by this call alone: the
 *     steady reader is not asked first (`impl.runner.ModelRunner._check`).
 *     read_general_of(sched, targets, last_step_id | None, hint_ids, hint_rows): the same, vectorcall, with the
 *     arguments a runner's steps share in one tuple made once (`impl.step_reader._general_targets`): ``targets`` is
 *     (SchedulerOutput, CachedRequests, req_to_row, check, check_args, max_num_reqs, num_computed, num_blocks,
 *     num_tokens, block_size, max_model_len, max_num_batched_tokens, num_kv_blocks, StepArrays, its fields, zeros);
 *     NotImplemented for another.  It returns the step as a `StepArrays` (every slot stored directly; its draft counts
 *     the first n of ``zeros``), or read_general's tuple when that type's layout is not the one it reads or n exceeds
 *     ``zeros``.
 *     A step as a decode batch usually brings it -- the scheduled dict listing the cached ids first, each key the
 *     same object as its cached id and in that order, then the new ids -- is read in one pass (read_in_lockstep:
 *     each request checked as the parts check it); any other step, or one where a rule fails, goes to the parts.
 *
 * Built by setup.py as the extension `runnercheck.impl.native._general` (impl/native/__init__.py says when and how).
 * The tests' planted bugs are not switches in this file: each is a patch applied to a copy of it
 * (tests/impl/native_plants.py).
 */
#include "arrays.h"

#include "slots.h"
#include "step_arrays.h"

#include <string.h>

/* A row of ``req_to_row``: 1 with it in *row; 0 when ``rid`` holds none; -1 when the dict holds a value
 * that is not an exact int in [0, num_rows) (the caller declines). */
static int row_of(PyObject *req_to_row, PyObject *rid, npy_intp num_rows, npy_int64 *row)
{
    PyObject *value = PyDict_GetItemWithError(req_to_row, rid);
    if (value == NULL)
        return PyErr_Occurred() ? -1 : 0;
    long long got;
    if (exact_int(value, &got) != EXACT_INT || got < 0 || got >= num_rows)
        return -1;
    *row = got;
    return 1;
}

/* How far ahead of its place read_cached looks for a cached id in the hint: past up to three requests that left. */
#define HINT_REACH 4

/* A cached id's row from the hint: 1 with it in *row when ``rid`` is the same object as one of the hint's next
 * HINT_REACH ids (*next_hint then moves past it), else 0 (the caller looks the id up: `row_of`).  Compares
 * pointers only: the id object is not read. */
static int hinted_row(PyObject *rid, PyObject *hint_ids, ArrayView hint_rows, Py_ssize_t num_hints, Py_ssize_t *next_hint,
                      npy_intp num_rows, npy_int64 *row)
{
    for (Py_ssize_t k = *next_hint; k < num_hints && k < *next_hint + HINT_REACH; k++)
        if (PyTuple_GET_ITEM(hint_ids, k) == rid) {
            if (AT(hint_rows, k) < 0 || AT(hint_rows, k) >= num_rows)
                return 0;
            *row = AT(hint_rows, k);
            *next_hint = k + 1;
            return 1;
        }
    return 0;
}

/* What a cached request is checked against: the mirror's computed counts and blocks by row, the rows leaving this
 * step, the hint (`hinted_row`, and whether the one pass checked its ids) and the limits on blocks. */
typedef struct {
    PyObject *req_to_row, *hint_ids;
    ArrayView mirror_computed, mirror_blocks, gone, hint_rows;
    Py_ssize_t num_hints;
    long long max_blocks, num_kv_blocks;
    int hint_checked;  /* every hint id is an exact str (`checked_batch`): one found there is not type-checked again */
} CachedMirror;

/* The batch the one pass accepted last (read_in_lockstep), held: each of its ids was an exact str.  Ids cannot change
 * their type, and the reference held here keeps this tuple's address from naming another, so a hint that is this
 * very tuple (the runner's usual next hint: `RequestStateTable.batch_hint`) holds only exact strs. */
static PyObject *checked_batch = NULL;

/* Whether a hint of ``num_hints`` ids holds only exact strs: it is `checked_batch`. */
#define HINT_CHECKED(hint_ids, num_hints) ((num_hints) > 0 && (hint_ids) == checked_batch)

enum { ENTRY_ERROR = -2, ENTRY_TYPE = -1, ENTRY_RULE = 0, ENTRY_OK = 1 };

/* One cached request (``rid``, its computed count, its new block list) checked as read_cached checks it: ENTRY_OK,
 * ENTRY_RULE when a rule fails (an unknown, repeated or leaving id, a computed count off the mirror, a block out of
 * range, more blocks than a request holds) -- every type is still checked --, ENTRY_TYPE when an object is not of its
 * exact type, ENTRY_ERROR with an error set.  Unless ENTRY_TYPE or ENTRY_ERROR: its row (-1: unknown) in *row and
 * its new blocks in *num_new; a known, unrepeated row is marked in ``seen``. */
static int cached_entry(PyObject *rid, PyObject *computed, PyObject *blocks, const CachedMirror *m, char *seen,
                        Py_ssize_t *next_hint, npy_int64 *row, Py_ssize_t *num_new)
{
    const npy_intp num_rows = m->mirror_computed.len;
    int verdict = ENTRY_OK;
    *row = -1;
    /* The batch usually lists the last one's requests again, in order, less those that left: the id object
     * at one of the hint's next HINT_REACH places takes its row without a look-up -- and, when the hint is the
     * batch the one pass checked last, without reading the id object for its type. */
    int found = hinted_row(rid, m->hint_ids, m->hint_rows, m->num_hints, next_hint, num_rows, row);
    if (!(found && m->hint_checked) && !PyUnicode_CheckExact(rid))
        return ENTRY_TYPE;
    if (!found)
        found = row_of(m->req_to_row, rid, num_rows, row);
    if (found < 0)
        return PyErr_Occurred() ? ENTRY_ERROR : ENTRY_TYPE;
    if (!found || seen[*row])  /* unknown (or new, or empty) id; a request named twice */
        verdict = ENTRY_RULE;
    else {
        seen[*row] = 1;
        for (npy_intp g = 0; g < m->gone.len; g++)
            if (AT(m->gone, g) == *row)  /* finished or preempted this step, and cached too */
                verdict = ENTRY_RULE;
    }
    long long claimed;
    int kind = exact_int(computed, &claimed);
    if (!kind)
        return ENTRY_TYPE;
    if (kind != EXACT_INT || (found && claimed != AT(m->mirror_computed, *row)))
        verdict = ENTRY_RULE;
    if (!PyTuple_CheckExact(blocks) && !PyList_CheckExact(blocks))
        return ENTRY_TYPE;
    *num_new = Py_SIZE(blocks);
    PyObject **items = PySequence_Fast_ITEMS(blocks);
    for (Py_ssize_t j = 0; j < *num_new; j++) {
        long long block;
        kind = exact_int(items[j], &block);
        if (!kind)
            return ENTRY_TYPE;
        if (kind != EXACT_INT || block < 0 || block >= m->num_kv_blocks)
            verdict = ENTRY_RULE;
    }
    if (*num_new && found && AT(m->mirror_blocks, *row) + *num_new > m->max_blocks)
        verdict = ENTRY_RULE;
    return verdict;
}

/* The appends of cached requests whose block lists (exact tuples or lists of exact ints, read already) add
 * ``counts[i]`` blocks to row ``rows[i]``: (rows, counts, block ids) of those that add any, in batch order, or None
 * when none does; NULL on an allocation failure. */
static PyObject *appends_of(PyObject *block_lists, const npy_int64 *rows, const npy_int64 *counts,
                            Py_ssize_t num_appending, Py_ssize_t num_appended)
{
    if (!num_appending)
        return Py_NewRef(Py_None);
    PyObject *append_rows = new_int64(num_appending), *append_counts = new_int64(num_appending);
    PyObject *append_ids = new_int64(num_appended), *appends = NULL;
    if (append_rows && append_counts && append_ids) {
        Py_ssize_t a = 0, b = 0;
        for (Py_ssize_t i = 0; a < num_appending; i++) {
            if (!counts[i])
                continue;
            DATA64(append_rows)[a] = rows[i];
            DATA64(append_counts)[a++] = counts[i];
            PyObject **items = PySequence_Fast_ITEMS(PyTuple_GET_ITEM(block_lists, i));
            for (Py_ssize_t j = 0; j < counts[i]; j++)
                DATA64(append_ids)[b++] = PyLong_AsLongLong(items[j]);
        }
        appends = PyTuple_Pack(3, append_rows, append_counts, append_ids);
    }
    Py_XDECREF(append_rows);
    Py_XDECREF(append_counts);
    Py_XDECREF(append_ids);
    return appends;
}

static PyObject *read_cached(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *ids, *computed, *block_lists, *req_to_row, *gone_obj, *num_computed_obj, *num_blocks_obj;
    PyObject *hint_ids = Py_None, *hint_rows_obj = Py_None;
    long long max_blocks, num_kv_blocks;
    if (!PyArg_ParseTuple(args, "OOOOOOOLL|OO", &ids, &computed, &block_lists, &req_to_row, &gone_obj, &num_computed_obj,
                          &num_blocks_obj, &max_blocks, &num_kv_blocks, &hint_ids, &hint_rows_obj))
        return NULL;
    if (!PyTuple_CheckExact(ids) || !PyTuple_CheckExact(computed) || !PyTuple_CheckExact(block_lists)
        || !PyDict_CheckExact(req_to_row))
        Py_RETURN_NOTIMPLEMENTED;
    ArrayView gone, mirror_computed, mirror_blocks, hint_rows = {NULL, 0, 0};
    if (!int64_view(gone_obj, &gone) || !int64_view(num_computed_obj, &mirror_computed)
        || !int64_view(num_blocks_obj, &mirror_blocks))
        Py_RETURN_NOTIMPLEMENTED;
    const Py_ssize_t n = PyTuple_GET_SIZE(ids);
    const npy_intp num_rows = mirror_computed.len;
    if (PyTuple_GET_SIZE(computed) != n || PyTuple_GET_SIZE(block_lists) != n || mirror_blocks.len != num_rows)
        Py_RETURN_NOTIMPLEMENTED;
    /* The hint: the last planned batch's ids and rows, each id still in its row (`RequestStateTable.batch_hint`). */
    Py_ssize_t num_hints = 0, next_hint = 0;
    if (hint_ids != Py_None) {
        if (!PyTuple_CheckExact(hint_ids) || !int64_view(hint_rows_obj, &hint_rows)
            || hint_rows.len != PyTuple_GET_SIZE(hint_ids))
            Py_RETURN_NOTIMPLEMENTED;
        num_hints = PyTuple_GET_SIZE(hint_ids);
    }

    PyObject *rows = new_int64(n), *counts = new_int64(n);
    char *seen = PyMem_Calloc(num_rows > 0 ? num_rows : 1, 1);
    PyObject *appends = NULL, *result = NULL;
    if (!rows || !counts || !seen) {
        if (!seen)
            PyErr_NoMemory();
        goto done;
    }
    npy_int64 *rows_out = DATA64(rows), *counts_out = DATA64(counts);
    const CachedMirror mirror = {req_to_row, hint_ids, mirror_computed, mirror_blocks, gone, hint_rows, num_hints,
                                 max_blocks, num_kv_blocks, HINT_CHECKED(hint_ids, num_hints)};
    /* One pass: exact types (any other: NotImplemented), and whether a value fails a rule or a computed
     * count differs from the mirror (then None: the Python reader decides, naming the request). */
    int verdict = ENTRY_OK;  /* ENTRY_OK: accepted so far, ENTRY_RULE: None, ENTRY_TYPE: NotImplemented */
    Py_ssize_t num_appending = 0, num_appended = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        npy_int64 row;
        Py_ssize_t num_new;
        const int entry = cached_entry(PyTuple_GET_ITEM(ids, i), PyTuple_GET_ITEM(computed, i),
                                       PyTuple_GET_ITEM(block_lists, i), &mirror, seen, &next_hint, &row, &num_new);
        if (entry == ENTRY_ERROR)
            goto done;
        if (entry == ENTRY_TYPE) {
            verdict = ENTRY_TYPE;
            break;
        }
        if (entry == ENTRY_RULE)
            verdict = ENTRY_RULE;
        rows_out[i] = row;
        counts_out[i] = num_new;
        if (num_new) {
            num_appending++;
            num_appended += num_new;
        }
    }
    if (verdict < 0) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    if (verdict == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    appends = appends_of(block_lists, rows_out, counts_out, num_appending, num_appended);
    if (appends)
        result = PyTuple_Pack(3, rows, counts, appends);
done:
    PyMem_Free(seen);
    Py_XDECREF(rows);
    Py_XDECREF(counts);
    Py_XDECREF(appends);
    return result;
}

/* read_scheduled's pass.  ``prefix_ids`` (NULL: none): ids whose rows the caller read already (``prefix_rows``), in
 * the order the batch usually lists them first; a key that is the same object as its entry takes that row. */
static PyObject *scheduled_pass(PyObject *scheduled, PyObject *req_to_row, PyObject *gone_obj, PyObject *tokens_obj,
                                PyObject *computed_obj, PyObject *blocks_obj, PyObject *prefix_ids, const npy_int64 *prefix_rows)
{
    ArrayView gone, mirror_tokens, mirror_computed, mirror_blocks;
    if (!PyDict_CheckExact(scheduled) || !PyDict_CheckExact(req_to_row) || !int64_view(gone_obj, &gone)
        || !int64_view(tokens_obj, &mirror_tokens) || !int64_view(computed_obj, &mirror_computed)
        || !int64_view(blocks_obj, &mirror_blocks))
        Py_RETURN_NOTIMPLEMENTED;
    const npy_intp num_rows = mirror_tokens.len;
    if (mirror_computed.len != num_rows || mirror_blocks.len != num_rows)
        Py_RETURN_NOTIMPLEMENTED;
    const Py_ssize_t n = PyDict_GET_SIZE(scheduled), num_prefix = prefix_ids ? PyTuple_GET_SIZE(prefix_ids) : 0;
    PyObject *ids = PyTuple_New(n), *lens = new_int64(n), *rows = new_int64(n);
    PyObject *known = new_int64(n), *starts = new_int64(n), *blocks = new_int64(n), *result = NULL;
    if (!ids || !lens || !rows || !known || !starts || !blocks)
        goto done;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    int leaving = 0;
    while (PyDict_Next(scheduled, &pos, &key, &value)) {
        long long count;
        npy_int64 row = -1;
        int found;
        if (i < num_prefix && key == PyTuple_GET_ITEM(prefix_ids, i) && exact_int(value, &count) == EXACT_INT) {
            row = prefix_rows[i];
            found = 1;
        }
        else if (i >= n || !PyUnicode_CheckExact(key) || exact_int(value, &count) != EXACT_INT
                 || (found = row_of(req_to_row, key, num_rows, &row)) < 0) {
            if (!PyErr_Occurred())
                result = Py_NewRef(Py_NotImplemented);
            goto done;
        }
        PyTuple_SET_ITEM(ids, i, Py_NewRef(key));
        DATA64(lens)[i] = count;
        if (found) {
            for (npy_intp g = 0; g < gone.len; g++)
                leaving |= AT(gone, g) == row;
            DATA64(known)[i] = AT(mirror_tokens, row);
            DATA64(starts)[i] = AT(mirror_computed, row);
            DATA64(blocks)[i] = AT(mirror_blocks, row);
        }
        else {  /* a new request's (or an unknown id's): filled in by the caller */
            row = -1;
            DATA64(known)[i] = DATA64(starts)[i] = DATA64(blocks)[i] = 0;
        }
        DATA64(rows)[i++] = row;
    }
    if (i != n)
        result = Py_NewRef(Py_NotImplemented);
    else if (leaving)
        result = Py_NewRef(Py_None);
    else
        result = PyTuple_Pack(6, ids, lens, rows, known, starts, blocks);
done:
    Py_XDECREF(ids);
    Py_XDECREF(lens);
    Py_XDECREF(rows);
    Py_XDECREF(known);
    Py_XDECREF(starts);
    Py_XDECREF(blocks);
    return result;
}

static PyObject *read_scheduled(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *scheduled, *req_to_row, *gone, *tokens, *computed, *blocks;
    if (!PyArg_ParseTuple(args, "OOOOOO", &scheduled, &req_to_row, &gone, &tokens, &computed, &blocks))
        return NULL;
    return scheduled_pass(scheduled, req_to_row, gone, tokens, computed, blocks, NULL, NULL);
}

/* The most blocks whose tokens can be counted in 64 bits: a request holding more holds any end. */
static inline npy_int64 max_held_blocks(long long block_size)
{
    return NPY_MAX_INT64 / block_size;
}

/* check_batch's rule for one request of ``count`` tokens from ``start``, with ``have`` tokens known (its drafts
 * included), ``k`` drafts and ``held`` blocks: -1 when the count itself is out of bounds (no end, nothing to sum),
 * else 1 when the rule holds and 0 when it fails, with the request's end in *end either way.  ``max_held``:
 * `max_held_blocks` (a division: once a batch). */
static inline int batch_rule(npy_int64 count, npy_int64 start, npy_int64 have, npy_int64 k, npy_int64 held,
                             long long block_size, long long max_model_len, long long max_num_batched_tokens,
                             npy_int64 max_held, npy_int64 *end)
{
    /* A scheduled count may be any 64-bit int: one above the budget is rejected before any sum (as the Python
     * reference does), so neither the end nor a total can overflow. */
    if (count <= 0 || count > max_num_batched_tokens || start > NPY_MAX_INT64 - count)
        return -1;
    *end = start + count;
    /* Past the blocks held: ceil(end / block_size) > held, i.e. end > held * block_size (no division a request;
     * a count of blocks too large to multiply holds any end). */
    return !(*end > have || (k > 0 && *end != have) || *end > max_model_len || held < 0
             || (held <= max_held && *end > held * block_size));
}

static PyObject *check_batch(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *lens_obj, *starts_obj, *known_obj, *blocks_obj, *drafts_obj;
    long long block_size, max_model_len, max_num_batched_tokens;
    if (!PyArg_ParseTuple(args, "OOOOOLLL", &lens_obj, &starts_obj, &known_obj, &blocks_obj, &drafts_obj, &block_size,
                          &max_model_len, &max_num_batched_tokens))
        return NULL;
    ArrayView lens, starts, known, blocks, drafts;
    int with_drafts = drafts_obj != Py_None;
    if (!int64_view(lens_obj, &lens) || !int64_view(starts_obj, &starts) || !int64_view(known_obj, &known)
        || !int64_view(blocks_obj, &blocks) || (with_drafts && !int64_view(drafts_obj, &drafts)) || block_size <= 0)
        Py_RETURN_NOTIMPLEMENTED;
    const npy_intp n = lens.len;
    if (starts.len != n || known.len != n || blocks.len != n || (with_drafts && drafts.len != n))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *ends = new_int64(n);
    npy_intp num_starts = n + 1;
    PyObject *query_starts = PyArray_SimpleNew(1, &num_starts, NPY_INT32);
    if (!ends || !query_starts) {
        Py_XDECREF(ends);
        Py_XDECREF(query_starts);
        return NULL;
    }
    npy_int64 *ends_out = DATA64(ends);
    npy_int32 *starts_out = (npy_int32 *)PyArray_DATA((PyArrayObject *)query_starts);
    long long total = 0, max_count = 0, max_end = 0, shared = n ? AT(lens, 0) : -1;
    const npy_int64 max_held = max_held_blocks(block_size);
    int bad = 0;
    starts_out[0] = 0;
    for (npy_intp i = 0; i < n; i++) {
        npy_int64 count = AT(lens, i), end, k = with_drafts ? AT(drafts, i) : 0;
        const int holds = batch_rule(count, AT(starts, i), AT(known, i) + k, k, AT(blocks, i), block_size,
                                     max_model_len, max_num_batched_tokens, max_held, &end);
        if (holds < 0) {
            bad = 1;
            ends_out[i] = 0;
            continue;
        }
        if (!holds)
            bad = 1;
        total += count;
        ends_out[i] = end;
        /* Written only while the total fits int32 (the budget does: `impl.runner._check_limits`); a batch past
         * the budget is rejected below and its starts are never read. */
        starts_out[i + 1] = (npy_int32)total;
        if (count > max_count)
            max_count = count;
        if (end > max_end)
            max_end = end;
        if (count != shared)
            shared = -1;
    }
    if (bad || total > max_num_batched_tokens) {
        Py_DECREF(ends);
        Py_DECREF(query_starts);
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(NLNLLL)", ends, total, query_starts, max_count, max_end, shared);
}

/* A tuple result of one of this module's functions, or NULL after dropping ``got`` (an error stays set; None
 * and NotImplemented are declined silently). */
static PyObject *accepted(PyObject *got)
{
    if (got != NULL && PyTuple_CheckExact(got))
        return got;
    Py_XDECREF(got);
    return NULL;
}

/* The step's leaving ids (finished, then preempted): each an exact, non-empty str holding a row, named once.  Adds
 * them to ``gone`` (a list) and their rows to ``rows`` (int64, room for all); 0 when one is not such an id (or
 * on an error, left set). */
static int read_gone(PyObject *ids, PyObject *req_to_row, PyObject *gone, npy_int64 *rows, Py_ssize_t room)
{
    PyObject *iter = PyObject_GetIter(ids), *rid;
    if (!iter)
        return 0;
    int ok = 1;
    while (ok && (rid = PyIter_Next(iter))) {
        npy_int64 row;
        Py_ssize_t k = PyList_GET_SIZE(gone);
        ok = PyUnicode_CheckExact(rid) && PyUnicode_GET_LENGTH(rid) > 0 && k < room
             && row_of(req_to_row, rid, NPY_MAX_INT64, &row) == 1 && PySequence_Contains(gone, rid) == 0
             && PyList_Append(gone, rid) == 0;
        if (ok)
            rows[k] = row;
        Py_DECREF(rid);
    }
    Py_DECREF(iter);
    return ok && !PyErr_Occurred();
}

/* The step's new requests into ``new`` (id -> (prefill length, blocks, prefix-cache hit)), each accepted by
 * ``check`` (`impl.boundary.check_new_request`'s C twin, called with the request and then ``check_args``: it
 * returns the prefill length, or anything else for the reference to decide); an id must be neither live (a
 * leaving id is live too: `read_step` rejects both) nor named twice.  0 when one is not (or on an error). */
static int read_new(PyObject *requests, PyObject *check, PyObject *check_args, PyObject *req_to_row, PyObject *new)
{
    enum { MAX_ARGS = 16 };
    PyObject *stack[MAX_ARGS];
    const Py_ssize_t num_args = PyTuple_GET_SIZE(check_args);
    if (num_args + 1 > MAX_ARGS || (!PyTuple_CheckExact(requests) && !PyList_CheckExact(requests)))
        return 0;
    for (Py_ssize_t a = 0; a < num_args; a++)
        stack[a + 1] = PyTuple_GET_ITEM(check_args, a);
    for (Py_ssize_t i = 0; i < Py_SIZE(requests); i++) {
        stack[0] = PySequence_Fast_ITEMS(requests)[i];
        PyObject *length = PyObject_Vectorcall(check, stack, (size_t)(num_args + 1), NULL);
        if (!length)
            return 0;
        PyObject *rid = NULL, *blocks = NULL, *hit = NULL, *facts = NULL;
        long long n, h;
        int ok = exact_int(length, &n) == EXACT_INT && (rid = attr(stack[0], "req_id")) && PyUnicode_CheckExact(rid)
                 && PyDict_Contains(req_to_row, rid) == 0
                 && PyDict_Contains(new, rid) == 0 && (blocks = attr(stack[0], "block_ids"))
                 && (hit = attr(stack[0], "num_computed_tokens")) && exact_int(hit, &h) == EXACT_INT;
        Py_ssize_t num_blocks = ok ? PyObject_Size(blocks) : -1;
        ok = ok && num_blocks >= 0 && (facts = Py_BuildValue("(LnL)", n, num_blocks, h)) && PyDict_SetItem(new, rid, facts) == 0;
        Py_DECREF(length);
        Py_XDECREF(rid);
        Py_XDECREF(blocks);
        Py_XDECREF(hit);
        Py_XDECREF(facts);
        if (!ok)
            return 0;
    }
    return 1;
}

/* A new request scheduled at batch index ``i`` under ``rid``: its facts as read_new recorded them in ``new_requests``
 * (prefill length, blocks, prefix-cache hit: the tokens it is known to, holds, and starts computing from), and
 * (i, rid) appended to ``positions``.  1 when read; 0 when ``rid`` names no new request (or on an error, left set). */
static int new_entry(PyObject *new_requests, PyObject *rid, Py_ssize_t i, PyObject *positions, long long *known,
                     long long *held, long long *start)
{
    PyObject *facts = PyDict_GetItemWithError(new_requests, rid);
    if (facts == NULL || !PyTuple_CheckExact(facts) || PyTuple_GET_SIZE(facts) != 3
        || exact_int(PyTuple_GET_ITEM(facts, 0), known) != EXACT_INT || exact_int(PyTuple_GET_ITEM(facts, 1), held) != EXACT_INT
        || exact_int(PyTuple_GET_ITEM(facts, 2), start) != EXACT_INT)
        return 0;
    PyObject *position = Py_BuildValue("(nO)", i, rid);
    const int ok = position != NULL && PyList_Append(positions, position) == 0;
    Py_XDECREF(position);
    return ok;
}

/* What read_general's one-pass reader reads a step against: the mirror, the hint and the limits. */
typedef struct {
    CachedMirror cached;  /* what each cached request is checked against (`cached_entry`) */
    PyObject *new_requests;
    ArrayView mirror_tokens;
    long long block_size, max_model_len, max_num_batched_tokens, max_held;
} GeneralMirror;

/* The step as a decode batch usually comes, read in one pass instead of read_general's passes: the scheduled dict
 * lists the cached requests first, each key the same object as its cached id and in that order, then the new
 * requests.  Each request is checked as read_cached, read_scheduled and check_batch check it, with the facts of a new
 * one from ``new_requests``.  Returns read_general's tuple (``gone``: its first item), or NULL: with an error set on a
 * failure, else when the step is not such a step or a rule fails (read_general's passes then decide). */
static PyObject *read_in_lockstep(PyObject *ids, PyObject *computed, PyObject *block_lists, PyObject *scheduled,
                                  PyObject *gone, const GeneralMirror *m)
{
    const Py_ssize_t num_cached = PyTuple_GET_SIZE(ids), n = PyDict_GET_SIZE(scheduled);
    const npy_intp num_rows = m->cached.mirror_computed.len;
    if (n != num_cached + PyDict_GET_SIZE(m->new_requests))
        return NULL;
    PyObject *cached_rows = new_int64(num_cached), *new_counts = new_int64(num_cached), *lens = new_int64(n);
    PyObject *rows = new_int64(n), *known = new_int64(n), *starts = new_int64(n), *ends = new_int64(n);
    npy_intp num_query_starts = n + 1;
    PyObject *query_starts = PyArray_SimpleNew(1, &num_query_starts, NPY_INT32);
    PyObject *positions = NULL, *new_positions = NULL, *appends = NULL, *result = NULL;
    char *seen = PyMem_Calloc(num_rows > 0 ? num_rows : 1, 1);
    /* The ids: the cached tuple itself when nothing is admitted (its items are the keys), else the keys, in order. */
    PyObject *req_ids = n == num_cached ? Py_NewRef(ids) : PyTuple_New(n);
    if (!cached_rows || !new_counts || !lens || !rows || !known || !starts || !ends || !query_starts || !seen || !req_ids) {
        if (!seen)
            PyErr_NoMemory();
        goto done;
    }
    npy_int64 *cached_out = DATA64(cached_rows), *counts_out = DATA64(new_counts), *lens_out = DATA64(lens);
    npy_int64 *rows_out = DATA64(rows), *known_out = DATA64(known), *starts_out = DATA64(starts), *ends_out = DATA64(ends);
    npy_int32 *query_out = (npy_int32 *)PyArray_DATA((PyArrayObject *)query_starts);
    long long total = 0, max_count = 0, max_end = 0, shared = -1;
    Py_ssize_t num_appending = 0, num_appended = 0, next_hint = 0, pos = 0, i = 0;
    PyObject *key, *value;
    query_out[0] = 0;
    while (PyDict_Next(scheduled, &pos, &key, &value)) {
        long long count, start, have, held;
        npy_int64 row = -1, end;
        if (exact_int(value, &count) != EXACT_INT)
            goto done;
        if (i < num_cached) {
            Py_ssize_t num_new;
            if (key != PyTuple_GET_ITEM(ids, i))
                goto done;
            /* Anything but a pass (a rejected draft's shift among them) goes to the passes, which decide. */
            const int entry = cached_entry(key, PyTuple_GET_ITEM(computed, i), PyTuple_GET_ITEM(block_lists, i),
                                           &m->cached, seen, &next_hint, &row, &num_new);
            if (entry != ENTRY_OK)
                goto done;
            if (num_new) {
                num_appending++;
                num_appended += num_new;
            }
            held = AT(m->cached.mirror_blocks, row) + num_new;
            cached_out[i] = row;
            counts_out[i] = num_new;
            start = AT(m->cached.mirror_computed, row);
            have = AT(m->mirror_tokens, row);
        }
        else if (!PyUnicode_CheckExact(key) || (!positions && !(positions = PyList_New(0)))
                 || !new_entry(m->new_requests, key, i, positions, &have, &held, &start))
            goto done;  /* not a new request's id (or an error, left set) */
        if (batch_rule(count, start, have, 0, held, m->block_size, m->max_model_len, m->max_num_batched_tokens, m->max_held,
                       &end) != 1)
            goto done;
        total += count;
        if (total > m->max_num_batched_tokens)
            goto done;
        if (req_ids != ids)
            PyTuple_SET_ITEM(req_ids, i, Py_NewRef(key));
        lens_out[i] = count;
        rows_out[i] = row;
        known_out[i] = have;
        starts_out[i] = start;
        ends_out[i] = end;
        query_out[i + 1] = (npy_int32)total;
        max_count = count > max_count ? count : max_count;
        max_end = end > max_end ? end : max_end;
        shared = i == 0 ? count : (count == shared ? shared : -1);
        i++;
    }
    if (i != n)
        goto done;
    if (!(appends = appends_of(block_lists, cached_out, counts_out, num_appending, num_appended)))
        goto done;
    new_positions = positions ? PyList_AsTuple(positions) : PyTuple_New(0);
    if (new_positions)
        result = Py_BuildValue("(OOOOOOOOOOLOLLLO)", gone, cached_rows, new_counts, appends, req_ids, lens, rows, known,
                               starts, ends, total, query_starts, max_count, max_end, n ? shared : -1LL, new_positions);
    if (result)  /* every id of the batch read is an exact str: the next step's hint, when it is this tuple */
        Py_XSETREF(checked_batch, Py_NewRef(req_ids));
done:
    PyMem_Free(seen);
    Py_XDECREF(cached_rows);
    Py_XDECREF(new_counts);
    Py_XDECREF(lens);
    Py_XDECREF(rows);
    Py_XDECREF(known);
    Py_XDECREF(starts);
    Py_XDECREF(ends);
    Py_XDECREF(query_starts);
    Py_XDECREF(req_ids);
    Py_XDECREF(positions);
    Py_XDECREF(new_positions);
    Py_XDECREF(appends);
    return result;
}

/* read_general's reading, on the step's fields (after `read_step_fields` checked them). */
static PyObject *general_read(PyObject *self, PyObject *ids, PyObject *computed, PyObject *block_lists, PyObject *scheduled,
                              PyObject *req_to_row, PyObject *finished, PyObject *preempted, PyObject *requests,
                              PyObject *check, PyObject *check_args, long long max_num_reqs, PyObject *num_computed,
                              PyObject *num_blocks, PyObject *num_tokens, long long block_size, long long max_model_len,
                              long long max_num_batched_tokens, long long num_kv_blocks, PyObject *hint_ids,
                              PyObject *hint_rows)
{
    if (!PyDict_CheckExact(req_to_row) || block_size <= 0 || max_model_len <= 0)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *gone = NULL, *gone_rows = NULL, *new_requests = NULL, *gone_sorted = NULL;
    PyObject *cached = NULL, *blocks_after = NULL, *batch = NULL, *checked = NULL, *positions = NULL, *result = NULL;
    PyObject *call = NULL;
    /* The leaving and new requests, checked as `read_step`'s own loops check them (any doubt: its parts decide). */
    const Py_ssize_t room = PyDict_GET_SIZE(req_to_row);
    npy_int64 *leaving = PyMem_Malloc(sizeof(npy_int64) * (size_t)(room + 1));
    if (!leaving) {
        PyErr_NoMemory();
        goto done;
    }
    if (!(gone = PyList_New(0)) || !(new_requests = PyDict_New()) || !read_gone(finished, req_to_row, gone, leaving, room)
        || !read_gone(preempted, req_to_row, gone, leaving, room))
        goto done;
    if (!read_new(requests, check, check_args, req_to_row, new_requests)
        || room - PyList_GET_SIZE(gone) + PyDict_GET_SIZE(new_requests) > max_num_reqs)
        goto done;
    if (!(gone_rows = new_int64(PyList_GET_SIZE(gone))) || PyList_Sort(gone) < 0 || !(gone_sorted = PyList_AsTuple(gone)))
        goto done;
    memcpy(DATA64(gone_rows), leaving, sizeof(npy_int64) * (size_t)PyList_GET_SIZE(gone));
    const long long max_blocks = blocks_per_request(max_model_len, block_size);
    GeneralMirror mirror = {{req_to_row, hint_ids, {0}, {0}, {0}, {NULL, 0, 0}, 0, max_blocks, num_kv_blocks, 0},
                            new_requests, {0}, block_size, max_model_len, max_num_batched_tokens,
                            max_held_blocks(block_size)};
    CachedMirror *cached_mirror = &mirror.cached;
    if (PyTuple_CheckExact(ids) && PyTuple_CheckExact(computed) && PyTuple_CheckExact(block_lists)
        && PyTuple_GET_SIZE(computed) == PyTuple_GET_SIZE(ids) && PyTuple_GET_SIZE(block_lists) == PyTuple_GET_SIZE(ids)
        && PyDict_CheckExact(scheduled) && int64_view(num_computed, &cached_mirror->mirror_computed)
        && int64_view(num_blocks, &cached_mirror->mirror_blocks) && int64_view(num_tokens, &mirror.mirror_tokens)
        && int64_view(gone_rows, &cached_mirror->gone)
        && cached_mirror->mirror_blocks.len == cached_mirror->mirror_computed.len
        && mirror.mirror_tokens.len == cached_mirror->mirror_computed.len
        && (hint_ids == Py_None || (PyTuple_CheckExact(hint_ids) && int64_view(hint_rows, &cached_mirror->hint_rows)
                                    && cached_mirror->hint_rows.len == PyTuple_GET_SIZE(hint_ids)))) {
        cached_mirror->num_hints = hint_ids == Py_None ? 0 : PyTuple_GET_SIZE(hint_ids);
        cached_mirror->hint_checked = HINT_CHECKED(hint_ids, cached_mirror->num_hints);
        if ((result = read_in_lockstep(ids, computed, block_lists, scheduled, gone_sorted, &mirror)) || PyErr_Occurred())
            goto done;
    }
    call = Py_BuildValue("(OOOOOOOLLOO)", ids, computed, block_lists, req_to_row, gone_rows, num_computed, num_blocks,
                         max_blocks, num_kv_blocks, hint_ids, hint_rows);
    if (!call || !(cached = accepted(read_cached(self, call))))
        goto done;
    /* The blocks each row holds after this step's appends (a copy: the mirror changes only at the commit). */
    blocks_after = num_blocks;
    Py_INCREF(blocks_after);
    PyObject *appends = PyTuple_GET_ITEM(cached, 2);
    if (appends != Py_None) {
        Py_SETREF(blocks_after, PyArray_NewCopy((PyArrayObject *)num_blocks, NPY_CORDER));
        if (!blocks_after)
            goto done;
        PyObject *rows = PyTuple_GET_ITEM(cached, 0), *counts = PyTuple_GET_ITEM(cached, 1);
        for (npy_intp i = 0; i < PyArray_DIM((PyArrayObject *)rows, 0); i++)
            DATA64(blocks_after)[DATA64(rows)[i]] += DATA64(counts)[i];
    }
    if (!(batch = accepted(scheduled_pass(scheduled, req_to_row, gone_rows, num_tokens, num_computed, blocks_after, ids,
                                          DATA64(PyTuple_GET_ITEM(cached, 0))))))
        goto done;
    /* The new requests' (prefill length, blocks, prefix-cache hit), as read_step fills them in. */
    PyObject *req_ids = PyTuple_GET_ITEM(batch, 0), *lens = PyTuple_GET_ITEM(batch, 1), *rows = PyTuple_GET_ITEM(batch, 2);
    PyObject *known = PyTuple_GET_ITEM(batch, 3), *starts = PyTuple_GET_ITEM(batch, 4), *blocks = PyTuple_GET_ITEM(batch, 5);
    if (!(positions = PyList_New(0)))
        goto done;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(req_ids); i++) {
        if (DATA64(rows)[i] >= 0)
            continue;
        long long n, held, hit;
        if (!new_entry(new_requests, PyTuple_GET_ITEM(req_ids, i), i, positions, &n, &held, &hit))
            goto done;  /* an unknown id (or an error): read_step names it */
        DATA64(known)[i] = n;
        DATA64(blocks)[i] = held;
        DATA64(starts)[i] = hit;
    }
    Py_SETREF(call, Py_BuildValue("(OOOOOLLL)", lens, starts, known, blocks, Py_None, block_size, max_model_len,
                                  max_num_batched_tokens));
    if (!call || !(checked = accepted(check_batch(self, call))))
        goto done;
    PyObject *new_positions = PyList_AsTuple(positions);
    if (new_positions)
        result = Py_BuildValue("(OOOOOOOOOOOOOOOO)", gone_sorted, PyTuple_GET_ITEM(cached, 0), PyTuple_GET_ITEM(cached, 1), appends,
                               req_ids, lens, rows, known, starts, PyTuple_GET_ITEM(checked, 0), PyTuple_GET_ITEM(checked, 1),
                               PyTuple_GET_ITEM(checked, 2), PyTuple_GET_ITEM(checked, 3), PyTuple_GET_ITEM(checked, 4),
                               PyTuple_GET_ITEM(checked, 5), new_positions);
    Py_XDECREF(new_positions);
done:
    PyMem_Free(leaving);
    Py_XDECREF(gone);
    Py_XDECREF(gone_rows);
    Py_XDECREF(new_requests);
    Py_XDECREF(gone_sorted);
    Py_XDECREF(call);
    Py_XDECREF(cached);
    Py_XDECREF(blocks_after);
    Py_XDECREF(batch);
    Py_XDECREF(checked);
    Py_XDECREF(positions);
    if (result == NULL && !PyErr_Occurred())
        result = Py_NewRef(Py_NotImplemented);
    return result;
}

static PyObject *read_general(PyObject *self, PyObject *args)
{
    PyObject *sched, *sched_type, *cached_type, *last_step_id, *req_to_row, *check, *check_args;
    PyObject *num_computed, *num_blocks, *num_tokens, *hint_ids = Py_None, *hint_rows = Py_None;
    long long max_num_reqs, block_size, max_model_len, max_num_batched_tokens, num_kv_blocks;
    if (!PyArg_ParseTuple(args, "OOOOOOO!LOOOLLLL|OO", &sched, &sched_type, &cached_type, &last_step_id, &req_to_row,
                          &check, &PyTuple_Type, &check_args, &max_num_reqs, &num_computed, &num_blocks, &num_tokens,
                          &block_size, &max_model_len, &max_num_batched_tokens, &num_kv_blocks, &hint_ids, &hint_rows))
        return NULL;
    PyObject *fields[NUM_STEP_FIELDS] = {NULL}, *cached[3] = {NULL}, *result = NULL;
    /* `check_containers`' exact types and `check_step_id`'s rule, and no drafts: anything else is read_step's to
     * check and name, or to read by its parts. */
    int changes;
    if (!read_step_fields(sched, sched_type, cached_type, last_step_id, fields, cached, &changes)
        || PyDict_GET_SIZE(fields[STEP_DRAFTS]))
        goto decline;
    result = general_read(self, cached[CACHED_IDS], cached[CACHED_COMPUTED], cached[CACHED_BLOCKS], fields[STEP_SCHEDULED],
                          req_to_row, fields[STEP_FINISHED], fields[STEP_PREEMPTED], fields[STEP_NEW], check, check_args,
                          max_num_reqs, num_computed, num_blocks, num_tokens, block_size, max_model_len,
                          max_num_batched_tokens, num_kv_blocks, hint_ids, hint_rows);
    release_step_fields(fields, cached);
    return result;
decline:
    release_step_fields(fields, cached);
    Py_RETURN_NOTIMPLEMENTED;
}

enum { OF_SCHED_TYPE, OF_CACHED_TYPE, OF_REQ_TO_ROW, OF_CHECK, OF_CHECK_ARGS, OF_MAX_NUM_REQS, OF_NUM_COMPUTED,
       OF_NUM_BLOCKS, OF_NUM_TOKENS, OF_BLOCK_SIZE, OF_MAX_MODEL_LEN, OF_MAX_BATCHED, OF_NUM_KV_BLOCKS, OF_STEP_TYPE,
       OF_STEP_FIELDS, OF_ZEROS, NUM_OF_TARGETS };

/* A `impl.step_reader.StepArrays` is made here with each slot stored directly (slots.h, step_arrays.h). */
static SlotsLayout step_arrays_layout;

/* read_general's tuple as a StepArrays (its draft counts the first n of ``zeros``); NULL with no error set when the
 * type's layout is not the one read, or n exceeds ``zeros`` (the caller returns the tuple). */
static PyObject *step_arrays(PyObject *type, PyObject *fields, PyObject *zeros, PyObject *got)
{
    const Py_ssize_t n = PyTuple_GET_SIZE(PyTuple_GET_ITEM(got, 4));
    if (!slots_layout(&step_arrays_layout, type, fields, STEP_ARRAYS_FIELDS, NUM_STEP_ARRAYS) || !PyArray_Check(zeros)
        || PyArray_NDIM((PyArrayObject *)zeros) != 1
        || PyArray_DIM((PyArrayObject *)zeros, 0) < n)
        return NULL;
    PyObject *num_drafts = PySequence_GetSlice(zeros, 0, n);
    if (num_drafts == NULL)
        return NULL;
    PyObject *values[NUM_STEP_ARRAYS] = {
        [SA_GONE] = PyTuple_GET_ITEM(got, 0), [SA_CACHED_ROWS] = PyTuple_GET_ITEM(got, 1), [SA_CACHED_COMPUTED] = Py_None,
        [SA_CACHED_NEW_BLOCKS] = PyTuple_GET_ITEM(got, 2), [SA_BLOCK_APPENDS] = PyTuple_GET_ITEM(got, 3),
        [SA_REQ_IDS] = PyTuple_GET_ITEM(got, 4), [SA_ROWS] = PyTuple_GET_ITEM(got, 6),
        [SA_NEW_POSITIONS] = PyTuple_GET_ITEM(got, 15), [SA_QUERY_LENS] = PyTuple_GET_ITEM(got, 5),
        [SA_STARTS] = PyTuple_GET_ITEM(got, 8), [SA_ENDS] = PyTuple_GET_ITEM(got, 9), [SA_KNOWN] = PyTuple_GET_ITEM(got, 7),
        [SA_NUM_DRAFTS] = num_drafts, [SA_DRAFTS] = Py_None, [SA_NUM_TOKENS] = PyTuple_GET_ITEM(got, 10),
        [SA_QUERY_STARTS] = PyTuple_GET_ITEM(got, 11), [SA_MAX_QUERY_LEN] = PyTuple_GET_ITEM(got, 12),
        [SA_MAX_END] = PyTuple_GET_ITEM(got, 13), [SA_UNIFORM_QUERY_LEN] = PyTuple_GET_ITEM(got, 14), [SA_STEADY] = Py_False,
    };
    PyObject *step = slots_new(&step_arrays_layout, values, NUM_STEP_ARRAYS);
    Py_DECREF(num_drafts);
    return step;
}

static PyObject *read_general_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "read_general_of takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *sched = args[0], *targets = args[1], *last_step_id = args[2];
    long long limits[5];  /* max_num_reqs, block_size, max_model_len, max_num_batched_tokens, num_kv_blocks */
    const int at[5] = {OF_MAX_NUM_REQS, OF_BLOCK_SIZE, OF_MAX_MODEL_LEN, OF_MAX_BATCHED, OF_NUM_KV_BLOCKS};
    if (!PyTuple_CheckExact(targets) || PyTuple_GET_SIZE(targets) != NUM_OF_TARGETS
        || !PyTuple_CheckExact(PyTuple_GET_ITEM(targets, OF_CHECK_ARGS)))
        Py_RETURN_NOTIMPLEMENTED;
    for (int k = 0; k < 5; k++)
        if (exact_int(PyTuple_GET_ITEM(targets, at[k]), &limits[k]) != EXACT_INT)
            Py_RETURN_NOTIMPLEMENTED;
    PyObject *fields[NUM_STEP_FIELDS] = {NULL}, *cached[3] = {NULL}, *result = NULL;
    int changes;
    if (!read_step_fields(sched, PyTuple_GET_ITEM(targets, OF_SCHED_TYPE), PyTuple_GET_ITEM(targets, OF_CACHED_TYPE),
                          last_step_id, fields, cached, &changes)
        || PyDict_GET_SIZE(fields[STEP_DRAFTS])) {
        release_step_fields(fields, cached);
        Py_RETURN_NOTIMPLEMENTED;
    }
    result = general_read(self, cached[CACHED_IDS], cached[CACHED_COMPUTED], cached[CACHED_BLOCKS], fields[STEP_SCHEDULED],
                          PyTuple_GET_ITEM(targets, OF_REQ_TO_ROW), fields[STEP_FINISHED], fields[STEP_PREEMPTED],
                          fields[STEP_NEW], PyTuple_GET_ITEM(targets, OF_CHECK), PyTuple_GET_ITEM(targets, OF_CHECK_ARGS),
                          limits[0], PyTuple_GET_ITEM(targets, OF_NUM_COMPUTED), PyTuple_GET_ITEM(targets, OF_NUM_BLOCKS),
                          PyTuple_GET_ITEM(targets, OF_NUM_TOKENS), limits[1], limits[2], limits[3], limits[4], args[3],
                          args[4]);
    release_step_fields(fields, cached);
    if (result == NULL || !PyTuple_CheckExact(result))
        return result;  /* NotImplemented, or an error */
    PyObject *step = step_arrays(PyTuple_GET_ITEM(targets, OF_STEP_TYPE), PyTuple_GET_ITEM(targets, OF_STEP_FIELDS),
                                 PyTuple_GET_ITEM(targets, OF_ZEROS), result);
    if (step == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(result);
            return NULL;
        }
        return result;  /* the tuple: read_step makes the StepArrays */
    }
    Py_DECREF(result);
    return step;
}

static PyMethodDef methods[] = {
    {"read_cached", read_cached, METH_VARARGS, "The cached requests of a general step (see the module's source header)."},
    {"read_scheduled", read_scheduled, METH_VARARGS, "A general step's batch: ids, query lengths, rows and their mirror."},
    {"check_batch", check_batch, METH_VARARGS, "A general step's per-request count rules, and its token total."},
    {"read_general_of", (PyCFunction)(void (*)(void))read_general_of, METH_FASTCALL,
     "read_general with the arguments a runner's steps share in one tuple."},
    {"read_general", read_general, METH_VARARGS, "A general step without drafts: its containers and step id, read_cached, read_scheduled, the new requests, check_batch."},
    {NULL, NULL, 0, NULL},
};

RUNNERCHECK_MODULE("The general step's reading, in C.")
