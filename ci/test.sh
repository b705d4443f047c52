#!/usr/bin/env bash
# The README's test command: set up, then the CPU suite in parallel (xdist).
# Extra arguments go to pytest (e.g. `bash ci/test.sh -m gpu`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/ci/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest -n auto -q "$@"
