#!/usr/bin/env bash
# The GPU runs behind docs/BENCHMARKS.md, docs/CHISQ.md and docs/MUTANTS.md, as run on a lent H200
# (no network, torch/triton from the image, the checkout on PYTHONPATH). Every job has its own time
# limit, so one slow job cannot lose the others' results.  The benchmark lab's investigation jobs
# (host profiles, two trees in lockstep, launch probes) are in bench/lab/h200_lab.sh.
#
#   bash ci/h200.sh OUTDIR JOB...      (every job behind a claim in the docs: bash ci/h200.sh OUTDIR all;
#                                       more than one device call's 10 minutes: run it in groups)
#
#   bench         `runnercheck bench --device cuda`, run alone first (timings; e2e runs graphs and eager, async and
#                 sync: 8 Qwen3-0.6B runners), then the others side by side:
#   bench_spec    `runnercheck bench --device cuda --only spec_ngram` alone: tokens/s and acceptance with the n-gram
#                 proposer on repetitive greedy prompts vs no speculation (Qwen3-0.6B shape, 8 and 64 requests)
#   bench_spec_draft `runnercheck bench --device cuda --only spec_draft` alone: issue 61's tokens/s of draft-model
#                 speculation (qwen3-0.6b-draft and self-draft, k=3, 8 and 64 requests) vs none, acceptance, graph replays
#   ngram         the n-gram proposer on cuda: its gpu-marked tests (kernel vs oracle, differential with 0 syncs),
#                 a delay-injected stress run with `--proposer ngram`, and the host-read mutant (must be killed by sync)
#   spec_draft    issue 61's draft-model run, alone: `bench --only spec_draft` (qwen3-0.6b-draft and self-draft, k=3,
#                 8 and 64 requests: tokens/s vs no speculation, acceptance, graph replays), then the gpu tests of
#                 draft-model buckets (replay == eager bit for bit over buckets and k=1..3, sync detector 0 during
#                 replay), the draft graph mutants with their control, and `verify --device cuda --quick` (its cuda plan
#                 ends with two draft-model runs: the micro-draft model and the target drafting for itself)
#   draft         the draft-model proposer on cuda (issue 20): its gpu-marked tests (differential with 0 syncs, unrelated
#                 and self drafts, CUDA-graph buckets), delay-injected stress runs with `--proposer draft` (the micro-draft model, then the
#                 target drafting for itself), the four rejection-sampling mutants (must be killed by the differential;
#                 the twin's own waits are named with allow_host_sync) with their control, and
#                 `bench --only spec_draft` (Qwen3-0.6B with qwen3-0.6b-draft and with itself as draft, 8 and 64 requests)
#   spec_stats    the speculative-verification chi-square cases at 2e6 draws each (the Triton verifier) and their four
#                 planted biases' power (`chisq --cases spec-q --biases spec-...`)
#   spec_benches  `bench --only spec_draft`, then `bench --only spec_ngram`, each alone (tokens/s and acceptance)
#   spec_mutant_rates  the four rejection-sampling mutants and accepted_count_read_on_host, 5 seeds each (kill rates)
#   gpu_launch    the gpu tests of the cached Triton launcher alone (`tests/impl/test_launch.py`)
#   bench_sampler `runnercheck bench --device cuda --only sampler logprobs` alone: issues 16 and 58's "Done when" in one run
#                 (greedy all-greedy launch vs torch.argmax vs the floor, temperature on RNG v2, top-k/top-p, logprobs)
#                 (the runner's sampler and logprobs at 1/8/64/256 rows, the memory floor, the Philox compute floor
#                 and noise bound, the PyTorch baselines, peak extra memory)
#   gpu_sampler   the sampler/logprobs/RNG gpu-marked tests alone (tokens vs the oracle at V=151936, both
#                 logprobs paths, Philox bits on every stream, noise within the fp32 bound, RNG v2's refinement
#                 against the dense argmax and its probe killing the v2 mutants, the scores' reciprocal multiply and
#                 the bounds' exp2 giving the bits of the division and exp they replace, a reloaded reference's key the
#                 bits of the one picked out of the chunk, the logits path's key bounds within the margin of the
#                 scores' and inf, never NaN, where theirs are)
#   sampler_shapes the sampler's launch-shape tests of the CPU suite, on cuda (small vocabularies: every split path with
#                 and without the select pass's chunk groups, the all-greedy launch over one and three spans a row and
#                 with its loop pipelined; the full vocabulary's greedy test): over 90 s on a cold H100, give it 150
#   graph_capture what capturing the CUDA graphs costs per sampler launch set (`bench/lab/twin_capture.py`: Qwen3-0.6B
#                 bf16, 64 requests, 512 batched tokens; graph counts, seconds and CUDA memory after capturing one, two
#                 and three sets; one JSON line in its log), then the gpu tests of the graph modes and their memory
#                 (test_graphs, test_mixed_graphs, test_lanes, test_draft_graphs, test_runner_launch_sets)
#   bench_logprobs `runnercheck bench --device cuda --only logprobs` alone (top-20 at 1/8/64/256 rows vs the
#                 memory floor, the same without top-n, extra memory; ~1 min), after
#   gpu_logprobs  the gpu-marked logprobs tests alone (row finish vs float64 at V=151936, ties at the bound,
#                 overflow to the fallback, counters reset, graph replay)
#   bench_host    `runnercheck bench --device cuda --only host_cost` alone (runner vs V1-style baseline, 1% and 0% churn;
#                 host enqueues per step, target 1 at 0% churn: the fused replay, H2D and D2H inside; total host CPU
#                 per step, caller + launch thread, target <= 1/2 of the baseline's at 1% churn), then the same with
#                 RUNNERCHECK_SLOW_LAUNCH=1 (every Triton launch through kernel[grid]: what the cached launcher saves),
#                 then the launch thread's alternatives: RUNNERCHECK_LAUNCH_THREAD=0 (the caller enqueues),
#                 RUNNERCHECK_LAUNCH_SPIN_US=300 (the worker polls up to 300 us, adapted to the steps, after a lead
#                 wait), and that without its lead wait, RUNNERCHECK_LAUNCH_LEAD_MARGIN_US=off (it polls from each
#                 step's wake to its push)
#   gpu_events    the gpu-marked tests of events, the steady step, its lanes, the launch thread and slot lifetimes
#                 alone (test_device, test_steady_step, test_lanes, test_launcher, test_launcher_idle, test_lifetime:
#                 ~45 s)
#   gpu_tests     the gpu-marked tests, four pytest workers sharing the GPU (the two deep-tail kernel tests are
#                 chisq_deep's cases)
#   mutants       `runnercheck mutants --device cuda`
#   mutants_new   the CUDA-graph and prefix-caching mutants alone (`mutants --only ...`), with their controls
#   mutants_bucketed  the mutants planted into bucketed (mixed and decode) steps' launches -- input prep, post-update,
#                 count reset, padding --, those moved to other workloads when prefills became mixed graphs, and the
#                 launch-set guards' (greedy, unfiltered; `mutants --no-chisq --only ...`), with their controls
#   mutants_rest  the rest of the catalogue, beside mutants_new, mutants_bucketed and staging_slots (race, sync, sampler,
#                 stream and speculative mutants; `mutants --only ...`, chi-square probes included), with their controls
#                 (335 s for the 17 mutants on an H100, run 161: its own limit, 500 s)
#   mutant_logprobs_rates  logprobs_from_processed over 3 seeds (`mutants --seeds 3 --only ...`): it patches the sampler's
#                 Python, so it recaptures the graphs (run 52 found it surviving graph-replayed logprob steps)
#   mutant_processed_rates  the processed-logprob mutants over 5 seeds (`mutants --seeds 5 --no-chisq --only ...`):
#                 the processed-scores pass on the GPU (issue 60 item 3)
#   race_rates    kill rates of the race mutants over 10 seeds (`mutants --seeds 10 --only ...`)
#   verify_kills  the race mutants through verify's own quick cuda plan (`mutants --campaign verify`), 5 seeds: kill rates
#   output_slots  the output-slot checksums on cuda: a clean delayed stress run, then output_slot_overwritten_early
#                 (must be killed by lifetime), one seed (`mutants --only ... --no-chisq`)
#   staging_slots the staging-slot checksums on cuda: a clean stress run delayed at the staging slots' readers (0
#                 violations), then reuse_staging_early, one seed
#   verify        `runnercheck verify --device cuda --quick`
#   stress        delay-injected stress with reuse_staging_early (must exit 1), its replay, then without it
#   chisq_matrix  the chi-square matrix, 2e6 draws per case, + calibration (the runner's sampler)
#   chisq_power   power of every CPU-affordable planted bias
#   chisq_capped  power of the capped-noise biases (~1e12 token-draws each)
#   chisq_coarse  power over 5 seeds of the coarse-arithmetic biases quick mode cannot see (fp16 probabilities,
#                 16-bit uniforms; inverse-CDF samplers on their full-mode probes, ~1.3e10 token-draws a repeat),
#                 then their gpu test (the fp16 bias rejected, the full-precision control passing on the same probe);
#                 113 s to 231 s on lent H100s: its own limit, CHISQ_COARSE_LIMIT_S (480)
#   chisq_deep    2^12..2^17-token tails 12..30 logits below the head (the runner's sampler; RNG v2: ~51 hits expected)
#   invariance    batch invariance (docs/INVARIANCE.md): `runnercheck invariance --device cuda` on our runner (micro with
#                 4 rows, then tiny with 8: must exit 0), each batch-dependence mutant of stress/mutants/batch.py through
#                 `invariance --mutant` (each must exit 1), their kill rates over 5 seeds (`mutants --seeds 5 --only ...`:
#                 exit 0 = all killed as designed), and the gpu tests of tests/stress/test_invariance.py and
#                 tests/impl/test_batch_invariant.py
#   csan          CUDA's stream sanitizer: the stream mutant killed by csan with its control clean
#                 (`mutants --only runner_stream_reads_default_stream_write`), then `stress --csan` and
#                 `chisq --csan --quick` (both must be clean)
#   sanitizer     compute-sanitizer memcheck/racecheck (ci/sanitizer.sh; not in 'all': run it alone, it
#                 instruments every launch; exit 3 = unsupported on this device/runtime)
# Logs and reports go to OUTDIR/<job>; OUTDIR/jobs.txt lists each job's exit status and seconds.
out=${1:?usage: ci/h200.sh OUTDIR JOB...}
shift
jobs=" $* "
[ "$jobs" = " all " ] && jobs=" bench bench_host bench_sampler bench_logprobs spec_benches gpu_tests mutants_new mutants_bucketed mutants_rest mutant_logprobs_rates mutant_processed_rates race_rates verify_kills spec_mutant_rates output_slots staging_slots verify stress ngram draft invariance spec_stats chisq_matrix chisq_power chisq_capped chisq_coarse chisq_deep csan "
. "$(dirname "${BASH_SOURCE[0]}")/h200_jobs.sh"
want bench && job bench "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --out "$out/bench"
want bench_spec_draft && job bench_spec_draft "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_draft \
  --out "$out/bench_spec_draft"
