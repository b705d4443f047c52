#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in the checkout with runnercheck installed.
# torch==2.13.0 (a CPU wheel) is installed only when no torch is importable; a GPU host
# keeps its own CUDA torch (the venv sees system site-packages).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv --system-site-packages .venv
fi
vpy=.venv/bin/python
stamp=.venv/.runnercheck-installed
# The install also compiles impl/native's C modules in place (setup.py): a changed C source or header installs again.
if [ -f "$stamp" ] && [ -z "$(find pyproject.toml setup.py impl/native -newer "$stamp" \( -name '*.toml' -o -name '*.py' -o -name '*.c' -o -name '*.h' \) -print -quit)" ]; then
  exit 0
fi
if ! "$vpy" -c "import torch" >/dev/null 2>&1; then
  "$vpy" -m pip install -q "torch==2.13.0"
fi
if ! "$vpy" -m pip install -q -e . >.venv/pip.log 2>&1; then cat .venv/pip.log >&2; exit 1; fi
# Loading impl/native's modules here says (one warning) when the install could not compile them.
"$vpy" -c "import torch, triton, numpy, scipy, hypothesis, runnercheck.impl.native as n; [n.load(m) for m in n.sources.MODULES]"
touch "$stamp"
