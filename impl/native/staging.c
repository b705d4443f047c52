/* The staged writes' packing in C (`impl.native`): each function is the twin of a Python reference in
 * its owner's module, which stays the fallback; each only writes the array it is handed, and on any
 * argument it does not take (another type, dtype, shape or a value outside its rule) it returns
 * `NotImplemented` before writing anything, and the caller runs the reference.
 *
 * pack_ragged -- `impl.staged_writes.StagedWriteGroup._flush_one_ragged`'s diff table (its owner's slot words):
 *     words[3i:3i+3] = (rows[i] * cols + starts[i] + word_offset, lens[i], sum(lens[:i])), then the values
 *     as int32 after the 3n meta words.  pack_ragged(words, rows, starts, lens, values, cols, word_offset)
 *     -> True | NotImplemented; ``words`` exactly the table's words, or, with a last argument ``first``, any
 *     1-D int32 array holding them from word ``first`` on.
 *
 * pack_members -- the general `StagedWriteGroup.flush` as a whole, from its dirty members' pending diffs and
 *     its single-element cells (reference: the flush's numpy path, `_take_cells` and `_join_parts` +
 *     `_fill_diff_table`): one diff (destination, length, source) per row diff, ragged entry and cell, the
 *     sources counting up through the lengths, then the values, in the reference's order -- first every
 *     member's array row diffs and ragged sets in member order, then the list row diffs grouped by element type (the types in
 *     the order their first member with diffs has them, each type's members in order), then the cells.
 *     pack_members(words | None, members, cell_tables) -> (diffs, value words, written) | NotImplemented: the
 *     table's size (3 * diffs + value words), and whether it was written at the start of ``words`` (a 1-D int32
 *     array at least that long; the words after it are not touched); None or a shorter array: nothing written,
 *     the size to reserve.  A member is (word offset, columns,
 *     element code, merged diffs, ragged sets): diffs (row, start, values) with values an exact list of numbers
 *     (converted as a cell is) or a 1-D array of the member's own dtype; ragged sets (rows, starts, lengths,
 *     values), int64 arrays, of an int32 member only.  ``cell_tables`` a tuple of (dict, element code) pairs --
 *     destination word (exact int) -> value, code 0 int32 (exact int in range), 1 float32 (exact float within
 *     float32's range, or not finite), 2 int64 (exact int in range, two words).
 *     pack_members(words, members, cell_tables, (records, layout)): the sampling state's admission records too,
 *     after the cells (reference: `SamplingState._stage_admissions`, which stages them as cells and a mask row
 *     diff before the numpy path): per record (a dict row -> (parameter values, prompt token ids)) its
 *     cells, then its prompt mask row (bit t % 32 of word t // 32 for each token t) as one diff; the layout
 *     (the parameter members' word offsets and element codes -- the interface's sampling fields and the seed,
 *     1 to MAX_PARAMS of them --, the mask's word offset and words per row, the vocabulary size, the rows).
 *     pack_members(words, members, cell_tables, admissions, list_rows) -> (diffs, value words, written, listed):
 *     with ``list_rows`` True, the admitted rows (the records' keys, in the dict's order) are written as ``listed``
 *     int32 words right after the table (the owner's count reset reads them there: `SamplingState.flush`); the
 *     words to reserve are then 3 * diffs + value words + listed.  ``list_rows`` False: listed is 0.  A sixth
 *     argument ``first``: the table is written from word ``first`` of ``words`` on (default 0; past its end:
 *     NotImplemented).
 *
 * prompt_bitmask -- `impl.sample.state.prompt_bitmask_words`: bit t % 32 of word t // 32 set for each token t.
 *     prompt_bitmask(words, tokens, vocab_size) -> True | NotImplemented.  ``tokens`` an exact tuple or list
 *     of exact ints in [0, vocab_size); ``words`` int32 of (vocab_size + 31) // 32 words (overwritten).
 *
 * put_words -- `impl.input_batch.InputBatch.stage`'s writes of the step's header and compact arrays into its slot
 *     (reference: numpy element and slice assignments through the slot's views): put_words(words, parts) -> True |
 *     NotImplemented, ``words`` the slot's int32 words, each part (first word, values) with values a tuple of exact
 *     ints within int32 or a 1-D int32 array, written from that word on; NotImplemented, nothing written, when a
 *     part is not such a pair or does not fit.
 *
 * Built by setup.py as the extension `runnercheck.impl.native._staging` (impl/native/__init__.py says when and how).
 * The tests' planted bugs are not switches in this file: each is a patch applied to a copy of it
 * (tests/impl/native_plants.py).
 */