want bench_spec && job bench_spec "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_ngram --out "$out/bench_spec"
want gpu_logprobs && job gpu_logprobs "$limit" python3 -m pytest -v -p no:cacheprovider -m "gpu and not stats" \
  tests/impl/test_sampler_split_gpu.py tests/impl/test_sampler_gpu.py -k "logprobs or row_finish or graph"
want bench_logprobs && job bench_logprobs "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only logprobs \
  --out "$out/bench_logprobs"
want bench_sampler && job bench_sampler "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only sampler logprobs \
  --out "$out/bench_sampler"
want gpu_sampler && job gpu_sampler "$limit" python3 -m pytest -v -p no:cacheprovider --durations=15 -m "gpu and not stats" \
  tests/impl/test_sampler_split_gpu.py tests/impl/test_sampler_gpu.py tests/impl/test_sampler_v2.py \
  tests/impl/test_sampler_arith_gpu.py tests/reference/test_rng.py
want graph_capture && {
  job graph_capture "$limit" python3 -m runnercheck.bench.lab.twin_capture --reqs 64 --tokens 512
  job graph_modes_tests "$limit" python3 -m pytest -v -p no:cacheprovider -m "gpu and not stats" tests/impl/test_graphs.py \
    tests/impl/test_mixed_graphs.py tests/impl/test_lanes.py tests/impl/test_draft_graphs.py \
    tests/impl/test_runner_launch_sets.py
}
want sampler_shapes && job sampler_shapes "$limit" python3 -m pytest -v -p no:cacheprovider -m "not stats" \
  tests/impl/test_sampler_split.py tests/impl/test_sampler_greedy.py
