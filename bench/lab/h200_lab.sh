#!/usr/bin/env bash
# The benchmark lab's GPU jobs: the investigations behind past host-cost and speculative-decoding
# work (cProfile and per-statement timing of a step, two trees in lockstep, launch and capture
# probes).  They back no claim in the docs; ci/h200.sh holds the product's runs.  Same machine and
# conventions as ci/h200.sh (its job runner: ci/h200_jobs.sh).  Run from the checkout's root:
#
#   bash bench/lab/h200_lab.sh OUTDIR JOB...
#
#   draft_rerun   `bench --only spec_draft` alone, then the four rejection-sampling mutants beside two replays of run
#                 12's draft_stress_self divergence (bench/lab/draft_stress_self-run12-repro.json)
#   spec_diag     four processes side by side: `ci/capture_probe.py --after-arm off|draft|self` (one 8-request arm of
#                 spec_draft, then the 64-request runner's capture) and `bench --only spec_draft` with the fast launcher off
#   draft_self    `stress --proposer draft --draft-model micro` (the target drafting for itself: near ties at every rank)
#   draft_bench_ab  `bench --only spec_draft` twice with the fast launcher and once without it, side by side
#   spec_profile  `python -m runnercheck.bench.lab.spec_profile --device cuda --reqs 8 --draft qwen3-0.6b-draft|ngram|off` side by side
#   spec_kernels  `spec_profile --kernels`: the draft arm at 8 and 64 requests, then no speculation at 8, one after
#                 another (SPEC_KERNELS_ARMS="REQS DRAFT,...": others): device time per kernel over 12 decode steps
#                 (graph replays' kernels included)
#   capture_probe `python ci/capture_probe.py` (the spec_draft bench's 64-request runner built alone; its graph capture
#                 passes or fails) with the default logprobs launch shape and with 2048 x 4, side by side
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
out=${1:?usage: bench/lab/h200_lab.sh OUTDIR JOB...}
shift
jobs=" $* "
. ci/h200_jobs.sh
want bench_host_python && RUNNERCHECK_NATIVE=0 job bench_host_python "${BENCH_LIMIT_S:-420}" $rc bench --device cuda \
  --only host_cost --out "$out/bench_host_python"
want bench_host_ab && job bench_host_ab "${BENCH_LIMIT_S:-500}" bash -c 'base() { (cd "${AB_BASE:?an exported tree of the commit to compare with}" &&
  PYTHONPATH=. python3 -m runnercheck.stress.cli.main bench --device cuda --only host_cost --out "$1"); }
  new() { python3 -m runnercheck.stress.cli.main bench --device cuda --only host_cost --out "$1"; }
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
want host_launch_thread && job host_launch_thread "${BENCH_LIMIT_S:-420}" bash -c 'off() { RUNNERCHECK_LAUNCH_THREAD=0 python3 -m runnercheck.stress.cli.main bench --device cuda --only host_cost --out "$1"; }
  on() { RUNNERCHECK_LAUNCH_THREAD=1 python3 -m runnercheck.stress.cli.main bench --device cuda --only host_cost --out "$1"; }
  for i in $(seq "${AB_PASSES:-3}"); do  # odd passes run the thread off first, even ones on first
    if [ $((i % 2)) = 1 ]; then off "$0/base_$i" && on "$0/new_$i" || exit 1
    else on "$0/new_$i" && off "$0/base_$i" || exit 1; fi
  done; python3 -m runnercheck.bench.lab.ab_compare "$0" --out "$0/ab.json"' "$out/host_launch_thread"
