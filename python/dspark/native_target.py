"""``dspark.NativeTarget``: the engine's Qwen3 causal LM (candle), a speculator target with no
Python in the loop.

    target = dspark.NativeTarget.from_pretrained("path/to/qwen3")   # config.json + safetensors
    drafter = dspark.Drafter.from_pretrained("path/to/drafter", target)  # embed/lm_head shared
    result = dspark.Speculator(target, drafter).generate([[1, 2, 3]], 64)

Weight matrices keep the checkpoint's dtype by default (f32, bf16 or f16 on disk; single file or
sharded): a bf16 checkpoint is read as 2 bytes a weight and widened in registers, arithmetic is
float32. ``dtype=`` chooses another (``"float32"``, ``"bfloat16"``, ``"float16"``), or a quantized
format: the decoder layers' linear maps quantized at load into ``"q8_0"`` blocks (32 weights and
one f16 scale, about half a bf16 weight's bytes) or ``"q4_k"`` super-blocks (256 weights, 4-bit
levels with 6-bit scales and mins, about a quarter), GGUF's layouts, with activations quantized
per row, so that speculative greedy decoding still equals target-only greedy decoding token for
token.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dspark import _native
from dspark._args import as_path, dtype_name, id_list
from dspark._errors import raise_error
from dspark._files import read_json
from dspark._native import InputError

if TYPE_CHECKING:
    from dspark._typing import FloatArray

__all__ = ["NativeTarget"]


class NativeTarget:
    """A Qwen3 causal LM run by the engine. Make it with :meth:`from_pretrained`."""

    __slots__ = ("_config", "_native_target", "path")

    def __init__(self, native: _native.NativeTarget, path: Path, config: dict[str, Any]) -> None:
        self._native_target = native
        self.path = path
        self._config = config

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        device: str = "cpu",
        dtype: str | object | None = None,
        kv_dtype: str | object | None = None,
    ) -> NativeTarget:
        """Load an HF ``Qwen3ForCausalLM`` directory, or a Qwen3 GGUF file as llama.cpp's
        converter and ``llama-quantize`` write it (F32, F16, BF16, Q8_0, Q4_K and Q6_K tensors,
        quantized ones kept in their blocks; its config from the file), onto ``device`` (typed
        ``dspark`` errors; a bad file: ``CheckpointError`` ``bad-gguf`` naming it and the tensor):
        ``"cpu"`` (default), ``"cuda"`` or ``"cuda:N"`` (the CUDA wheel, ``docs/gpu.md``).

        ``dtype``: the dtype the weight matrices are kept in, ``"float32"``, ``"bfloat16"`` or
        ``"float16"`` (also ``"f32"``, ``"bf16"``, ``"f16"`` or a ``torch.dtype``), ``"q8_0"``
        (the layers' maps and the output head in 8-bit blocks, the embedding as stored) or
        ``"q4_k"`` (the layers' maps in 4-bit super-blocks, the head in 8-bit blocks); ``None``
        (default) keeps the checkpoint's. ``kv_dtype``: the KV cache's element type,
        ``"float16"``, ``"bfloat16"`` or ``"float32"`` (aliases and ``torch.dtype`` as for
        ``dtype``); ``None`` (default) is the engine's default, ``float16``: half the bytes a
        decode step reads at a long context, attention still in f32. Anything else raises
        ``InputError`` (``invalid-argument``) listing the choices."""
        if not isinstance(device, str):
            raise_error(
                InputError,
                "invalid-argument",
                f"device: expected a str such as 'cpu' or 'cuda:0', got {type(device).__name__}",
            )
        root = as_path(path, "path")
        native = _native.NativeTarget.load(
            root, device, dtype_name(dtype), dtype_name(kv_dtype, "kv_dtype")
        )
        if root.is_dir():
            config = read_json(root / "config.json", "target config")
        else:
            config = _native.gguf_side_files(root)["config"]
        return cls(native, root, config if isinstance(config, dict) else {})

    @property
    def device(self) -> str:
        """Where the weights live: ``"cpu"`` or ``"cuda:N"``."""
        return str(self._native_target.device)

    @property
    def kv_dtype(self) -> str:
        """The KV cache's element type: ``"float32"``, ``"float16"`` or ``"bfloat16"``."""
        return str(self._native_target.kv_dtype)

    @property
    def weight_dtype(self) -> str:
        """The dtype the layers' weight matrices are kept in: ``"float32"``, ``"bfloat16"``,
        ``"float16"``, or ``"q8_0"`` / ``"q4_k"`` when quantized at load."""
        return str(self._native_target.weight_dtype)

    @property
    def weight_bytes_per_step(self) -> int:
        """Bytes of weights one forward step reads (a decode step's floor is this over the
        machine's read bandwidth)."""
        return int(self._native_target.weight_bytes_per_step)

    @property
    def num_hidden_layers(self) -> int:
        """Number of decoder layers."""
        return int(self._native_target.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        """Hidden width."""
        return int(self._native_target.hidden_size)

    @property
    def vocab_size(self) -> int:
        """Logical vocabulary ``V_t``."""
        return int(self._native_target.vocab_size)

    def config_dict(self) -> dict[str, Any]:
        """The ``config.json`` the target was loaded from (a GGUF file's: the one its metadata
        stands for)."""
        return dict(self._config)

    def logits(self, input_ids: npt.ArrayLike) -> FloatArray:
        """Float32 logits ``[S, V_t]`` of every position of one sequence (an empty cache).

        ``input_ids``: one sequence of ids (a list, a 1-D tensor or array), each an int in
        ``[0, V_t)``; a bool, a float or a string where an id is meant is ``invalid-argument``,
        an id outside the vocabulary ``token-out-of-range``, more dimensions ``bad-shape``.
        """
        ids = id_list(input_ids, "input_ids", self.vocab_size)
        return self._native_target.logits(np.asarray(ids, dtype=np.int64))

    def __repr__(self) -> str:
        return f"NativeTarget({str(self.path)!r}, {self._native_target!r})"
