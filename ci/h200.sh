#!/usr/bin/env bash
# The GPU runs behind docs/BENCHMARKS.md, docs/CHISQ.md and docs/MUTANTS.md, as run on a lent H200
# (no network, torch/triton from the image, the checkout on PYTHONPATH). Phases fit one 10-minute
# call each; every job has its own time limit so one slow job cannot lose the others' results.
#
#   bash ci/h200.sh bench|check OUTDIR
#
#   bench: `runnercheck bench --device cuda` alone on the GPU (timings); then, side by side, the
#          gpu-marked tests and the mutant catalogue (its racing workloads want an uncontended GPU).
#   check: side by side: verify --quick on cuda; delay-injected stress with and without
#          reuse_staging_early, and replay of the repro; the chi-square matrix with 2e6 draws per
#          case + calibration; the power of every planted bias (the capped-noise ones, which only
#          ~1e12 token-draws show, in a process of their own); the deep tails (2^17 tokens 25/30
#          logits down) with the runner's sampler.
# Logs and reports go to OUTDIR/<job>; OUTDIR/jobs.txt lists each job's exit status and seconds.
set -uo pipefail
phase=${1:?phase: bench|check}
out=${2:?output folder}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1
rc="python3 -m stress.cli"

job() {  # job NAME LIMIT_S command...: run one job under a time limit, logging to OUTDIR/NAME.log
  local name=$1 limit=$2 start=$SECONDS status
  shift 2
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  status=$?
  echo "$name rc=$status ${limit}s-limit $((SECONDS - start))s" | tee -a "$out/jobs.txt"
}

python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, torch.cuda.get_device_name())" | tee "$out/versions.txt"
case $phase in
  bench)
    job bench 270 $rc bench --device cuda --out "$out/bench"
    job gpu_tests 300 python3 -m pytest -q -p no:cacheprovider -m "gpu and not stats" tests \
      --deselect tests/stress/test_mutants.py::test_cuda_run_kills_every_mutant_including_the_noise_bugs &
    job mutants 300 $rc mutants --device cuda --out "$out/mutants" &
    wait
    ;;
  check)
    job verify 500 $rc verify --device cuda --quick --no-progress --out "$out/verify" &
    (
      job stress_mutant 120 $rc stress --device cuda --seed 1 --steps 300 --delay-us 300 --mutant reuse_staging_early \
        --no-progress --out "$out/stress_mutant"
      job replay_mutant 120 $rc replay "$out/stress_mutant/repro.json"
      job stress_clean 150 $rc stress --device cuda --seed 1 --steps 300 --delay-us 300 --no-progress --out "$out/stress_clean"
    ) &
    job chisq_matrix 500 $rc chisq --device cuda --samples 2000000 --no-power --out "$out/chisq_matrix" &
    job chisq_power 500 $rc chisq --device cuda --no-matrix --no-calibration \
      --biases top-k-off-by-one top-p-drop-boundary top-p-extra-token temperature-twice penalty-wrong-sign \
      draft-shared-noise bf16-noise u24-uniform fp16-noise --out "$out/chisq_power" &
    job chisq_capped 500 $rc chisq --device cuda --no-matrix --no-calibration --biases u31-floor u32-uniform \
      --power-repeats 2 --out "$out/chisq_capped" &
    job chisq_deep 500 $rc chisq --device cuda --deep-tail --cases tail-d --no-calibration --no-power --out "$out/chisq_deep" &
    wait
    ;;
  *) echo "unknown phase $phase" >&2; exit 2 ;;
esac
cat "$out/jobs.txt"
