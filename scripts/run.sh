#!/usr/bin/env bash
# The main job: install dspark into a virtual environment (no torch: the demo runs dspark's
# native Qwen3 target), then speculative decoding on the bundled models (a trained tiny Qwen3
# target + DSpark drafter shipped in the wheel) over 8 held-out prompts (standard-library files
# the pair never trained on, shipped with the package): streams each continuation with the
# accepted drafts marked, then reports the aggregate acceptance length, per-position acceptance
# and the speedup over target-only decoding (the same native target) measured in the same run.
#
# The environment is `.venv` in the clone, or DSPARK_VENV; it is created when missing and
# reused after. Extra arguments go to `dspark demo` (see `dspark demo --help`; `--target-backend
# hf` runs the target in transformers and needs `pip install "dspark[torch]"`).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${DSPARK_VENV:-$PWD/.venv}"
if [[ ! -x "$venv/bin/python3" ]]; then
    echo "run.sh: [1/3] creating the virtual environment $venv" >&2
    python3 -m venv "$venv"
else
    echo "run.sh: [1/3] reusing the virtual environment $venv" >&2
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
echo "run.sh: [2/3] building and installing dspark (the first build compiles the Rust engine:" \
    "a few minutes on 2 cores; cargo shows its progress)" >&2
DSPARK_INSTALL_VERBOSE=1 bash scripts/install.sh
echo "run.sh: [3/3] dspark demo (dspark is installed in $venv: activate it with" \
    "'source $venv/bin/activate')" >&2
dspark demo "$@"
