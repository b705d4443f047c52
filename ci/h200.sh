#!/usr/bin/env bash
# The GPU runs behind docs/BENCHMARKS.md, docs/CHISQ.md and docs/MUTANTS.md, as run on a lent H200
# (no network, torch/triton from the image, the checkout on PYTHONPATH). Every job has its own time
# limit, so one slow job cannot lose the others' results.
#
#   bash ci/h200.sh OUTDIR JOB...      (all jobs: bash ci/h200.sh OUTDIR all)
#
#   bench         `runnercheck bench --device cuda`, run alone first (timings; e2e runs graphs and eager, async and
#                 sync: 8 Qwen3-0.6B runners), then the others side by side:
#   bench_spec    `runnercheck bench --device cuda --only spec_ngram` alone: tokens/s and acceptance with the n-gram
#                 proposer on repetitive greedy prompts vs no speculation (Qwen3-0.6B shape, 8 and 64 requests)
#   ngram         the n-gram proposer on cuda: its gpu-marked tests (kernel vs oracle, differential with 0 syncs),
#                 a delay-injected stress run with `--proposer ngram`, and the host-read mutant (must be killed by sync)
#   draft         the draft-model proposer on cuda (issue 20): its gpu-marked tests (differential with 0 syncs, unrelated
#                 and self drafts), delay-injected stress runs with `--proposer draft` (the micro-draft model, then the
#                 target drafting for itself), the four rejection-sampling mutants (must be killed by the differential;
#                 the twin's own waits are named with allow_host_sync) with their control, and
#                 `bench --only spec_draft` (Qwen3-0.6B with qwen3-0.6b-draft and with itself as draft, 8 and 64 requests)
#   draft_rerun   `bench --only spec_draft` alone, then the four rejection-sampling mutants beside two replays of run
#                 12's draft_stress_self divergence (docs/results/2026-12-01-h200-draft_stress_self-run12-repro.json)
#   spec_diag     four processes side by side: `ci/capture_probe.py --after-arm off|draft|self` (one 8-request arm of
#                 spec_draft, then the 64-request runner's capture) and `bench --only spec_draft` with the fast launcher off
#   spec_stats    the speculative-verification chi-square cases at 2e6 draws each (the Triton verifier) and their four
#                 planted biases' power (`chisq --cases spec-q --biases spec-...`)
#   draft_self    `stress --proposer draft --draft-model micro` (the target drafting for itself: near ties at every rank)
#   draft_bench_ab  `bench --only spec_draft` twice with the fast launcher and once without it, side by side
#   spec_benches  `bench --only spec_draft`, then `bench --only spec_ngram`, each alone (tokens/s and acceptance)
#   spec_mutant_rates  the four rejection-sampling mutants and accepted_count_read_on_host, 5 seeds each (kill rates)
#   spec_profile  `python -m runnercheck.bench.lab.spec_profile --device cuda --reqs 8 --draft qwen3-0.6b-draft|ngram|off` side by side
#   gpu_launch    the gpu tests of the cached Triton launcher alone (`tests/impl/test_launch.py`)
#   capture_probe `python ci/capture_probe.py` (the spec_draft bench's 64-request runner built alone; its graph capture
#                 passes or fails) with the default logprobs launch shape and with 2048 x 4, side by side
#   bench_sampler `runnercheck bench --device cuda --only sampler logprobs` alone: issue 16's "Done when" in one run
#                 (the runner's sampler and logprobs at 1/8/64/256 rows, the memory floor, the Philox compute floor
#                 and noise bound, the PyTorch baselines, peak extra memory)
#   gpu_sampler   the sampler/logprobs/RNG gpu-marked tests alone (tokens vs the oracle at V=151936, both
#                 logprobs paths, Philox bits on every stream, noise within the fp32 bound)
#   bench_logprobs `runnercheck bench --device cuda --only logprobs` alone (top-20 at 1/8/64/256 rows vs the
#                 memory floor, the same without top-n, extra memory; ~1 min), after
#   gpu_logprobs  the gpu-marked logprobs tests alone (row finish vs float64 at V=151936, ties at the bound,
#                 overflow to the fallback, counters reset, graph replay)
#   bench_host    `runnercheck bench --device cuda --only host_cost` alone (runner vs V1-style baseline, 1% and 0% churn;
#                 host enqueues per step, target 1 at 0% churn: the fused replay, H2D and D2H inside), then the same with
#                 RUNNERCHECK_SLOW_LAUNCH=1 (every Triton launch through kernel[grid]: what the cached launcher saves)
#   bench_host_python  the same host_cost bench with RUNNERCHECK_NATIVE=0: the Python twins of impl/native/*.c (the
#                 readers, the rows writes, the diff tables), to compare with bench_host's C parts through each pass's own ratio
#   host_primitives  `python -m runnercheck.bench.lab.host_primitives` alone: host us of the steady step's pieces (numpy ops, the
#                 type check, H2D/D2H copy_, event record new and re-recorded, enqueue, stream switch, graph replay) on this
#                 machine, the step's three submissions in situ (after Python work, GPU idle or busy), and one Triton launch
#                 with the eager kernels' argument shape by piece (Triton's path, the cached launcher, its key, its gate)
#   graph_census  alone: each graph the host_cost runner replays at 64 and 256 requests, 1% and 0% churn (`python -m
#                 bench.graph_census`): host us per replay inside the runner's steps, then alone (GPU idle, back to
#                 back, after the most replayed graph, after the GPU idled or the CPU caches were swept), device us
#   host_trace    alone: the steady step's pieces timed by wrappers at 256 and 64 requests (`host_profile --phases`),
#                 then torch.profiler over 100 steady steps (`--trace`: host self time per operator and CUDA runtime call,
#                 device time queued per step)
#   host_trace_eager  alone: the same for the eager churn step (1% churn: an admission every step at 256 requests),
#                 its device-work pieces included (`host_profile --phases --churn 0.01`), then torch.profiler over 100 of them
#   host_affinity alone: host_cost passes as they run (base_i) and under `taskset -c $AFFINITY_CPUS` (new_i, default
#                 4,5: the process held on two cores), $AB_PASSES each (default 4), alternating which goes first, compared by bench.ab_compare: whether the host
#                 moving the process between cores is part of what a step costs (runner and baseline alike)
#   host_launch_thread alone: host_cost passes with the device's launch thread off (base_i, RUNNERCHECK_LAUNCH_THREAD=0)
#                 and on (new_i, =1: the step's graph replay and marker issued by a worker, `impl/launcher.py`),
#                 $AB_PASSES each (default 3), alternating which goes first, compared by bench.ab_compare
#   bench_host_ab alone: host_cost passes of this tree and of the tree at $AB_BASE (an earlier commit exported there:
#                 `git archive COMMIT | tar x -C DIR`; the device's own git metadata may be stale), alternating
#                 (the base first in odd passes, this tree first in even ones), $AB_PASSES each (default 3), so both
#                 are timed under one host's conditions; then the pairs'
#                 ratios compared (`python -m runnercheck.bench.lab.ab_compare`: medians, pairs down, Wilcoxon p; ab.json)
#   bench_tree_ab alone: this tree against the one at $AB_BASE in lockstep (`python -m runnercheck.bench.lab.tree_ab --device cuda`):
#                 a worker process per tree, the host_cost runner and workload each, asked for blocks of 10 steps in
#                 turn, $TREE_AB_PAIRS fresh pairs (default 4) at $TREE_AB_REQS requests (default "64 256"), 1% churn:
#                 both trees timed under the host's speed of the moment; AB_NEW (default this tree): the new side;
#                 TREE_AB_PIN: both sides' workers on these CPUs (`taskset -c`)
#   bench_tree_env alone: bench_tree_ab's lockstep on this tree against itself with TREE_AB_ENV (NAME=VALUE) set in the
#                 new side's workers (e.g. RUNNERCHECK_LAUNCH_NAP_FOR_US=0: the launch thread without naps)
#   bench_tree_native alone: bench_tree_ab's lockstep on this tree against itself with RUNNERCHECK_NATIVE=0 in the new
#                 side's workers: what the C twins of impl/native buy a step on this host (new / base > 1: they save)
#   host_lines    alone: each statement of the step's functions timed on this host (`host_profile --lines`, a clock
#                 read before each): the fused steady step at 64 requests (`ModelRunner._execute_steady`), the churn
#                 step at 64 and 256 requests (`ModelRunner._execute`, its `_update_rows` and `_check`)
#   host_lines_admit  alone: the same per statement, inside an admitting step and its pieces (reading, admission, plan,
#                 staging, flushes, output) at 256 and 64 requests, 1% churn (LINES_REQS="64": one size)
#   host_lines_drain  alone: the end of a step's stream scope timed per statement at 64 requests, 1% and 0% churn: how
#                 long a step waits at its end for the launch thread to issue what it pushed (`Device.drain_launches`)
#   host_cpu_time alone: each step's wall time against its thread's CPU time and the launch thread's (`host_profile
#                 --cpu-time`) at 64 and 256 requests, 1% and 0% churn: whether a step computes all its wall time
#   host_spin     alone: host_cpu_time's 64-request, 1% churn probe with the launch thread polling 0, 300 and 50000 us
#                 after its last job (RUNNERCHECK_LAUNCH_SPIN_US), twice in turn, then with the thread off: whether its
#                 polling slows the step's own thread
#   host_cache    alone: host_cpu_time's probe at 64 and 256 requests, 1% churn, with 0, 512 KiB, 2, 8, 32 and 128 MiB of
#                 other memory written before each step, the sizes in turn (`--sweep-kib`): what cold caches cost a step
#                 (600 steps at 256: the workload's longest requests outgrow max_model_len in 1200; CACHE_REQS="256": one size)
#   host_siblings alone: a Python loop pinned to CPU 0 and to CPU 8, beside a busy loop on each other CPU in turn
#                 (`runnercheck.bench.lab.host_siblings`): hidden SMT siblings among the CPUs the VM shows
#   host_profile  cProfile of execute_model, 256 decode requests, 1% churn and uniform decode (`python -m runnercheck.bench.lab.host_profile`;
#                 prints host enqueues per step and how many Triton launches took the cached launcher), then 1% churn
#                 with RUNNERCHECK_SLOW_LAUNCH=1
#   tune_logprobs (alone, after bench) the logprobs launch shapes (chunk x warps x sub-block x finish capacity x
#                 register cap), timed with and without top-n and checked equal (`python -m runnercheck.bench.lab.tune_selection`)
#   gpu_events    the gpu-marked tests of events, the steady step, its lanes, the launch thread and slot lifetimes
#                 alone (test_device, test_steady_step, test_lanes, test_launcher, test_lifetime: ~45 s)
#   gpu_tests     the gpu-marked tests (the two deep-tail kernel tests are chisq_deep's cases)
#   mutants       `runnercheck mutants --device cuda`
#   mutants_new   the CUDA-graph and prefix-caching mutants alone (`mutants --only ...`), with their controls
#   mutants_bucketed  the mutants planted into bucketed (mixed and decode) steps' launches -- input prep, post-update,
#                 count reset, padding -- and those moved to other workloads when prefills became mixed graphs
#                 (`mutants --no-chisq --only ...`), with their controls
#   mutants_rest  the rest of the catalogue, beside mutants_new, mutants_bucketed and staging_slots (race, sync, sampler,
#                 stream and speculative mutants; `mutants --only ...`, chi-square probes included), with their controls
#   mutant_logprobs_rates  logprobs_from_processed over 3 seeds (`mutants --seeds 3 --only ...`): it patches the sampler's
#                 Python, so it recaptures the graphs (run 52 found it surviving graph-replayed logprob steps)
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
#   chisq_deep    2^12..2^17-token tails 12..30 logits below the head (the runner's sampler)
#   csan          CUDA's stream sanitizer: the stream mutant killed by csan with its control clean
#                 (`mutants --only runner_stream_reads_default_stream_write`), then `stress --csan` and
#                 `chisq --csan --quick` (both must be clean)
#   sanitizer     compute-sanitizer memcheck/racecheck (ci/sanitizer.sh; not in 'all': run it alone, it
#                 instruments every launch; exit 3 = unsupported on this device/runtime)
# Logs and reports go to OUTDIR/<job>; OUTDIR/jobs.txt lists each job's exit status and seconds.
set -uo pipefail
out=${1:?usage: ci/h200.sh OUTDIR JOB...}
shift
jobs=" $* "
[ "$jobs" = " all " ] && jobs=" bench bench_spec host_profile gpu_tests mutants mutants_new race_rates verify stress ngram draft chisq_matrix chisq_power chisq_capped chisq_deep csan "
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1
rc="python3 -m runnercheck.stress.cli"
limit=${JOB_LIMIT_S:-340}