want bench_host && job bench_host "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only host_cost --out "$out/bench_host" &&
  RUNNERCHECK_SLOW_LAUNCH=1 job bench_host_slow_launch "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only host_cost \
  --out "$out/bench_host_slow_launch" &&
  RUNNERCHECK_LAUNCH_THREAD=0 job bench_host_no_launch_thread "${BENCH_LIMIT_S:-420}" $rc bench --device cuda \
  --only host_cost --out "$out/bench_host_no_launch_thread" &&
  RUNNERCHECK_LAUNCH_SPIN_US=300 job bench_host_spin "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only host_cost \
  --out "$out/bench_host_spin" &&
  RUNNERCHECK_LAUNCH_SPIN_US=300 RUNNERCHECK_LAUNCH_LEAD_MARGIN_US=off job bench_host_spin_no_lead_wait \
  "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only host_cost --out "$out/bench_host_spin_no_lead_wait"
want gpu_events && job gpu_events "$limit" python3 -m pytest -v -p no:cacheprovider -m "gpu and not stats" \
  tests/impl/test_device.py tests/impl/test_steady_step.py tests/impl/test_lanes.py tests/impl/test_launcher.py \
  tests/impl/test_launcher_idle.py tests/checks/test_lifetime.py
want gpu_tests && job gpu_tests "$limit" python3 -m pytest -v -n 4 -p no:cacheprovider --durations=15 -m "gpu and not stats" tests \
  --deselect tests/stress/test_mutants.py::test_cuda_run_kills_every_mutant_including_the_noise_bugs \
  --deselect tests/impl/test_sampler_tail.py &
