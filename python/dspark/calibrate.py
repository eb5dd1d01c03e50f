"""``dspark calibrate``: fit per-position confidence temperatures (STS) for a drafter.

The drafter's confidence head scores each draft slot k with c_k, meant to be
P(slot k accepted | slots < k accepted): the number the threshold and the scheduler act on.
This command measures how well it does, then fits Sequential Temperature Scaling (STS): per
position, the T_k that makes ``sigmoid(logit(c) / T_k)`` match the observed acceptance (the
engine's format, SGLang style: ``{"temperatures": [T_0, ..., T_{K-1}]}``).

How (every figure from one run):

1. Prompts: windows of held-out texts (``DRAFTER/../heldout_chunks.json`` or
   ``DRAFTER/../heldout_prompts.json`` if present, else the bundled held-out chunks: all 18
   held-out files in 2000-character pieces; or ``--prompts FILE``). Each text gives prompts
   ending at ``--prompt-tokens``, then every ``--stride`` tokens further. The texts are split in
   two by their index: even indices (#0, #2, ...) are the *fit* half, odd ones the *held-out*
   half, so no text, and no window of one, is on both sides.
2. Speculative decoding with FULL verification (every slot verified; greedy unless
   ``--temperature``) with ``record_confidence=True``, on the engine's native Qwen3 target when
   the target directory loads as one (else on the transformers model), in batches alternating
   between the halves, until both halves together reach ``--rounds`` request-rounds. The
   drafter is loaded with ``sts=False`` where the installed dspark knows that argument, so the
   confidences are the raw head's.
3. Every verified slot whose earlier slots were all accepted is one sample ``(k, c, accepted)``.
   T_k minimizes the binary NLL on the fit half (golden-section search over log T in
   ``[1e-2, 1e2]``); positions with fewer than ``--min-samples`` fit samples, or with one outcome
   only, keep T = 1 and are named.
4. ECE (10 equal-width bins, weighted by bin counts) before and after, on the *held-out* half:
   the numbers the issue's target (ECE <= 0.05 at every position) is judged on. Next to them:
   the ECE a perfectly calibrated head would still show on the same samples (sampling noise),
   and, as a diagnostic, the held-out ECE of a per-position scale *and bias* (Platt) fit, which
   the STS format cannot express.

The table written is the fit half's (the one evaluated), to ``--out`` (default
``DRAFTER/sts.json``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from dspark._errors import raise_error
from dspark._native import DSparkError, InputError
from dspark.calibration import (
    DEFAULT_MIN_SAMPLES,
    T_MAX,
    T_MIN,
    PositionReport,
    apply_platt,
    apply_sts,
    ece,
    ece_noise_floor,
    fit_platt,
    fit_positions,
    fit_temperature,
)

__all__ = [
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_ROUNDS",
    "T_MAX",
    "T_MIN",
    "Calibration",
    "PositionReport",
    "add_arguments",
    "apply_platt",
    "apply_sts",
    "collect",
    "ece",
    "ece_noise_floor",
    "fit_platt",
    "fit_positions",
    "fit_temperature",
    "load_texts",
    "prompt_windows",
    "run",
]

#: Request-rounds collected by default (both halves together). Late positions are reached in
#: a fraction of rounds (on the bundled pair greedy, position 8 in ~6%): at 2000 rounds each half
#: holds ~60 of its samples, where sampling noise alone already gives an ECE of ~0.05.
DEFAULT_ROUNDS = 2000
#: The issue's target: held-out ECE at every position.
TARGET_ECE = 0.05
DEFAULT_PROMPT_TOKENS = 96
DEFAULT_STRIDE = 64
DEFAULT_NEW_TOKENS = 64
DEFAULT_BATCH = 8

_FloatArray = npt.NDArray[np.float64]


# -- data ----------------------------------------------------------------------------------


def load_texts(path: Path) -> list[str]:
    """Prompt texts of ``path``: a JSON list of strings, a JSON object ``{"texts": [...]}``, or
    (anything that is not JSON) a text file with one prompt per line (blank lines skipped)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise_error(InputError, "invalid-argument", f"{path}: cannot read prompts ({exc})")
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


def _default_texts(drafter: Path) -> tuple[list[str], str]:
    """The default held-out texts: ``DRAFTER/../heldout_chunks.json`` (every held-out file in
    2000-character pieces, interleaved so even and odd entries come from different files), else
    ``DRAFTER/../heldout_prompts.json`` (each held-out file's first piece), else the bundled
    chunks."""
    from dspark.demo import bundled_dir

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

    target: Any
    drafter: Any
    tokenizer: Any
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
    from tokenizers import Tokenizer

    from dspark.drafter import Drafter
    from dspark.generate import check_pair_dirs
    from dspark.native_target import NativeTarget

    config = check_pair_dirs(target_dir, drafter_dir)
    tokenizer = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    kwargs, sts_off = _drafter_kwargs()
    try:
        target: Any = NativeTarget.from_pretrained(target_dir)
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
    while out.fit_rounds + out.held_rounds < rounds or not (out.fit_prompts and out.held_prompts):
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
    out.seconds = time.perf_counter() - t0
    if progress is not None:
        progress.write("\n")
        progress.flush()
    return out


