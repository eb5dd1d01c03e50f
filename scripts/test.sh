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
# The main job's virtual environment (`.venv` in the clone, or DSPARK_VENV), created when
# missing; the tests add torch, transformers and their own dependencies to it, beside the same
# release build of dspark the main job installs.
venv="${DSPARK_VENV:-$PWD/.venv}"
if [[ ! -x "$venv/bin/python3" ]]; then
    echo "test.sh: creating the virtual environment $venv" >&2
    python3 -m venv "$venv"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
echo "test.sh: installing dspark, torch and the test dependencies into $venv" >&2
bash scripts/install.sh --test
# The test build: the same wheel with the test hooks compiled in (`_dlpack_describe`,
# `_dlpack_sum`, `_test_panic`), unpacked under target/ and never installed. PYTHONPATH puts it
# before the venv's dspark for the Python suites (and every process they start), so the
# installed package stays the release build; DSPARK_TEST_BUILD makes the suites check both.
echo "test.sh: building the test wheel (the test hooks compiled in) into target/test-build" >&2
# shellcheck source=scripts/maturin.sh
source scripts/maturin.sh
rm -rf target/wheels-test target/test-build
dspark_maturin build --release --quiet --features test-hooks --out target/wheels-test
python3 -m pip install --disable-pip-version-check --quiet --no-deps --target target/test-build \
    target/wheels-test/dspark-*.whl
export PYTHONPATH="$PWD/target/test-build${PYTHONPATH:+:$PYTHONPATH}"
export DSPARK_TEST_BUILD="$PWD/target/test-build"
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
