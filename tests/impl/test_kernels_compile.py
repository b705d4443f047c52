"""The speculative-sampling, processed-score, drawn-distribution, split-pass, all-greedy, attention and batch-invariant matmul kernels compile for a GPU (sm_90) on a machine without one.

The CPU suite runs every kernel in Triton's interpreter, which executes the Python body and so cannot see
what only code generation rejects (a constexpr branch the compiler resolves differently, a type a lowering
refuses).  Here a subprocess without ``TRITON_INTERPRET`` compiles each kernel ahead of time for an H100/H200
target (``triton.compile`` to PTX: no driver needed).  Skipped where Triton lacks the NVIDIA backend, and on a
CUDA machine, whose gpu-marked tests compile and run them for real."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

# (module, kernel, pointer and float parameters' types, constexprs); every other parameter is an i32 scalar
KERNELS = [
    ("spec_verify", "spec_verify_kernel",
     dict(target_ptr="*fp32", draft_probs_ptr="*fp32", draft_tokens_ptr="*i64", cu_drafts_ptr="*i32",
          idx_mapping_ptr="*i32", seed_ptr="*i64", temperature_ptr="*fp32", position_ptr="*i64", out_tokens_ptr="*i64",
          accepted_ptr="*i32"), dict(OUT_WIDTH=4, OUT_P2=4, BLOCK=1024)),
    ("spec_verify", "spec_resample_partials_kernel",
     dict(target_ptr="*fp32", draft_probs_ptr="*fp32", cu_drafts_ptr="*i32", idx_mapping_ptr="*i32", seed_ptr="*i64",
          temperature_ptr="*fp32", position_ptr="*i64", accepted_ptr="*i32", part_ptr="*i32"), dict(CHUNK=4096, BLOCK=1024)),
    ("spec_verify", "spec_resample_combine_kernel",
     dict(idx_mapping_ptr="*i32", temperature_ptr="*fp32", accepted_ptr="*i32", part_ptr="*i32", out_tokens_ptr="*i64"),
     dict(CHUNKS_P2=64)),
    ("draft_model", "_draft_sample_partials_kernel",
     dict(rows_ptr="*i32", state_rows_ptr="*i32", positions_ptr="*i64", seed_ptr="*i64", q_ptr="*fp32", part_ptr="*i32"),
     dict(CHUNK=4096, BLOCK=1024)),
    ("draft_model", "_draft_sample_combine_kernel",
     dict(rows_ptr="*i32", part_ptr="*i32", proposed_ptr="*i32", next_ptr="*i64"), dict(CHUNKS_P2=64)),
    ("draft_model", "_gather_draft_probs_kernel",
     dict(rows_ptr="*i32", draft_start_ptr="*i32", q_ptr="*fp32", out_ptr="*fp32"), dict(CHUNK=4096, BLOCK=1024)),
    ("sampling_processed", "processed_scores_kernel",
     dict(logits_ptr="*fp32", state_row_ptr="*i32", temperature_ptr="*fp32", repetition_ptr="*fp32",
          frequency_ptr="*fp32", presence_ptr="*fp32", mode_ptr="*i32", bound_ptr="*fp32", prompt_mask_ptr="*i32",
          counts_ptr="*i32", draft_ptr="*i32", out_ptr="*fp32"), dict(CHUNK=1024)),
    ("sampling_distribution", "distribution_scores_kernel",
     dict(logits_ptr="*fp32", state_row_ptr="*i32", temperature_ptr="*fp32", repetition_ptr="*fp32",
          frequency_ptr="*fp32", presence_ptr="*fp32", bound_ptr="*fp32", prompt_mask_ptr="*i32", counts_ptr="*i32",
          draft_ptr="*i32", out_ptr="*fp32", part_ptr="*fp32"), dict(SPAN=4096, BLOCK=1024)),
    ("sampling_distribution", "distribution_finish_kernel",
     dict(out_ptr="*fp32", part_ptr="*fp32", state_row_ptr="*i32", temperature_ptr="*fp32", token_ptr="*i64"),
     dict(SPAN=4096, BLOCK=1024, SPANS_P2=64)),
] + [  # the sampler's first split pass, and its select pass with and without chunk groups (a runtime loop)
    ("sampling", "sampler_block_kernel",
     dict(logits_ptr="*fp32", state_row_ptr="*i32", position_ptr="*i64", temperature_ptr="*fp32", top_k_ptr="*i32",
          top_p_ptr="*fp32", min_p_ptr="*fp32", repetition_ptr="*fp32", frequency_ptr="*fp32", presence_ptr="*fp32",
          seed_ptr="*i64", prompt_mask_ptr="*i32", counts_ptr="*i32", draft_ptr="*i32", part_best_ptr="*fp32",
          part_token_ptr="*i32", part_max_ptr="*fp32", part_flag_ptr="*i32", part_inf_ptr="*i32"),
     dict(CHUNK=1024)),
] + [
    ("sampling", "sampler_select_kernel",
     dict(logits_ptr="*fp32", state_row_ptr="*i32", position_ptr="*i64", temperature_ptr="*fp32",
          repetition_ptr="*fp32", frequency_ptr="*fp32", presence_ptr="*fp32", seed_ptr="*i64", prompt_mask_ptr="*i32",
          counts_ptr="*i32", draft_ptr="*i32", mode_ptr="*i32", bound_ptr="*fp32", part_best_ptr="*fp32",
          part_token_ptr="*i32", part_max_ptr="*fp32", part_count_ptr="*i32", slots_ptr="*i64"),
     dict(CHUNK=1024, SLOT=16, GROUPED=grouped))
    for grouped in (False, True)
] + [  # the all-greedy launch
    ("sampling_greedy", "greedy_argmax_kernel",
     dict(logits_ptr="*fp32", state_row_ptr="*i32", repetition_ptr="*fp32", frequency_ptr="*fp32", presence_ptr="*fp32",
          prompt_mask_ptr="*i32", counts_ptr="*i32", draft_ptr="*i32", packed_ptr="*i64", inf_ptr="*i32",
          flag_ptr="*i32", arrivals_ptr="*i32", token_out_ptr="*i64", flag_out_ptr="*i32"), dict(SUB=2048, STAGES=stages))
    for stages in (1, 3)  # plain loads, and the loop software-pipelined
] + [  # the tile products as compiled (ROW_EXACT_DOT off: tl.dot), bf16 with tf32 dots and fp32 with IEEE ones
    ("attention", "_paged_attention_kernel",
     dict(out_ptr=f"*{dt}", query_ptr=f"*{dt}", k_cache_ptr=f"*{dt}", v_cache_ptr=f"*{dt}", block_table_ptr="*i32",
          query_start_loc_ptr="*i32", seq_lens_ptr="*i32", scale_log2="fp32"),
     dict(KV_BLOCK_SIZE=16, HEAD_DIM=128, HEAD_DIM_PAD=128, QUERIES_PER_KV=2, BLOCK_Q=16, BLOCK_M=32, TILE_N=32,
          DOT_PRECISION=precision, ROW_EXACT_DOT=False))
    for dt, precision in (("bf16", "tf32"), ("fp32", "ieee"))
] + [
    ("batch_invariant", "_bi_matmul_kernel",
     dict(a_ptr="*bf16", w_ptr="*bf16", bias_ptr="*bf16", res_ptr="*bf16", out_ptr="*bf16"),
     dict(HAS_BIAS=True, HAS_RESIDUAL=True, PRECISION="tf32", BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, ROW_EXACT_DOT=False)),
]

_COMPILE = textwrap.dedent("""
    import importlib, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name, pointers, constexprs = eval(sys.argv[1])
    fn = getattr(importlib.import_module("runnercheck.impl.kernels." + module), name)
    params = [p.name for p in fn.params]
    signature = {p: "constexpr" if p in constexprs else pointers.get(p, "i32") for p in params}
    source = ASTSource(fn=fn, signature=signature, constexprs={(params.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    assert ".entry" in compiled.asm["ptx"], "no kernel entry in the PTX"
""")


def _nvidia_backend() -> bool:
    try:
        from triton.backends import backends
    except ImportError:
        return False
    return "nvidia" in backends


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine the gpu-marked tests compile and run them")
@pytest.mark.skipif(not _nvidia_backend(), reason="Triton without its NVIDIA backend")
@pytest.mark.parametrize("spec", KERNELS, ids=[k[1] + (f"-{k[3]['DOT_PRECISION']}" if "DOT_PRECISION" in k[3] else "")
                                               for k in KERNELS])
def test_kernel_compiles_for_sm90(spec: tuple) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE, repr(spec)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
