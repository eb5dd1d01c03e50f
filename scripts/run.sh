#!/usr/bin/env bash
# The main job: install dspark, generate a small drafter checkpoint, inspect it against its target.
# (Speculative decoding on the bundled default models replaces this once they ship.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
out="${DSPARK_EXAMPLE_DIR:-$(mktemp -d)/dspark-example}"
dspark make-example "$out"
dspark inspect "$out/drafter" --target "$out/target"