#include "arrays.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define SOURCE_OF(source) (source)

/* ``view`` from its word ``first`` on (a slot's words from a reservation's first word: no numpy view made for it);
 * 0 when ``first`` lies outside it. */
static int from_word(ArrayView *view, long long first)
{
    if (first < 0 || first > view->len)
        return 0;
    view->data += (npy_intp)first * view->stride;
    view->len -= (npy_intp)first;
    return 1;
}

static PyObject *pack_ragged(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *words_obj, *rows_obj, *starts_obj, *lens_obj, *values_obj;
    long long cols, word_offset, first = -1;
    if (!PyArg_ParseTuple(args, "OOOOOLL|L", &words_obj, &rows_obj, &starts_obj, &lens_obj, &values_obj, &cols,
                          &word_offset, &first))
        return NULL;
    ArrayView words, rows, starts, lens, values;
    if (!array_view(words_obj, NPY_INT32, 1, &words) || !int64_view(rows_obj, &rows) || !int64_view(starts_obj, &starts)
        || !int64_view(lens_obj, &lens) || !int64_view(values_obj, &values))
        Py_RETURN_NOTIMPLEMENTED;
    const npy_intp n = rows.len;
    if (first >= 0) {  /* the table at ``first``, in a longer array */
        if (!from_word(&words, first) || words.len < 3 * n + values.len)
            Py_RETURN_NOTIMPLEMENTED;
        words.len = 3 * n + values.len;
    }
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

enum { MAX_MEMBERS = 64 };

typedef struct {
    long long offset, cols, code;
    PyObject *diffs, *ragged;
} Member;

static const int CODE_WORDS[CELL_CODES] = {1, 1, 2};
static const int CODE_TYPES[CELL_CODES] = {NPY_INT32, NPY_FLOAT32, NPY_INT64};

/* Emit one diff: its meta words at ``d`` and its value words at ``w`` (when writing), then advance both. */
typedef struct {
    ArrayView *words;  /* NULL: count only */
    npy_intp diffs, value_words;
    npy_int64 source;
} Packer;

static void emit_meta(Packer *pk, npy_int64 dst, npy_int64 length)
{
    if (pk->words) {
        OUT32(*pk->words, 3 * pk->diffs) = (npy_int32)dst;
        OUT32(*pk->words, 3 * pk->diffs + 1) = (npy_int32)length;
        OUT32(*pk->words, 3 * pk->diffs + 2) = (npy_int32)SOURCE_OF(pk->source);
    }
    pk->diffs++;
    pk->source += length;
}

/* A row diff (row, start, values) of ``m``: list values only when ``lists``, array values only otherwise.
 * 0 when something is not what the reference converts the same way. */
static int emit_diff(Packer *pk, const Member *m, PyObject *diff, int lists, npy_intp table_words)
{
    long long row, start;
    if (!PyTuple_CheckExact(diff) || PyTuple_GET_SIZE(diff) != 3 || exact_int(PyTuple_GET_ITEM(diff, 0), &row) != EXACT_INT
        || exact_int(PyTuple_GET_ITEM(diff, 1), &start) != EXACT_INT)
        return 0;
    PyObject *values = PyTuple_GET_ITEM(diff, 2);
    const int words_per = CODE_WORDS[m->code];
    const npy_int64 dst = m->offset + (row * m->cols + start) * words_per;
    if (PyList_CheckExact(values)) {
        if (!lists)
            return 1;
        Py_ssize_t count = PyList_GET_SIZE(values);
        emit_meta(pk, dst, (npy_int64)count * words_per);
        for (Py_ssize_t j = 0; j < count; j++) {
            npy_int32 cell[2];
            if (cell_words(PyList_GET_ITEM(values, j), (long)m->code, cell) != words_per)
                return 0;
            for (int k = 0; k < words_per; k++, pk->value_words++)
                if (pk->words)
                    OUT32(*pk->words, table_words + pk->value_words) = cell[k];
        }
        return 1;
    }
    ArrayView array;
    if (!PyArray_CheckExact(values) || !array_view(values, CODE_TYPES[m->code], 0, &array))
        return 0;
    if (lists)
        return 1;
    emit_meta(pk, dst, (npy_int64)array.len * words_per);
    for (npy_intp j = 0; j < array.len; j++)
        for (int k = 0; k < words_per; k++, pk->value_words++)
            if (pk->words)
                OUT32(*pk->words, table_words + pk->value_words) = ((const npy_int32 *)(array.data + j * array.stride))[k];
    return 1;
}

/* A ragged set (rows, starts, lengths, values) of an int32 member. */
static int emit_ragged(Packer *pk, const Member *m, PyObject *set, npy_intp table_words)
{
    ArrayView rows, starts, lens, values;
    if (m->code != CELL_INT32 || !PyTuple_CheckExact(set) || PyTuple_GET_SIZE(set) != 4
        || !int64_view(PyTuple_GET_ITEM(set, 0), &rows) || !int64_view(PyTuple_GET_ITEM(set, 1), &starts)
        || !int64_view(PyTuple_GET_ITEM(set, 2), &lens) || !int64_view(PyTuple_GET_ITEM(set, 3), &values)
        || starts.len != rows.len || lens.len != rows.len)
        return 0;
    npy_int64 total = 0;
    for (npy_intp i = 0; i < lens.len; i++) {
        if (AT(lens, i) < 0)
            return 0;
        total += AT(lens, i);
    }
    if (total != values.len)
        return 0;
    for (npy_intp i = 0; i < rows.len; i++)
        emit_meta(pk, AT(rows, i) * m->cols + AT(starts, i) + m->offset, AT(lens, i));
    for (npy_intp j = 0; j < values.len; j++, pk->value_words++)
        if (pk->words)
            OUT32(*pk->words, table_words + pk->value_words) = (npy_int32)AT(values, j);
    return 1;
}

/* Admission records (`impl.sample.state.SamplingState`'s, deferred to the flush): each row's one-element
 * parameters (the interface's sampling fields, then the seed: as many as the layout lists, at most MAX_PARAMS,
 * `impl.staged_writes.MAX_ADMISSION_SCALARS`) and its prompt bitmask.  The layout: ((word offset of each parameter
 * member), (its element code), prompt mask word offset, mask words per row, vocabulary size, rows). */
enum { MAX_PARAMS = 16 };

typedef struct {
    long long offsets[MAX_PARAMS], codes[MAX_PARAMS], num_params;
    long long mask_offset, mask_words, vocab, num_rows;
} AdmissionLayout;

static int read_layout(PyObject *obj, AdmissionLayout *layout)
{
    if (!PyTuple_CheckExact(obj) || PyTuple_GET_SIZE(obj) != 6)
        return 0;
    PyObject *offsets = PyTuple_GET_ITEM(obj, 0), *codes = PyTuple_GET_ITEM(obj, 1);
    if (!PyTuple_CheckExact(offsets) || !PyTuple_CheckExact(codes) || PyTuple_GET_SIZE(offsets) < 1
        || PyTuple_GET_SIZE(offsets) > MAX_PARAMS || PyTuple_GET_SIZE(codes) != PyTuple_GET_SIZE(offsets))
        return 0;
    layout->num_params = PyTuple_GET_SIZE(offsets);
    for (int k = 0; k < layout->num_params; k++)
        if (exact_int(PyTuple_GET_ITEM(offsets, k), &layout->offsets[k]) != EXACT_INT
            || exact_int(PyTuple_GET_ITEM(codes, k), &layout->codes[k]) != EXACT_INT
            || layout->codes[k] < 0 || layout->codes[k] >= CELL_CODES)
            return 0;
    return exact_int(PyTuple_GET_ITEM(obj, 2), &layout->mask_offset) == EXACT_INT
           && exact_int(PyTuple_GET_ITEM(obj, 3), &layout->mask_words) == EXACT_INT
           && exact_int(PyTuple_GET_ITEM(obj, 4), &layout->vocab) == EXACT_INT
           && exact_int(PyTuple_GET_ITEM(obj, 5), &layout->num_rows) == EXACT_INT
           && layout->vocab >= 1 && layout->mask_words == (layout->vocab + 31) / 32;
}

/* Every record of ``records`` (a dict: row -> (the layout's parameter values, prompt token ids)) as its cells and
 * its mask row; 0 when one is not what the reference (`SamplingState._stage_admissions`) stages the same way. */
static int emit_admissions(Packer *pk, PyObject *records, const AdmissionLayout *layout, npy_intp table_words)
{
    PyObject *key, *record;
    Py_ssize_t pos = 0;
    while (PyDict_Next(records, &pos, &key, &record)) {
        long long row;
        if (exact_int(key, &row) != EXACT_INT || row < 0 || row >= layout->num_rows || !PyTuple_CheckExact(record)
            || PyTuple_GET_SIZE(record) != 2)
            return 0;
        PyObject *values = PyTuple_GET_ITEM(record, 0), *tokens = PyTuple_GET_ITEM(record, 1);
        if (!PyTuple_CheckExact(values) || PyTuple_GET_SIZE(values) != layout->num_params
            || !(PyTuple_CheckExact(tokens) || PyList_CheckExact(tokens)))
            return 0;
        for (int k = 0; k < layout->num_params; k++) {
            npy_int32 cell[2];
            const int words_per = CODE_WORDS[layout->codes[k]];
            if (cell_words(PyTuple_GET_ITEM(values, k), (long)layout->codes[k], cell) != words_per)
                return 0;
            emit_meta(pk, layout->offsets[k] + row * words_per, words_per);
            for (int w = 0; w < words_per; w++, pk->value_words++)
                if (pk->words)
                    OUT32(*pk->words, table_words + pk->value_words) = cell[w];
        }
        PyObject **items = PySequence_Fast_ITEMS(tokens);
        const Py_ssize_t count = PySequence_Fast_GET_SIZE(tokens);
        for (Py_ssize_t i = 0; i < count; i++) {
            long long token;
            if (exact_int(items[i], &token) != EXACT_INT || token < 0 || token >= layout->vocab)
                return 0;
        }
        emit_meta(pk, layout->mask_offset + row * layout->mask_words, layout->mask_words);
        if (pk->words) {
            const npy_intp first = table_words + pk->value_words;
            for (npy_intp j = 0; j < layout->mask_words; j++)
                OUT32(*pk->words, first + j) = 0;
            for (Py_ssize_t i = 0; i < count; i++) {
                long long token = PyLong_AsLongLong(items[i]);
                npy_uint32 *word = (npy_uint32 *)(pk->words->data + (first + (npy_intp)(token >> 5)) * pk->words->stride);
                *word |= (npy_uint32)1 << (token & 31);
            }
        }
        pk->value_words += layout->mask_words;
    }
    return 1;
}

/* The whole table in the reference's order; 0 when a member or cell is not one this function takes. */
static int walk_members(Packer *pk, const Member *members, Py_ssize_t count, PyObject *tables, PyObject *records,
                        const AdmissionLayout *layout, npy_intp table_words)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        const Member *m = &members[i];
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(m->diffs); j++)
            if (!emit_diff(pk, m, PyList_GET_ITEM(m->diffs, j), 0, table_words))
                return 0;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(m->ragged); j++)
            if (!emit_ragged(pk, m, PyList_GET_ITEM(m->ragged, j), table_words))
                return 0;
    }
    /* List diffs by element type, the types in the order of their first member with diffs. */
    int seen[CELL_CODES] = {0}, order[CELL_CODES], num_codes = 0;
    for (Py_ssize_t i = 0; i < count; i++)
        if (PyList_GET_SIZE(members[i].diffs) && !seen[members[i].code]) {
            seen[members[i].code] = 1;
            order[num_codes++] = (int)members[i].code;
        }
    for (int c = 0; c < num_codes; c++)
        for (Py_ssize_t i = 0; i < count; i++) {
            if (members[i].code != order[c])
                continue;
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(members[i].diffs); j++)
                if (!emit_diff(pk, &members[i], PyList_GET_ITEM(members[i].diffs, j), 1, table_words))
                    return 0;
        }
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(tables); t++) {
        PyObject *pair = PyTuple_GET_ITEM(tables, t), *key, *value;
        long code = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
        Py_ssize_t pos = 0;
        while (PyDict_Next(PyTuple_GET_ITEM(pair, 0), &pos, &key, &value)) {
            npy_int32 cell[2];
            int length = cell_words(value, code, cell);
            emit_meta(pk, PyLong_AsLongLong(key), length);
            for (int k = 0; k < length; k++, pk->value_words++)
                if (pk->words)
                    OUT32(*pk->words, table_words + pk->value_words) = cell[k];
        }
    }
    return records == NULL || emit_admissions(pk, records, layout, table_words);
}

