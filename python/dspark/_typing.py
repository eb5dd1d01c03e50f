"""Types of the typed front: what a tensor argument may be, and what comes back.

The kernels and the drafters read tensors through DLPack (numpy arrays, torch tensors, anything
with ``__dlpack__``) or, for plain sequences, through ``numpy.asarray``. Results are numpy
arrays, or torch tensors when the main input was one. torch is optional at run time: its types
are imported for the type checker only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

__all__ = [
    "DLPackTensor",
    "FloatArray",
    "IdArray",
    "PerRequestFloat",
    "PerRequestInt",
    "TensorLike",
    "TorchTensor",
]


class DLPackTensor(Protocol):
    """Anything that exports its memory through DLPack (numpy arrays, torch tensors, ...)."""

    def __dlpack__(self) -> object:
        """The DLPack capsule of the data."""
        ...

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device type, device id)`` of the data."""
        ...


#: A torch tensor (torch is optional; only the type checker imports it).
TorchTensor: TypeAlias = "torch.Tensor"
#: A tensor argument: a DLPack producer, or anything ``numpy.asarray`` reads (nested sequences).
TensorLike: TypeAlias = "DLPackTensor | npt.ArrayLike"
#: Token ids as the kernels return them on the host.
IdArray: TypeAlias = "npt.NDArray[np.int64]"
#: Logits, confidences and embeddings as the kernels return them on the host.
FloatArray: TypeAlias = "npt.NDArray[np.float32]"
#: One integer for every request, or one per request (a sequence, an array or a tensor).
PerRequestInt: TypeAlias = "int | Sequence[int] | npt.NDArray[np.integer[Any]] | torch.Tensor"
#: One float for every request, or one per request (a sequence, an array or a tensor).
PerRequestFloat: TypeAlias = (
    "float | Sequence[float] | npt.NDArray[np.floating[Any]] | torch.Tensor"
)