job() {  # job NAME LIMIT_S command...: run one job under a time limit, logging to OUTDIR/NAME.log
  local name=$1 limit=$2 start=$SECONDS status threads=${JOB_THREADS:-2}
  shift 2
  # Jobs run side by side: a few CPU threads each (the float64 oracle's torch ops would otherwise
  # each take every core); the timed bench jobs run alone and keep them all.
  [[ $name == bench* ]] && threads=$(nproc)
  OMP_NUM_THREADS=$threads timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  status=$?
  echo "$name rc=$status ${limit}s-limit $((SECONDS - start))s" | tee -a "$out/jobs.txt"
}
want() { [[ "$jobs" == *" $1 "* ]]; }

python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())" | tee "$out/versions.txt"
# The C parts (impl/native) built in place here, before jobs run side by side: the checkout is used on PYTHONPATH,
# not installed, and nothing compiles at import (setup.py; no network needed).  A failed build is logged, and the
# jobs then use the Python twins (each host_cost row says whether its step reading and diff packing ran in C or Python).
python3 setup.py -q build_ext --inplace >"$out/native_build.log" 2>&1 || echo "impl/native build failed: $out/native_build.log"
# An A/B base tree (AB_BASE: bench_host_ab, bench_tree_ab) is built the same way, or its side would run the Python
# twins; a tree older than setup.py builds its C at first use itself.
if [ -n "${AB_BASE:-}" ] && [ -f "$AB_BASE/setup.py" ]; then
  (cd "$AB_BASE" && python3 setup.py -q build_ext --inplace) >"$out/native_build_base.log" 2>&1 \
    || echo "impl/native build of AB_BASE failed: $out/native_build_base.log"
