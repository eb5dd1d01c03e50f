#!/usr/bin/env bash
# Build the dspark wheel (release, abi3) and install it with its Python dependencies.
# Usage: bash scripts/install.sh [--test]   (--test also installs test deps, torch and transformers)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/dspark-target}"
PIP="python3 -m pip"
pip_install() { $PIP install --disable-pip-version-check --quiet "$@"; }
pip_install "maturin>=1.9.4,<2.0" "numpy>=1.24"
if [[ "${1:-}" == "--test" ]]; then
    pip_install "pytest>=8" "pytest-benchmark>=4" "scipy>=1.10" "safetensors>=0.4" "ruff>=0.6"
    # torch from PyPI is a large CUDA build; pip skips it when already installed.
    pip_install "torch>=2.4" "transformers>=4.50"
fi
rm -rf target/wheels
maturin build --release --quiet --out target/wheels
$PIP install --disable-pip-version-check --quiet --force-reinstall --no-deps target/wheels/dspark-*.whl
