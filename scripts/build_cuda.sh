#!/usr/bin/env bash
# Build the CUDA wheel of dspark (or, with --check, only lint the `cuda` feature).
#
#   bash scripts/build_cuda.sh           # wheel into target/wheels-cuda/, then checked
#   bash scripts/build_cuda.sh --check   # cargo clippy --all-targets -D warnings with cuda
#
# The toolkit (CUDA 13.0 from NVIDIA's PyPI wheels, a CUDA_ROOT of symlinks, a link-time driver
# stub) is prepared and exported by scripts/cuda_env.sh, cached in DSPARK_CUDA_CACHE
# (default /var/tmp/dspark-cuda). Builds use their own target folder (CARGO_TARGET_DIR, default
# /var/tmp/dspark-cuda-target), so they never invalidate the CPU build; the lint runs in the
# release profile so that it and the wheel share candle's compiled kernels. No GPU is needed.
# The extension opens the driver and the CUDA libraries at run time (cudarc's dynamic-loading
# mode, see scripts/cuda_rustc_wrapper.sh), so the wheel imports anywhere; built with the
# maturin pinned in pyproject.toml (scripts/maturin.sh), with no auditwheel repair (nothing is
# vendored). scripts/check_cuda_wheel.py then checks the wheel: non-empty, the extension, PTX
# for sm_$CUDA_COMPUTE_CAP, what it links, its size; the script fails when any check does.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=wheel
for arg in "$@"; do
    case "$arg" in
        --check) mode=check ;;
        -h | --help)
            sed -n '2,17p' "$0"
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
# shellcheck source=scripts/maturin.sh
source scripts/maturin.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/dspark-cuda-target}"
echo "build_cuda.sh: nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), CUDA_ROOT=$CUDA_ROOT, sm_$CUDA_COMPUTE_CAP, target $CARGO_TARGET_DIR" >&2

# cudarc in its run-time loading mode. Cargo does not see the wrapper in its fingerprints, so a
# cudarc compiled before (without the cfg) is cleaned once per target folder.
wrapper="$PWD/scripts/cuda_rustc_wrapper.sh"
if [[ -n "${RUSTC_WRAPPER:-}" && "$RUSTC_WRAPPER" != "$wrapper" ]]; then
    export DSPARK_RUSTC_WRAPPER_NEXT="$RUSTC_WRAPPER"
fi
export RUSTC_WRAPPER="$wrapper"
stamp="$CARGO_TARGET_DIR/.dspark-cudarc-dynamic-loading"
if [[ ! -f "$stamp" ]]; then
    echo "build_cuda.sh: first build with the cudarc wrapper in $CARGO_TARGET_DIR: cleaning cudarc" >&2
    cargo clean --quiet -p cudarc
    cargo clean --quiet -p cudarc --release
    mkdir -p "$CARGO_TARGET_DIR"
    touch "$stamp"
fi

case "$mode" in
    check)
        cargo clippy --release --workspace --all-targets --features dspark/cuda,dspark-py/cuda \
            -- -D warnings
        ;;
    wheel)
        out=target/wheels-cuda
        rm -rf "$out"
        started=$(date +%s)
        dspark_maturin build --release --features cuda \
            --auditwheel skip --out "$out"
        echo "build_cuda.sh: maturin finished in $(($(date +%s) - started)) s" >&2
        if ! python3 scripts/check_cuda_wheel.py "$out" --sm "${CUDA_COMPUTE_CAP//[!0-9]/}"; then
            echo "build_cuda.sh: the CUDA wheel in $out failed its checks (above)" >&2
            exit 1
        fi
        ls -l "$out"
        ;;
esac