fi
python3 -c "import runnercheck.impl.native as n; print('native step reading, boundary, staging, rows, seeds, plans and launch thread (impl/native/*.c):', *map(n.describe, n.sources.MODULES))" \
  2>&1 | tee -a "$out/versions.txt"
want bench && job bench "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --out "$out/bench"
want bench_spec && job bench_spec "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_ngram --out "$out/bench_spec"
want gpu_logprobs && job gpu_logprobs "$limit" python3 -m pytest -v -p no:cacheprovider -m "gpu and not stats" \
  tests/impl/test_sampler_split_gpu.py tests/impl/test_sampler_gpu.py -k "logprobs or row_finish or graph"
want bench_logprobs && job bench_logprobs "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only logprobs \
  --out "$out/bench_logprobs"
want bench_sampler && job bench_sampler "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only sampler logprobs \
  --out "$out/bench_sampler"
want gpu_sampler && job gpu_sampler "$limit" python3 -m pytest -v -p no:cacheprovider --durations=15 -m "gpu and not stats" \
  tests/impl/test_sampler_split_gpu.py tests/impl/test_sampler_gpu.py tests/reference/test_rng.py
want bench_host_python && RUNNERCHECK_NATIVE=0 job bench_host_python "${BENCH_LIMIT_S:-420}" $rc bench --device cuda \
  --only host_cost --out "$out/bench_host_python"
