#!/usr/bin/env bash
# Install everything and run every test: the Rust engine tests (with the fused CUDA kernels'
# source run by a host emulator against their Rust models: crates/dspark-kernel-emu), then the
# Python suite; then the kernel, drafter, target and speculator suites again on the two device
# paths forced on the CPU: DSPARK_KERNEL_PATH=tensor (candle tensor ops) and
# DSPARK_KERNEL_PATH=fused (the fused kernels' models): the code a CUDA device runs, tested
# without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# Build folders live in the clone (target/) unless CARGO_TARGET_DIR names a shared cache (CI does).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
bash scripts/install.sh --test
# Every temporary file of the tests (pytest's folders, the servers' and pairs' scratch) goes
# under one folder, removed when this script ends, however it ends.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/dspark-test.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
export TMPDIR="$scratch"
cargo test --workspace --exclude dspark-py
python3 -m pytest tests

# The device-generic suites (one test binary per subject: crates/dspark/tests/<subject>/).
# The same package selection as the run above, so that cargo resolves the same features and
# reuses its build (`-p dspark` alone would rebuild the engine and the dependencies whose
# features the workspace unifies); the kernel path is read at run time, never at build time.
tensor_tests=(--workspace --exclude dspark-py --lib --test sampling --test drafter --test targets
    --test speculator)
for path in tensor fused; do
    echo "== the device suites on the CPU: DSPARK_KERNEL_PATH=$path"
    DSPARK_KERNEL_PATH=$path cargo test "${tensor_tests[@]}"
    DSPARK_KERNEL_PATH=$path python3 -m pytest tests/test_kernels_*.py tests/test_drafter_*.py \
        tests/test_build_info.py tests/test_devices.py
done
