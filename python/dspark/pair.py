"""A target + drafter pair loaded from two directories (or a GGUF target file and a drafter
directory), checked before anything loads.

What ``dspark generate``, ``dspark demo`` and the benchmarks load: an HF transformers causal LM
(``config.json``, weights and a fast-tokenizer ``tokenizer.json``) and a DSpark drafter
checkpoint for it. :func:`check_pair_dirs` applies the rules of ``dspark inspect`` first (typed
errors with their codes), then :func:`load_model_pair` loads through the public API
(``AutoModelForCausalLM.from_pretrained`` → :meth:`dspark.Drafter.from_pretrained`), and
:func:`make_speculator` puts a :class:`dspark.Speculator` over it.

:func:`load_native_pair` loads the same directories with dspark's native Qwen3 target
instead: no torch or transformers, only ``tokenizers``. Its target may also be one Qwen3 GGUF
file (llama.cpp's format): the config, tokenizer and end-of-sequence ids then come from the file
(:func:`gguf_side`).

The HF path needs ``torch``, ``transformers`` and ``tokenizers`` (imported when a pair is
loaded).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark._args import as_int
from dspark._errors import raise_error, raise_report_errors
from dspark._files import MAX_TOKENIZER_BYTES, check_input_file, read_json
from dspark._native import BackendError, CheckpointError, ConfigError, InputError, gguf_side_files
from dspark._native import inspect as engine_inspect
from dspark._threads import available_cpus

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel

    from dspark.drafter import Drafter
    from dspark.native_target import NativeTarget
    from dspark.speculator import Speculator

__all__ = [
    "DTYPES",
    "NATIVE_DTYPES",
    "QUANT_DTYPES",
    "ModelPair",
    "check_pair_dirs",
    "gguf_side",
    "load_model_pair",
    "load_native_pair",
    "make_speculator",
    "target_tokenizer",
]

#: The target dtypes a pair loads in.
DTYPES = ("float32", "bfloat16", "float16")
#: The quantized formats the native target also takes: ``q8_0`` and ``q4_k``, its layers' maps
#: in GGUF's 8-bit blocks or 4-bit super-blocks.
QUANT_DTYPES = ("q8_0", "q4_k")
#: What the native target takes.
NATIVE_DTYPES = (*DTYPES, *QUANT_DTYPES)
#: The element types of the native target's KV cache.
KV_DTYPES = ("float16", "bfloat16", "float32")


@functools.lru_cache(maxsize=4)
def gguf_side(target: Path) -> dict[str, Any] | None:
    """What the GGUF file ``target`` carries beside its tensors (``config``, ``tokenizer``,
    ``tokenizer_config``, ``generation_config``: :func:`dspark._native.gguf_side_files`), or
    ``None`` when ``target`` is not a file (a checkpoint directory)."""
    return gguf_side_files(target) if target.is_file() else None


def check_pair_dirs(target: Path, drafter: Path, *, sts: bool = True) -> dict[str, Any]:
    """Check the pair before loading anything; returns the target's ``config.json`` as a dict
    (a GGUF target's: the one its metadata stands for).

    Raises the typed error of the first problem: a missing directory, config or
    ``tokenizer.json`` (``missing-file``; a GGUF file without a tokenizer: ``bad-gguf``), or what
    ``dspark inspect`` finds (its codes; several problems raise code ``multiple`` and list them
    all). ``sts=False``: the drafter's calibration file (``sts.json``) is not checked (for a load
    that does not read it).
    """
    side = gguf_side(target)
    if side is not None:
        if not drafter.is_dir():
            why = "not a directory" if drafter.exists() else "no such directory"
            raise_error(CheckpointError, "missing-file", f"drafter {drafter}: {why}")
        report = engine_inspect(drafter, target, sts=sts).to_dict()
        raise_report_errors(report["errors"])
        if side["tokenizer"] is None:
            raise_error(CheckpointError, "bad-gguf", str(side["tokenizer_error"]))
        return dict(side["config"])
    for what, path in (("target", target), ("drafter", drafter)):
        if not path.is_dir():
            why = "not a directory" if path.exists() else "no such directory"
            raise_error(CheckpointError, "missing-file", f"{what} {path}: {why}")
    config_path = target / "config.json"
    if not config_path.is_file():
        raise_error(
            CheckpointError, "missing-file", f"{config_path}: missing (the target's HF config)"
        )
    report = engine_inspect(drafter, target, sts=sts).to_dict()
    raise_report_errors(report["errors"])
    if not (target / "tokenizer.json").exists():
        raise_error(
            CheckpointError,
            "missing-file",
            f"{target / 'tokenizer.json'}: missing (dspark generate reads the target's "
            "fast-tokenizer file; save one with tokenizer.save_pretrained(DIR))",
        )
    check_input_file(target / "tokenizer.json", MAX_TOKENIZER_BYTES, "tokenizer")
    config = read_json(config_path, "target config")
    if not isinstance(config, dict):
        raise_error(ConfigError, "bad-config", f"{config_path}: not a JSON object")
    return config


@dataclass
class ModelPair:
    """A loaded target + drafter pair with its tokenizer and stop tokens.

    Attributes:
        tokenizer: the target's ``tokenizers.Tokenizer``.
        target: the HF causal LM (eval mode), or dspark's native target
            (:func:`load_native_pair`).
        drafter: the :class:`dspark.Drafter` loaded for it.
        stop_ids: the target's end-of-sequence ids inside its vocabulary.
        max_positions: the target's ``max_position_embeddings``, if it has one.
    """

    tokenizer: Tokenizer
    target: PreTrainedModel | NativeTarget
    drafter: Drafter
    stop_ids: list[int] = field(default_factory=list)
    max_positions: int | None = None

    @property
    def vocab_size(self) -> int:
        """The target's logical vocabulary."""
        return int(self.drafter.target_vocab_size)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (``InputError`` if none, or any outside the target vocab)."""
        ids = [int(i) for i in self.tokenizer.encode(text).ids]
        if not ids:
            raise_error(InputError, "invalid-argument", "the prompt encodes to no tokens")
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise_error(
                InputError,
                "token-out-of-range",
                f"the tokenizer produced ids {bad[:5]} outside the target vocab "
                f"[0, {self.vocab_size})",
            )
        return ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` (special tokens skipped)."""
        return str(self.tokenizer.decode(ids))

    def check_budget(self, prompt: list[int], max_new_tokens: int) -> None:
        """``InputError`` if prompt + new tokens exceed the target's position limit."""
        check_positions(len(prompt), max_new_tokens, self.max_positions)