want bench_host_ab && job bench_host_ab "${BENCH_LIMIT_S:-500}" bash -c 'base() { (cd "${AB_BASE:?an exported tree of the commit to compare with}" &&
  PYTHONPATH=. python3 -m runnercheck.stress.cli bench --device cuda --only host_cost --out "$1"); }
  new() { python3 -m runnercheck.stress.cli bench --device cuda --only host_cost --out "$1"; }
  for i in $(seq "${AB_PASSES:-3}"); do  # odd passes run the base first, even ones this tree: neither always goes first
    if [ $((i % 2)) = 1 ]; then base "$0/base_$i" && new "$0/new_$i" || exit 1
    else new "$0/new_$i" && base "$0/base_$i" || exit 1; fi
  done; python3 -m runnercheck.bench.lab.ab_compare "$0" --out "$0/ab.json"' "$out/bench_host_ab"
want bench_tree_ab && job bench_tree_ab "${BENCH_LIMIT_S:-500}" python3 -m runnercheck.bench.lab.tree_ab "${AB_BASE:?an exported tree of the commit to compare with}" \
  --new "${AB_NEW:-.}" --device cuda --reqs ${TREE_AB_REQS:-64 256} --pairs "${TREE_AB_PAIRS:-4}" ${TREE_AB_PIN:+--pin "$TREE_AB_PIN"} \
  --out "$out/bench_tree_ab.json"
