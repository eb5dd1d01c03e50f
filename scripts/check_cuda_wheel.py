"""Check the CUDA wheel as an artifact (standard library only; runs on the GPU machine too).

    python3 scripts/check_cuda_wheel.py [WHEEL_OR_DIR] [--sm 90] [--max-ptx 9.0] [--max-mib 40]

WHEEL_OR_DIR defaults to target/wheels-cuda (which must then hold exactly one wheel). Fails
(exit 1, one line per problem) when the wheel is missing, empty or not a zip; lacks the
extension ``dspark/_native*.so`` or the package's Python files; has no PTX for ``sm_<SM>``
(``.target sm_90`` or ``sm_90a``: candle's kernels and dspark's own, embedded in the
extension) or lacks the fused sampling kernels (their PTX, uncompressed in the extension's
fatbins: every ``dspark_vf_*`` and ``dspark_sb_*`` entry); has PTX newer than ``--max-ptx``
(the driver refuses PTX newer than itself: 9.0 is CUDA 13.0, driver 580); needs a shared
library other than glibc's, the GCC runtime's and NVIDIA's wheel libraries (in particular the
driver ``libcuda.so.1``, which is opened at run time, never linked); or is larger than
``--max-mib`` (the device tool carries 64 MiB in all).
Prints what it found: sizes, the PTX modules, the DT_NEEDED list.
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
import zipfile
from pathlib import Path

# Libraries every Linux Python extension may need: glibc's and the GCC runtime's.
SYSTEM_LIBS = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "libgcc_s.so.1",
    "libstdc++.so.6",
}
# NVIDIA's PyPI wheels (nvidia/cu13/lib, nvidia/*/lib), found by dspark's loader.
NVIDIA_WHEEL_LIB = re.compile(r"lib(cudart|cublas|cublasLt|curand|nvrtc|nvJitLink)\.so\.\d+$")
DT_NEEDED, DT_RPATH, DT_RUNPATH = 1, 15, 29
# The fused kernels' entry points (crates/dspark-kernels/kernels/fused_*.cu).
FUSED_ENTRIES = (
    "dspark_vf_stats",
    "dspark_vf_rows",
    "dspark_vf_resid",
    "dspark_vf_pick",
    "dspark_sb_prep",
    "dspark_sb_bias",
    "dspark_sb_pick",
    "dspark_sb_topk",
    "dspark_sb_onehot",
)
SHT_DYNAMIC = 6


def elf_dynamic(data: bytes) -> tuple[list[str], list[str]]:
    """(DT_NEEDED, DT_RPATH + DT_RUNPATH) of a little-endian ELF64 shared object."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    needed: list[str] = []
    paths: list[str] = []
    for sh in sections:
        if sh[1] != SHT_DYNAMIC:
            continue
        strtab = sections[sh[6]]
        str_off = strtab[4]
        for off in range(sh[4], sh[4] + sh[5], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag in (DT_NEEDED, DT_RPATH, DT_RUNPATH):
                end = data.index(b"\0", str_off + val)
                text = data[str_off + val : end].decode()
                (needed if tag == DT_NEEDED else paths).append(text)
    return needed, paths


def find_wheel(arg: str) -> Path:
    path = Path(arg)
    if path.is_dir():
        wheels = sorted(path.glob("dspark-*.whl"))
        if len(wheels) != 1:
            found = [w.name for w in wheels] or "none"
            raise SystemExit(
                f"check_cuda_wheel: FAIL: expected one dspark wheel in {path}: {found}"
            )
        return wheels[0]
    return path


def check(wheel: Path, sm: str, max_ptx: tuple[int, int], max_mib: float) -> list[str]:
    problems: list[str] = []
    if not wheel.is_file():
        return [f"no wheel at {wheel} (build it with scripts/build_cuda.sh)"]
    size = wheel.stat().st_size
    print(f"wheel: {wheel} ({size / 2**20:.1f} MiB, {size} bytes)")
    if size < 1024 or not zipfile.is_zipfile(wheel):
        return [f"{wheel.name} is empty or not a zip ({size} bytes): the build did not finish"]
    if size > max_mib * 2**20:
        problems.append(f"the wheel is {size / 2**20:.1f} MiB, over the {max_mib:g} MiB budget")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        natives = [n for n in names if re.fullmatch(r"dspark/_native[^/]*\.so", n)]
        for required in ("dspark/__init__.py", "dspark/_cuda_libs.py", "dspark/_native.pyi"):
            if required not in names:
                problems.append(f"the wheel lacks {required}")
        if len(natives) != 1:
            problems.append(f"expected one dspark/_native*.so in the wheel, found {natives}")
            return problems
        info = z.getinfo(natives[0])
        data = z.read(natives[0])
    print(f"extension: {natives[0]} ({info.file_size / 2**20:.1f} MiB unpacked)")

    targets = sorted(set(re.findall(rb"^\.target\s+(sm_\w+)", data, re.M)))
    found = re.findall(rb"^\.version\s+(\d+)\.(\d+)", data, re.M)
    versions = sorted({(int(a), int(b)) for a, b in found})
    modules = len(found)
    shown_targets = ", ".join(t.decode() for t in targets) or "none"
    shown_versions = ", ".join(f"{a}.{b}" for a, b in versions) or "none"
    print(f"PTX: {modules} modules, .target {shown_targets}, .version {shown_versions}")
    if not any(re.fullmatch(rf"sm_{sm}a?".encode(), t) for t in targets):
        problems.append(f"no PTX for sm_{sm} (`.target sm_{sm}`) in the extension")
    missing = [e for e in FUSED_ENTRIES if f".entry {e}(".encode() not in data]
    if missing:
        problems.append(f"the fused kernels are missing from the extension: {', '.join(missing)}")
    too_new = [v for v in versions if v > max_ptx]
    if too_new:
        problems.append(
            f"PTX .version {', '.join(f'{a}.{b}' for a, b in too_new)} is newer than "
            f"{max_ptx[0]}.{max_ptx[1]}: a driver for that CUDA version would refuse it"
        )

    try:
        needed, paths = elf_dynamic(data)
    except (ValueError, struct.error, IndexError) as e:
        problems.append(f"cannot read the extension's dynamic section: {e}")
        return problems
    print(f"DT_NEEDED: {' '.join(needed)}")
    if paths:
        print(f"RPATH/RUNPATH: {' '.join(paths)}")
    for lib in needed:
        if lib.startswith("libcuda.so"):
            problems.append(
                f"the extension links the driver ({lib}): it must open it at run time "
                "(cudarc's dynamic-loading mode; see scripts/cuda_rustc_wrapper.sh)"
            )
        elif lib not in SYSTEM_LIBS and not NVIDIA_WHEEL_LIB.fullmatch(lib):
            problems.append(f"the extension needs {lib}, which is neither glibc's nor NVIDIA's")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("wheel", nargs="?", default="target/wheels-cuda")
    p.add_argument("--sm", default="90", help="compute capability the PTX must target")
    p.add_argument("--max-ptx", default="9.0", help="newest PTX ISA allowed (9.0 = CUDA 13.0)")
    p.add_argument("--max-mib", type=float, default=40.0, help="largest wheel allowed")
    args = p.parse_args()
    major, minor = (int(x) for x in args.max_ptx.split("."))
    problems = check(find_wheel(args.wheel), args.sm, (major, minor), args.max_mib)
    for problem in problems:
        print(f"check_cuda_wheel: FAIL: {problem}", file=sys.stderr)
    if not problems:
        print("check_cuda_wheel: OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
