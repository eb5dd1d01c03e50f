"""``dspark generate``: speculative decoding with your own target + DSpark drafter pair.

``--target DIR`` is an HF causal-LM directory (``config.json``, weights and a fast-tokenizer
``tokenizer.json``); ``--drafter DIR`` is a DSpark drafter checkpoint for it. The pair is checked
first, before anything is loaded, with the same rules as ``dspark inspect`` (problems are
reported with their codes), then loaded through the Python API: a Qwen3 target by dspark's
native engine (:class:`dspark.NativeTarget`, no torch; the engine ``dspark demo`` and
``dspark serve`` run), any other through transformers (``AutoModelForCausalLM``; needs torch),
or as ``--target-backend`` says; then :meth:`dspark.Drafter.from_pretrained` →
:class:`dspark.Speculator`. The continuation streams to stdout (on a terminal the accepted
drafts are coloured); acceptance length τ and tokens/s go to stderr, and ``--json`` adds one JSON
object as the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, TextIO

from dspark._errors import raise_error
from dspark._native import InputError
from dspark.cli.backend import BACKENDS, choose_backend, engine_threads, need_torch
from dspark.cli.errors import EXIT_OK
from dspark.cli.options import (
    add_pair_arguments,
    add_sampling_arguments,
    existing_file,
    prompt_text,
    read_prompt,
    thread_count,
    token_count,
    verify_mode,
)
from dspark.cli.terminal import Stage, Style, TokenPrinter, is_tty, std_streams
from dspark.pair import (
    KV_DTYPES,
    NATIVE_DTYPES,
    QUANT_DTYPES,
    load_model_pair,
    load_native_pair,
    make_speculator,
)

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "main", "run"]

HELP = "speculative decoding with your own target + DSpark drafter"
DESCRIPTION = (
    "Checks the pair as dspark inspect does, loads it through the Python API (a Qwen3 "
    "target natively, any other through transformers; dspark.Drafter, dspark.Speculator), "
    "streams the continuation to stdout and reports acceptance length and tokens/s on stderr."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark generate`` options."""
    add_pair_arguments(
        p,
        target_help="HF causal-LM dir, or a Qwen3 GGUF file (native target)",
        drafter_help="DSpark drafter checkpoint dir",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", type=prompt_text, metavar="TEXT", help="text to continue (UTF-8)")
    src.add_argument("--prompt-file", type=existing_file, metavar="F", help="UTF-8 text file")
    p.add_argument(
        "--max-new-tokens",
        type=token_count,
        default=128,
        metavar="N",
        help="tokens generated at most; fewer when a stop token comes (default 128)",
    )
    add_sampling_arguments(p)
    p.add_argument(
        "--verify",
        type=verify_mode,
        default="scheduled",
        metavar="{full,scheduled,THRESHOLD}",
        help="the paper's scheduler on a cost model that needs no profile, taking plain "
        "target steps where drafting would not pay (default); the whole block; or the prefix "
        "whose confidence is at least THRESHOLD in [0, 1]",
    )
    p.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        metavar="N",
        help="threads of the target (at most the CPUs this process may use; default: all of "
        "them natively, torch's default through transformers)",
    )
    p.add_argument(
        "--target-backend",
        choices=BACKENDS,
        default="auto",
        help="auto (default): dspark's native engine for a Qwen3 target (no torch), "
        "transformers for any other; native; or hf (transformers: needs torch)",
    )
    p.add_argument(
        "--dtype",
        choices=NATIVE_DTYPES,
        default=None,
        help="target weight dtype (default: the checkpoint's natively, float32 through "
        "transformers); q8_0 / q4_k (native only): the layers in 8- / 4-bit blocks",
    )
    p.add_argument(
        "--kv-dtype",
        choices=KV_DTYPES,
        default=None,
        help="the native target's KV cache dtype (default: the engine's, float16)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object as the last stdout line")
    p.add_argument("--quiet", action="store_true", help="do not stream the text")
    p.add_argument("--no-color", action="store_true", help="never colour the accepted drafts")


def main(args: argparse.Namespace) -> int:
    """Run ``dspark generate`` on the standard streams; exit code 0."""
    run(args)
    return EXIT_OK


def run(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> dict[str, Any]:
    """Run ``dspark generate``; returns the summary (also printed)."""
    out, err = std_streams(out, err)
    text = args.prompt if args.prompt is not None else read_prompt(args.prompt_file)
    backend = choose_backend(args.target_backend, args.target)
    native = backend == "native"
    if native:
        with Stage(f"loading {args.target} and {args.drafter}", err):
            pair = load_native_pair(
                args.target,
                args.drafter,
                dtype=args.dtype,
                threads=args.threads,
                kv_dtype=args.kv_dtype,
            )
    else:
        if args.dtype in QUANT_DTYPES or args.kv_dtype is not None:
            flag = "--kv-dtype" if args.kv_dtype is not None else f"--dtype {args.dtype}"
            raise_error(
                InputError,
                "invalid-argument",
                f"{flag} runs on the native target (--target-backend native, or auto "
                "for a Qwen3 target)",
            )
        need_torch("a transformers target")
        dtype = args.dtype or "float32"
        with Stage(f"loading {args.target} (transformers) and {args.drafter}", err):
            pair = load_model_pair(args.target, args.drafter, dtype=dtype, threads=args.threads)
    prompt = pair.encode(text)
    pair.check_budget(prompt, args.max_new_tokens)
    sp = make_speculator(
        pair,
        prompt,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        verify=args.verify,
    )
    # Warm-up on the prompt's tail: first-call allocations are not the pair's speed.
    sp.generate([prompt[-8:]], 2)
    style: Style = "color" if is_tty(out) and not args.no_color else "plain"
    printer = TokenPrinter(pair.decode, out, style, pair.stop_ids)
    show = not args.quiet
    if show:
        out.write(text)
        out.flush()
    res = sp.generate(
        [prompt],
        args.max_new_tokens,
        pair.stop_ids,
        on_round=(lambda new: printer.round(new[0])) if show else None,
    )
    tokens, stats = res.tokens[0], res.stats
    if show:
        out.write("\n")
    secs = stats.total_seconds
    tps = len(tokens) / secs if secs > 0 else float("nan")
    stopped = "stop-token" if tokens and tokens[-1] in pair.stop_ids else "max-new-tokens"
    k = pair.drafter.block_size
    summary = {
        "text": pair.decode(tokens),
        "tokens": tokens,
        "new_tokens": len(tokens),
        "prompt_tokens": len(prompt),
        "acceptance_length": round(stats.acceptance_length, 4),
        "per_position_acceptance": [
            None if math.isnan(a) else round(a, 4) for a in stats.per_position_acceptance
        ],
        "tokens_per_second": round(tps, 2),
        "seconds": round(secs, 4),
        "rounds": stats.rounds,
        "block_size": k,
        "stopped": stopped,
        "verify": args.verify,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "threads": engine_threads(native),
        "target_backend": backend,
    }
    err.write(
        f"acceptance length τ   {stats.acceptance_length:.2f} tokens/round "
        f"(max {k + 1}, {stats.rounds} rounds)\n"
        "per-position accept   "
        + " ".join("-" if math.isnan(a) else f"{a:.2f}" for a in stats.per_position_acceptance)
        + "\n"
        f"speculative           {tps:.1f} tok/s ({len(tokens)} new tokens in {secs:.2f} s, "
        f"prefill included; stopped at {stopped}; {'native' if native else 'transformers'} "
        f"target, {summary['threads']} threads)\n"
    )
    err.flush()
    if args.json:
        out.write(json.dumps(summary) + "\n")
    out.flush()
    return summary
