"""``dspark demo``: speculative decoding with the bundled tiny target + DSpark drafter pair.

Loads the pair shipped in the package (``dspark/models/tiny``: a Qwen3 target trained on the
CPython standard library and its DSpark drafter, see ``NOTICE``), streams the speculative
generation for a prompt, then decodes the same prompt with the target alone (one token per
forward, same KV-cache forward, same process) and reports acceptance length τ, per-position
acceptance, tokens/s of both, their ratio and whether the greedy outputs are identical.
Needs ``torch``, ``transformers`` and ``tokenizers``.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import math
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_PROMPT", "BundledPair", "add_arguments", "bundled_dir", "load_pair", "run"]

DEFAULT_PROMPT = '''import os


def read_lines(path):
    """Return the lines of the file at path."""
'''


def bundled_dir() -> Path:
    """Directory of the bundled pair inside the installed package (``target/``, ``drafter/``)."""
    return Path(str(resources.files("dspark") / "models" / "tiny"))


@dataclass
class BundledPair:
    """The loaded pair: tokenizer, HF target, candle drafter, and the stop token."""

    tokenizer: Any
    target: Any
    drafter: Any
    eos_id: int


def load_pair(root: Path | None = None, threads: int | None = None) -> BundledPair:
    """Load the tokenizer, target (f32, eval) and drafter from ``root`` (default: bundled)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from dspark.drafter import Drafter

    if threads:
        torch.set_num_threads(threads)
    base = root or bundled_dir()
    if not (base / "target" / "config.json").is_file():
        raise FileNotFoundError(f"{base}: no bundled model pair (target/config.json is missing)")
    tok = Tokenizer.from_file(str(base / "target" / "tokenizer.json"))
    target = AutoModelForCausalLM.from_pretrained(base / "target", dtype=torch.float32).eval()
    drafter = Drafter.from_pretrained(base / "drafter", target)
    eos = tok.token_to_id("<|endoftext|>")
    return BundledPair(tok, target, drafter, int(eos))


def target_only(
    model: Any,
    prompt: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_p: float | None = None,
    seed: int = 0,
    stop: int | None = None,
) -> tuple[list[int], float]:
    """Plain autoregressive decoding, one KV-cached forward per token; (tokens, seconds)."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def pick(logits: torch.Tensor) -> int:
        if temperature == 0.0:
            return int(logits.argmax())
        probs = torch.softmax(logits.double() / temperature, dim=-1)
        if top_p is not None and top_p < 1.0:
            sp, idx = probs.sort(descending=True)
            keep = sp.cumsum(0) - sp < top_p
            probs = torch.zeros_like(probs).scatter(0, idx[keep], sp[keep])
        return int(torch.multinomial(probs, 1, generator=gen))

    out: list[int] = []
    kw = _cache_kwarg(model)
    t0 = time.perf_counter()
    with torch.inference_mode():
        res = model(input_ids=torch.tensor([prompt]), use_cache=True)
        while True:
            tok = pick(res.logits[0, -1])
            out.append(tok)
            if len(out) >= max_new_tokens or tok == stop:
                break
            res = model(input_ids=torch.tensor([[tok]]), use_cache=True, **{kw: _cache_of(res)})
    return out, time.perf_counter() - t0


def _cache_kwarg(model: Any) -> str:
    """``past_key_values`` (transformers 4) or ``cache`` (transformers 5)."""
    params = inspect.signature(model.forward).parameters
    return "past_key_values" if "past_key_values" in params else "cache"


def _cache_of(res: Any) -> Any:
    cache = getattr(res, "past_key_values", None)
    return cache if cache is not None else res.cache


def steps_per_second(
    model: Any, prompt: list[int], max_tokens: int, reps: int = 3
) -> list[tuple[int, float]]:
    """Measured target verify throughput: ``(tokens in the forward, forwards per second)``."""
    import torch

    table = []
    with torch.inference_mode():
        base = _cache_of(model(input_ids=torch.tensor([prompt]), use_cache=True))
        kw = _cache_kwarg(model)
        for n in range(1, max_tokens + 1):
            ids = torch.tensor([prompt[-1:] * n])
            best = float("inf")
            for _ in range(reps):
                cache = copy.deepcopy(base)
                t0 = time.perf_counter()
                model(input_ids=ids, use_cache=True, **{kw: cache})
                best = min(best, time.perf_counter() - t0)
            table.append((n, 1.0 / best))
    return table


def speculative(
    sp: Any, prompt: list[int], max_new_tokens: int, stop: int | None, emit: Any
) -> tuple[list[int], Any, float]:
    """Run ``sp`` on one prompt, calling ``emit(new_tokens)`` after every round.

    Returns (tokens, stats, seconds spent in decoding, excluding ``emit``).
    """
    stops = [] if stop is None else [stop]
    res = sp.generate([prompt], max_new_tokens, stops, on_round=lambda new: emit(new[0]))
    return res.tokens[0], res.stats, res.stats.total_seconds


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark demo`` options."""
    p.add_argument("--prompt", default=None, help="text to continue (default: a Python snippet)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--verify",
        choices=["full", "threshold", "scheduled"],
        default="full",
        help="verify the whole block, a confident prefix, or the paper's scheduler",
    )
    p.add_argument("--threshold", type=float, default=0.3, help="confidence for --verify threshold")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--model-dir", type=Path, default=None, help="a pair laid out like the bundle")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    p.add_argument("--quiet", action="store_true", help="do not stream the text")


