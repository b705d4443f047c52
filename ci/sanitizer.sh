#!/usr/bin/env bash
# compute-sanitizer over a small GPU subset: memcheck must report 0 errors on the runner's kernels
# and must catch a planted out-of-bounds Triton store; racecheck (shared-memory hazards) on a smaller
# subset.  Runs on a machine with a GPU and compute-sanitizer (the H200 image has it):
#
#   bash ci/sanitizer.sh OUTDIR            (or as a job: bash ci/h200.sh OUTDIR sanitizer)
#
# Steps, each with its own time limit (at most 6 minutes in all, expected under 4; Triton JIT compiles and every
# instrumented kernel launch are slow under the sanitizer, so the subset is small):
#   0. probe        memcheck on a trivial torch program: no support here -> exit 3, said plainly
#   1. planted      tests/checks/test_sanitizer_oob.py under memcheck: must FAIL with
#                   "Invalid __global__ write" (the check that the sanitizer can see a Triton bug)
#   2. memcheck     RNG, sampler, staging and device gpu tests, then an eager `runnercheck stress`
#                   run (staged writes, input prep, paged attention, sampler): "0 errors" each
#   3. racecheck    the RNG kernel and the sampler's filter test: "0 hazards"/"0 errors"
# PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor is its own cudaMalloc, so a write past a tensor's
# end is past an allocation (the caching allocator would hide it inside a larger block).  That
# also rules out CUDA-graph capture (no cudaMalloc while capturing): the runner runs --eager here.
#
# Exit: 0 all good; 1 a check failed (planted bug not caught, errors in the clean subset, a step
# timed out); 3 compute-sanitizer unsupported on this device/runtime (or not installed).
# Logs: OUTDIR/<step>.log; OUTDIR/sanitizer.txt lists each step's verdict.
set -uo pipefail
out=${1:?usage: ci/sanitizer.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1
ERROR_RC=86  # compute-sanitizer's exit status when it reported an error
summary="$out/sanitizer.txt"
: >"$summary"
failed=0

say() { echo "$*" | tee -a "$summary"; }

find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

unsupported() {
  say "compute-sanitizer: unsupported on this device/runtime: $*"
  exit 3
}

cs=$(find_sanitizer) || unsupported "compute-sanitizer not found (PATH, /usr/local/cuda)"
"$cs" --version >"$out/version.log" 2>&1 || unsupported "'$cs --version' failed: $(head -n 3 "$out/version.log" | tr '\n' ' ')"
say "using $cs ($(grep -m1 -i version "$out/version.log"))"

# sanitize NAME LIMIT_S TOOL command...: one step under compute-sanitizer; sets $step_rc, log in OUTDIR/NAME.log
sanitize() {
  local name=$1 limit=$2 tool=$3 start=$SECONDS
  shift 3
  timeout --kill-after=10 "$limit" "$cs" --tool "$tool" --error-exitcode "$ERROR_RC" --target-processes all \
    --print-limit 20 "$@" >"$out/$name.log" 2>&1
  step_rc=$?
  step_s=$((SECONDS - start))
}

# 0. Probe: a trivial CUDA program must run clean under memcheck, or this runtime cannot be sanitized.
sanitize probe 60 memcheck python3 -c \
  "import torch; x = torch.ones(8, device='cuda'); torch.cuda.synchronize(); print('probe sum', float(x.sum()))"
if [ "$step_rc" -ne 0 ] || ! grep -q "probe sum 8.0" "$out/probe.log"; then
  reason=$(grep -m1 -iE "not supported|unsupported|error|failed|unable" "$out/probe.log" | sed 's/^=* *//')
  [ "$step_rc" -eq 124 ] && reason="a trivial torch program timed out after 60 s under memcheck"
  unsupported "${reason:-a trivial torch program failed under memcheck (rc $step_rc, see $out/probe.log)}"
fi
say "probe: ok (${step_s}s)"

# 1. The planted out-of-bounds Triton store must be caught.
export RUNNERCHECK_UNDER_SANITIZER=1  # the planted test's gate
sanitize planted 60 memcheck python3 -m pytest -q -p no:cacheprovider tests/checks/test_sanitizer_oob.py
unset RUNNERCHECK_UNDER_SANITIZER
if [ "$step_rc" -eq "$ERROR_RC" ] && grep -q "Invalid __global__ write" "$out/planted.log"; then
  say "planted: caught ($(grep -m1 -o "ERROR SUMMARY: [0-9]* errors*" "$out/planted.log"), ${step_s}s)"
else
  say "planted: NOT caught (rc $step_rc, no 'Invalid __global__ write' with exit $ERROR_RC; see $out/planted.log)"
  failed=1
fi

# clean NAME LIMIT_S TOOL command...: a step that must report no error.
clean() {
  local name=$1
  sanitize "$@"
  if [ "$step_rc" -eq 0 ] && grep -qE "ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: .*\(0 errors" "$out/$name.log"; then
    say "$name: clean (${step_s}s)"
  else
    local why="rc $step_rc"
    [ "$step_rc" -eq 124 ] && why="timed out"
    [ "$step_rc" -eq "$ERROR_RC" ] && why=$(grep -m1 -oE "(ERROR|RACECHECK) SUMMARY: .*" "$out/$name.log")
    say "$name: FAILED ($why; see $out/$name.log)"
    failed=1
  fi
}

# 2. memcheck on the runner's kernels.
clean memcheck_tests 90 memcheck python3 -m pytest -q -p no:cacheprovider \
  "tests/reference/test_rng.py::test_kernel_bits_match_reference_cuda" \
  "tests/impl/test_sampler_gpu.py::test_large_vocab_matches_reference" \
  "tests/checks/test_lifetime.py::test_cuda_write_after_submit_is_caught" \
  "tests/impl/test_device.py::test_cuda_stream_event_roundtrip"
clean memcheck_runner 90 memcheck python3 -m runnercheck.stress.cli.main stress --device cuda --eager --in-process --seed 1 \
  --steps 16 --no-progress --out "$out/stress"

# 3. racecheck (shared-memory hazards) on two kernels with block reductions.
clean racecheck 60 racecheck python3 -m pytest -q -p no:cacheprovider \
  "tests/reference/test_rng.py::test_kernel_bits_match_reference_cuda" \
  "tests/impl/test_sampler_gpu.py::test_large_vocab_filters_keep_the_reference_set"

[ "$failed" -eq 0 ] && say "sanitizer: all steps passed" || say "sanitizer: FAILED"
exit "$failed"
