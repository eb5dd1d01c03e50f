"""A minimal safetensors writer over numpy arrays (no torch needed).

Used to generate example and test checkpoints. Reading is the engine's job.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

_DTYPES: dict[np.dtype, str] = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.float64): "F64",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}


def save_file(
    tensors: Mapping[str, np.ndarray],
    path: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write ``tensors`` to ``path`` in the safetensors format (little-endian, C order)."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    chunks: list[bytes] = []
    offset = 0
    for name, array in tensors.items():
        arr = np.ascontiguousarray(array)
        dtype = _DTYPES.get(arr.dtype)
        if dtype is None:
            raise TypeError(f"tensor {name!r}: unsupported dtype {arr.dtype}")
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes
    with Path(path).open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for chunk in chunks:
            f.write(chunk)
