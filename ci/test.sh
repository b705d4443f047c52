#!/usr/bin/env bash
# The README's test command: set up, then the CPU suite in parallel (xdist), with Triton
# interpreted. On a host with a CUDA GPU a second pass runs the `gpu`-marked tests compiled.
# Extra arguments go to pytest (both passes).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/ci/setup.sh"
cd "$root"
py=.venv/bin/python
has_cuda=0
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && has_cuda=1
if [ "$has_cuda" = 0 ] || CUDA_VISIBLE_DEVICES="" "$py" ci/interp_probe.py >/dev/null 2>&1; then
  # CPU pass: hide any GPU so cpu/sim kernels run in Triton's interpreter on CPU tensors.
  CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 "$py" -m pytest -n auto -q "$@"
else
  echo "note: Triton's interpreter does not run on this host (triton 3.6 needs numpy < 2.4); CPU pass skipped" >&2
fi
if [ "$has_cuda" = 1 ]; then
  "$py" -m pytest -q -m gpu "$@"
fi
