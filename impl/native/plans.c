/* The plain step plan in C (`impl.native`): the twin of `impl.input_batch._plain_plan`, which stays the reference and
 * the fallback, and is called by `impl.input_batch.plan_step` first.
 *
 * plain_plan -- the `StepPlan` of a checked step without drafts, logprobs or prompt logprobs: the step's own arrays
 *     (its ids, query starts and lengths, draft counts, counts and bounds), its rows as int32, the plan parts every
 *     plan of its request count shares (``parts``: draft starts, logit-row starts int32 and int64, logprob counts),
 *     the empty draft, prompt-index and prompt-target arrays, no prompt requests, -1 for both logprob maxima, the
 *     shared (query length, 0) when every request has one, the request count and 0 prompt rows.
 *     plain_plan(targets, step, parts) -> StepPlan, or NotImplemented (a step or plan type whose slots are not the
 *     fields it names, rows that are not a 1-D int64 array, a step with drafts, parts of another shape).
 *     ``targets``: (StepPlan, its fields, StepArrays, its fields, the empty drafts, prompt index and prompt targets).
 *     Each instance is read and made slot by slot (slots.h): no Python frame.
 *
 * Built by setup.py as the extension `runnercheck.impl.native._plans` (impl/native/__init__.py says when and how).
 * The tests' planted bugs are not switches in this file: each is a patch applied to a copy of it
 * (tests/impl/native_plants.py).
 */
#include "arrays.h"

#include "slots.h"
#include "step_arrays.h"

enum {
    PLAN_REQ_IDS, PLAN_ROWS, PLAN_CU, PLAN_DRAFT_START, PLAN_DRAFTS, PLAN_LOGITS_START, PLAN_PROMPT_TOKEN_INDEX,
    PLAN_PROMPT_TARGETS, PLAN_PROMPT_REQUESTS, PLAN_NUM_LOGPROBS, PLAN_NUM_TOKENS, PLAN_MAX_QUERY_LEN, PLAN_MAX_SEQ_LEN,
    PLAN_MAX_NUM_LOGPROBS, PLAN_MAX_NUM_PROMPT_LOGPROBS, PLAN_QUERY_LENS, PLAN_NUM_DRAFTS, PLAN_UNIFORM,
    PLAN_LOGITS_START64, PLAN_NUM_REQS, PLAN_NUM_PROMPT_ROWS, NUM_PLAN_FIELDS,
};

/* `impl.input_batch.StepPlan`'s fields, in order. */
static const char *const PLAN_FIELDS[NUM_PLAN_FIELDS] = {
    "req_ids", "rows", "cu", "draft_start", "drafts", "logits_start", "prompt_token_index", "prompt_targets",
    "prompt_requests", "num_logprobs", "num_tokens", "max_query_len", "max_seq_len", "max_num_logprobs",
    "max_num_prompt_logprobs", "query_lens", "num_drafts", "uniform", "logits_start64", "num_reqs", "num_prompt_rows",
};

enum { T_PLAN_TYPE, T_PLAN_FIELDS, T_STEP_TYPE, T_STEP_FIELDS, T_NO_DRAFTS, T_NO_PROMPT_INDEX, T_NO_PROMPT_TARGETS,
       NUM_PLAN_TARGETS };

static SlotsLayout plan_layout, step_layout;

