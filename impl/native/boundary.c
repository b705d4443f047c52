/* The admission boundary's checks in C (`impl.native`): the twin of `impl.boundary.check_new_request`, which
 * stays the reference, names every rejection and decides every request this function does not.
 *
 * check_new_request -- everything about one new request that needs no runner state (its id, token lists,
 *     sampling parameters as `impl.interface.SamplingParams.validate` checks them, prefill length, block ids
 *     and prefix-cache hit as `impl.boundary.validate_prefix_hit` checks it).
 *
 *     check_new_request(req, new_request_type, sampling_params_type, vocab_size, max_logprobs, max_model_len,
 *                       num_kv_blocks, max_blocks, block_size, max_seed, rules)
 *       -> NotImplemented | None | prefill length
 *
 *     ``rules``: the sampling fields' rules from the interface's table (`impl.step_reader.BOUNDARY_RULES`), so
 *     that a new field needs no C here.
 *
 *     It decides only requests whose every inspected object has its exact expected type: the request and
 *     its parameters of exactly the two given classes, the id a `str`, token and block lists `tuple` or
 *     `list` of `int`, counts and ids `int` (of 64 bits), float parameters `int` or `float`, optional ones
 *     `None` or `int`.  Then no comparison can call user code, and the verdict -- the prefill length, or
 *     None when a rule fails (the reference then raises the error that names it) -- is a pure function of
 *     the values.  On any other request it returns NotImplemented before deciding, and the reference
 *     decides.  It only reads.
 *
 * Built by setup.py as the extension `runnercheck.impl.native._boundary` (impl/native/__init__.py says when and how).
 * The tests' planted bugs are not switches in this file: each is a patch applied to a copy of it
 * (tests/impl/native_plants.py).
 */
#include "arrays.h"

#include <math.h>

enum { UNDECIDED = -1, REJECT = 0, ACCEPT = 1 };

/* A number parameter (exact int of 64 bits or exact float) as a double, for a check that does not depend on
 * the int's last bits (comparisons with small bounds); UNDECIDED for any other object. */
static int number(PyObject *value, double *out)
{
    if (PyFloat_CheckExact(value)) {
        *out = PyFloat_AS_DOUBLE(value);
        return ACCEPT;
    }
    long long v;
    if (exact_int(value, &v) != EXACT_INT)
        return UNDECIDED;
    *out = (double)v;
    return ACCEPT;
}

/* A token or block-id list: an exact tuple or list of exact ints; REJECT when one lies outside [0, bound). */
static int id_list(PyObject *list, long long bound, Py_ssize_t *count)
{
    if (!PyTuple_CheckExact(list) && !PyList_CheckExact(list))
        return UNDECIDED;
    PyObject **items = PySequence_Fast_ITEMS(list);
    *count = PySequence_Fast_GET_SIZE(list);
    int verdict = ACCEPT;
    for (Py_ssize_t i = 0; i < *count; i++) {
        long long v;
        int kind = exact_int(items[i], &v);
        if (kind == 0)
            return UNDECIDED;
        if (kind == EXACT_INT_TOO_BIG || v < 0 || v >= bound)
            verdict = REJECT;  /* the whole list is still read: a later odd type leaves the request undecided */
    }
    return verdict;
}

/* An optional count (None, or an exact int >= 0 and <= limit). */
static int optional_count(PyObject *value, long long limit, int *is_none)
{
    *is_none = value == Py_None;
    if (*is_none)
        return ACCEPT;
    long long v;
    int kind = exact_int(value, &v);
    if (kind == 0)
        return UNDECIDED;
    return kind == EXACT_INT && v >= 0 && v <= limit ? ACCEPT : REJECT;
}

/* The sampling fields' rules, as the interface's table states them (`impl.step_reader.BOUNDARY_RULES`, handed over
 * with the limits): per field (name, is int, neutral, low, high, low open, high open), the bounds as floats (an
 * absent one infinite).  A value is valid when it is the neutral one or lies within the bounds, and a float field's
 * value is finite -- `SamplingField.accepts`.  Nothing here names a field: a new one in the table needs no C. */
