"""The planted C bugs of the native-module tests: each a patch of a copy of impl/native's sources, never a switch in them.

A planted bug is a `Plant`: what it breaks, and the `Patch` (file, the exact text it replaces, the text it plants)
per source file it touches.  `build` applies a plant's patches to a copy of one module's sources and compiles that
copy as a private module (`runnercheck.impl.native.variants`); the checkout's C is never written.  A patch whose
original text is no longer in its file exactly once is a `PatchError` naming the plant: update the plant to the C
as it is now, keeping the bug it plants.

The patches reproduce, text for text, the ``#ifdef RUNNERCHECK_PLANT_*`` branches the C held before issue 59 moved
them here (each variant behaves as that build did).  Only tests plant them: no shipped mutant uses one.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import pytest

from runnercheck.impl import native
from runnercheck.impl.native.variants import Patch, build_variant, patched


@dataclass(frozen=True)
class Plant:
    """A planted bug: what it breaks, and its patches (one or more files; a module gets those of its own files)."""
    breaks: str
    patches: tuple[Patch, ...]

    def __init__(self, breaks: str, *patches: Patch):
        object.__setattr__(self, "breaks", breaks)
        object.__setattr__(self, "patches", patches)


PLANTS: dict[str, Plant] = {
    'stale_step_id': Plant(
        "readers that accept a step id not past the last (arrays.h's `read_step_fields`, shared by the steady and general readers)",
        Patch('arrays.h',
              ('    if (last_step_id != Py_None && (exact_int(last_step_id, &last) != EXACT_INT || step_id <= last))\n'
                 '        return 0;\n'),
              '    (void)last;\n'),
    ),
    'top_p_zero': Plant(
        'a new-request check that takes an open lower bound as closed (a top_p of 0 accepted)',
        Patch('boundary.c',
              '        int above_low = low_open ? v > low : v >= low;\n',
              '        int above_low = v >= low;\n'),
    ),
    'hint_off_by_one': Plant(
        "a cached reader that takes the row after the hint's",
        Patch('general.c',
              '            *row = AT(hint_rows, k);\n',
              '            *row = (AT(hint_rows, k) + 1) % num_rows;\n'),
    ),
    'hint_trusted': Plant(
        "readers that take any hint's ids as exact strs, not only the batch they checked",
        Patch('general.c',
              '#define HINT_CHECKED(hint_ids, num_hints) ((num_hints) > 0 && (hint_ids) == checked_batch)\n',
              '#define HINT_CHECKED(hint_ids, num_hints) ((num_hints) > 0)\n'),
    ),
    'live_id_readmitted': Plant(
        'a general reader that takes a new request under a live id',
        Patch('general.c',
              '                 && PyDict_Contains(req_to_row, rid) == 0\n',
              ''),
    ),
    'lockstep_known_unread': Plant(
        'a one-pass general reader that never reads the tokens known',
        Patch('general.c',
              '            have = AT(m->mirror_tokens, row);\n',
              '            have = NPY_MAX_INT64;\n'),
    ),
    'new_hit_zero': Plant(
        'a general reader that reads every new request from token 0',
        Patch('general.c',
              '    PyObject *position = Py_BuildValue("(nO)", i, rid);\n',
              ('    *start = 0;\n'
                 '    PyObject *position = Py_BuildValue("(nO)", i, rid);\n')),
    ),
    'step_slots_swapped': Plant(
        'a read_general_of whose StepArrays holds starts and ends swapped',
        Patch('general.c',
              '    PyObject *step = slots_new(&step_arrays_layout, values, NUM_STEP_ARRAYS);\n',
              ("    values[SA_STARTS] = PyTuple_GET_ITEM(got, 9);  /* the planted bug: starts and ends stored in each other's slot */\n"
                 '    values[SA_ENDS] = PyTuple_GET_ITEM(got, 8);\n'
                 '    PyObject *step = slots_new(&step_arrays_layout, values, NUM_STEP_ARRAYS);\n')),
    ),
    'trust_computed': Plant(
        "readers that never compare the scheduler's computed counts with the mirror (steady.c, general.c)",
        Patch('general.c',
              ('    if (kind != EXACT_INT || (found && claimed != AT(m->mirror_computed, *row)))\n'
                 '        verdict = ENTRY_RULE;\n'),
              ''),
        Patch('steady.c',
              ('        if (kind != EXACT_INT || claimed != AT(mirror_computed, row))\n'
                 '            mismatch = 1;\n'),
              ''),
    ),
    'issued_early': Plant(
        'a launch thread whose issued() answers with the jobs pushed, so a job still in the ring passes for one on the stream',
        Patch('launcher.c',
              '    return atomic_load(&self->issued);\n',
              '    return atomic_load(&self->pushed);\n'),
    ),
    'nap_misses_push': Plant(
        "a napping launch worker that looks only for a step's wake(), not for a pushed job, so a job pushed without one waits for the naps to end",
        Patch('launcher.c',
              ('            } else {\n'
                 '                nap(l->nap_ns);\n'),
              ('            } else {\n'
                 '                nap(l->nap_ns);\n'
                 '                while (!atomic_load(&l->wanted) && !atomic_load(&l->stop) && now_ns() - idle_since < window + l->nap_limit_ns)\n'
                 '                    nap(l->nap_ns);\n')),
    ),
    'push_skips_sleeper': Plant(
        "a push that wakes the launch worker only when it is not asleep: a job pushed to a sleeping worker is never "
        "issued (a lost wakeup)",
        Patch('launcher.c',
              ('    atomic_store(&self->pushed, seq + 1);\n'
               '    if (atomic_load(&self->sleeping))\n'),
              ('    atomic_store(&self->pushed, seq + 1);\n'
               '    if (!atomic_load(&self->sleeping))\n'))),
    'plan_rows_shifted': Plant(
        "a plan whose int32 rows are the step's rows each one later in the batch",
        Patch('plans.c',
              '        out[i] = (npy_int32)AT(rows64, i);  /* rows of a checked step: within the table, int32 */\n',
              '        out[i] = (npy_int32)AT(rows64, i + 1 < n ? i + 1 : i);\n'),
    ),
    'admit_generation_reused': Plant(
        "an admitted row's RowInfo naming the generation before its own",
        Patch('rows.c',
              '    PyObject *info_generation = Py_NewRef(generation_obj);\n',
              '    PyObject *info_generation = PyLong_FromLongLong(generation - 1);\n'),
    ),
    'no_sample': Plant(
        'an advance that forgets the sampled token',
        Patch('rows.c',
              '        npy_int64 after = end + 1;  /* a request that reached the end of what is known samples one more */\n',
              '        npy_int64 after = end;\n'),
    ),
    'prefill_ends_early': Plant(
        "a row's prefill reads seen over once anything of it is computed",
        Patch('rows.c',
              '    *ended = AT(*computed, row) - AT(*unconfirmed, row) >= length;\n',
              ('    *ended = AT(*computed, row) - AT(*unconfirmed, row) >= length;\n'
                 '    *ended = AT(*computed, row) >= 1;\n')),
    ),
    'prefill_shifted': Plant(
        'an admission whose prefill tokens land one column late (admit_row and admit_request)',
        Patch('rows.c',
              '    npy_int32 *out = (npy_int32 *)PyArray_GETPTR2(prefill, row, 0);\n',
              ('    npy_int32 *out = (npy_int32 *)PyArray_GETPTR2(prefill, row, 0);\n'
                 '    if (n < PyArray_DIM(prefill, 1))\n'
                 '        out++;\n')),
    ),
    'release_reads_over_kept': Plant(
        'a release that never notes the last reading step of a row still prefilling',
        Patch('rows.c',
              '    if (history_reads == Py_True || was_prefilling)  /* the newest marked step may have read its tokens */\n',
              ('    was_prefilling = 0;\n'
                 '    if (history_reads == Py_True || was_prefilling)  /* the newest marked step may have read its tokens */\n')),
    ),
    'staged_never_joins': Plant(
        "an admission whose staged lists never join the group's dirty list, so they would never be flushed",
        Patch('rows.c',
              '    out->joins = PyList_GET_SIZE(out->pending) == 0 && PyList_GET_SIZE(out->ragged) == 0;\n',
              ('    out->joins = PyList_GET_SIZE(out->pending) == 0 && PyList_GET_SIZE(out->ragged) == 0;\n'
                 '    out->joins = 0;\n')),
    ),
    'starts_after_append': Plant(
        'block appends placed after the counts they moved',
        Patch('rows.c',
              '        OUT64(num_blocks, AT(rows, i)) = DATA64(starts)[i] + AT(counts, i);\n',
              ('        OUT64(num_blocks, AT(rows, i)) = DATA64(starts)[i] + AT(counts, i);\n'
                 '        DATA64(starts)[i] += AT(counts, i);\n')),
    ),
    'swap_returns_new': Plant(
        'a release that reads the values it wrote, not those the row held (swap_row and release_request)',
        Patch('rows.c',
              '        held[c] = OUT64(views[c], row);\n',
              ('        OUT64(views[c], row) = PyLong_AsLongLong(PyTuple_GET_ITEM(values, c));\n'
                 '        held[c] = OUT64(views[c], row);\n')),
    ),
    'seed_rounds': Plant(
        "a seed derivation one mixing round short of BLAKE2b's twelve",
        Patch('seeds.c',
              ('enum { ROUNDS = 12 };\n'
                 'enum { BLOCK_BYTES = 128, DIGEST_BYTES = 8 };\n'),
              ('enum { ROUNDS = 11 };\n'
                 'enum { BLOCK_BYTES = 128, DIGEST_BYTES = 8 };\n')),
    ),
    'listed_row_next': Plant(
        'admitted rows listed as the row after each',
        Patch('staging.c',
              '            OUT32(words, table_words + i) = (npy_int32)PyLong_AsLongLong(key);\n',
              '            OUT32(words, table_words + i) = (npy_int32)PyLong_AsLongLong(key) + 1;\n'),
    ),
    'mask_bit31_lost': Plant(
        'a prompt bitmask that never sets bit 31 of a word',
        Patch('staging.c',
              '        npy_uint32 *word = (npy_uint32 *)(words.data + (npy_intp)(token >> 5) * words.stride);\n',
              ('        npy_uint32 *word = (npy_uint32 *)(words.data + (npy_intp)(token >> 5) * words.stride);\n'
                 '        if ((token & 31) == 31)\n'
                 "            continue;  /* the planted bug: a signed shift's sign bit dropped */\n")),
    ),
    'put_words_short': Plant(
        "a put that leaves each part's last value unwritten",
        Patch('staging.c',
              '        if (values.data == NULL)\n',
              ('        if (count > 1)\n'
                 '            count--;\n'
                 '        if (values.data == NULL)\n')),
    ),
    'record_row_stride_one': Plant(
        'admission records whose parameter rows are one word apart',
        Patch('staging.c',
              '            emit_meta(pk, layout->offsets[k] + row * words_per, words_per);\n',
              '            emit_meta(pk, layout->offsets[k] + row, words_per);  /* the planted bug: int64 rows one word apart */\n'),
    ),
    'source_zero': Plant(
        'diff tables whose every source offset is 0',
        Patch('staging.c',
              '#define SOURCE_OF(source) (source)\n',
              '#define SOURCE_OF(source) 0\n'),
    ),
}

# Not a bug: read_general with its one pass (read_in_lockstep) never taken, so every step goes to the parts -- the
# reference the lock-step reader's tests compare with.
VARIANTS: dict[str, Plant] = {
    'general_passes_only': Plant(
        'read_general without its one pass: every step read by the parts',
        Patch('general.c',
              '    if (PyTuple_CheckExact(ids) && PyTuple_CheckExact(computed) && PyTuple_CheckExact(block_lists)\n',
              '    if (0 && PyTuple_CheckExact(ids) && PyTuple_CheckExact(computed) && PyTuple_CheckExact(block_lists)\n'),
    ),
}


def sources(plant: str, module: str) -> dict[str, str]:
    """Module ``module``'s sources with ``plant`` (a key of `PLANTS` or `VARIANTS`) applied."""
    table = PLANTS if plant in PLANTS else VARIANTS
    if plant not in table:
        raise KeyError(f"no plant {plant!r}; the plants are {', '.join([*PLANTS, *VARIANTS])}")
    return patched(module, plant, table[plant].patches)


def build(plant: str, module: str) -> ModuleType:
    """Module ``module`` built with ``plant``; `NativeBuildError` when it cannot be compiled here."""
    return build_variant(module, plant, sources(plant, module))


def planted(plant: str, module: str = "steady") -> ModuleType:
    """`build`, for a test: skips where the product's own module is not loaded (the tests put the variant in its
    place, beside the other C modules) or nothing can be compiled, while a patch that no longer applies fails the
    test."""
    texts = sources(plant, module)  # a PatchError here is the test's failure, not a skip
    if native.load(module) is None:
        pytest.skip(f"impl/native/{module}.c not built here (or RUNNERCHECK_NATIVE=0): {native.BUILD_HINT}")
    try:
        return build_variant(module, plant, texts)
    except native.NativeBuildError as err:
        pytest.skip(f"no C compiler here: {err}")
