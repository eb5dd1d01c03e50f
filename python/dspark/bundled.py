"""The bundled model pair: a tiny trained Qwen3 target and its DSpark drafter, in the package.

``dspark/models/tiny`` holds ``target/`` (an HF ``Qwen3ForCausalLM`` trained on the CPython
standard library, with ``tokenizer.json``), ``drafter/`` (its DSpark drafter and ``sts.json``)
and the held-out texts: ``heldout_prompts.json`` (the first 2000 characters of every
standard-library file the pair never trained on; the split is a hash of the file name) and
``heldout_chunks.json`` (the same files in 2000-character pieces). See ``NOTICE`` and
``models/tiny/TRAINING.md``; ``python -m dspark.train`` rebuilds it.

Used by ``dspark demo``, ``dspark calibrate``, the tests and the benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from dspark._errors import raise_error
from dspark._files import read_json
from dspark._native import InputError
from dspark.pair import load_model_pair, load_native_pair

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel

    from dspark.drafter import Drafter
    from dspark.native_target import NativeTarget

__all__ = ["BundledPair", "bundled_dir", "heldout_texts", "load_pair"]


def bundled_dir() -> Path:
    """Directory of the bundled pair inside the installed package (``target/``, ``drafter/``)."""
    return Path(str(resources.files("dspark") / "models" / "tiny"))


@dataclass
class BundledPair:
    """The loaded pair: tokenizer, target (native or HF), candle drafter, and the stop token."""

    tokenizer: Tokenizer
    target: PreTrainedModel | NativeTarget
    drafter: Drafter
    eos_id: int


def load_pair(
    root: Path | None = None, threads: int | None = None, backend: str = "hf"
) -> BundledPair:
    """Load the tokenizer, target and drafter from ``root`` (default: bundled).

    ``backend``: ``"hf"`` (default: transformers, f32, eval; needs torch) or ``"native"``
    (dspark's Qwen3 target, no torch: what ``dspark demo`` runs by default). The same checks
    and loading path as ``dspark generate`` (typed errors, nothing loaded before the pair
    passes ``dspark inspect``).
    """
    base = root or bundled_dir()
    if backend == "native":
        pair = load_native_pair(base / "target", base / "drafter", threads=threads)
    elif backend == "hf":
        pair = load_model_pair(base / "target", base / "drafter", threads=threads)
    else:
        raise_error(InputError, "invalid-argument", f"backend {backend!r}: 'native' or 'hf'")
    eos = pair.tokenizer.token_to_id("<|endoftext|>")
    if eos is None:
        eos = pair.stop_ids[0] if pair.stop_ids else -1
    return BundledPair(pair.tokenizer, pair.target, pair.drafter, int(eos))


def heldout_texts(root: Path | None = None) -> list[tuple[str, str]]:
    """``(file name, text)`` of the held-out prompts, in their stored order.

    ``root/heldout_prompts.json`` when a model directory is given and has one, else the
    bundled file (written by ``python -m dspark.train``: the held-out files' first 2000
    characters; the split is a hash of the file name, not a choice).
    """
    path = bundled_dir() / "heldout_prompts.json"
    if root is not None and (root / "heldout_prompts.json").is_file():
        path = root / "heldout_prompts.json"
    data = read_json(path, "held-out prompts", config=False)
    try:
        texts = data["texts"]
        names = data.get("files") or [f"held-out #{i + 1}" for i in range(len(texts))]
        pairs = [(str(n), str(t)) for n, t in zip(names, texts, strict=True)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise_error(InputError, "invalid-argument", f"{path}: no usable held-out prompts ({exc})")
    return pairs