enum { MAX_RULES = 16 };

static int field_rules(PyObject *params, PyObject *rules)
{
    if (!PyTuple_CheckExact(rules) || PyTuple_GET_SIZE(rules) > MAX_RULES)
        return UNDECIDED;
    int verdict = ACCEPT;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(rules); i++) {
        PyObject *rule = PyTuple_GET_ITEM(rules, i);
        if (!PyTuple_CheckExact(rule) || PyTuple_GET_SIZE(rule) != 7 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(rule, 0))
            || !PyFloat_CheckExact(PyTuple_GET_ITEM(rule, 2)) || !PyFloat_CheckExact(PyTuple_GET_ITEM(rule, 3))
            || !PyFloat_CheckExact(PyTuple_GET_ITEM(rule, 4)))
            return UNDECIDED;
        const int is_int = PyTuple_GET_ITEM(rule, 1) == Py_True;
        const double neutral = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(rule, 2)), low = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(rule, 3)),
                     high = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(rule, 4));
        const int low_open = PyTuple_GET_ITEM(rule, 5) == Py_True, high_open = PyTuple_GET_ITEM(rule, 6) == Py_True;
        PyObject *field = PyObject_GetAttr(params, PyTuple_GET_ITEM(rule, 0));
        if (!field)
            return UNDECIDED;
        double v;
        long long as_int;
        /* An int field: an exact int of 64 bits (beyond them, valid or not by its sign: the reference decides). */
        int kind = is_int ? (exact_int(field, &as_int) == EXACT_INT ? ACCEPT : UNDECIDED) : number(field, &v);
        Py_DECREF(field);
        if (kind == UNDECIDED)
            return UNDECIDED;
        if (is_int)
            v = (double)as_int;  /* compared with small bounds only: its last bits do not matter */
        int above_low = low_open ? v > low : v >= low;
        const int within = above_low && (high_open ? v < high : v <= high);
        if (!isfinite(v) || !(v == neutral || within))
            verdict = REJECT;
    }
    return verdict;
}

/* `SamplingParams.validate`'s rules on exactly typed fields: the table's fields by ``rules``, then the rest. */
static int sampling_params(PyObject *params, PyObject *rules, long long vocab_size, long long max_logprobs,
                           long long max_seed, int *asks_prompt_logprobs)
{
    int verdict = field_rules(params, rules);
    if (verdict == UNDECIDED)
        return UNDECIDED;

    long long max_tokens = 0;
    PyObject *max_tokens_obj = attr(params, "max_tokens");
    if (!max_tokens_obj)
        return UNDECIDED;
    int max_tokens_kind = exact_int(max_tokens_obj, &max_tokens);
    Py_DECREF(max_tokens_obj);
    if (max_tokens_kind != EXACT_INT)  /* another type, or beyond 64 bits (valid or not by its sign): the reference decides */
        return UNDECIDED;
    if (max_tokens < 1)
        verdict = REJECT;

    static const char *optionals[] = {"seed", "logprobs", "prompt_logprobs"};
    long long limits[] = {max_seed, max_logprobs, max_logprobs};
    for (int i = 0; i < 3; i++) {
        PyObject *field = attr(params, optionals[i]);
        if (!field)
            return UNDECIDED;
        int is_none, kind = optional_count(field, limits[i], &is_none);
        Py_DECREF(field);
        if (kind == UNDECIDED)
            return UNDECIDED;
        if (kind == REJECT)
            verdict = REJECT;
        if (i == 2)
            *asks_prompt_logprobs = !is_none;
    }

    /* ``logprobs_mode``: the default "raw" is decided here; anything else ("processed", or a bad value the
       reference names with `LogprobsModeError`) is left to the reference. */
    PyObject *mode = attr(params, "logprobs_mode");
    if (!mode)
        return UNDECIDED;
    int raw_mode = PyUnicode_CheckExact(mode) && PyUnicode_CompareWithASCIIString(mode, "raw") == 0;
    Py_DECREF(mode);
    if (!raw_mode)
        return UNDECIDED;

    PyObject *stops = attr(params, "stop_token_ids");
    if (!stops)
        return UNDECIDED;
    Py_ssize_t num_stops;
    int kind = id_list(stops, vocab_size, &num_stops);
    Py_DECREF(stops);
    if (kind == UNDECIDED)
        return UNDECIDED;
    return kind == REJECT ? REJECT : verdict;
}