want mutants && job mutants "$limit" $rc mutants --device cuda --out "$out/mutants" &
want mutants_new && job mutants_new "$limit" $rc mutants --device cuda --junit "$out/mutants_new.xml" --only \
  graph_buffer_reallocated padding_row_writes_live_state predicate_admits_larger_batch graph_init_only_at_capture mixed_tail_left_stale \
  graph_skips_admitted_count_reset draft_q_not_refreshed draft_propose_before_post_update \
  prefix_hit_recomputes_cached_block block_table_tail_kept prefix_hit_one_block_too_long evicted_block_still_referenced \
  refcount_dropped_on_preemption --out "$out/mutants_new" &
want mutants_bucketed && job mutants_bucketed "$limit" $rc mutants --device cuda --no-chisq --only positions_off_by_one \
  slot_mapping_wrong_block idx_mapping_off_by_one num_computed_not_advanced tensor_in_python_if staged_writes_wrong_order \
  stale_row_after_preempt graph_buffer_reallocated padding_row_writes_live_state predicate_admits_larger_batch \
  graph_init_only_at_capture mixed_tail_left_stale graph_skips_admitted_count_reset greedy_from_first_request \
  unfiltered_from_first_request --out "$out/mutants_bucketed" &
want mutants_rest && job mutants_rest "${MUTANTS_REST_LIMIT_S:-500}" $rc mutants --device cuda --only \
  pageable_nonblocking_copy output_slot_overwritten_early item_in_step synchronize_in_step fp16_gumbel_noise \
  u24_uniform top_k_off_by_one top_p_boundary_dropped temperature_twice penalty_sign_flipped logprobs_from_processed \
  runner_stream_reads_default_stream_write accepted_count_read_on_host spec_accept_ratio_normalised spec_residual_abs \
  spec_accept_uses_draft_noise spec_bonus_dropped \
  --out "$out/mutants_rest" &
want mutant_logprobs_rates && job mutant_logprobs_rates "$limit" $rc mutants --device cuda --no-chisq --seeds 3 \
  --only logprobs_from_processed --out "$out/mutant_logprobs_rates" &
want mutant_processed_rates && job mutant_processed_rates "$limit" $rc mutants --device cuda --no-chisq --seeds 5 \
  --only processed_logprobs_without_temperature processed_logprobs_before_filters processed_logprobs_mode_kept_on_reuse \
  --out "$out/mutant_processed_rates" &