want bench_tree_env && job bench_tree_env "${BENCH_LIMIT_S:-500}" python3 -m runnercheck.bench.lab.tree_ab . --device cuda \
  --reqs ${TREE_AB_REQS:-64} --pairs "${TREE_AB_PAIRS:-4}" --new-env "${TREE_AB_ENV:?NAME=VALUE for the new side}" \
  --out "$out/bench_tree_env.json"
want bench_tree_native && job bench_tree_native "${BENCH_LIMIT_S:-500}" python3 -m runnercheck.bench.lab.tree_ab . --device cuda \
  --reqs ${TREE_AB_REQS:-64 256} --pairs "${TREE_AB_PAIRS:-4}" --new-env RUNNERCHECK_NATIVE=0 --out "$out/bench_tree_native.json"
want host_launch_thread && job host_launch_thread "${BENCH_LIMIT_S:-420}" bash -c 'off() { RUNNERCHECK_LAUNCH_THREAD=0 python3 -m runnercheck.stress.cli bench --device cuda --only host_cost --out "$1"; }
  on() { RUNNERCHECK_LAUNCH_THREAD=1 python3 -m runnercheck.stress.cli bench --device cuda --only host_cost --out "$1"; }
  for i in $(seq "${AB_PASSES:-3}"); do  # odd passes run the thread off first, even ones on first
    if [ $((i % 2)) = 1 ]; then off "$0/base_$i" && on "$0/new_$i" || exit 1
    else on "$0/new_$i" && off "$0/base_$i" || exit 1; fi
  done; python3 -m runnercheck.bench.lab.ab_compare "$0" --out "$0/ab.json"' "$out/host_launch_thread"
want host_affinity && job host_affinity "${BENCH_LIMIT_S:-420}" bash -c 'free() { python3 -m runnercheck.stress.cli bench --device cuda --only host_cost --out "$1"; }
  held() { taskset -c "${AFFINITY_CPUS:-4,5}" python3 -m runnercheck.stress.cli bench --device cuda --only host_cost --out "$1"; }
  for i in $(seq "${AB_PASSES:-4}"); do  # odd passes run free first, even ones held first
    if [ $((i % 2)) = 1 ]; then free "$0/base_$i" && held "$0/new_$i" || exit 1
    else held "$0/new_$i" && free "$0/base_$i" || exit 1; fi
  done; python3 -m runnercheck.bench.lab.ab_compare "$0" --out "$0/ab.json"' "$out/host_affinity"
want bench_host && job bench_host "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only host_cost --out "$out/bench_host" &&
  RUNNERCHECK_SLOW_LAUNCH=1 job bench_host_slow_launch "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only host_cost \
  --out "$out/bench_host_slow_launch"
want host_primitives && job host_primitives 120 python3 -m runnercheck.bench.lab.host_primitives --out "$out/host_primitives.json"
want graph_census && job graph_census 200 python3 -m runnercheck.bench.lab.graph_census --out "$out/graph_census.json"
want host_trace && job host_trace 300 bash -c "python3 -m runnercheck.bench.lab.host_profile --device cuda --reqs 256 --steps 200 --churn 0 --phases &&
  python3 -m runnercheck.bench.lab.host_profile --device cuda --reqs 64 --steps 200 --churn 0 --phases &&
  python3 -m runnercheck.bench.lab.host_profile --device cuda --reqs 256 --steps 100 --churn 0 --trace --top 30"