def run(args: argparse.Namespace, out: Any = None) -> dict[str, Any]:
    """Run the demo; returns the summary (also printed)."""
    from dspark.speculator import Speculator

    out = out or sys.stdout
    if args.max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be >= 1")
    if args.temperature < 0:
        raise ValueError("--temperature must be >= 0")
    if args.top_p is not None and not 0.0 < args.top_p <= 1.0:
        raise ValueError("--top-p must be in (0, 1]")
    pair = load_pair(args.model_dir, args.threads)
    text = DEFAULT_PROMPT if args.prompt is None else args.prompt
    prompt = pair.tokenizer.encode(text).ids
    if not prompt:
        raise ValueError("--prompt encodes to no tokens")
    k = pair.drafter.block_size
    verify: Any = {"full": "full", "threshold": args.threshold, "scheduled": "scheduled"}[
        args.verify
    ]
    table = steps_per_second(pair.target, prompt, k + 1) if args.verify == "scheduled" else None
    sp = Speculator(
        pair.target,
        pair.drafter,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        verify=verify,
        steps_per_second=table,
    )
    # Warm both paths up (first-call allocations, thread pools) before anything is timed.
    target_only(pair.target, prompt, 4)
    speculative(sp, prompt, 4, None, lambda _new: None)
    show = not args.quiet
    if show:
        out.write(text)
        out.flush()
    decoded: list[int] = []

    def emit(new: list[int]) -> None:
        if show and new:
            before = pair.tokenizer.decode(decoded)
            decoded.extend(new)
            out.write(pair.tokenizer.decode(decoded)[len(before) :])
            out.flush()

    spec_tokens, stats, spec_s = speculative(sp, prompt, args.max_new_tokens, pair.eos_id, emit)
    if show:
        out.write("\n" + "-" * 60 + "\n")
    ref_tokens, ref_s = target_only(
        pair.target,
        prompt,
        args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        stop=pair.eos_id,
    )
    greedy = args.temperature == 0.0
    spec_tps = len(spec_tokens) / spec_s if spec_s > 0 else float("nan")
    ref_tps = len(ref_tokens) / ref_s if ref_s > 0 else float("nan")
    summary = {
        "acceptance_length": round(stats.acceptance_length, 4),
        "per_position_acceptance": [
            None if math.isnan(a) else round(a, 4) for a in stats.per_position_acceptance
        ],
        "tokens_per_second": round(spec_tps, 2),
        "target_only_tokens_per_second": round(ref_tps, 2),
        "speedup_vs_target_only": round(spec_tps / ref_tps, 3),
        "greedy_matches_target": (spec_tokens == ref_tokens) if greedy else None,
        "new_tokens": len(spec_tokens),
        "rounds": stats.rounds,
        "block_size": k,
        "verify": args.verify,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "prompt_tokens": len(prompt),
    }
    lines = [
        f"acceptance length τ   {summary['acceptance_length']:.2f} tokens/round "
        f"(max {k + 1}, {stats.rounds} rounds)",
        "per-position accept   " + " ".join(f"{a:.2f}" for a in stats.per_position_acceptance),
        f"speculative           {spec_tps:8.1f} tok/s",
        f"target only           {ref_tps:8.1f} tok/s",
        f"speedup               {summary['speedup_vs_target_only']:.2f}x",
        "greedy == target-only "
        + ({True: "yes", False: "NO", None: "n/a (sampling)"}[summary["greedy_matches_target"]]),
    ]
    if not args.json or show:
        out.write("\n".join(lines) + "\n")
    if args.json:
        out.write(json.dumps(summary) + "\n")
    out.flush()
    return summary
