#!/usr/bin/env bash
# The device check, for a machine with an NVIDIA GPU (no network needed): run from the
# repository root with the CUDA wheel built by scripts/build_cuda.sh in target/wheels-cuda/.
# Needs Python with torch (CUDA), numpy, scipy, transformers and pytest installed.
#
# 1. checks the wheel (scripts/check_cuda_wheel.py: not empty, the extension, PTX for sm_90,
#    the driver not linked; an empty or broken wheel stops the script here) and installs it
#    into a private folder (nothing else is touched). No LD_LIBRARY_PATH is set: the extension
#    opens the driver and cuBLAS / cuRAND / NVRTC at run time, and `import dspark` finds the
#    latter in the nvidia wheels torch installed (dspark/_cuda_libs.py);
# 2. `pytest -m cuda`: CUDA against the CPU fast path, the fused kernels against their Rust
#    models bit for bit (a child process runs the models on the CPU), losslessness, the
#    speculator with an HF target on the GPU, no per-round host copy of logits;
# 3. benches/bench_cuda.py: verify and block sampling, fused and on the tensor path, against
#    torch ops and the HBM floor, with the launches and copies of one call and the fused
#    kernels' targets; a Qwen3-4B-shaped drafter's propose against TorchDrafter; the bundled
#    native pair on the device against the CPU.
# Each step is bounded (180 s and 260 s) so that the script ends within 8 minutes, and
# gpu_check.json says after every step which steps ran, how long, and with what status.
#
# Results (JSON, logs) go to $OUT when set (the device tool's folder), else target/gpu_check.
# Exit status: 0 only when the tests pass and the benchmark ran.
#
# `--dry-run` runs every step on a machine without a GPU, to check the script before a GPU
# window: the tests with their "device" tensors on the CPU (DSPARK_CUDA_TEST_DEVICE=cpu) and
# the benchmark's smoke shapes on the CPU (`--device cpu --quick`).
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
[[ "${1:-}" == --dry-run ]] && dry=1
out="${OUT:-target/gpu_check}"
mkdir -p "$out"
started=$(date +%s)
summary="$out/gpu_check.json"
steps=""
# record STEP STATUS SECONDS: add a step and rewrite the summary (valid JSON after each step).
record() {
    steps="${steps:+$steps, }\"$1\": {\"status\": $2, \"seconds\": $3}"
    printf '{"started": %s, "elapsed": %s, "steps": {%s}}\n' "$started" \
        "$(($(date +%s) - started))" "$steps" >"$summary"
}
step_start=$started
# lap: seconds since the previous lap, into $took (no subshell, so the clock moves on).
lap() {
    local now
    now=$(date +%s)
    took=$((now - step_start))
    step_start=$now
}

wheels=(target/wheels-cuda/dspark-*.whl)
if [[ ! -f "${wheels[0]}" ]]; then
    echo "gpu_check: no CUDA wheel in target/wheels-cuda/ (build it with scripts/build_cuda.sh)" >&2
    exit 2
fi
wheel="${wheels[0]}"
python3 scripts/check_cuda_wheel.py "$wheel" 2>&1 | tee "$out/wheel_check.log"
wheel_status=${PIPESTATUS[0]}
lap
record wheel_check "$wheel_status" "$took"
if [[ "$wheel_status" != 0 ]]; then
    echo "gpu_check: $wheel failed its checks (above): rebuild it with scripts/build_cuda.sh" >&2
    exit 2
fi
if [[ "$dry" == 0 ]]; then
    python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"' || exit 2
fi

prefix=/tmp/dspark-gpu-check
rm -rf "$prefix"
python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$prefix" "$wheel" || exit 2
export PYTHONPATH="$prefix${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 - "$out/build_info.json" "$prefix" "$dry" <<'EOF' || exit 2
import json, sys
import dspark
from dspark._cuda_libs import LOADED
info = dspark.build_info()
print("dspark", dspark.__file__, info)
print("CUDA libraries loaded from:", LOADED)
open(sys.argv[1], "w").write(json.dumps({**info, "loaded": LOADED}))
assert dspark.__file__.startswith(sys.argv[2]), "not the wheel just installed"
assert info["cuda"], "not the CUDA build"
assert sys.argv[3] == "1" or info["cuda_devices"] >= 1, f"no GPU: {info['cuda_error']}"
EOF

lap
record install 0 "$took"

bench_args=()
if [[ "$dry" == 1 ]]; then
    export DSPARK_CUDA_TEST_DEVICE=cpu
    bench_args=(--device cpu --quick)
fi
status=0
timeout 180 python3 -m pytest -m cuda tests/test_cuda.py -q -p no:cacheprovider \
    --junitxml "$out/pytest.xml" 2>&1 | tee "$out/pytest.log"
tests_status=${PIPESTATUS[0]}
lap
record pytest "$tests_status" "$took"
[[ "$tests_status" == 0 ]] || status=1
timeout 380 python3 benches/bench_cuda.py --out "$out/bench_cuda.json" "${bench_args[@]}" 2>&1 \
    | tee "$out/bench.log"
bench_status=${PIPESTATUS[0]}
lap
record bench "$bench_status" "$took"
[[ "$bench_status" == 0 ]] || status=1
echo "gpu_check: status $status after $(( $(date +%s) - started )) s; results in $out"
exit "$status"
