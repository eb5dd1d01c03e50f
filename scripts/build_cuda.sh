#!/usr/bin/env bash
# Build the CUDA wheel of dspark (or, with --check, only lint the `cuda` feature).
#
#   bash scripts/build_cuda.sh           # wheel into target/wheels-cuda/
#   bash scripts/build_cuda.sh --check   # cargo clippy --all-targets -D warnings with cuda
#
# The toolkit (CUDA 13.0 from NVIDIA's PyPI wheels, a CUDA_ROOT of symlinks, a link-time driver
# stub) is prepared and exported by scripts/cuda_env.sh, cached in DSPARK_CUDA_CACHE
# (default /var/tmp/dspark-cuda). Builds use their own target folder (CARGO_TARGET_DIR, default
# /var/tmp/dspark-cuda-target), so they never invalidate the CPU build. No GPU is needed to
# build; the wheel links libcuda.so.1 and so imports only where an NVIDIA driver exists.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=wheel
for arg in "$@"; do
    case "$arg" in
        --check) mode=check ;;
        -h | --help)
            sed -n '2,11p' "$0"
            exit 0
            ;;
        *)
            echo "build_cuda.sh: unknown argument $arg" >&2
            exit 2
            ;;
    esac
done

# shellcheck source=scripts/cuda_env.sh
source scripts/cuda_env.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/dspark-cuda-target}"
echo "build_cuda.sh: nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), CUDA_ROOT=$CUDA_ROOT, sm_$CUDA_COMPUTE_CAP, target $CARGO_TARGET_DIR" >&2

case "$mode" in
    check)
        cargo clippy --workspace --all-targets --features dspark/cuda,dspark-py/cuda -- -D warnings
        ;;
    wheel)
        if ! command -v maturin >/dev/null; then
            python3 -m pip install --disable-pip-version-check --quiet "maturin>=1.9,<2"
        fi
        maturin build --release -m crates/dspark-py/Cargo.toml --features cuda \
            --out target/wheels-cuda
        ls -l target/wheels-cuda
        ;;
esac
