#!/usr/bin/env bash
# The device check, for a machine with an NVIDIA GPU (no network needed): run from the
# repository root with the CUDA wheel built by scripts/build_cuda.sh in target/wheels-cuda/.
# Needs Python with torch (CUDA), numpy, scipy, transformers and pytest installed.
#
# 1. installs the wheel into a private folder (nothing else is touched);
# 2. `pytest -m cuda`: CUDA against the CPU fast path, losslessness, the speculator with an HF
#    target on the GPU, no per-round host copy of logits;
# 3. benches/bench_cuda.py: verify and block sampling against torch ops and the HBM floor, a
#    Qwen3-4B-shaped drafter's propose against TorchDrafter, and the bundled native pair on the
#    device against the CPU.
# The two steps are bounded so that the script ends within 8 minutes.
#
# Results (JSON, logs) go to $OUT when set (the device tool's folder), else target/gpu_check.
# Exit status: 0 only when the tests pass and the benchmark ran.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-target/gpu_check}"
mkdir -p "$out"
started=$(date +%s)

wheel=$(ls target/wheels-cuda/dspark-*.whl 2>/dev/null | head -n 1)
if [[ -z "$wheel" ]]; then
    echo "no CUDA wheel in target/wheels-cuda/ (build it with scripts/build_cuda.sh)" >&2
    exit 2
fi
python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"' || exit 2

# cuBLAS / cuRAND / NVRTC come from the nvidia wheels torch installed; the extension links
# the driver's libcuda.so.1 from the system.
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for lib in "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib; do
    [[ -d "$lib" ]] && LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH

prefix=/tmp/dspark-gpu-check
rm -rf "$prefix"
python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$prefix" "$wheel" || exit 2
export PYTHONPATH="$prefix${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 - "$out/build_info.json" <<'EOF' || exit 2
import json, sys
import dspark
info = dspark.build_info()
print("dspark", dspark.__file__, info)
assert info["cuda"] and info["cuda_devices"] >= 1, info
open(sys.argv[1], "w").write(json.dumps(info))
EOF

status=0
timeout 200 python3 -m pytest -m cuda tests/test_cuda.py -q -p no:cacheprovider \
    --junitxml "$out/pytest.xml" 2>&1 | tee "$out/pytest.log" || status=1
timeout 260 python3 benches/bench_cuda.py --out "$out/bench_cuda.json" 2>&1 \
    | tee "$out/bench.log" || status=1
echo "gpu_check: status $status after $(( $(date +%s) - started )) s; results in $out"
exit "$status"
