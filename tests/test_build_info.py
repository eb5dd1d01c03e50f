"""``dspark.build_info()``: version, CUDA support and the kernel path switch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dspark

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


def test_reports_version_cuda_and_kernel_path() -> None:
    info = dspark.build_info()
    assert set(info) == {"version", "cuda", "cuda_devices", "kernel_path"}
    assert info["version"] == dspark.__version__
    assert isinstance(info["cuda"], bool)
    assert isinstance(info["cuda_devices"], int) and info["cuda_devices"] >= 0
    if not info["cuda"]:
        assert info["cuda_devices"] == 0
    expected = os.environ.get("DSPARK_KERNEL_PATH", "").strip() or "fast"
    assert info["kernel_path"] == expected
    assert "build_info" in dspark.__all__


@pytest.mark.parametrize(
    ("value", "shown"), [(None, "fast"), ("fast", "fast"), ("tensor", "tensor"), ("", "fast")]
)
def test_the_switch_is_read_from_the_environment(value: str | None, shown: str) -> None:
    out = _info_in_child(value)
    assert out.returncode == 0, out.stderr
    assert f"('kernel_path', '{shown}')" in out.stdout


def test_an_invalid_kernel_path_is_an_input_error() -> None:
    out = _info_in_child("gpu")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "InputError invalid-argument"


@pytest.mark.cuda
def test_cuda_builds_see_a_device() -> None:
    # Runs only with the CUDA wheel on a machine with a GPU (conftest skips it elsewhere).
    info = dspark.build_info()
    assert info["cuda"] and info["cuda_devices"] >= 1