want host_trace_eager && job host_trace_eager 300 bash -c "python3 -m runnercheck.bench.lab.host_profile --device cuda --reqs 256 --steps 200 --churn 0.01 --phases &&
  python3 -m runnercheck.bench.lab.host_profile --device cuda --reqs 64 --steps 200 --churn 0.01 --phases &&
  python3 -m runnercheck.bench.lab.host_profile --device cuda --reqs 256 --steps 100 --churn 0.01 --trace --top 45"
hp="python3 -m runnercheck.bench.lab.host_profile --device cuda --steps 300"
want host_lines && job host_lines 300 bash -c "$hp --reqs 64 --churn 0 --lines runnercheck.impl.runner:ModelRunner._execute_steady &&
  $hp --reqs 64 --churn 0.01 --lines runnercheck.impl.runner:ModelRunner._execute && $hp --reqs 64 --churn 0.01 --lines runnercheck.impl.runner:ModelRunner._update_rows &&
  $hp --reqs 256 --churn 0.01 --lines runnercheck.impl.runner:ModelRunner._execute && $hp --reqs 256 --churn 0.01 --lines runnercheck.impl.runner:ModelRunner._check"
want host_lines_admit && job host_lines_admit 300 bash -c "for reqs in ${LINES_REQS:-256 64}; do $hp --reqs \$reqs --churn 0.01 --depth 1 \
  --lines runnercheck.impl.runner:ModelRunner._execute --lines runnercheck.impl.runner:ModelRunner._check --lines runnercheck.impl.step_reader:read_step --lines runnercheck.impl.runner:ModelRunner._update_rows --lines runnercheck.impl.state:RequestStateTable.admit_staged \
  --lines runnercheck.impl.input_batch:plan_step --lines runnercheck.impl.input_batch:InputBatch.stage --lines runnercheck.impl.graphs:CudaGraphManager.select \
  --lines runnercheck.impl.staged_writes:StagedWriteGroup.flush --lines runnercheck.impl.sample.state:SamplingState.flush \
  --lines runnercheck.impl.runner:ModelRunner._enqueue_output --lines runnercheck.impl.state:RequestStateTable._take_free_row \
  --lines runnercheck.impl.state:RequestStateTable.is_quarantined --lines runnercheck.impl.state:RequestStateTable._use_event \
  --lines runnercheck.impl.device:DeviceEvent.query --lines runnercheck.impl.state:RequestStateTable.release \
  --lines runnercheck.impl.staged_writes:StagedWriteGroup._pack_members --lines runnercheck.impl.state:RequestStateTable.advance || exit 1; done"
want host_lines_drain && job host_lines_drain 200 bash -c "for churn in 0.01 0; do $hp --reqs 64 --churn \$churn --depth 1 \
  --lines runnercheck.impl.device:_StreamScope.__exit__ --lines runnercheck.impl.device:Device.drain_launches || exit 1; done"
want host_cpu_time && job host_cpu_time 200 bash -c "for reqs in 64 256; do for churn in 0.01 0; do \
  $hp --reqs \$reqs --churn \$churn --cpu-time || exit 1; done; done"
want host_spin && job host_spin 300 bash -c "for pass in 1 2; do for spin in 0 300 50000; do echo spin_us=\$spin pass=\$pass; \
  RUNNERCHECK_LAUNCH_SPIN_US=\$spin $hp --reqs 64 --churn 0.01 --cpu-time || exit 1; done; done; echo launch thread off; \
  RUNNERCHECK_LAUNCH_THREAD=0 $hp --reqs 64 --churn 0.01 --cpu-time"
want host_cache && job host_cache 300 bash -c "for reqs in ${CACHE_REQS:-64 256}; do $hp --reqs \$reqs --churn 0.01 --cpu-time \
  --steps \$((reqs > 64 ? 600 : 1200)) --sweep-kib 0 512 2048 8192 32768 131072 || exit 1; done"
