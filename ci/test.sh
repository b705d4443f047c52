#!/usr/bin/env bash
# The README's test command: set up, then the CPU suite in parallel (xdist), with Triton
# interpreted. On a host with a CUDA GPU a second pass runs the `gpu`-marked tests compiled.
# Extra arguments go to pytest (both passes).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/ci/setup.sh"
cd "$root"
# CPU pass: hide any GPU so cpu/sim kernels run in Triton's interpreter on CPU tensors.
CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 .venv/bin/python -m pytest -n auto -q "$@"
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  .venv/bin/python -m pytest -q -m gpu "$@"
fi
