"""Write a large checkpoint as sharded safetensors, one tensor in memory at a time (numpy only).

The layout is decided first from names, shapes and the dtype alone (:func:`plan_shards`), so
the file names and ``model.safetensors.index.json`` are known before any data exists; then
:func:`write_shards` asks for each tensor's float32 values in file order, converts them
(``bfloat16`` rounds to nearest even) and streams them out. Same inputs, same bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

__all__ = ["DTYPES", "Dtype", "ShardPlan", "TensorSpec", "plan_shards", "to_bf16", "write_shards"]

Dtype = Literal["float32", "bfloat16"]
#: Bytes per element and safetensors dtype name of each supported output dtype.
DTYPES: dict[str, tuple[int, str]] = {"float32": (4, "F32"), "bfloat16": (2, "BF16")}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: its checkpoint name and shape."""

    name: str
    shape: tuple[int, ...]

    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ShardPlan:
    """Which tensors go to which file, in order."""

    files: list[tuple[str, list[TensorSpec]]]
    dtype: Dtype
    total_bytes: int

    @property
    def sharded(self) -> bool:
        """Whether there is more than one file (and so an index)."""
        return len(self.files) > 1


def plan_shards(specs: Sequence[TensorSpec], dtype: Dtype, max_shard_bytes: int) -> ShardPlan:
    """Split ``specs`` (kept in order) into files of at most ``max_shard_bytes`` of tensor data
    (a tensor larger than that gets a file of its own). One file is ``model.safetensors``;
    several are ``model-0000i-of-0000n.safetensors``, as transformers names them."""
    size, _ = DTYPES[dtype]
    groups: list[list[TensorSpec]] = [[]]
    used = 0
    for spec in specs:
        nbytes = spec.numel() * size
        if groups[-1] and used + nbytes > max_shard_bytes:
            groups.append([])
            used = 0
        groups[-1].append(spec)
        used += nbytes
    n = len(groups)
    names = (
        ["model.safetensors"]
        if n == 1
        else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    )
    total = sum(s.numel() for s in specs) * size
    return ShardPlan(list(zip(names, groups, strict=True)), dtype, total)


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (``uint16``), rounding to nearest, ties to even.

    Finite inputs only (the generator never makes NaN or infinity)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    out: np.ndarray = ((bits + rounding) >> np.uint32(16)).astype(np.uint16)
    return out


def _encode(values: np.ndarray, dtype: Dtype) -> bytes:
    if dtype == "bfloat16":
        return to_bf16(values).astype("<u2", copy=False).tobytes()
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def write_shards(
    root: Path,
    plan: ShardPlan,
    values: Callable[[TensorSpec], np.ndarray],
    metadata: dict[str, str] | None = None,
) -> list[Path]:
    """Write ``plan`` under ``root`` (an existing directory), calling ``values(spec)`` once per
    tensor in file order for its float32 data; returns the files written (index last)."""
    size, st_dtype = DTYPES[plan.dtype]
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    for fname, specs in plan.files:
        header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
        offset = 0
        for spec in specs:
            nbytes = spec.numel() * size
            header[spec.name] = {
                "dtype": st_dtype,
                "shape": list(spec.shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
            weight_map[spec.name] = fname
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        path = root / fname
        with path.open("wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for spec in specs:
                arr = values(spec)
                if arr.shape != spec.shape:
                    raise AssertionError(f"{spec.name}: made {arr.shape}, planned {spec.shape}")
                f.write(_encode(arr, plan.dtype))
        written.append(path)
    if plan.sharded:
        index = {"metadata": {"total_size": plan.total_bytes}, "weight_map": weight_map}
        path = root / "model.safetensors.index.json"
        path.write_text(json.dumps(index, indent=2) + "\n")
        written.append(path)
    return written
