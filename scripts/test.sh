#!/usr/bin/env bash
# Install everything and run every test: the Rust engine tests, then the Python suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/dspark-target}"
bash scripts/install.sh --test
cargo test --workspace --exclude dspark-py
python3 -m pytest tests