want host_affinity && job host_affinity "${BENCH_LIMIT_S:-420}" bash -c 'free() { python3 -m runnercheck.stress.cli.main bench --device cuda --only host_cost --out "$1"; }
  held() { taskset -c "${AFFINITY_CPUS:-4,5}" python3 -m runnercheck.stress.cli.main bench --device cuda --only host_cost --out "$1"; }
  for i in $(seq "${AB_PASSES:-4}"); do  # odd passes run free first, even ones held first
    if [ $((i % 2)) = 1 ]; then free "$0/base_$i" && held "$0/new_$i" || exit 1
    else held "$0/new_$i" && free "$0/base_$i" || exit 1; fi
  done; python3 -m runnercheck.bench.lab.ab_compare "$0" --out "$0/ab.json"' "$out/host_affinity"
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
  --lines runnercheck.impl.runner:ModelRunner._enqueue_output --lines runnercheck.impl.quarantine:RowQuarantine._take_free_row \
  --lines runnercheck.impl.quarantine:RowQuarantine.is_quarantined --lines runnercheck.impl.quarantine:RowQuarantine._use_event \
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
want draft_rerun && (  # after run 12: the mutants with the twin's waits named, the bench alone, run 12's divergence replayed twice
  job draft_bench "${BENCH_LIMIT_S:-420}" $rc bench --device cuda --only spec_draft --out "$out/draft_bench"
  job draft_mutants 240 $rc mutants --device cuda --no-chisq --only spec_accept_ratio_normalised spec_residual_abs \
    spec_accept_uses_draft_noise spec_bonus_dropped --out "$out/draft_mutants" &
  for k in 1 2; do
    job draft_self_replay_$k 120 $rc replay bench/lab/draft_stress_self-run12-repro.json --no-progress
  done
  wait
)
want capture_probe && (  # run 13's spec_draft capture failure: the no-speculation runner alone, default and 2048 x 4 logprobs
  job capture_probe_default 150 python3 bench/lab/capture_probe.py &
  job capture_probe_2048x4 150 python3 bench/lab/capture_probe.py --logprobs-shape 2048x4 &
  wait
)
want spec_diag && (  # which earlier runner breaks the 64-request capture of spec_draft, and whether the fast launcher is involved
  for arm in off draft self; do job capture_after_$arm 300 python3 bench/lab/capture_probe.py --after-arm $arm & done
  RUNNERCHECK_SLOW_LAUNCH=1 job draft_bench_slow_launch 420 $rc bench --device cuda --only spec_draft \
    --out "$out/draft_bench_slow_launch" &
  wait
) &
want draft_bench_ab && (  # spec_draft with the fast launcher (twice) and without it, side by side: does run 13's capture failure recur
  for k in 1 2; do job draft_bench_fast_$k 420 $rc bench --device cuda --only spec_draft --out "$out/draft_bench_fast_$k" & done
  RUNNERCHECK_SLOW_LAUNCH=1 job draft_bench_slow 420 $rc bench --device cuda --only spec_draft --out "$out/draft_bench_slow" &
  wait
) &
want spec_profile && (  # where a speculative decode step's time goes (host enqueue vs wait, cProfile), 8 requests
  for d in qwen3-0.6b-draft ngram off; do job spec_profile_$d 240 python3 -m runnercheck.bench.lab.spec_profile --device cuda --reqs 8 \
    --draft $d & done
  wait
) &
want spec_kernels && (  # device time per kernel of a speculative decode step (torch.profiler), one at a time
  IFS=, read -ra arms <<< "${SPEC_KERNELS_ARMS:-8 qwen3-0.6b-draft,64 qwen3-0.6b-draft,8 off}"
  for arm in "${arms[@]}"; do set -- $arm
    job spec_kernels_$2_$1 "${SPEC_KERNELS_LIMIT_S:-150}" python3 -m runnercheck.bench.lab.spec_profile --device cuda --reqs $1 \
      --draft $2 --steps 12 --kernels --top 45; done
) &
want draft_self && job draft_stress_self 240 $rc stress --device cuda --seed 2 --steps 200 --delay-us auto --max-inflight 2 \
  --proposer draft --draft-model micro --no-progress --out "$out/draft_stress_self" &
wait
cat "$out/jobs.txt"
