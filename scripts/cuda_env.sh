#!/usr/bin/env bash
# Prepare a CUDA 13.0 toolkit from NVIDIA's PyPI wheels and export the build environment for
# candle's `cuda` feature. Source it (`source scripts/cuda_env.sh`) to get the variables in the
# calling shell; running it directly only prepares the cache and prints the exports.
#
# Everything lives in a cache folder outside the clone (DSPARK_CUDA_CACHE, default
# /var/tmp/dspark-cuda), keyed by the pinned release, so a second run is instant:
#   wheels-<release>/  the pinned wheels (pip --target, --no-deps: every piece is pinned here)
#   root-<release>/    a CUDA_ROOT of symlinks: bin include nvvm -> the wheels; lib64/ with
#                      links to each library plus unversioned libX.so; lib -> lib64;
#                      lib64/stubs/libcuda.so, a link-time-only driver stub
#
# Why 13.0: the lent GPU machine has driver 580 (CUDA 13.0). The driver loads candle's PTX at run
# time and refuses a newer `.version` (nvcc 13.2 writes 9.2), so every piece is pinned to one
# release of the 13.0 line (pip would otherwise mix releases through nvcc's unpinned deps).
#
# The stub libcuda.so (soname libcuda.so.1) only satisfies the linker: every `cu*` symbol cudarc
# binds returns 34 (CUDA_ERROR_STUB_LIBRARY). It sits in lib64/stubs, which is never put on a
# run-time library path: where a real driver exists, it must win.

_dspark_cuda_prepare() {
    set -euo pipefail
    local release="13.0.88"
    local pins=(
        "nvidia-cuda-nvcc==13.0.88"
        "nvidia-cuda-crt==13.0.88"
        "nvidia-nvvm==13.0.88"
        "nvidia-cuda-runtime==13.0.96"
        "nvidia-cuda-cccl==13.0.85"
        "nvidia-cuda-nvrtc==13.0.88"
        "nvidia-cublas==13.1.0.3"
        "nvidia-curand==10.4.0.35"
    )
    local cache="${DSPARK_CUDA_CACHE:-/var/tmp/dspark-cuda}"
    local wheels="$cache/wheels-$release"
    local root="$cache/root-$release"
    local py="${PYTHON:-python3}"
    mkdir -p "$cache"

    # 1. The wheels (skipped when the stamp names the same pins).
    local stamp_want
    stamp_want="$(printf '%s\n' "${pins[@]}")"
    if [[ ! -f "$wheels/.pins" || "$(cat "$wheels/.pins")" != "$stamp_want" ]]; then
        echo "cuda_env: installing the CUDA $release wheels into $wheels" >&2
        rm -rf "$wheels.tmp"
        "$py" -m pip install --disable-pip-version-check --quiet --no-deps \
            --target "$wheels.tmp" "${pins[@]}"
        printf '%s\n' "${pins[@]}" >"$wheels.tmp/.pins"
        rm -rf "$wheels" "$root"
        mv "$wheels.tmp" "$wheels"
    fi
    local cu="$wheels/nvidia/cu13"
    [[ -x "$cu/bin/nvcc" ]] || { echo "cuda_env: no nvcc in $cu/bin" >&2; return 1; }

    # 2. The CUDA_ROOT of symlinks.
    if [[ ! -f "$root/.done" ]]; then
        rm -rf "$root"
        mkdir -p "$root/lib64/stubs"
        ln -s "$cu/bin" "$root/bin"
        ln -s "$cu/include" "$root/include"
        ln -s "$cu/nvvm" "$root/nvvm"
        ln -s lib64 "$root/lib"
        local f base
        for f in "$cu"/lib/lib*.so*; do
            base="$(basename "$f")"
            ln -sf "$f" "$root/lib64/$base"
            # libX.so.13 (or libX.so.13.0.88) -> also libX.so for the linker.
            ln -sf "$f" "$root/lib64/${base%%.so*}.so"
        done
        touch "$root/.done"
    fi

    # 3. The link-time driver stub, from the cu* names of the cudarc in Cargo.lock.
    if [[ ! -f "$root/lib64/stubs/libcuda.so" ]]; then
        local here lock ver src
        here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
        lock="$here/Cargo.lock"
        ver="$(awk '/^name = "cudarc"$/ {getline; gsub(/"/, "", $3); print $3; exit}' "$lock")"
        [[ -n "$ver" ]] || { echo "cuda_env: no cudarc in $lock" >&2; return 1; }
        src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$ver" 2>/dev/null | head -n1 || true)"
        if [[ -z "$src" ]]; then
            (cd "$here" && cargo fetch --locked --quiet)
            src="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$ver" | head -n1)"
            [[ -n "$src" ]] || { echo "cuda_env: cudarc $ver not found after cargo fetch" >&2; return 1; }
        fi
        local c="$root/lib64/stubs/libcuda_stub.c"
        grep -oE '^pub unsafe fn cu[A-Za-z0-9_]+' "$src/src/driver/sys/mod.rs" |
            awk '{print $4}' | sort -u |
            awk '{printf "int %s(void) { return 34; }\n", $1}' >"$c"
        cc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$root/lib64/stubs/libcuda.so.tmp" "$c"
        mv "$root/lib64/stubs/libcuda.so.tmp" "$root/lib64/stubs/libcuda.so"
    fi

    # 4. The environment.
    export CUDA_ROOT="$root" CUDA_PATH="$root" CUDA_HOME="$root" CUDA_TOOLKIT_ROOT_DIR="$root"
    export NVCC="$root/bin/nvcc"
    export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
    case ":$PATH:" in
        "$root/bin:"*) ;;
        *) export PATH="$root/bin:$PATH" ;;
    esac
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    _dspark_cuda_prepare
    for v in CUDA_ROOT CUDA_PATH CUDA_HOME CUDA_TOOLKIT_ROOT_DIR NVCC CUDA_COMPUTE_CAP PATH; do
        printf 'export %s=%q\n' "$v" "${!v}"
    done
else
    # Sourced: prepare in this shell (a failure exits it under set -e), then restore the
    # caller's shell options.
    _dspark_cuda_opts="$(set +o)"
    _dspark_cuda_prepare
    _dspark_cuda_rc=$?
    eval "$_dspark_cuda_opts"
    unset _dspark_cuda_opts
    # shellcheck disable=SC2317
    return "$_dspark_cuda_rc" 2>/dev/null || true
fi
