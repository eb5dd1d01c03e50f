#!/usr/bin/env bash
# Check the CUDA wheel on a machine without a GPU (CI does, after scripts/build_cuda.sh):
#
# 1. the artifact (scripts/check_cuda_wheel.py): not empty, the extension, PTX for sm_90, only
#    glibc / GCC runtime / NVIDIA wheel libraries linked (the driver is opened at run time),
#    its size;
# 2. the wheel at work: installed into a scratch virtualenv made anew (DSPARK_CUDA_VENV,
#    default /var/tmp/dspark-cuda-venv) that also sees the running Python's packages (torch,
#    numpy, scipy and pytest: a .pth adds them after its own, so its dspark shadows the CPU
#    one), with no LD_LIBRARY_PATH: it imports, build_info() says cuda True, cuda_devices 0
#    and why (no driver here), and the Python kernel and speculator suites pass on the CPU.
#
#   bash scripts/check_cuda_wheel.sh [WHEEL]    # default: the wheel in target/wheels-cuda/
#
# Needs the test dependencies in the running python3 (scripts/test.sh's venv, activated).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

wheel="${1:-}"
if [[ -z "$wheel" ]]; then
    wheel="$(ls target/wheels-cuda/dspark-*.whl 2>/dev/null | head -n 1 || true)"
fi
python3 scripts/check_cuda_wheel.py "${wheel:-target/wheels-cuda}"

venv="${DSPARK_CUDA_VENV:-/var/tmp/dspark-cuda-venv}"
rm -rf "$venv"
parent_site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
python3 -m venv "$venv"
py="$venv/bin/python"
own_site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$parent_site')" >"$own_site/zz_dspark_parent.pth"
# --ignore-installed: the CPU dspark it sees (same version) must not count as installed.
"$py" -m pip install --disable-pip-version-check --quiet --no-deps --no-index --ignore-installed \
    "$wheel"

echo "== the CUDA wheel in $venv, no LD_LIBRARY_PATH"
env -u LD_LIBRARY_PATH "$py" - <<'EOF'
import ctypes
import json
import sys

import dspark

info = dspark.build_info()
print("dspark:", dspark.__file__)
print("build_info:", json.dumps(info))
assert dspark.__file__.startswith(sys.prefix), f"not the venv's dspark: {dspark.__file__}"
assert info["cuda"] is True, "the wheel is not a CUDA build"
try:
    ctypes.CDLL("libcuda.so.1")
except OSError:
    assert info["cuda_devices"] == 0, info
    assert "libcuda.so.1" in info["cuda_error"], info
else:
    print("note: an NVIDIA driver loads here; cuda_devices is what it reports")
EOF

env -u LD_LIBRARY_PATH "$py" -m pytest -q -p no:cacheprovider \
    tests/test_kernels_*.py tests/test_speculator_*.py tests/test_build_info.py \
    tests/test_devices.py
echo "check_cuda_wheel.sh: passed in $(($(date +%s) - started)) s"
