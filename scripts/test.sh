#!/usr/bin/env bash
# Install everything and run every test: the Rust engine tests, then the Python suite; then the
# kernel, drafter, target and speculator suites again on the device-generic tensor path, forced
# on the CPU with DSPARK_KERNEL_PATH=tensor (the code a CUDA device runs, tested without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/dspark-target}"
bash scripts/install.sh --test
cargo test --workspace --exclude dspark-py
python3 -m pytest tests

tensor_tests=()
for f in crates/dspark/tests/sampling_*.rs crates/dspark/tests/drafter_*.rs \
    crates/dspark/tests/targets_*.rs crates/dspark/tests/speculator_*.rs \
    crates/dspark/tests/engine_*.rs; do
    tensor_tests+=(--test "$(basename "$f" .rs)")
done
DSPARK_KERNEL_PATH=tensor cargo test -p dspark --lib "${tensor_tests[@]}"
DSPARK_KERNEL_PATH=tensor python3 -m pytest tests/test_kernels_*.py tests/test_drafter_*.py \
    tests/test_build_info.py tests/test_devices.py
