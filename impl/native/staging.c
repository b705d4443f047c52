/* The staged writes' packing in C (`impl.native`): each function is the twin of a Python reference in
 * its owner's module, which stays the fallback; each only writes the array it is handed, and on any
 * argument it does not take (another type, dtype, shape or a value outside its rule) it returns
 * `NotImplemented` before writing anything, and the caller runs the reference.
 *
 * pack_ragged -- `impl.staged_writes.StagedWriteGroup._flush_one_ragged`'s diff table (its owner's slot words):
 *     words[3i:3i+3] = (rows[i] * cols + starts[i] + word_offset, lens[i], sum(lens[:i])), then the values
 *     as int32 after the 3n meta words.  pack_ragged(words, rows, starts, lens, values, cols, word_offset)
 *     -> True | NotImplemented.
 *
 * pack_parts -- the general `StagedWriteGroup.flush`'s diff table, from the parts it gathered and its cell
 *     tables (reference: `StagedWriteGroup._take_cells`, then `_fill_diff_table` over `_join_parts`): the
 *     diffs of every (destinations, lengths) part in order, then one diff per cell of each table in order,
 *     as (destination, length, source) with the sources counting up through the lengths; then every word
 *     part in order, then the cells' values.  pack_parts(words, dst_parts, len_parts, word_parts,
 *     cell_tables=()) -> True | NotImplemented.  The parts are lists of 1-D arrays (int64, int64, int32);
 *     ``cell_tables`` a tuple of (dict, element code) pairs -- destination word (exact int) -> value, code 0 int32
 *     (exact int in range), 1 float32 (exact float within float32's range, or not finite), 2 int64 (exact
 *     int in range, two words).  ``words`` (int32) must hold exactly the table and the values.
 *
 * prompt_bitmask -- `impl.sample.state.prompt_bitmask_words`: bit t % 32 of word t // 32 set for each token t.
 *     prompt_bitmask(words, tokens, vocab_size) -> True | NotImplemented.  ``tokens`` an exact tuple or list
 *     of exact ints in [0, vocab_size); ``words`` int32 of (vocab_size + 31) // 32 words (overwritten).
 *
 * Built at run time by `impl.native`; the planted-bug tests build variants with
 * -DRUNNERCHECK_PLANT_SOURCE_ZERO (diff tables whose every source offset is 0) and
 * -DRUNNERCHECK_PLANT_MASK_BIT31_LOST (a bitmask that never sets bit 31 of a word).
 */
#include "arrays.h"

#include <float.h>
#include <math.h>
#include <string.h>

#ifdef RUNNERCHECK_PLANT_SOURCE_ZERO
#define SOURCE_OF(source) 0
#else
#define SOURCE_OF(source) (source)
#endif

static PyObject *pack_ragged(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *words_obj, *rows_obj, *starts_obj, *lens_obj, *values_obj;
    long long cols, word_offset;
    if (!PyArg_ParseTuple(args, "OOOOOLL", &words_obj, &rows_obj, &starts_obj, &lens_obj, &values_obj, &cols,
                          &word_offset))
        return NULL;
    ArrayView words, rows, starts, lens, values;
    if (!array_view(words_obj, NPY_INT32, 1, &words) || !int64_view(rows_obj, &rows) || !int64_view(starts_obj, &starts)
        || !int64_view(lens_obj, &lens) || !int64_view(values_obj, &values))
        Py_RETURN_NOTIMPLEMENTED;
    const npy_intp n = rows.len;
    if (starts.len != n || lens.len != n || words.len != 3 * n + values.len)
        Py_RETURN_NOTIMPLEMENTED;
    npy_int64 total = 0;
    for (npy_intp i = 0; i < n; i++)
        total += AT(lens, i);
    if (total != values.len)
        Py_RETURN_NOTIMPLEMENTED;
    npy_int64 source = 0;
    for (npy_intp i = 0; i < n; i++) {
        OUT32(words, 3 * i) = (npy_int32)(AT(rows, i) * cols + AT(starts, i) + word_offset);
        OUT32(words, 3 * i + 1) = (npy_int32)AT(lens, i);
        OUT32(words, 3 * i + 2) = (npy_int32)SOURCE_OF(source);
        source += AT(lens, i);
    }
    for (npy_intp j = 0; j < values.len; j++)
        OUT32(words, 3 * n + j) = (npy_int32)AT(values, j);
    Py_RETURN_TRUE;
}

