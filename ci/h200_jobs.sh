# Sourced by ci/h200.sh (the product's GPU runs) and bench/lab/h200_lab.sh (the lab's): the job runner and
# the machine's versions.  The caller sets `out` (OUTDIR) and `jobs` (" job1 job2 ... ") first.
set -uo pipefail
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1
rc="python3 -m runnercheck.stress.cli.main"
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
# An A/B base tree (AB_BASE: the lab's bench_host_ab, bench_tree_ab) is built the same way, or its side would run the
# Python twins; a tree older than setup.py builds its C at first use itself.
if [ -n "${AB_BASE:-}" ] && [ -f "$AB_BASE/setup.py" ]; then
  (cd "$AB_BASE" && python3 setup.py -q build_ext --inplace) >"$out/native_build_base.log" 2>&1 \
    || echo "impl/native build of AB_BASE failed: $out/native_build_base.log"
fi
python3 -c "import runnercheck.impl.native as n; print('native step reading, boundary, staging, rows, seeds, plans and launch thread (impl/native/*.c):', *map(n.describe, n.sources.MODULES))" \
  2>&1 | tee -a "$out/versions.txt"