def check_positions(prompt_tokens: int, max_new_tokens: int, max_positions: int | None) -> None:
    """``InputError`` if a prompt of ``prompt_tokens`` plus ``max_new_tokens`` exceeds the
    target's ``max_positions`` (``None``: no limit); ``calibrate`` checks its first window."""
    if max_positions is not None and prompt_tokens + max_new_tokens > max_positions:
        raise_error(
            InputError,
            "invalid-argument",
            f"prompt ({prompt_tokens} tokens) + --max-new-tokens {max_new_tokens} exceeds "
            f"the target's max_position_embeddings {max_positions}",
        )


def _stop_ids(raw: object, config: dict[str, Any], vocab: int) -> list[int]:
    """The end-of-sequence ids: ``raw`` (the generation config's ``eos_token_id``) first, then
    ``config.json``'s."""
    if raw is None:
        raw = config.get("eos_token_id")
    values = raw if isinstance(raw, list) else [raw]
    return sorted(
        {int(v) for v in values if isinstance(v, int) and not isinstance(v, bool) and v < vocab}
    )


def load_model_pair(
    target: Path,
    drafter: Path,
    *,
    dtype: str = "float32",
    threads: int | None = None,
    quiet: bool = True,
) -> ModelPair:
    """Check (:func:`check_pair_dirs`), then load tokenizer, HF target and candle drafter.

    ``threads`` sets torch's thread count; ``quiet`` turns transformers' progress bars off.
    """
    if dtype not in DTYPES:
        raise_error(InputError, "invalid-argument", f"dtype {dtype!r}: one of {DTYPES}")
    if threads is not None:
        threads = as_int(threads, "threads", lo=1, hi=available_cpus())
    if target.is_file():
        raise_error(
            InputError,
            "invalid-argument",
            f"{target}: a GGUF target runs on dspark's native target "
            "(--target-backend native), not through transformers",
        )
    config = check_pair_dirs(target, drafter)
    import torch
    from transformers import AutoModelForCausalLM

    from dspark.drafter import Drafter

    if threads is not None:
        torch.set_num_threads(threads)
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    tokenizer = target_tokenizer(target)
    try:
        model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype)).eval()
    except Exception as exc:  # transformers raises many types; one typed error for all
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise_error(
            BackendError, "backend", f"{target}: transformers could not load the target: {first}"
        )
    pair = ModelPair(tokenizer, model, Drafter.from_pretrained(drafter, model))
    gen = getattr(model, "generation_config", None)
    pair.stop_ids = _stop_ids(getattr(gen, "eos_token_id", None), config, pair.vocab_size)
    limit = config.get("max_position_embeddings")
    pair.max_positions = limit if isinstance(limit, int) and limit > 0 else None
    return pair