#define MAX_PARTS 256

/* Views of a list's arrays of ``type`` (at most MAX_PARTS); their count, or -1 when one is not usable. */
static Py_ssize_t part_views(PyObject *list, int type, ArrayView *views)
{
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) > MAX_PARTS)
        return -1;
    Py_ssize_t count = PyList_GET_SIZE(list);
    for (Py_ssize_t p = 0; p < count; p++)
        if (!array_view(PyList_GET_ITEM(list, p), type, 0, &views[p]))
            return -1;
    return count;
}

#define WORD_AT(view, i) (*(const npy_int32 *)((view).data + (npy_intp)(i) * (view).stride))

enum { CELL_INT32 = 0, CELL_FLOAT32 = 1, CELL_INT64 = 2, CELL_CODES = 3 };

/* One cell's value as its words (1, or 2 for int64: the in-memory halves, as numpy's int32 view has them);
 * 0 when the value is not one the reference converts the same way. */
static int cell_words(PyObject *value, long code, npy_int32 *out)
{
    if (code == CELL_FLOAT32) {
        if (!PyFloat_CheckExact(value))
            return 0;
        double v = PyFloat_AS_DOUBLE(value);
        if (isfinite(v) && (v > FLT_MAX || v < -FLT_MAX))
            return 0;  /* numpy warns and rounds to infinity: left to it */
        float f = (float)v;
        memcpy(out, &f, sizeof f);
        return 1;
    }
    long long v;
    if (exact_int(value, &v) != EXACT_INT)
        return 0;
    if (code == CELL_INT32) {
        if (v < NPY_MIN_INT32 || v > NPY_MAX_INT32)
            return 0;
        out[0] = (npy_int32)v;
        return 1;
    }
    npy_int64 wide = (npy_int64)v;
    memcpy(out, &wide, sizeof wide);
    return 2;
}

/* The cell tables' (dict, code) pairs: their count of cells and of value words, or 0 when one is not usable. */
static int cell_tables_size(PyObject *tables, npy_intp *cells, npy_intp *value_words)
{
    *cells = *value_words = 0;
    if (!PyTuple_CheckExact(tables))
        return 0;
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(tables); t++) {
        PyObject *pair = PyTuple_GET_ITEM(tables, t);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyDict_CheckExact(PyTuple_GET_ITEM(pair, 0)))
            return 0;
        long long code;
        if (exact_int(PyTuple_GET_ITEM(pair, 1), &code) != EXACT_INT || code < 0 || code >= CELL_CODES)
            return 0;
        PyObject *dict = PyTuple_GET_ITEM(pair, 0), *key, *value;
        Py_ssize_t pos = 0;
        npy_int32 scratch[2];
        while (PyDict_Next(dict, &pos, &key, &value)) {
            long long dst;
            if (exact_int(key, &dst) != EXACT_INT)
                return 0;
            int words = cell_words(value, (long)code, scratch);
            if (!words)
                return 0;
            *cells += 1;
            *value_words += words;
        }
    }
    return 1;
}

