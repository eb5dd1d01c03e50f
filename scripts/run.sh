#!/usr/bin/env bash
# The main job: install dspark (with torch), then speculative decoding on the bundled default
# models (a trained tiny Qwen3 target + DSpark drafter shipped in the wheel) over 8 held-out
# prompts (standard-library files the pair never trained on, shipped with the package): streams
# each continuation with the accepted drafts marked, then reports the aggregate acceptance length,
# per-position acceptance and the speedup over target-only decoding measured in the same run.
# Extra arguments go to `dspark demo` (see `dspark demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --torch
dspark demo "$@"
