"""Confidence records: what ``dspark calibrate`` fits per-position temperatures on.

Every verified draft slot whose earlier slots were all accepted is one record ``(position,
confidence, accepted)``. This module makes them:

1. prompts: windows of held-out texts (:func:`load_texts`, :func:`default_texts`,
   :func:`prompt_windows`: each text gives prompts ending at ``prompt_tokens``, then every
   ``stride`` tokens further). The texts are split in two by their index: even indices are the
   *fit* half, odd ones the *held-out* half, so no text, and no window of one, is on both sides;
2. the pair (:func:`load`): the engine's native Qwen3 target when the target directory loads as
   one (else the transformers model), the drafter with its raw confidences (``sts=False``);
3. the runs (:func:`collect`): speculative decoding with FULL verification and
   ``record_confidence=True``, batches alternating between the halves, until both halves
   together reach the requested request-rounds.

The fit itself is :mod:`dspark.sts`; the command, :mod:`dspark.cli.calibrate`.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from dspark._errors import raise_error
from dspark._files import MAX_TEXT_BYTES, read_text
from dspark._native import DSparkError, InputError

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel

    from dspark.drafter import Drafter
    from dspark.native_target import NativeTarget

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_NEW_TOKENS",
    "DEFAULT_PROMPT_TOKENS",
    "DEFAULT_STRIDE",
    "Collected",
    "Loaded",
    "collect",
    "default_texts",
    "load",
    "load_texts",
    "prompt_windows",
]

#: Tokens of a text's first prompt window.
DEFAULT_PROMPT_TOKENS = 96
#: Tokens between a text's prompt windows.
DEFAULT_STRIDE = 64
#: Tokens generated per prompt.
DEFAULT_NEW_TOKENS = 64
#: Prompts per ``generate`` call.
DEFAULT_BATCH = 8


def load_texts(path: Path) -> list[str]:
    """Prompt texts of ``path``: a JSON list of strings, a JSON object ``{"texts": [...]}``, or
    (anything that is not JSON) a text file with one prompt per line (blank lines skipped)."""
    raw = read_text(path, MAX_TEXT_BYTES, "prompts file")
    data: Any
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if data is None or isinstance(data, (int, float, bool)):
        texts = [line for line in raw.splitlines() if line.strip()]
    else:
        if isinstance(data, dict):
            data = data.get("texts")
        if not isinstance(data, list) or not all(isinstance(t, str) for t in data):
            raise_error(
                InputError,
                "invalid-argument",
                f'{path}: expected a JSON list of strings or {{"texts": [...]}}',
            )
        texts = [t for t in data if t.strip()]
    if len(texts) < 2:
        raise_error(
            InputError,
            "invalid-argument",
            f"{path}: {len(texts)} prompt(s); calibration needs at least 2 (one per half)",
        )
    return texts


def default_texts(drafter: Path) -> tuple[list[str], str]:
    """The default held-out texts: ``DRAFTER/../heldout_chunks.json`` (every held-out file in
    2000-character pieces, interleaved so even and odd entries come from different files), else
    ``DRAFTER/../heldout_prompts.json`` (each held-out file's first piece), else the bundled
    chunks."""
    from dspark.bundled import bundled_dir

    for path in (
        drafter.parent / "heldout_chunks.json",
        drafter.parent / "heldout_prompts.json",
        bundled_dir() / "heldout_chunks.json",
    ):
        if path.is_file():
            return load_texts(path), str(path)
    raise_error(InputError, "invalid-argument", f"{drafter}: no held-out prompts; pass --prompts")


def prompt_windows(
    ids: list[int], first: int, stride: int, limit: int | None = None
) -> list[list[int]]:
    """Prompts ending at ``first``, ``first + stride``, ... tokens of ``ids`` (the whole text
    once when it is shorter than ``first``), none longer than ``limit`` tokens."""
    if limit is not None:
        ids = ids[: max(1, limit)]
    if len(ids) <= first:
        return [ids] if ids else []
    return [ids[:end] for end in range(first, len(ids) + 1, stride)]


@dataclass
class Loaded:
    """The loaded pair, as calibrate uses it."""

    target: NativeTarget | PreTrainedModel
    drafter: Drafter
    tokenizer: Tokenizer
    backend: str
    stop_ids: list[int]
    sts_off: bool
    max_positions: int | None = None


def _drafter_kwargs() -> tuple[dict[str, Any], bool]:
    """``{"sts": False}`` when the installed ``Drafter.from_pretrained`` takes ``sts``."""
    from dspark.drafter import Drafter

    try:
        params = inspect.signature(Drafter.from_pretrained).parameters
    except (TypeError, ValueError):
        return {}, False
    return ({"sts": False}, True) if "sts" in params else ({}, False)


def load(target_dir: Path, drafter_dir: Path) -> Loaded:
    """The native Qwen3 target when it loads (else the transformers model), the drafter with
    raw confidences, the target's tokenizer and its stop tokens."""
    from dspark.drafter import Drafter
    from dspark.native_target import NativeTarget
    from dspark.pair import check_pair_dirs, target_tokenizer

    # The drafter's own sts.json is neither read nor checked: the confidences must be the raw
    # head's, and a stale or broken file is what calibrate replaces.
    config = check_pair_dirs(target_dir, drafter_dir, sts=False)
    tokenizer = target_tokenizer(target_dir)
    kwargs, sts_off = _drafter_kwargs()
    try:
        target: NativeTarget | PreTrainedModel = NativeTarget.from_pretrained(target_dir)
        backend = "native"
    except DSparkError:
        import torch
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        backend = "transformers"
    drafter = Drafter.from_pretrained(drafter_dir, target, **kwargs)
    if not drafter.has_confidence_head:
        raise_error(
            InputError,
            "invalid-argument",
            f"{drafter_dir}: the drafter has no confidence head: nothing to calibrate",
        )
    stops = set()
    eos = tokenizer.token_to_id("<|endoftext|>")
    if eos is not None:
        stops.add(int(eos))
    raw = config.get("eos_token_id")
    for v in raw if isinstance(raw, list) else [raw]:
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < drafter.target_vocab_size:
            stops.add(v)
    limit = config.get("max_position_embeddings")
    limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
    return Loaded(target, drafter, tokenizer, backend, sorted(stops), sts_off, limit)


@dataclass
class Collected:
    """Confidence records of both halves and what produced them."""

    fit: list[tuple[int, float, bool]] = field(default_factory=list)
    held: list[tuple[int, float, bool]] = field(default_factory=list)
    fit_rounds: int = 0
    held_rounds: int = 0
    fit_prompts: int = 0
    held_prompts: int = 0
    committed: int = 0
    seconds: float = 0.0
    exhausted: bool = False


def collect(
    pair: Loaded,
    texts: Sequence[str],
    *,
    rounds: int,
    temperature: float = 0.0,
    seed: int = 0,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    stride: int = DEFAULT_STRIDE,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    batch: int = DEFAULT_BATCH,
    progress: TextIO | None = None,
) -> Collected:
    """Run full-verification speculative decoding over prompt windows of ``texts`` (even
    indices: fit half, odd: held-out half), batches alternating between the halves, until both
    together reach ``rounds`` request-rounds and each has run at least once (or the windows run
    out)."""
    from dspark.speculator import Speculator

    halves: list[list[list[int]]] = [[], []]
    # A prompt plus its continuation must fit the target's positions.
    limit = None if pair.max_positions is None else pair.max_positions - new_tokens
    windows = [
        prompt_windows([int(i) for i in pair.tokenizer.encode(t).ids], prompt_tokens, stride, limit)
        for t in texts
    ]
    # Window order: the first window of every text, then the second of every text, ...
    for w in range(max((len(x) for x in windows), default=0)):
        for i, x in enumerate(windows):
            if w < len(x):
                halves[i % 2].append(x[w])
    sp = Speculator(
        pair.target,
        pair.drafter,
        temperature=temperature,
        verify="full",
        seed=seed,
        record_confidence=True,
    )
    out = Collected()
    cursor = [0, 0]
    side = 0
    t0 = time.perf_counter()
    # The progress line ends however the loop does (Ctrl-C included), so an error line that
    # follows starts a line of its own.
    try:
        while out.fit_rounds + out.held_rounds < rounds or not (
            out.fit_prompts and out.held_prompts
        ):
            if cursor[0] >= len(halves[0]) and cursor[1] >= len(halves[1]):
                out.exhausted = True
                break
            if cursor[side] >= len(halves[side]):
                side = 1 - side
            chunk = halves[side][cursor[side] : cursor[side] + batch]
            cursor[side] += len(chunk)
            res = sp.generate(chunk, new_tokens, pair.stop_ids)
            st = res.stats
            recs = [(int(p), float(c), bool(a)) for p, c, a in st.confidence_records]
            if side == 0:
                out.fit.extend(recs)
                out.fit_rounds += st.request_rounds
                out.fit_prompts += len(chunk)
            else:
                out.held.extend(recs)
                out.held_rounds += st.request_rounds
                out.held_prompts += len(chunk)
            out.committed += st.committed_tokens
            if progress is not None:
                progress.write(
                    f"\rcollecting: {out.fit_rounds + out.held_rounds}/{rounds} request-rounds"
                )
                progress.flush()
            side = 1 - side
    finally:
        if progress is not None:
            progress.write("\n")
            progress.flush()
    out.seconds = time.perf_counter() - t0
    return out