static PyObject *pack_members(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *words_obj, *member_list, *tables, *admissions = Py_None, *records = NULL, *list_rows = Py_None;
    long long first = 0;
    if (!PyArg_ParseTuple(args, "OOO|OOL", &words_obj, &member_list, &tables, &admissions, &list_rows, &first))
        return NULL;
    if (list_rows != Py_None && !PyBool_Check(list_rows))
        Py_RETURN_NOTIMPLEMENTED;
    AdmissionLayout layout = {{0}, {0}, 0, 0, 0, 0, 0};
    if (admissions != Py_None) {
        if (!PyTuple_CheckExact(admissions) || PyTuple_GET_SIZE(admissions) != 2
            || !PyDict_CheckExact(PyTuple_GET_ITEM(admissions, 0)) || !read_layout(PyTuple_GET_ITEM(admissions, 1), &layout))
            Py_RETURN_NOTIMPLEMENTED;
        records = PyTuple_GET_ITEM(admissions, 0);
    }
    Member members[MAX_MEMBERS];
    if (!PyList_CheckExact(member_list) || PyList_GET_SIZE(member_list) > MAX_MEMBERS)
        Py_RETURN_NOTIMPLEMENTED;
    const Py_ssize_t count = PyList_GET_SIZE(member_list);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(member_list, i);
        Member *m = &members[i];
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 5
            || exact_int(PyTuple_GET_ITEM(item, 0), &m->offset) != EXACT_INT
            || exact_int(PyTuple_GET_ITEM(item, 1), &m->cols) != EXACT_INT
            || exact_int(PyTuple_GET_ITEM(item, 2), &m->code) != EXACT_INT || m->code < 0 || m->code >= CELL_CODES
            || !PyList_CheckExact(PyTuple_GET_ITEM(item, 3)) || !PyList_CheckExact(PyTuple_GET_ITEM(item, 4)))
            Py_RETURN_NOTIMPLEMENTED;
        m->diffs = PyTuple_GET_ITEM(item, 3);
        m->ragged = PyTuple_GET_ITEM(item, 4);
    }
    npy_intp num_cells, cell_value_words;
    if (!cell_tables_size(tables, &num_cells, &cell_value_words))
        Py_RETURN_NOTIMPLEMENTED;
    ArrayView words;
    if (words_obj != Py_None && (!array_view(words_obj, NPY_INT32, 1, &words) || !from_word(&words, first)))
        Py_RETURN_NOTIMPLEMENTED;
    Packer measure = {NULL, 0, 0, 0};
    if (!walk_members(&measure, members, count, tables, records, &layout, 0))
        Py_RETURN_NOTIMPLEMENTED;
    /* The admitted rows listed after the values, when asked (the owner's count reset reads them there). */
    const npy_intp listed = list_rows == Py_True && records != NULL ? PyDict_GET_SIZE(records) : 0;
    const npy_intp table_words = 3 * measure.diffs + measure.value_words;
    if (words_obj == Py_None || words.len < table_words + listed)
        return list_rows == Py_None ? Py_BuildValue("(nnO)", measure.diffs, measure.value_words, Py_False)
                                    : Py_BuildValue("(nnOn)", measure.diffs, measure.value_words, Py_False, listed);
    Packer pack = {&words, 0, 0, 0};
    walk_members(&pack, members, count, tables, records, &layout, 3 * measure.diffs);  /* the measuring walk accepted them */
    if (listed) {
        PyObject *key, *record;
        Py_ssize_t pos = 0;
        for (npy_intp i = 0; PyDict_Next(records, &pos, &key, &record); i++)  /* rows the walk read as exact ints */
            OUT32(words, table_words + i) = (npy_int32)PyLong_AsLongLong(key);
    }
    return list_rows == Py_None ? Py_BuildValue("(nnO)", measure.diffs, measure.value_words, Py_True)
                                : Py_BuildValue("(nnOn)", measure.diffs, measure.value_words, Py_True, listed);
}