want host_siblings && job host_siblings 200 bash -c "python3 -m runnercheck.bench.lab.host_siblings --cpu 0 --out $out/host_siblings_cpu0.json &&
  python3 -m runnercheck.bench.lab.host_siblings --cpu 8 --out $out/host_siblings_cpu8.json"
want tune_logprobs && job tune_logprobs 300 python3 -m runnercheck.bench.lab.tune_selection --device cuda --out "$out/tune_logprobs"
want host_profile && job host_profile "$limit" bash -c "python3 -m runnercheck.bench.lab.host_profile --device cuda --reqs 256 --steps 100 &&
  python3 -m runnercheck.bench.lab.host_profile --device cuda --reqs 256 --steps 100 --churn 0 &&
  RUNNERCHECK_SLOW_LAUNCH=1 python3 -m runnercheck.bench.lab.host_profile --device cuda --reqs 256 --steps 100" &
want gpu_events && job gpu_events "$limit" python3 -m pytest -v -p no:cacheprovider -m "gpu and not stats" \
  tests/impl/test_device.py tests/impl/test_steady_step.py tests/impl/test_lanes.py tests/impl/test_launcher.py \
  tests/checks/test_lifetime.py
want gpu_tests && job gpu_tests "$limit" python3 -m pytest -v -p no:cacheprovider --durations=15 -m "gpu and not stats" tests \
  --deselect tests/stress/test_mutants.py::test_cuda_run_kills_every_mutant_including_the_noise_bugs \
  --deselect tests/impl/test_sampler_tail.py &
want mutants && job mutants "$limit" $rc mutants --device cuda --out "$out/mutants" &
want mutants_new && job mutants_new "$limit" $rc mutants --device cuda --junit "$out/mutants_new.xml" --only \
  graph_buffer_reallocated padding_row_writes_live_state predicate_admits_larger_batch graph_init_only_at_capture mixed_tail_left_stale \
  graph_skips_admitted_count_reset \
  prefix_hit_recomputes_cached_block block_table_tail_kept prefix_hit_one_block_too_long evicted_block_still_referenced \
  refcount_dropped_on_preemption --out "$out/mutants_new" &
want mutants_bucketed && job mutants_bucketed "$limit" $rc mutants --device cuda --no-chisq --only positions_off_by_one \
  slot_mapping_wrong_block idx_mapping_off_by_one num_computed_not_advanced tensor_in_python_if staged_writes_wrong_order \
  stale_row_after_preempt graph_buffer_reallocated padding_row_writes_live_state predicate_admits_larger_batch \
  graph_init_only_at_capture mixed_tail_left_stale graph_skips_admitted_count_reset --out "$out/mutants_bucketed" &
want mutants_rest && job mutants_rest "$limit" $rc mutants --device cuda --only pageable_nonblocking_copy \
  output_slot_overwritten_early item_in_step synchronize_in_step fp16_gumbel_noise u24_uniform top_k_off_by_one \
  top_p_boundary_dropped temperature_twice penalty_sign_flipped logprobs_from_processed runner_stream_reads_default_stream_write \
  accepted_count_read_on_host spec_accept_ratio_normalised spec_residual_abs spec_accept_uses_draft_noise spec_bonus_dropped \
  --out "$out/mutants_rest" &
