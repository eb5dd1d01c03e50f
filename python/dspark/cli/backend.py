"""Which engine runs a command's target: dspark's native Qwen3 target (no torch) or
transformers, and how many threads it has.

``dspark demo`` runs the native target unless told otherwise; ``dspark generate`` picks it
(``auto``) whenever the target is a Qwen3 checkpoint, the architecture it implements, and
transformers otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dspark._errors import raise_error
from dspark._native import InputError
from dspark._threads import available_cpus

__all__ = ["BACKENDS", "choose_backend", "engine_threads", "need_torch"]

#: The ``--target-backend`` values of ``dspark generate``.
BACKENDS = ("auto", "native", "hf")

#: ``model_type`` values of the checkpoints the native target implements.
NATIVE_MODEL_TYPES = ("qwen3",)


def choose_backend(choice: str, target: Path) -> str:
    """``"native"`` or ``"hf"`` for ``--target-backend choice`` on the target directory
    ``target``: ``auto`` is native when its ``config.json`` says a Qwen3 model (an unreadable
    config is left to the pair checks that follow, which name the problem)."""
    if choice != "auto":
        return choice
    try:
        config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "native"
    model_type = config.get("model_type") if isinstance(config, dict) else None
    return "native" if model_type in NATIVE_MODEL_TYPES else "hf"


def need_torch(flag: str = "--target-backend hf") -> None:
    """``missing-dependency`` (saying what to install) when transformers' torch is absent."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise_error(
            InputError,
            "missing-dependency",
            f"{flag} needs torch and transformers ({exc}): "
            'pip install "dspark[torch]", or use the native target (the default)',
        )


def engine_threads(native: bool) -> int:
    """The target's thread count: the engine's (``RAYON_NUM_THREADS``) or torch's."""
    if native:
        value = os.environ.get("RAYON_NUM_THREADS", "")
        return int(value) if value.isdigit() and int(value) > 0 else available_cpus()
    import torch

    return int(torch.get_num_threads())