static PyObject *pack_parts(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *words_obj, *dst_list, *len_list, *value_list, *tables = NULL;
    if (!PyArg_ParseTuple(args, "OOOO|O", &words_obj, &dst_list, &len_list, &value_list, &tables))
        return NULL;
    ArrayView words, dst[MAX_PARTS], lens[MAX_PARTS], values[MAX_PARTS];
    if (!array_view(words_obj, NPY_INT32, 1, &words))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t num_dst = part_views(dst_list, NPY_INT64, dst), num_lens = part_views(len_list, NPY_INT64, lens);
    Py_ssize_t num_values = part_views(value_list, NPY_INT32, values);
    if (num_dst < 0 || num_lens != num_dst || num_values < 0)
        Py_RETURN_NOTIMPLEMENTED;
    npy_intp num_cells = 0, cell_value_words = 0;
    if (tables != NULL && !cell_tables_size(tables, &num_cells, &cell_value_words))
        Py_RETURN_NOTIMPLEMENTED;
    npy_intp n = 0, value_words = 0;
    npy_int64 length_total = 0;
    for (Py_ssize_t p = 0; p < num_dst; p++) {
        if (dst[p].len != lens[p].len)
            Py_RETURN_NOTIMPLEMENTED;
        n += lens[p].len;
        for (npy_intp i = 0; i < lens[p].len; i++) {
            npy_int64 length = AT(lens[p], i);
            if (length < 0 || length > NPY_MAX_INT32)
                Py_RETURN_NOTIMPLEMENTED;
            length_total += length;  /* at most MAX_PARTS x 2^31 x 2^31: no overflow in 64 bits */
        }
    }
    for (Py_ssize_t p = 0; p < num_values; p++)
        value_words += values[p].len;
    if (length_total != value_words || words.len != 3 * (n + num_cells) + value_words + cell_value_words)
        Py_RETURN_NOTIMPLEMENTED;
    npy_intp d = 0;
    npy_int64 source = 0;
    for (Py_ssize_t p = 0; p < num_dst; p++)
        for (npy_intp i = 0; i < lens[p].len; i++, d++) {
            OUT32(words, 3 * d) = (npy_int32)AT(dst[p], i);
            OUT32(words, 3 * d + 1) = (npy_int32)AT(lens[p], i);
            OUT32(words, 3 * d + 2) = (npy_int32)SOURCE_OF(source);
            source += AT(lens[p], i);
        }
    npy_intp w = 3 * (n + num_cells);
    for (Py_ssize_t p = 0; p < num_values; p++)
        for (npy_intp j = 0; j < values[p].len; j++)
            OUT32(words, w++) = WORD_AT(values[p], j);
    for (Py_ssize_t t = 0; tables != NULL && t < PyTuple_GET_SIZE(tables); t++) {
        PyObject *pair = PyTuple_GET_ITEM(tables, t), *key, *value;
        long code = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
        Py_ssize_t pos = 0;
        while (PyDict_Next(PyTuple_GET_ITEM(pair, 0), &pos, &key, &value)) {
            npy_int32 cell[2];
            int length = cell_words(value, code, cell);
            OUT32(words, 3 * d) = (npy_int32)PyLong_AsLongLong(key);
            OUT32(words, 3 * d + 1) = length;
            OUT32(words, 3 * d + 2) = (npy_int32)SOURCE_OF(source);
            source += length;
            d++;
            for (int k = 0; k < length; k++)
                OUT32(words, w++) = cell[k];
        }
    }
    Py_RETURN_TRUE;
}

static PyObject *prompt_bitmask(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *words_obj, *tokens;
    long long vocab_size;
    if (!PyArg_ParseTuple(args, "OOL", &words_obj, &tokens, &vocab_size))
        return NULL;
    ArrayView words;
    if (vocab_size < 1 || !array_view(words_obj, NPY_INT32, 1, &words) || words.len != (vocab_size + 31) / 32
        || !(PyTuple_CheckExact(tokens) || PyList_CheckExact(tokens)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(tokens);
    for (Py_ssize_t i = 0; i < count; i++) {
        long long token;
        if (exact_int(items[i], &token) != EXACT_INT || token < 0 || token >= vocab_size)
            Py_RETURN_NOTIMPLEMENTED;
    }
    for (npy_intp j = 0; j < words.len; j++)
        OUT32(words, j) = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long token = PyLong_AsLongLong(items[i]);
        npy_uint32 *word = (npy_uint32 *)(words.data + (npy_intp)(token >> 5) * words.stride);
#ifdef RUNNERCHECK_PLANT_MASK_BIT31_LOST
        if ((token & 31) == 31)
            continue;  /* the planted bug: a signed shift's sign bit dropped */
#endif
        *word |= (npy_uint32)1 << (token & 31);
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"pack_ragged", pack_ragged, METH_VARARGS, "One ragged set of int32 diffs as a staged-write diff table."},
    {"pack_parts", pack_parts, METH_VARARGS, "A general flush's gathered parts as one staged-write diff table."},
    {"prompt_bitmask", prompt_bitmask, METH_VARARGS, "The prompt-token bitmask words of one sampling-state row."},
    {NULL, NULL, 0, NULL},
};

RUNNERCHECK_MODULE("The staged writes' packing, in C.")
