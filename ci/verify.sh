#!/usr/bin/env bash
# The README's main-job command: set up, then `runnercheck verify` (cuda when a GPU is present,
# else sim). Extra arguments go to verify (e.g. `bash ci/verify.sh --quick --seed 3`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/ci/setup.sh"
cd "$root"
exec .venv/bin/runnercheck verify "$@"
