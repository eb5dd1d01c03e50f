#!/usr/bin/env bash
# Build the dspark wheel (release, abi3) and install it with its Python dependencies.
# Usage: bash scripts/install.sh [--torch | --test]
#   (no flag) dspark with numpy and tokenizers: the native target, `dspark demo`, `dspark serve`
#   --torch  also installs torch and transformers (HF targets, `--target-backend hf`)
#   --test   --torch plus the test and benchmark dependencies (the wheel installed is the same
#            release build: scripts/test.sh builds its test-hooks wheel apart, never installed)
set -euo pipefail
cd "$(dirname "$0")/.."
# Build folders live in the clone (target/) unless CARGO_TARGET_DIR names a shared cache (CI does).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
PIP="python3 -m pip"
# DSPARK_INSTALL_VERBOSE=1 (the main job): pip's and cargo's own progress instead of quiet.
quiet=(--quiet)
[[ "${DSPARK_INSTALL_VERBOSE:-0}" == 1 ]] && quiet=()
pip_install() { $PIP install --disable-pip-version-check "${quiet[@]}" "$@"; }
# shellcheck source=scripts/maturin.sh
source scripts/maturin.sh
pip_install "$(dspark_maturin_pin)" "numpy>=1.24" "tokenizers>=0.15"
case "${1:-}" in
    --torch | --test)
        # torch from PyPI is a large CUDA build; pip skips it when already installed.
        pip_install "torch>=2.4" "transformers>=4.50" "tokenizers>=0.15" "safetensors>=0.4"
        ;;&
    --test)
        pip_install "pytest>=8" "pytest-benchmark>=4" "scipy>=1.10" "ruff>=0.6" "hypothesis>=6.100" \
            "openai>=1.40"
        ;;
esac
rm -rf target/wheels
dspark_maturin build --release "${quiet[@]}" --out target/wheels
$PIP install --disable-pip-version-check "${quiet[@]}" --force-reinstall --no-deps \
    target/wheels/dspark-*.whl