static PyObject *check_new_request(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *req, *request_type, *params_type;
    PyObject *rules;
    long long vocab_size, max_logprobs, max_model_len, num_kv_blocks, max_blocks, block_size, max_seed;
    if (!PyArg_ParseTuple(args, "OOOLLLLLLLO!", &req, &request_type, &params_type, &vocab_size, &max_logprobs,
                          &max_model_len, &num_kv_blocks, &max_blocks, &block_size, &max_seed, &PyTuple_Type, &rules))
        return NULL;
    if ((PyObject *)Py_TYPE(req) != request_type || block_size < 1)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *fields[6] = {NULL};
    static const char *names[] = {"req_id", "sampling_params", "prompt_token_ids", "output_token_ids", "block_ids",
                                  "num_computed_tokens"};
    int verdict = UNDECIDED;
    for (int i = 0; i < 6; i++) {
        fields[i] = attr(req, names[i]);
        if (!fields[i]) {
            PyErr_Clear();
            goto done;
        }
    }
    PyObject *rid = fields[0], *params = fields[1], *prompt = fields[2], *outputs = fields[3], *blocks = fields[4];
    if (!PyUnicode_CheckExact(rid) || (PyObject *)Py_TYPE(params) != params_type)
        goto done;
    Py_ssize_t prompt_len, output_len, num_blocks;
    int checks[3] = {id_list(prompt, vocab_size, &prompt_len), id_list(outputs, vocab_size, &output_len),
                     id_list(blocks, num_kv_blocks, &num_blocks)};
    long long hit;
    int hit_kind = exact_int(fields[5], &hit);
    if (checks[0] == UNDECIDED || checks[1] == UNDECIDED || checks[2] == UNDECIDED || hit_kind == 0)
        goto done;
    int asks_prompt_logprobs = 0;
    int params_verdict = sampling_params(params, rules, vocab_size, max_logprobs, max_seed, &asks_prompt_logprobs);
    if (params_verdict == UNDECIDED) {
        PyErr_Clear();
        goto done;
    }
    long long prefill_len = (long long)prompt_len + output_len;
    verdict = ACCEPT;
    if (PyUnicode_GET_LENGTH(rid) == 0 || checks[0] == REJECT || checks[1] == REJECT || checks[2] == REJECT
        || prompt_len == 0 || params_verdict == REJECT || prefill_len > max_model_len || num_blocks > max_blocks)
        verdict = REJECT;
    if (hit_kind == EXACT_INT_TOO_BIG || hit < 0)
        verdict = REJECT;
    else if (hit > 0 && (hit % block_size || hit >= prefill_len || (long long)num_blocks * block_size < hit
                         || asks_prompt_logprobs))
        verdict = REJECT;
    if (verdict == ACCEPT) {
        for (int i = 0; i < 6; i++)
            Py_DECREF(fields[i]);
        return PyLong_FromLongLong(prefill_len);
    }

done:
    for (int i = 0; i < 6; i++)
        Py_XDECREF(fields[i]);
    if (verdict == REJECT)
        Py_RETURN_NONE;
    Py_RETURN_NOTIMPLEMENTED;
}

static PyMethodDef methods[] = {
    {"check_new_request", check_new_request, METH_VARARGS, "One new request's stateless checks (see the source header)."},
    {NULL, NULL, 0, NULL},
};

RUNNERCHECK_MODULE("The admission boundary's checks, in C.")
