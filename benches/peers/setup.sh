#!/usr/bin/env bash
# The peers of benches/bench_memory_bound.py, installed outside the clone (idempotent, cached):
#
#   $PEERS/venv                  a venv with llama-cpp-python[server] (built from its PyPI sdist,
#                                native CPU), mistralrs (the CPU wheel), openai, and what llama.cpp's
#                                HF -> GGUF converter needs (torch, transformers, sentencepiece)
#   $PEERS/src/llama_cpp_python-$V/vendor/llama.cpp
#                                the llama.cpp source llama-cpp-python vendors (a git checkout):
#                                convert_hf_to_gguf.py and its gguf-py come from here
#   $PEERS/llama.cpp/bin         the C++ tools built from that same source with cmake (Release,
#                                GGML_NATIVE, no AMX): llama-bench, llama-cli, llama-completion,
#                                llama-quantize, llama-speculative-simple (--spec-type draft-dspark),
#                                llama-server, llama-tokenize
#   $PEERS/peers.json            what was installed where, with versions (read by the benchmark)
#
# Usage: bash benches/peers/setup.sh     (PEERS defaults to /var/tmp/dspark-peers; DSPARK_PEERS_JOBS
# sets the build parallelism, default 2). Each step is skipped when its result is already there;
# a step that fails is reported and the others still run. Exit status 1 if any step failed.
set -uo pipefail

PEERS="${DSPARK_PEERS_DIR:-/var/tmp/dspark-peers}"
JOBS="${DSPARK_PEERS_JOBS:-2}"
PYTHON="${PYTHON:-python3}"

# Pinned versions (verified together on this project's CI machine: Python 3.11, x86-64 AVX-512).
LLAMA_CPP_PYTHON_VERSION=0.3.36 # vendors llama.cpp 0c1e57098bba (2026-10-01): has draft-dspark
MISTRALRS_VERSION=0.9.5
OPENAI_VERSION=3.57.0
CMAKE_VERSION=4.4.5
NINJA_VERSION=1.13.2
# llama.cpp's own pins for its converter (requirements/requirements-convert_hf_to_gguf.txt).
TORCH_VERSION=2.11.0
TRANSFORMERS_VERSION=4.57.6
NUMPY_SPEC="numpy~=2.2.6"
SENTENCEPIECE_SPEC="sentencepiece>=0.1.98,<0.3.0"
PROTOBUF_SPEC="protobuf>=4.21.0,<5.0.0"

# Native ISA without AMX: llama.cpp's AMX tiles die with SIGILL (exit -4) on its batched products
# (a prompt, a draft-dspark verification) where the VM advertises AMX but does not grant the
# tile state. GCC keeps these explicit -mno-* over -march=native's defaults. dspark uses no AMX.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

VENV="$PEERS/venv"
VPY="$VENV/bin/python"
SRC="$PEERS/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
LLAMA_SRC="$SRC/vendor/llama.cpp"
BUILD="$PEERS/llama.cpp/build"
BIN="$PEERS/llama.cpp/bin"
TOOLS=(llama-bench llama-cli llama-completion llama-quantize llama-speculative-simple llama-server
    llama-tokenize)

declare -a REPORT=()
FAILED=0
note() { REPORT+=("$(printf '%-26s %s' "$1" "$2")"); }
step() { printf '\n== %s\n' "$*"; }
secs() { echo $(($(date +%s) - $1)); }

mkdir -p "$PEERS/dl" "$PEERS/src" "$BIN" "$PEERS/logs"

step "venv ($VENV)"
if [[ -x "$VPY" ]]; then
    note venv "present ($("$VPY" --version 2>&1))"
elif "$PYTHON" -m venv "$VENV"; then
    note venv "created ($("$VPY" --version 2>&1))"
else
    note venv "FAILED: $PYTHON -m venv"
    printf '%s\n' "${REPORT[@]}"
    exit 1
fi
pip() { "$VPY" -m pip --disable-pip-version-check "$@"; }
have() { "$VPY" - "$@" <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
name, want = sys.argv[1], sys.argv[2]
sys.exit(0 if m.version(name) == want else 1)
EOF
}

step "build tools (cmake $CMAKE_VERSION, ninja $NINJA_VERSION)"
if have cmake "$CMAKE_VERSION" && have ninja "$NINJA_VERSION"; then
    note "cmake, ninja" "present"
elif pip install --quiet "cmake==$CMAKE_VERSION" "ninja==$NINJA_VERSION"; then
    note "cmake, ninja" "installed $CMAKE_VERSION, $NINJA_VERSION"
else
    note "cmake, ninja" "FAILED"
    FAILED=1
fi
export PATH="$VENV/bin:$PATH"

step "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist"
SDIST="$PEERS/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    pip download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$PEERS/dl" || FAILED=1
fi
if [[ -f "$SDIST" && ! -f "$LLAMA_SRC/convert_hf_to_gguf.py" ]]; then
    tar -xzf "$SDIST" -C "$PEERS/src" || FAILED=1
fi
if [[ -f "$LLAMA_SRC/convert_hf_to_gguf.py" ]]; then
    LLAMA_COMMIT="$(git -C "$LLAMA_SRC" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
    note "llama.cpp source" "$LLAMA_SRC (commit $LLAMA_COMMIT)"
else
    LLAMA_COMMIT=unknown
    note "llama.cpp source" "FAILED: no $SDIST"
    FAILED=1
fi