/* One part of put_words: its first word and length, 0 when it is not one put_words takes. */
static int word_part(PyObject *part, npy_intp num_words, npy_intp *first, npy_intp *count, ArrayView *values)
{
    long long offset, single;
    if (!PyTuple_CheckExact(part) || PyTuple_GET_SIZE(part) != 2 || exact_int(PyTuple_GET_ITEM(part, 0), &offset) != EXACT_INT
        || offset < 0)
        return 0;
    PyObject *what = PyTuple_GET_ITEM(part, 1);
    if (PyTuple_CheckExact(what)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(what); i++)
            if (exact_int(PyTuple_GET_ITEM(what, i), &single) != EXACT_INT || single < NPY_MIN_INT32 || single > NPY_MAX_INT32)
                return 0;
        *count = PyTuple_GET_SIZE(what);
        values->data = NULL;
    }
    else if (array_view(what, NPY_INT32, 0, values))
        *count = values->len;
    else
        return 0;
    *first = (npy_intp)offset;
    return offset <= num_words && *count <= num_words - offset;
}

static PyObject *put_words(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *words_obj, *parts;
    if (!PyArg_ParseTuple(args, "OO!", &words_obj, &PyTuple_Type, &parts))
        return NULL;
    ArrayView words, values;
    npy_intp first, count;
    if (!array_view(words_obj, NPY_INT32, 1, &words))
        Py_RETURN_NOTIMPLEMENTED;
    for (Py_ssize_t p = 0; p < PyTuple_GET_SIZE(parts); p++)
        if (!word_part(PyTuple_GET_ITEM(parts, p), words.len, &first, &count, &values))
            Py_RETURN_NOTIMPLEMENTED;
    for (Py_ssize_t p = 0; p < PyTuple_GET_SIZE(parts); p++) {
        PyObject *part = PyTuple_GET_ITEM(parts, p);
        word_part(part, words.len, &first, &count, &values);  /* accepted above */
        if (values.data == NULL)
            for (npy_intp i = 0; i < count; i++)
                OUT32(words, first + i) = (npy_int32)PyLong_AsLong(PyTuple_GET_ITEM(PyTuple_GET_ITEM(part, 1), i));
        else
            for (npy_intp i = 0; i < count; i++)
                OUT32(words, first + i) = *(const npy_int32 *)(values.data + i * values.stride);
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
        *word |= (npy_uint32)1 << (token & 31);
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"pack_ragged", pack_ragged, METH_VARARGS, "One ragged set of int32 diffs as a staged-write diff table."},
    {"pack_members", pack_members, METH_VARARGS, "A general flush's members and cells as one staged-write diff table."},
    {"prompt_bitmask", prompt_bitmask, METH_VARARGS, "The prompt-token bitmask words of one sampling-state row."},
    {"put_words", put_words, METH_VARARGS, "int32 values and arrays written at word offsets of a slot's words."},
    {NULL, NULL, 0, NULL},
};

RUNNERCHECK_MODULE("The staged writes' packing, in C.")
