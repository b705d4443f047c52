/* `impl.step_reader.StepArrays`' fields, in order: what general.c stores when it makes one and plans.c reads when it
 * plans one (slots.h).  Included after slots.h. */
#ifndef RUNNERCHECK_NATIVE_STEP_ARRAYS_H
#define RUNNERCHECK_NATIVE_STEP_ARRAYS_H

enum {  /* arrays.h's STEP_* name a SchedulerOutput's fields; these, a StepArrays' */
    SA_GONE, SA_CACHED_ROWS, SA_CACHED_COMPUTED, SA_CACHED_NEW_BLOCKS, SA_BLOCK_APPENDS, SA_REQ_IDS, SA_ROWS,
    SA_NEW_POSITIONS, SA_QUERY_LENS, SA_STARTS, SA_ENDS, SA_KNOWN, SA_NUM_DRAFTS, SA_DRAFTS, SA_NUM_TOKENS,
    SA_QUERY_STARTS, SA_MAX_QUERY_LEN, SA_MAX_END, SA_UNIFORM_QUERY_LEN, SA_STEADY, NUM_STEP_ARRAYS,
};

static const char *const STEP_ARRAYS_FIELDS[NUM_STEP_ARRAYS] = {
    "gone", "cached_rows", "cached_computed", "cached_new_blocks", "block_appends", "req_ids", "rows", "new_positions",
    "query_lens", "starts", "ends", "known", "num_drafts", "drafts", "num_tokens", "query_starts", "max_query_len",
    "max_end", "uniform_query_len", "steady",
};

#endif