want race_rates && job race_rates "$limit" $rc mutants --device cuda --seeds 10 --no-chisq --only \
  reuse_staging_early pageable_nonblocking_copy output_slot_overwritten_early --out "$out/race_rates" &
want verify_kills && (  # two shards side by side (seeds 0,2,4 and 1,3), then their kill rates merged
  for k in 0 1; do
    job verify_kills_$k "$limit" $rc mutants --device cuda --campaign verify --quick --seeds 5 --shard $k/2 --no-chisq \
      --only reuse_staging_early pageable_nonblocking_copy output_slot_overwritten_early --out "$out/verify_kills_$k" &
  done
  wait
  job verify_kills 60 $rc mutants --merge "$out/verify_kills_0" "$out/verify_kills_1" --out "$out/verify_kills"
) &
want output_slots && (
  job output_slots_clean 90 $rc stress --device cuda --seed 1 --steps 60 --delay-us auto --delay-target output-slot \
    --max-inflight 3 --no-progress --out "$out/output_slots_clean"
  job output_slots_mutant 90 $rc mutants --device cuda --no-chisq --only output_slot_overwritten_early --out "$out/output_slots_mutant"
) &
want staging_slots && (
  job staging_slots_clean 120 $rc stress --device cuda --seed 2 --steps 80 --delay-us auto --delay-target staging-slot \
    --max-inflight 3 --no-progress --out "$out/staging_slots_clean"
  job staging_slots_mutant 120 $rc mutants --device cuda --no-chisq --only reuse_staging_early --out "$out/staging_slots_mutant"
)&
want ngram && (
  job ngram_tests "$limit" python3 -m pytest -v -p no:cacheprovider -m gpu tests/impl/test_ngram_proposer.py
  job ngram_stress 150 $rc stress --device cuda --seed 1 --steps 200 --delay-us auto --max-inflight 2 --proposer ngram \
    --no-progress --out "$out/ngram_stress"
  job ngram_mutant 120 $rc mutants --device cuda --no-chisq --only accepted_count_read_on_host --out "$out/ngram_mutant"
) &
want spec_benches && job bench_spec_draft "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_draft \
  --out "$out/bench_spec_draft" && job bench_spec_ngram "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_ngram \
  --out "$out/bench_spec_ngram"
want spec_mutant_rates && job spec_mutant_rates "$limit" $rc mutants --device cuda --seeds 5 --no-chisq --only \
  spec_accept_ratio_normalised spec_residual_abs spec_accept_uses_draft_noise spec_bonus_dropped accepted_count_read_on_host \
  --out "$out/spec_mutant_rates" &
want gpu_launch && job gpu_launch 200 python3 -m pytest -v -p no:cacheprovider -m gpu tests/impl/test_launch.py &
want spec_stats && job spec_stats "$limit" $rc chisq --device cuda --samples 2000000 --cases spec-q --no-calibration \
  --biases spec-ratio-normalised spec-residual-abs spec-accept-shares-draft-noise spec-bonus-dropped --out "$out/spec_stats" &
