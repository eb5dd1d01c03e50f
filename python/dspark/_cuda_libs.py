"""Make NVIDIA's CUDA libraries findable for the CUDA build, with no ``LD_LIBRARY_PATH``.

The CUDA build of the extension links no CUDA library: it opens the driver (``libcuda.so.1``,
installed with the NVIDIA driver) and cuBLAS, cuRAND and NVRTC by soname (``dlopen``) when a
CUDA device is first used, so it imports, and runs on the CPU, on a machine without a GPU, a
driver or those libraries. A ``dlopen`` by soname is answered by a library that is already
loaded in the process, so where a driver exists this module loads the CUDA libraries from
NVIDIA's PyPI wheels (the ones torch's CUDA wheels install, or ``pip install "dspark[cuda]"``)
by full path, once, when ``dspark`` is imported: ``nvidia/cu13/lib`` (CUDA 13 wheels) or
``nvidia/<package>/lib`` (CUDA 12 wheels) under any ``sys.path`` entry (a virtualenv, the
system's site-packages, a ``pip install --target`` folder on ``PYTHONPATH``).

A library already loaded (torch imported first) is left as it is; one found in no wheel is
left to the system's search path; one missing everywhere is reported, with what to install,
as a ``device-unavailable`` error when a CUDA device is asked for. The CPU build (no library
names) and machines without a driver skip all of this.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from dspark import _native

__all__ = ["LOADED", "cuda_library_dirs", "preload_cuda_libraries"]

# soname -> the file it was loaded from ("" when it was already loaded in the process).
LOADED: dict[str, str] = {}
_HANDLES: list[ctypes.CDLL] = []  # keeps the libraries loaded for the process


def cuda_library_dirs(major: int) -> list[Path]:
    """NVIDIA wheel library folders for CUDA ``major`` under ``sys.path``, in search order."""
    dirs: list[Path] = []
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if not root.is_dir():
            continue
        candidates = [root / f"cu{major}" / "lib", *sorted(root.glob("*/lib"))]
        for d in candidates:
            if d.is_dir() and d not in dirs:
                dirs.append(d)
    return dirs


def _already_loaded(soname: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(soname, mode=os.RTLD_NOLOAD)
    except OSError:
        return None


def preload_cuda_libraries() -> dict[str, str]:
    """Load the CUDA build's runtime libraries from NVIDIA's wheels (see the module docs).

    Returns :data:`LOADED`. Does nothing for the CPU build or where the driver does not load.
    """
    names: list[str] = list(_native._cuda_libraries())
    if not names or LOADED:
        return LOADED
    try:
        _HANDLES.append(ctypes.CDLL("libcuda.so.1"))
    except OSError:
        return LOADED  # no driver: CUDA is off (build_info() says why), nothing to find
    major = next((int(n.rsplit(".", 1)[1]) for n in names if n.startswith("libcublas.")), 0)
    dirs = cuda_library_dirs(major)
    for soname in names:
        handle = _already_loaded(soname)
        if handle is not None:
            _HANDLES.append(handle)
            LOADED[soname] = ""
            continue
        for d in dirs:
            path = d / soname
            if not path.is_file():
                continue
            try:
                _HANDLES.append(ctypes.CDLL(str(path)))
            except OSError:
                continue  # a broken copy: try the next folder
            LOADED[soname] = str(path)
            break
    return LOADED