# -- the command ---------------------------------------------------------------------------


@dataclass
class Calibration:
    """The result of :func:`run`: per-position reports and the JSON written."""

    positions: list[PositionReport]
    document: dict[str, Any]
    out: Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark calibrate`` options."""
    from dspark.generate import existing_file, positive_int, seed_int, temperature

    p.add_argument("--target", type=Path, required=True, metavar="DIR", help="target model dir")
    p.add_argument("--drafter", type=Path, required=True, metavar="DIR", help="drafter dir")
    p.add_argument(
        "--prompts",
        type=existing_file,
        default=None,
        metavar="FILE",
        help='JSON list of strings, {"texts": [...]}, or one prompt per line (default: '
        "DRAFTER/../heldout_chunks.json or heldout_prompts.json if present, else the bundled "
        "held-out chunks)",
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        default=DEFAULT_ROUNDS,
        metavar="N",
        help=f"request-rounds to collect, both halves together (default {DEFAULT_ROUNDS})",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="where to write the STS JSON (default DRAFTER/sts.json)",
    )
    p.add_argument(
        "--temperature",
        type=temperature,
        default=0.0,
        metavar="T",
        help="sampling temperature of the runs (default 0: greedy); calibrate at the "
        "temperature you serve at",
    )
    p.add_argument("--seed", type=seed_int, default=0, metavar="S")
    p.add_argument(
        "--min-samples",
        type=positive_int,
        default=DEFAULT_MIN_SAMPLES,
        metavar="N",
        help=f"fit samples a position needs, else T = 1 (default {DEFAULT_MIN_SAMPLES})",
    )
    p.add_argument(
        "--prompt-tokens",
        type=positive_int,
        default=DEFAULT_PROMPT_TOKENS,
        metavar="N",
        help=f"length of each text's first prompt window (default {DEFAULT_PROMPT_TOKENS})",
    )
    p.add_argument(
        "--stride",
        type=positive_int,
        default=DEFAULT_STRIDE,
        metavar="N",
        help=f"tokens between a text's prompt windows (default {DEFAULT_STRIDE})",
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=DEFAULT_NEW_TOKENS,
        metavar="N",
        help=f"tokens generated per prompt (default {DEFAULT_NEW_TOKENS})",
    )
    p.add_argument(
        "--batch",
        type=positive_int,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"prompts per generate call (default {DEFAULT_BATCH})",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _num(x: float, digits: int = 4) -> float | None:
    return None if math.isnan(x) or math.isinf(x) else round(x, digits)


def _cell(x: float, width: int, digits: int = 3) -> str:
    return ("-" if math.isnan(x) else f"{x:.{digits}f}").rjust(width)


def format_table(positions: list[PositionReport]) -> str:
    """The per-position table (position numbers 1-based, as ``dspark demo`` prints them)."""
    head = (
        f"{'pos':>3} {'fit n':>6} {'held n':>6} {'accept':>7} {'mean c':>7} "
        f"{'ECE before':>10} {'ECE after':>9} {'floor':>6} {'T_k':>7} {'+bias':>6}  note"
    )
    lines = [head]
    for r in positions:
        lines.append(
            f"{r.position + 1:>3} {r.fit_samples:>6} {r.samples:>6} "
            f"{_cell(r.acceptance, 7)} {_cell(r.mean_confidence, 7)} "
            f"{_cell(r.ece_before, 10)} {_cell(r.ece_after, 9)} {_cell(r.ece_noise_floor, 6)} "
            f"{r.temperature:7.3f} {_cell(r.ece_after_platt, 6)}  {r.note}".rstrip()
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``dspark calibrate``; returns the exit code (0 when the file was written)."""
    out = out or sys.stdout
    err = err or sys.stderr
    target_dir, drafter_dir = Path(args.target), Path(args.drafter)
    if args.prompts is not None:
        texts, prompt_source = load_texts(Path(args.prompts)), str(args.prompts)
    else:
        texts, prompt_source = _default_texts(drafter_dir)
    dest = Path(args.out) if args.out is not None else drafter_dir / "sts.json"
    if not dest.resolve().parent.is_dir():
        raise_error(InputError, "invalid-argument", f"--out {dest}: {dest.parent} does not exist")
    pair = load(target_dir, drafter_dir)
    k = int(pair.drafter.block_size)
    data = collect(
        pair,
        texts,
        rounds=int(args.rounds),
        temperature=float(args.temperature),
        seed=int(args.seed),
        prompt_tokens=int(args.prompt_tokens),
        stride=int(args.stride),
        new_tokens=int(args.max_new_tokens),
        batch=int(args.batch),
        progress=None if args.quiet or args.json else err,
    )
    positions = fit_positions(data.fit, data.held, k, min_samples=int(args.min_samples))
    fit_idx = list(range(0, len(texts), 2))
    held_idx = list(range(1, len(texts), 2))
    source: dict[str, Any] = {
        "tool": "dspark calibrate",
        "target": str(target_dir),
        "drafter": str(drafter_dir),
        "target_backend": pair.backend,
        "raw_confidence": "sts=False" if pair.sts_off else "drafter loaded without STS support",
        "prompts": prompt_source,
        "texts": len(texts),
        "split": "fit on texts with even index (0, 2, ...); ece_before / ece_after / samples "
        "are on the odd-index texts (held out)",
        "fit_texts": fit_idx,
        "heldout_texts": held_idx,
        "prompt_tokens": int(args.prompt_tokens),
        "stride": int(args.stride),
        "max_new_tokens": int(args.max_new_tokens),
        "verify": "full",
        "temperature": float(args.temperature),
        "seed": int(args.seed),
        "request_rounds": {"fit": data.fit_rounds, "heldout": data.held_rounds},
        "prompts_run": {"fit": data.fit_prompts, "heldout": data.held_prompts},
        "windows_exhausted": data.exhausted,
        "bins": 10,
        "min_samples": int(args.min_samples),
        "seconds": round(data.seconds, 3),
    }
    worst_before = max((r.ece_before for r in positions if r.samples), default=float("nan"))
    worst_after = max((r.ece_after for r in positions if r.samples), default=float("nan"))
    worst_platt = max((r.ece_after_platt for r in positions if r.samples), default=float("nan"))
    met = all(r.samples and r.ece_after <= TARGET_ECE for r in positions)
    document: dict[str, Any] = {
        "temperatures": [r.temperature for r in positions],
        "ece_before": [_num(r.ece_before) for r in positions],
        "ece_after": [_num(r.ece_after) for r in positions],
        "samples": [r.samples for r in positions],
        "fit_samples": [r.fit_samples for r in positions],
        "acceptance": [_num(r.acceptance) for r in positions],
        "mean_confidence": [_num(r.mean_confidence) for r in positions],
        "ece_noise_floor": [_num(r.ece_noise_floor) for r in positions],
        "ece_fit_before": [_num(r.ece_fit_before) for r in positions],
        "ece_fit_after": [_num(r.ece_fit_after) for r in positions],
        "diagnostic_scale_bias": {
            "note": "per-position sigmoid(scale*logit(c)+bias) fit on the same half; not in "
            "the STS format (temperatures only)",
            "scale": [round(r.platt[0], 5) for r in positions],
            "bias": [round(r.platt[1], 5) for r in positions],
            "ece_after": [_num(r.ece_after_platt) for r in positions],
        },
        "notes": {str(r.position): r.note for r in positions if r.note},
        "target_ece": TARGET_ECE,
        "target_met": bool(met),
        "source": source,
    }
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, dest)
    if args.json:
        out.write(json.dumps(document) + "\n")
        out.flush()
        return 0
    mode = "greedy" if args.temperature == 0 else f"T={args.temperature:g}"
    lines = [
        f"dspark calibrate: {data.fit_rounds + data.held_rounds} request-rounds "
        f"({data.fit_prompts + data.held_prompts} prompts, {data.seconds:.1f} s) on the "
        f"{pair.backend} target; {mode}, verify full, block {k}",
        f"prompts: windows of {len(texts)} texts from {prompt_source}",
        f"fit on the {len(fit_idx)} even-index texts ({data.fit_rounds} request-rounds); ECE "
        f"below is on the {len(held_idx)} odd-index texts, HELD OUT ({data.held_rounds} "
        "request-rounds)",
        "",
        format_table(positions),
        "",
        "accept / mean c: held-out acceptance rate and mean raw confidence given earlier slots "
        "accepted; floor: the ECE a perfectly calibrated head would show on the same held-out "
        "samples; +bias: held-out ECE with a per-position scale and bias (not in the STS format)",
        f"held-out ECE, worst position: {worst_before:.3f} before, {worst_after:.3f} after STS, "
        f"{worst_platt:.3f} with a bias; target <= {TARGET_ECE}: " + ("met" if met else "NOT met"),
    ]
    flat = [r.position + 1 for r in positions if r.temperature >= T_MAX * 0.999]
    if flat:
        lines.append(
            f"T_k at the upper bound {T_MAX:g} at position(s) {flat}: there the raw confidences "
            "sit on the other side of 0.5 from the acceptance rate, and a temperature cannot "
            "move a confidence across 0.5, so STS can only flatten them towards 0.5; a "
            "per-position bias could (the +bias column), the STS format has none"
        )
    noisy = [r.position + 1 for r in positions if r.samples and r.ece_noise_floor > TARGET_ECE]
    if noisy:
        lines.append(
            f"position(s) {noisy}: too few held-out samples to judge ECE <= {TARGET_ECE} (the "
            "noise floor alone is above it); raise --rounds or add prompts"
        )
    if data.exhausted:
        lines.append(
            f"note: the prompt windows ran out before --rounds {args.rounds} (add prompts, or "
            "lower --stride)"
        )
    if not pair.sts_off:
        lines.append(
            "note: this dspark's Drafter.from_pretrained has no sts= argument; the confidences "
            "are the head's raw ones (no STS is loaded by this build)"
        )
    lines.append(f"wrote {dest}")
    out.write("\n".join(lines) + "\n")
    out.flush()
    return 0