step "llama-cpp-python[server] $LLAMA_CPP_PYTHON_VERSION (from the sdist, GGML_NATIVE, $JOBS jobs)"
if have llama_cpp_python "$LLAMA_CPP_PYTHON_VERSION"; then
    note llama-cpp-python "present"
else
    t0=$(date +%s)
    if CMAKE_ARGS="-DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'" \
        CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
        pip install --quiet "$SDIST" >"$PEERS/logs/llama-cpp-python.log" 2>&1 &&
        pip install --quiet "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" \
            >>"$PEERS/logs/llama-cpp-python.log" 2>&1; then
        note llama-cpp-python "built and installed in $(secs "$t0") s"
    else
        note llama-cpp-python "FAILED (see $PEERS/logs/llama-cpp-python.log)"
        FAILED=1
    fi
fi

step "llama.cpp C++ tools: ${TOOLS[*]} (Release, GGML_NATIVE without AMX, $JOBS jobs)"
missing=()
for t in "${TOOLS[@]}"; do [[ -x "$BIN/$t" ]] || missing+=("$t"); done
# Tools built with other flags are rebuilt.
STAMP="$BIN/.build-flags"
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$NO_AMX" ]]; then missing=("${TOOLS[@]}"); fi
if [[ ${#missing[@]} -eq 0 ]]; then
    note "llama.cpp tools" "present in $BIN"
elif [[ -f "$LLAMA_SRC/CMakeLists.txt" ]]; then
    t0=$(date +%s)
    if cmake -S "$LLAMA_SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
        >"$PEERS/logs/llama.cpp-cmake.log" 2>&1 &&
        cmake --build "$BUILD" -j "$JOBS" --target "${TOOLS[@]}" \
            >>"$PEERS/logs/llama.cpp-cmake.log" 2>&1; then
        for t in "${TOOLS[@]}"; do cp -f "$BUILD/bin/$t" "$BIN/$t"; done
        echo "$NO_AMX" >"$STAMP"
        note "llama.cpp tools" "built in $(secs "$t0") s into $BIN"
    else
        note "llama.cpp tools" "FAILED (see $PEERS/logs/llama.cpp-cmake.log)"
        FAILED=1
    fi
else
    note "llama.cpp tools" "SKIPPED: no llama.cpp source"
    FAILED=1
fi

step "converter requirements (torch $TORCH_VERSION, transformers $TRANSFORMERS_VERSION)"
# torch comes from PyPI (the llama.cpp requirements name PyTorch's CPU index as an extra index,
# which is not reachable everywhere; the converter only uses torch on the CPU either way).
if have torch "$TORCH_VERSION" && have transformers "$TRANSFORMERS_VERSION" &&
    "$VPY" -c 'import sentencepiece, google.protobuf' 2>/dev/null; then
    note "converter deps" "present"
elif pip install --quiet "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" \
    "$NUMPY_SPEC" "$SENTENCEPIECE_SPEC" "$PROTOBUF_SPEC" safetensors; then
    note "converter deps" "installed torch $TORCH_VERSION, transformers $TRANSFORMERS_VERSION"
else
    note "converter deps" "FAILED"
    FAILED=1
fi

step "mistralrs $MISTRALRS_VERSION (CPU wheel)"
if have mistralrs "$MISTRALRS_VERSION"; then
    note mistralrs "present"
elif pip install --quiet --only-binary mistralrs "mistralrs==$MISTRALRS_VERSION"; then
    note mistralrs "installed"
else
    note mistralrs "SKIPPED: no wheel for this platform"
fi

step "openai $OPENAI_VERSION"
if have openai "$OPENAI_VERSION"; then
    note openai "present"
elif pip install --quiet "openai==$OPENAI_VERSION"; then
    note openai "installed"
else
    note openai "FAILED"
    FAILED=1
fi

step "check: imports and tools"
for mod in llama_cpp mistralrs openai torch transformers sentencepiece; do
    if v=$("$VPY" -c "import $mod as m; print(getattr(m, '__version__', 'ok'))" 2>/dev/null); then
        note "import $mod" "$v"
    else
        note "import $mod" "not importable"
    fi
done
for t in "${TOOLS[@]}"; do
    if [[ -x "$BIN/$t" ]]; then note "$t" "$BIN/$t"; else note "$t" "missing"; fi
done
if grep -q '"draft-dspark"' "$LLAMA_SRC/common/speculative.cpp" 2>/dev/null; then
    note "draft-dspark" "supported by this llama.cpp (--spec-type draft-dspark)"
else
    note "draft-dspark" "not in this llama.cpp"
fi

"$VPY" - "$PEERS/peers.json" <<EOF
import json, sys
doc = {
    "peers_dir": "$PEERS",
    "python": "$VPY",
    "llama_cpp_python": "$LLAMA_CPP_PYTHON_VERSION",
    "llama_cpp_commit": "$LLAMA_COMMIT",
    "llama_cpp_source": "$LLAMA_SRC",
    "converter": "$LLAMA_SRC/convert_hf_to_gguf.py",
    "bin": "$BIN",
    "tools": {t: "$BIN/" + t for t in "${TOOLS[*]}".split()},
    "mistralrs": "$MISTRALRS_VERSION",
    "openai": "$OPENAI_VERSION",
    "torch": "$TORCH_VERSION",
    "transformers": "$TRANSFORMERS_VERSION",
}
with open(sys.argv[1], "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
EOF

printf '\n== summary (%s)\n' "$PEERS"
printf '%s\n' "${REPORT[@]}"
exit "$FAILED"