def target_tokenizer(target: Path) -> Tokenizer:
    """The target's fast tokenizer (``tokenizers``; a typed error for a bad file): its
    directory's ``tokenizer.json``, or the one a GGUF target file carries."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise_error(
            InputError,
            "missing-dependency",
            f"{exc}: the pair's text needs the tokenizers package (pip install tokenizers)",
        )
    side = gguf_side(target)
    if side is not None:
        try:
            return Tokenizer.from_str(str(side["tokenizer"]))
        except Exception as exc:  # tokenizers raises plain Exception on a bad document
            raise_error(ConfigError, "bad-config", f"{target}: its tokenizer: {exc}")
    tok_path = target / "tokenizer.json"
    try:
        return Tokenizer.from_file(str(tok_path))
    except Exception as exc:  # tokenizers raises plain Exception on a bad file
        raise_error(ConfigError, "bad-config", f"{tok_path}: {str(exc).splitlines()[0]}")


def load_native_pair(
    target: Path,
    drafter: Path,
    *,
    dtype: str | None = None,
    threads: int | None = None,
    kv_dtype: str | None = None,
) -> ModelPair:
    """Check (:func:`check_pair_dirs`), then load tokenizer, dspark's native Qwen3 target (in
    ``dtype``, by default the checkpoint's; its KV cache in ``kv_dtype``, by default the
    engine's) and the candle drafter: no torch, no transformers.

    ``threads`` sets the engine's thread count (``RAYON_NUM_THREADS``); it takes effect when
    nothing in this process has run a parallel engine op yet (as in a fresh ``dspark``
    command).
    """
    import os

    from dspark.drafter import Drafter
    from dspark.native_target import NativeTarget

    if threads is not None:
        threads = as_int(threads, "threads", lo=1, hi=available_cpus())
        os.environ["RAYON_NUM_THREADS"] = str(threads)
    config = check_pair_dirs(target, drafter)
    tokenizer = target_tokenizer(target)
    if dtype is not None and dtype not in NATIVE_DTYPES:
        raise_error(InputError, "invalid-argument", f"dtype {dtype!r}: one of {NATIVE_DTYPES}")
    model = NativeTarget.from_pretrained(target, dtype=dtype, kv_dtype=kv_dtype)
    pair = ModelPair(tokenizer, model, Drafter.from_pretrained(drafter, model))
    gen_path = target / "generation_config.json"
    side = gguf_side(target)
    if side is not None:
        gen = side["generation_config"]
    else:
        gen = read_json(gen_path, "generation config") if gen_path.is_file() else {}
    raw = gen.get("eos_token_id") if isinstance(gen, dict) else None
    pair.stop_ids = _stop_ids(raw, config, pair.vocab_size)
    limit = config.get("max_position_embeddings")
    pair.max_positions = limit if isinstance(limit, int) and limit > 0 else None
    return pair


def make_speculator(pair: ModelPair, prompt: list[int], **kw: Any) -> Speculator:
    """A :class:`dspark.Speculator` over ``pair`` with the options ``kw``.

    Nothing is measured first: under ``verify="scheduled"`` (the default) the scheduler starts
    from a prior built from the target's shape and this machine's speed and refines it with
    every round's timings. ``prompt`` is kept for callers that passed one.
    """
    from dspark.speculator import Speculator

    del prompt
    return Speculator(pair.target, pair.drafter, **kw)