want spec_draft && (  # alone: the bench first (timings), then the checks of the same build
  job bench_spec_draft "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_draft --out "$out/spec_draft_bench"
  job spec_draft_tests "$limit" python3 -m pytest -v -p no:cacheprovider -m gpu tests/impl/test_draft_graphs.py \
    tests/impl/test_draft_proposer.py tests/impl/test_spec_verify_kernel.py
  job spec_draft_mutants 240 $rc mutants --device cuda --no-chisq --only draft_q_not_refreshed \
    draft_propose_before_post_update --out "$out/spec_draft_mutants"
  job spec_draft_verify "$limit" $rc verify --device cuda --quick --no-progress --out "$out/spec_draft_verify"
)
want draft && (
  job draft_tests "$limit" python3 -m pytest -v -p no:cacheprovider -m gpu tests/impl/test_draft_proposer.py \
    tests/impl/test_draft_graphs.py
  job draft_stress 180 $rc stress --device cuda --seed 1 --steps 200 --delay-us auto --max-inflight 2 --proposer draft \
    --no-progress --out "$out/draft_stress"
  job draft_stress_self 180 $rc stress --device cuda --seed 2 --steps 200 --delay-us auto --max-inflight 2 --proposer draft \
    --draft-model micro --no-progress --out "$out/draft_stress_self"
  job draft_mutants 240 $rc mutants --device cuda --no-chisq --only spec_accept_ratio_normalised spec_residual_abs \
    spec_accept_uses_draft_noise spec_bonus_dropped draft_q_not_refreshed draft_propose_before_post_update \
    --out "$out/draft_mutants"
  job draft_bench "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_draft --out "$out/draft_bench"
) &
want verify && job verify "$limit" $rc verify --device cuda --quick --no-progress --out "$out/verify" &
want stress && (
  job stress_mutant 150 $rc stress --device cuda --seed 1 --steps 200 --delay-us auto --max-inflight 3 \
    --mutant reuse_staging_early --no-progress --out "$out/stress_mutant"
  job replay_mutant 60 $rc replay "$out/stress_mutant/repro.json" --no-progress
  job stress_clean 120 $rc stress --device cuda --seed 1 --steps 200 --delay-us auto --max-inflight 3 \
    --no-progress --out "$out/stress_clean"
) &
want invariance && (
  job invariance 300 $rc invariance --device cuda --no-progress --out "$out/invariance"
  job invariance_tiny 400 $rc invariance --device cuda --model tiny --max-num-reqs 8 --no-progress --out "$out/invariance_tiny"
  for m in sampler_path_by_batch_size noise_keyed_by_batch_slot norm_block_from_num_tokens; do
    job invariance_$m 200 $rc invariance --device cuda --mutant $m --no-progress --out "$out/invariance_$m"
  done
  job invariance_mutant_rates "$limit" $rc mutants --device cuda --no-chisq --seeds 5 --only sampler_path_by_batch_size \
    noise_keyed_by_batch_slot norm_block_from_num_tokens --out "$out/invariance_mutant_rates"
  job invariance_gpu_tests "$limit" python3 -m pytest -v -p no:cacheprovider -m gpu tests/stress/test_invariance.py \
    tests/impl/test_batch_invariant.py
) &
want chisq_matrix && job chisq_matrix "$limit" $rc chisq --device cuda --samples 2000000 --no-power --out "$out/chisq_matrix" &
want chisq_power && job chisq_power "$limit" $rc chisq --device cuda --no-matrix --no-calibration \
  --biases top-k-off-by-one top-p-drop-boundary top-p-extra-token temperature-twice penalty-wrong-sign \
  draft-shared-noise bf16-noise u24-uniform fp16-noise min-p-before-temperature --out "$out/chisq_power" &
want chisq_capped && job chisq_capped "$limit" $rc chisq --device cuda --no-matrix --no-calibration \
  --biases u31-floor u32-uniform --power-repeats 2 --out "$out/chisq_capped" &
want chisq_coarse && (
  job chisq_coarse "${CHISQ_COARSE_LIMIT_S:-480}" $rc chisq --device cuda --no-matrix --no-calibration --no-spec \
    --biases fp16-probabilities u16-uniform --power-repeats 5 --out "$out/chisq_coarse"
  job chisq_coarse_gpu "$limit" python3 -m pytest -v -p no:cacheprovider -m gpu tests/checks/test_chisq_coarse.py
) &
want chisq_deep && job chisq_deep "$limit" $rc chisq --device cuda --deep-tail --cases tail-d --no-calibration \
  --no-power --out "$out/chisq_deep" &
want csan && (
  job csan_mutant "$limit" $rc mutants --device cuda --quick --no-chisq --only runner_stream_reads_default_stream_write \
    --junit "$out/csan_mutant.xml" --out "$out/csan_mutant"
  job csan_stress 150 $rc stress --device cuda --csan --seed 1 --steps 60 --no-progress --out "$out/csan_stress"
  job csan_chisq 150 $rc chisq --device cuda --csan --quick --no-calibration --no-power --junit "$out/csan_chisq.xml" \
    --out "$out/csan_chisq"
) &
want sanitizer && job sanitizer "${SANITIZER_LIMIT_S:-420}" bash ci/sanitizer.sh "$out/sanitizer" &
wait
cat "$out/jobs.txt"
