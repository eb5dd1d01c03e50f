"""``dspark.build_info()``: version, CUDA support and the kernel path switch."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dspark
from helpers import BUILD_INFO_KEYS

PYTHON_DIR = str(Path(dspark.__file__).resolve().parent.parent)


def _info_in_child(value: str | None) -> subprocess.CompletedProcess[str]:
    """Run ``build_info()`` in a fresh interpreter (the variable is read once per process)."""
    env = dict(os.environ)
    env.pop("DSPARK_KERNEL_PATH", None)
    if value is not None:
        env["DSPARK_KERNEL_PATH"] = value
    env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, env.get("PYTHONPATH", "")])
    code = (
        "import dspark\n"
        "try:\n"
        "    print(sorted(dspark.build_info().items()))\n"
        "except dspark.InputError as e:\n"
        "    print('InputError', e.code)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def _driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_reports_version_cuda_and_kernel_path() -> None:
    info = dspark.build_info()
    assert set(info) == BUILD_INFO_KEYS
    assert info["cpu_kernel"] in ("amx-bf16", "avx512-bf16", "avx512", "avx2", "portable")
    assert info["quant_kernel"] in ("amx-int8", "avx512vnni", "avxvnni", "avx2", "portable")
    assert info["version"] == dspark.__version__
    assert isinstance(info["cuda"], bool)
    assert isinstance(info["cuda_devices"], int) and info["cuda_devices"] >= 0
    if not info["cuda"]:
        assert info["cuda_devices"] == 0
    # `cuda_error` says why no CUDA device is usable, exactly when none is.
    if info["cuda_devices"] == 0:
        assert isinstance(info["cuda_error"], str) and info["cuda_error"]
    else:
        assert info["cuda_error"] is None
    expected = os.environ.get("DSPARK_KERNEL_PATH", "").strip() or "fast"
    assert info["kernel_path"] == expected
    assert "build_info" in dspark.__all__


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "fast"), ("fast", "fast"), ("tensor", "tensor"), ("fused", "fused"), ("", "fast")],
)
def test_the_switch_is_read_from_the_environment(value: str | None, shown: str) -> None:
    out = _info_in_child(value)
    assert out.returncode == 0, out.stderr
    assert f"('kernel_path', '{shown}')" in out.stdout


def test_an_invalid_kernel_path_is_an_input_error() -> None:
    out = _info_in_child("gpu")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "InputError invalid-argument"


def test_the_reason_names_the_build_or_the_missing_driver() -> None:
    info = dspark.build_info()
    why = info["cuda_error"]
    if not info["cuda"]:
        # The CPU wheel: says which build it is.
        assert "CPU build" in why and "no `cuda` feature" in why
    elif not _driver_loads():
        # The CUDA wheel where there is no NVIDIA driver (CI): it imported, works on the CPU,
        # and says the driver library is missing (loaded at run time, never linked).
        assert info["cuda_devices"] == 0
        assert "libcuda.so.1" in why and "not found" in why
    elif info["cuda_devices"] == 0:
        assert why  # a driver without a usable device: its own reason
    else:
        pytest.skip("this machine has a usable CUDA device")


def test_the_cuda_build_imports_without_its_libraries_on_the_path() -> None:
    """The extension links neither the driver nor a CUDA library (they are opened at run
    time), so importing it needs no ``LD_LIBRARY_PATH``: checked in a child without one."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, env.get("PYTHONPATH", "")])
    code = "import dspark, json; print(json.dumps(dspark.build_info()))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert '"cuda": ' in out.stdout


@pytest.mark.cuda
def test_cuda_builds_see_a_device() -> None:
    # Runs only with the CUDA wheel on a machine with a GPU (conftest skips it elsewhere).
    info = dspark.build_info()
    assert info["cuda"] and info["cuda_devices"] >= 1
