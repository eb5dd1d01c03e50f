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
   the numbers the goal (:data:`TARGET_ECE`: ECE <= 0.05 at every position) is judged on.
   Next to them: the ECE a perfectly calibrated head would still show on the same samples
   (sampling noise), and, as a diagnostic, the held-out ECE of a per-position scale *and bias*
   (Platt) fit, which the STS format cannot express.

The table written is the fit half's (the one evaluated), to ``--out`` (default
``DRAFTER/sts.json``). Steps 1-3 are :mod:`dspark.confidence_records`, the fit and ECE
:mod:`dspark.sts`; this module is the command around them.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from dspark._files import check_output_file, write_atomic
from dspark.cli.options import (
    add_pair_arguments,
    existing_file,
    positive_int,
    seed_int,
    temperature,
    token_count,
)
from dspark.cli.terminal import std_streams
from dspark.confidence_records import (
    DEFAULT_BATCH,
    DEFAULT_NEW_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_STRIDE,
    collect,
    default_texts,
    load,
    load_texts,
)
from dspark.pair import check_positions
from dspark.sts import DEFAULT_MIN_SAMPLES, T_MAX, PositionReport, fit_positions

__all__ = [
    "DEFAULT_ROUNDS",
    "DESCRIPTION",
    "HELP",
    "TARGET_ECE",
    "Calibration",
    "add_arguments",
    "format_table",
    "main",
    "run",
]

HELP = "fit per-position confidence temperatures (STS) for a drafter, judged on held-out prompts"
DESCRIPTION = (
    "Runs full-verification speculative decoding over held-out prompt windows "
    "with confidence recording, fits one temperature per draft position on half of the "
    "texts (binary NLL of sigmoid(logit(c)/T)) and reports ECE before and after on the "
    "other half. Writes a JSON {temperatures: [...], ...} (the engine's STS format) to --out "
    "(default DRAFTER/sts.json)."
)

#: Request-rounds collected by default (both halves together). Late positions are reached in
#: a fraction of rounds (on the bundled pair greedy, position 8 in ~6%): at 2000 rounds each half
#: holds ~60 of its samples, where sampling noise alone already gives an ECE of ~0.05.
DEFAULT_ROUNDS = 2000
#: The held-out ECE every position should reach.
TARGET_ECE = 0.05


@dataclass
class Calibration:
    """The result of :func:`run`: per-position reports and the JSON written."""

    positions: list[PositionReport]
    document: dict[str, Any]
    out: Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark calibrate`` options."""
    add_pair_arguments(
        p, target_help="target model dir, or a Qwen3 GGUF file", drafter_help="drafter dir"
    )
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
    p.add_argument(
        "--seed",
        type=seed_int,
        default=0,
        metavar="S",
        help="seed of the sampled rounds (default 0)",
    )
    p.add_argument(
        "--min-samples",
        type=positive_int,
        default=DEFAULT_MIN_SAMPLES,
        metavar="N",
        help=f"fit samples a position needs, else T = 1 (default {DEFAULT_MIN_SAMPLES})",
    )
    p.add_argument(
        "--prompt-tokens",
        type=token_count,
        default=DEFAULT_PROMPT_TOKENS,
        metavar="N",
        help=f"length of each text's first prompt window (default {DEFAULT_PROMPT_TOKENS})",
    )
    p.add_argument(
        "--stride",
        type=token_count,
        default=DEFAULT_STRIDE,
        metavar="N",
        help=f"tokens between a text's prompt windows (default {DEFAULT_STRIDE})",
    )
    p.add_argument(
        "--max-new-tokens",
        type=token_count,
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


def main(args: argparse.Namespace) -> int:
    """Run ``dspark calibrate`` on the standard streams; its exit code."""
    return run(args)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``dspark calibrate``; returns the exit code (0 when the file was written)."""
    out, err = std_streams(out, err)
    target_dir, drafter_dir = Path(args.target), Path(args.drafter)
    if args.prompts is not None:
        texts, prompt_source = load_texts(Path(args.prompts)), str(args.prompts)
    else:
        texts, prompt_source = default_texts(drafter_dir)
    dest = Path(args.out) if args.out is not None else drafter_dir / "sts.json"
    check_output_file(dest, "--out")
    pair = load(target_dir, drafter_dir)
    # The first window plus what is generated after it must fit the target's positions (as
    # `generate` and `demo` require): refused before anything decodes.
    check_positions(int(args.prompt_tokens), int(args.max_new_tokens), pair.max_positions)
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
    write_atomic(dest, json.dumps(document, indent=2) + "\n")
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