static PyObject *plain_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "plain_plan takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *targets = args[0], *step = args[1], *parts = args[2];
    if (!PyTuple_CheckExact(targets) || PyTuple_GET_SIZE(targets) != NUM_PLAN_TARGETS || !PyTuple_CheckExact(parts)
        || PyTuple_GET_SIZE(parts) != 4
        || !slots_layout(&plan_layout, PyTuple_GET_ITEM(targets, T_PLAN_TYPE), PyTuple_GET_ITEM(targets, T_PLAN_FIELDS),
                         PLAN_FIELDS, NUM_PLAN_FIELDS)
        || !slots_layout(&step_layout, PyTuple_GET_ITEM(targets, T_STEP_TYPE), PyTuple_GET_ITEM(targets, T_STEP_FIELDS),
                         STEP_ARRAYS_FIELDS, NUM_STEP_ARRAYS)
        || (PyObject *)Py_TYPE(step) != (PyObject *)step_layout.type)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *req_ids = slot_get(&step_layout, step, SA_REQ_IDS), *rows = slot_get(&step_layout, step, SA_ROWS);
    PyObject *uniform_len = slot_get(&step_layout, step, SA_UNIFORM_QUERY_LEN);
    ArrayView rows64;
    long long uniform;
    for (int k = 0; k < NUM_STEP_ARRAYS; k++)
        if (slot_get(&step_layout, step, k) == NULL)  /* a slot never set: the reference raises */
            Py_RETURN_NOTIMPLEMENTED;
    if (!PyTuple_CheckExact(req_ids) || !int64_view(rows, &rows64) || rows64.len != PyTuple_GET_SIZE(req_ids)
        || slot_get(&step_layout, step, SA_DRAFTS) != Py_None || exact_int(uniform_len, &uniform) != EXACT_INT)
        Py_RETURN_NOTIMPLEMENTED;
    npy_intp n = rows64.len;
    PyObject *rows32 = PyArray_SimpleNew(1, &n, NPY_INT32);
    PyObject *num_reqs = PyLong_FromSsize_t(n), *zero = PyLong_FromLong(0), *minus_one = PyLong_FromLong(-1);
    PyObject *shared = NULL, *plan = NULL;
    if (!rows32 || !num_reqs || !zero || !minus_one)
        goto done;
    npy_int32 *out = (npy_int32 *)PyArray_DATA((PyArrayObject *)rows32);
    for (npy_intp i = 0; i < n; i++)
        out[i] = (npy_int32)AT(rows64, i);  /* rows of a checked step: within the table, int32 */
    if (uniform >= 0 && !(shared = PyTuple_Pack(2, uniform_len, zero)))
        goto done;
    PyObject *values[NUM_PLAN_FIELDS] = {
        [PLAN_REQ_IDS] = req_ids, [PLAN_ROWS] = rows32, [PLAN_CU] = slot_get(&step_layout, step, SA_QUERY_STARTS),
        [PLAN_DRAFT_START] = PyTuple_GET_ITEM(parts, 0), [PLAN_DRAFTS] = PyTuple_GET_ITEM(targets, T_NO_DRAFTS),
        [PLAN_LOGITS_START] = PyTuple_GET_ITEM(parts, 1),
        [PLAN_PROMPT_TOKEN_INDEX] = PyTuple_GET_ITEM(targets, T_NO_PROMPT_INDEX),
        [PLAN_PROMPT_TARGETS] = PyTuple_GET_ITEM(targets, T_NO_PROMPT_TARGETS), [PLAN_PROMPT_REQUESTS] = NULL,
        [PLAN_NUM_LOGPROBS] = PyTuple_GET_ITEM(parts, 3), [PLAN_NUM_TOKENS] = slot_get(&step_layout, step, SA_NUM_TOKENS),
        [PLAN_MAX_QUERY_LEN] = slot_get(&step_layout, step, SA_MAX_QUERY_LEN),
        [PLAN_MAX_SEQ_LEN] = slot_get(&step_layout, step, SA_MAX_END), [PLAN_MAX_NUM_LOGPROBS] = minus_one,
        [PLAN_MAX_NUM_PROMPT_LOGPROBS] = minus_one, [PLAN_QUERY_LENS] = slot_get(&step_layout, step, SA_QUERY_LENS),
        [PLAN_NUM_DRAFTS] = slot_get(&step_layout, step, SA_NUM_DRAFTS), [PLAN_UNIFORM] = shared ? shared : Py_None,
        [PLAN_LOGITS_START64] = PyTuple_GET_ITEM(parts, 2), [PLAN_NUM_REQS] = num_reqs, [PLAN_NUM_PROMPT_ROWS] = zero,
    };
    if (!(values[PLAN_PROMPT_REQUESTS] = PyTuple_New(0)))
        goto done;
    plan = slots_new(&plan_layout, values, NUM_PLAN_FIELDS);
    Py_DECREF(values[PLAN_PROMPT_REQUESTS]);
done:
    Py_XDECREF(rows32);
    Py_XDECREF(num_reqs);
    Py_XDECREF(zero);
    Py_XDECREF(minus_one);
    Py_XDECREF(shared);
    return plan;
}

static PyMethodDef methods[] = {
    {"plain_plan", (PyCFunction)(void (*)(void))plain_plan, METH_FASTCALL,
     "The StepPlan of a step without drafts, logprobs or prompt logprobs (impl.input_batch._plain_plan)."},
    {NULL, NULL, 0, NULL},
};

RUNNERCHECK_MODULE("The plain step plan, in C; see the source's header.")
