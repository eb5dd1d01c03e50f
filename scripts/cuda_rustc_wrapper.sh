#!/usr/bin/env bash
# RUSTC_WRAPPER of the CUDA builds (scripts/build_cuda.sh sets it): compiles the `cudarc`
# crate in its run-time loading mode, so the extension links neither the NVIDIA driver nor a
# CUDA library and imports on machines without them.
#
# Why a wrapper: candle-core turns on cudarc's `dynamic-linking` feature (DT_NEEDED on
# libcuda.so.1, libcublas.so.13, ...: the extension then cannot even be imported without a
# driver), and cudarc's build script rejects `dynamic-loading` next to it, so no Cargo feature
# of ours can select it. cudarc's code, though, chooses between linked symbols and `dlopen`
# (libloading) on `cfg(feature = "dynamic-loading")` alone. This wrapper adds that cfg to the
# compilation of the cudarc library and nothing else: its build script still runs as with
# `dynamic-linking` and asks for `-lcuda -lcublas ...`, but no symbol of those libraries is
# referenced any more, so the linker (which links with --as-needed) records none of them.
# scripts/check_cuda_wheel.py verifies the result (the extension's DT_NEEDED list).
#
# Cargo does not fingerprint the wrapper: build_cuda.sh cleans cudarc once per target folder
# (a stamp file) so that no cudarc compiled without the cfg is reused.
#
# Usage (by cargo): cuda_rustc_wrapper.sh RUSTC ARGS...; DSPARK_RUSTC_WRAPPER_NEXT, when set,
# is a wrapper to chain (e.g. a compiler cache that RUSTC_WRAPPER named before).
set -euo pipefail
rustc="$1"
shift
extra=()
prev=""
for arg in "$@"; do
    if [[ "$prev" == "--crate-name" && "$arg" == "cudarc" ]]; then
        extra=(--cfg 'feature="dynamic-loading"')
        break
    fi
    prev="$arg"
done
if [[ -n "${DSPARK_RUSTC_WRAPPER_NEXT:-}" ]]; then
    exec "$DSPARK_RUSTC_WRAPPER_NEXT" "$rustc" "$@" "${extra[@]}"
fi
exec "$rustc" "$@" "${extra[@]}"