want mutant_logprobs_rates && job mutant_logprobs_rates "$limit" $rc mutants --device cuda --no-chisq --seeds 3 \
  --only logprobs_from_processed --out "$out/mutant_logprobs_rates" &
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
want draft_rerun && (  # after run 12: the mutants with the twin's waits named, the bench alone, run 12's divergence replayed twice
  job draft_bench "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_draft --out "$out/draft_bench"
  job draft_mutants 240 $rc mutants --device cuda --no-chisq --only spec_accept_ratio_normalised spec_residual_abs \
    spec_accept_uses_draft_noise spec_bonus_dropped --out "$out/draft_mutants" &
  for k in 1 2; do
    job draft_self_replay_$k 120 $rc replay docs/results/2026-12-01-h200-draft_stress_self-run12-repro.json --no-progress
  done
  wait
)
want capture_probe && (  # run 13's spec_draft capture failure: the no-speculation runner alone, default and 2048 x 4 logprobs
  job capture_probe_default 150 python3 ci/capture_probe.py &
  job capture_probe_2048x4 150 python3 ci/capture_probe.py --logprobs-shape 2048x4 &
  wait
)
want spec_diag && (  # which earlier runner breaks the 64-request capture of spec_draft, and whether the fast launcher is involved
  for arm in off draft self; do job capture_after_$arm 300 python3 ci/capture_probe.py --after-arm $arm & done
  RUNNERCHECK_SLOW_LAUNCH=1 job draft_bench_slow_launch 420 $rc bench --device cuda --only spec_draft \
    --out "$out/draft_bench_slow_launch" &
  wait
) &
want draft_bench_ab && (  # spec_draft with the fast launcher (twice) and without it, side by side: does run 13's capture failure recur
  for k in 1 2; do job draft_bench_fast_$k 420 $rc bench --device cuda --only spec_draft --out "$out/draft_bench_fast_$k" & done
  RUNNERCHECK_SLOW_LAUNCH=1 job draft_bench_slow 420 $rc bench --device cuda --only spec_draft --out "$out/draft_bench_slow" &
  wait
) &
want spec_benches && job bench_spec_draft "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_draft \
  --out "$out/bench_spec_draft" && job bench_spec_ngram "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_ngram \
  --out "$out/bench_spec_ngram"
want spec_mutant_rates && job spec_mutant_rates "$limit" $rc mutants --device cuda --seeds 5 --no-chisq --only \
  spec_accept_ratio_normalised spec_residual_abs spec_accept_uses_draft_noise spec_bonus_dropped accepted_count_read_on_host \
  --out "$out/spec_mutant_rates" &
want spec_profile && (  # where a speculative decode step's time goes (host enqueue vs wait, cProfile), 8 requests
  for d in qwen3-0.6b-draft ngram off; do job spec_profile_$d 240 python3 -m runnercheck.bench.lab.spec_profile --device cuda --reqs 8 \
    --draft $d & done
  wait
) &
want gpu_launch && job gpu_launch 200 python3 -m pytest -v -p no:cacheprovider -m gpu tests/impl/test_launch.py &
want spec_stats && job spec_stats "$limit" $rc chisq --device cuda --samples 2000000 --cases spec-q --no-calibration \
  --biases spec-ratio-normalised spec-residual-abs spec-accept-shares-draft-noise spec-bonus-dropped --out "$out/spec_stats" &
want draft_self && job draft_stress_self 240 $rc stress --device cuda --seed 2 --steps 200 --delay-us auto --max-inflight 2 \
  --proposer draft --draft-model micro --no-progress --out "$out/draft_stress_self" &
want draft && (
  job draft_tests "$limit" python3 -m pytest -v -p no:cacheprovider -m gpu tests/impl/test_draft_proposer.py
  job draft_stress 180 $rc stress --device cuda --seed 1 --steps 200 --delay-us auto --max-inflight 2 --proposer draft \
    --no-progress --out "$out/draft_stress"
  job draft_stress_self 180 $rc stress --device cuda --seed 2 --steps 200 --delay-us auto --max-inflight 2 --proposer draft \
    --draft-model micro --no-progress --out "$out/draft_stress_self"
  job draft_mutants 240 $rc mutants --device cuda --no-chisq --only spec_accept_ratio_normalised spec_residual_abs \
    spec_accept_uses_draft_noise spec_bonus_dropped --out "$out/draft_mutants"
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
want chisq_matrix && job chisq_matrix "$limit" $rc chisq --device cuda --samples 2000000 --no-power --out "$out/chisq_matrix" &
want chisq_power && job chisq_power "$limit" $rc chisq --device cuda --no-matrix --no-calibration \
  --biases top-k-off-by-one top-p-drop-boundary top-p-extra-token temperature-twice penalty-wrong-sign \
  draft-shared-noise bf16-noise u24-uniform fp16-noise min-p-before-temperature --out "$out/chisq_power" &
want chisq_capped && job chisq_capped "$limit" $rc chisq --device cuda --no-matrix --no-calibration \
  --biases u31-floor u32-uniform --power-repeats 2 --out "$out/chisq_capped" &
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
