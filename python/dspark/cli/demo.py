"""``dspark demo``: speculative decoding with the bundled tiny target + DSpark drafter pair.

Loads the pair shipped in the package (``dspark/models/tiny``: a Qwen3 target trained on the
CPython standard library and its DSpark drafter, see ``NOTICE``) and, by default, continues the
first ``--prompts`` held-out prompts (the first 96 tokens of standard-library files the pair never
trained on, shipped as ``heldout_prompts.json``; the same prompts ``benches/bench_e2e.py``
measures, taken in their stored order, never picked by their output). Each continuation streams
with the accepted drafts marked apart from the target's own tokens, and right after it the same
prompt is decoded by the target alone (one KV-cached forward per token, same process: both under
the same machine load). Then the aggregate is reported: acceptance length τ, per-position
acceptance, tokens/s of both, their ratio, whether the greedy outputs are identical, and how
repetitive the continuations are (distinct 4-gram ratio; τ and the speedup without the looping
continuations too).
The target runs natively by default (dspark's Qwen3 target: needs only ``tokenizers``);
``--target-backend hf`` runs it in transformers instead (needs ``torch`` and
``transformers``). Both the speculative run and its target-only baseline use the same target.
``--plot`` needs ``matplotlib``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

from dspark._args import as_float, as_int
from dspark._errors import raise_error
from dspark._native import InputError
from dspark._threads import available_cpus
from dspark.bundled import heldout_texts, load_pair
from dspark.cli.backend import engine_threads, need_torch
from dspark.cli.demo_report import (
    PromptRun,
    Totals,
    check_plot,
    plot_acceptance,
    rounded_4gram_ratio,
)
from dspark.cli.errors import EXIT_OK
from dspark.cli.load import busy_share, busy_warning
from dspark.cli.options import (
    MAX_COUNT,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    add_sampling_arguments,
    existing_file,
    positive_int,
    prompt_text,
    read_prompt,
    thread_count,
    threshold,
    token_count,
    verify_mode,
)
from dspark.cli.terminal import (
    DIM,
    RESET,
    Progress,
    Stage,
    Style,
    TokenPrinter,
    is_tty,
    legend,
    markers,
    std_streams,
)
from dspark.measure import speculative, target_only

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel

__all__ = [
    "DEFAULT_NEW_TOKENS",
    "DEFAULT_PROMPTS",
    "DEFAULT_PROMPT_TOKENS",
    "DESCRIPTION",
    "HELP",
    "DemoPrompt",
    "add_arguments",
    "main",
    "plot_acceptance",
    "run",
]

HELP = "speculative decoding with the bundled tiny model pair (native target; no torch needed)"
DESCRIPTION = (
    "Continues held-out prompts (by default the first 8: code the bundled pair "
    "never trained on) with the bundled target + DSpark drafter, streaming each "
    "continuation with the accepted drafts marked, then decodes them again with the target "
    "alone and reports the aggregate acceptance length, per-position acceptance, tokens/s "
    "of both and the speed-up, all measured in this run."
)

#: Defaults: the measurement of ``benches/bench_e2e.py`` (8 held-out files, 96 prompt tokens,
#: 64 new tokens).
DEFAULT_PROMPTS = 8
DEFAULT_PROMPT_TOKENS = 96
DEFAULT_NEW_TOKENS = 64


@dataclass
class DemoPrompt:
    """One prompt of the demo: a name (the held-out file, or ``--prompt``), ids and text."""

    name: str
    ids: list[int]
    text: str


def _demo_verify(text: str) -> str | float:
    """``threshold`` (use ``--threshold``) or anything ``dspark generate --verify`` takes."""
    return text if text == "threshold" else verify_mode(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark demo`` options."""
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--prompts",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"continue the first N held-out prompts (default {DEFAULT_PROMPTS})",
    )
    src.add_argument(
        "--prompt",
        type=prompt_text,
        default=None,
        metavar="TEXT",
        help="continue this text instead",
    )
    src.add_argument(
        "--prompt-file",
        type=existing_file,
        default=None,
        metavar="F",
        help="continue this UTF-8 file instead",
    )
    p.add_argument(
        "--prompt-tokens",
        type=token_count,
        default=DEFAULT_PROMPT_TOKENS,
        metavar="N",
        help=f"tokens of each held-out file used as its prompt (default {DEFAULT_PROMPT_TOKENS})",
    )
    p.add_argument(
        "--max-new-tokens",
        type=token_count,
        default=DEFAULT_NEW_TOKENS,
        metavar="N",
        help=f"tokens generated per prompt at most (default {DEFAULT_NEW_TOKENS})",
    )
    add_sampling_arguments(p)
    p.add_argument(
        "--verify",
        type=_demo_verify,
        default="scheduled",
        metavar="{full,scheduled,threshold,THRESHOLD}",
        help="the paper's scheduler on a cost model that needs no profile, taking plain "
        "target steps where drafting would not pay (default); the whole block; or the prefix "
        "whose confidence reaches a threshold (--threshold, or a number here)",
    )
    p.add_argument(
        "--threshold",
        type=threshold,
        default=0.3,
        help="confidence for --verify threshold (default 0.3)",
    )
    p.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        metavar="N",
        help="threads of the target (default: all the CPUs this process may use; torch's "
        "default with --target-backend hf)",
    )
    p.add_argument(
        "--target-backend",
        choices=("native", "hf"),
        default="native",
        help="run the target natively (default: dspark's Qwen3 target, no torch) or in "
        'transformers (hf: needs torch; pip install "dspark[torch]")',
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="a pair laid out like the bundle (DIR/target, DIR/drafter)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    p.add_argument("--quiet", action="store_true", help="do not stream the text")
    p.add_argument(
        "--no-color", action="store_true", help="mark accepted drafts with «» instead of colour"
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="draw per-position acceptance to FILE.png (needs matplotlib)",
    )


def _with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with every option it lacks at its default (for callers from Python)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    full = parser.parse_args([])
    for key, value in vars(args).items():
        setattr(full, key, value)
    return full


def _validate(args: argparse.Namespace) -> None:
    """Typed errors for options given through Python (the CLI already checked them), with the
    command line's bounds."""
    for name in ("max_new_tokens", "prompt_tokens"):
        flag = f"--{name.replace('_', '-')}"
        setattr(args, name, as_int(getattr(args, name), flag, lo=1, hi=MAX_TOKENS))
    if getattr(args, "prompts", None) is not None:
        args.prompts = as_int(args.prompts, "--prompts", lo=1, hi=MAX_COUNT)
    args.temperature = as_float(args.temperature, "--temperature")
    if not 0.0 <= args.temperature <= MAX_TEMPERATURE:
        raise_error(
            InputError, "invalid-argument", f"--temperature must be in [0, {MAX_TEMPERATURE:g}]"
        )
    if args.top_p is not None and not 0.0 < as_float(args.top_p, "--top-p") <= 1.0:
        raise_error(InputError, "invalid-argument", "--top-p must be in (0, 1]")
    args.seed = as_int(args.seed, "--seed", hi=2**63 - 1)
    if args.threads is not None:
        args.threads = as_int(args.threads, "--threads", lo=1, hi=available_cpus())


def _prompt_sources(args: argparse.Namespace) -> list[tuple[str, str, bool]]:
    """``(name, text, truncate)`` of every prompt, checked before any model loads."""
    text = args.prompt
    if text is None and getattr(args, "prompt_file", None) is not None:
        text = read_prompt(args.prompt_file)
    if text is not None:
        return [("your prompt", text, False)]
    texts = heldout_texts(args.model_dir)
    n = DEFAULT_PROMPTS if args.prompts is None else int(args.prompts)
    if n > len(texts):
        raise_error(
            InputError, "invalid-argument", f"--prompts {n}: only {len(texts)} held-out prompts"
        )
    return [(name, full, True) for name, full in texts[:n]]


def _encode_prompts(
    sources: list[tuple[str, str, bool]], tokenizer: Tokenizer, prompt_tokens: int
) -> list[DemoPrompt]:
    out = []
    for name, text, truncate in sources:
        ids = [int(i) for i in tokenizer.encode(text).ids]
        if truncate:
            ids = ids[:prompt_tokens]
            text = tokenizer.decode(ids)
        if not ids:
            raise_error(InputError, "invalid-argument", f"{name}: the prompt encodes to no tokens")
        out.append(DemoPrompt(name, ids, text))
    return out


def _nan_if_none(x: float | None) -> float:
    return float("nan") if x is None else x


def _prompt_tail(text: str, lines: int = 3) -> str:
    parts = text.split("\n")
    tail = "\n".join(parts[-lines:])
    return ("…" if len(parts) > lines else "") + tail


def _position_limit(target: object) -> int | None:
    """The target's ``max_position_embeddings`` (native or HF), if it has one."""
    from dspark.native_target import NativeTarget

    if isinstance(target, NativeTarget):
        limit = target.config_dict().get("max_position_embeddings")
    else:
        limit = getattr(getattr(target, "config", None), "max_position_embeddings", None)
    return limit if isinstance(limit, int) else None


def main(args: argparse.Namespace) -> int:
    """Run ``dspark demo`` on the standard streams; exit code 0."""
    run(args)
    return EXIT_OK


def run(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> dict[str, Any]:
    """Run the demo; returns the summary (also printed)."""
    from dspark.speculator import Speculator

    out, err = std_streams(out, err)
    args = _with_defaults(args)
    _validate(args)
    check_plot(args.plot)
    sources = _prompt_sources(args)
    native = args.target_backend == "native"
    if not native:
        need_torch()
    with Stage("loading the target and the drafter", err):
        pair = load_pair(args.model_dir, args.threads, args.target_backend)
    prompts = _encode_prompts(sources, pair.tokenizer, int(args.prompt_tokens))
    v_t = pair.drafter.target_vocab_size
    limit = _position_limit(pair.target)
    for pr in prompts:
        if any(not 0 <= i < v_t for i in pr.ids):
            raise_error(
                InputError, "token-out-of-range", f"{pr.name}: token ids outside [0, {v_t})"
            )
        if isinstance(limit, int) and len(pr.ids) + args.max_new_tokens > limit:
            raise_error(
                InputError,
                "invalid-argument",
                f"{pr.name}: prompt ({len(pr.ids)} tokens) + --max-new-tokens "
                f"{args.max_new_tokens} exceeds the target's max_position_embeddings {limit}",
            )
    k = pair.drafter.block_size
    verify: str | float = args.threshold if args.verify == "threshold" else args.verify
    sp = Speculator(
        pair.target,
        pair.drafter,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        verify=verify,
    )
    threads = engine_threads(native)
    stop = pair.eos_id if pair.eos_id >= 0 else None

    def alone(
        ids: list[int], n: int, seed: int, tick: Callable[[], None]
    ) -> tuple[list[int], float]:
        """The target alone on ``ids``: (tokens, seconds)."""
        if not native:
            model = cast("PreTrainedModel", pair.target)
            return target_only(
                model, ids, n, temperature=args.temperature, top_p=args.top_p, seed=seed,
                stop=stop, on_token=tick,
            )  # fmt: skip

        def ticks(new: list[list[int]]) -> None:
            for _ in new[0]:
                tick()

        t0 = time.perf_counter()
        res = sp.generate_target_only(
            [ids], n, [] if stop is None else [stop], seed=seed, on_round=ticks
        )
        return [int(t) for t in res.tokens[0]], time.perf_counter() - t0

    # Checked once everything is valid and loaded, right before the timed runs.
    busy = busy_warning(busy_share(), available_cpus())
    if busy is not None:
        err.write(busy + "\n")
    # Warm both paths up (first-call allocations, thread pools) before anything is timed.
    alone(prompts[0].ids, 4, args.seed, lambda: None)
    speculative(sp, prompts[0].ids, 4, None, lambda _new: None)

    show = not args.quiet
    style: Style = "color" if is_tty(out) and not args.no_color else "markers"
    held_out = args.prompt is None and args.prompt_file is None
    mode = "greedy" if args.temperature == 0.0 else f"T={args.temperature:g}"
    if args.top_p is not None:
        mode += f", top-p {args.top_p:g}"
    if not held_out:
        what = f"your prompt ({len(prompts[0].ids)} tokens)"
        origin = ""
    else:
        what = f"{len(prompts)} held-out prompt{'s' * (len(prompts) != 1)}"
        if args.model_dir is None:
            src = "standard-library files the pair never trained on"
        elif (args.model_dir / "heldout_prompts.json").is_file():
            src = f"the texts in {args.model_dir / 'heldout_prompts.json'}"
        else:
            src = "the bundled pair's held-out files, not necessarily held out for this pair"
        origin = f"prompts: the first {args.prompt_tokens} tokens of {src}\n"
    measured = (
        f"{what} x up to {args.max_new_tokens} new tokens; {mode}, verify {verify}, "
        f"block {k}; {'native' if native else 'transformers'} target, "
        f"{threads} thread{'s' * (threads != 1)}"
    )
    if show:
        out.write(f"dspark demo: {measured}\n{origin}{legend(style, out)}\n")
    boundary = "" if style == "color" else ("‖" if markers(out)[0] == "«" else "||")

    runs: list[PromptRun] = []
    for i, pr in enumerate(prompts):
        printer = TokenPrinter(pair.tokenizer.decode, out, style, [] if stop is None else [stop])
        if show:
            out.write(f"\n── [{i + 1}/{len(prompts)}] {pr.name} · {len(pr.ids)} prompt tokens ──\n")
            tail = _prompt_tail(pr.text) if held_out else pr.text
            out.write(f"{DIM}{tail}{RESET}" if style == "color" else tail + boundary)
            out.flush()
        toks, st, secs = speculative(
            sp, pr.ids, args.max_new_tokens, stop, printer.round if show else (lambda _n: None)
        )
        if show:
            ratio = _nan_if_none(rounded_4gram_ratio(toks))
            out.write(
                f"\n   τ {st.acceptance_length:.2f} · {len(toks)} tokens · "
                f"distinct 4-grams {ratio:.2f}\n"
            )
            out.flush()
        # The target alone on the same prompt, right after: both measured under the same load.
        bar = Progress(f"target-only baseline {i + 1}/{len(prompts)}", args.max_new_tokens, err)
        ref, ref_s = alone(pr.ids, args.max_new_tokens, args.seed + i, bar.advance)
        bar.finish()
        runs.append(PromptRun(pr.name, len(pr.ids), toks, st, secs, ref, ref_s))

    totals = Totals(runs, k, greedy=args.temperature == 0.0)
    settings = {
        "held_out": held_out,
        "max_new_tokens": args.max_new_tokens,
        "verify": args.verify,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "target_backend": args.target_backend,
    }
    summary = totals.summary(settings, threads)
    lines = totals.lines(measured, summary["speedup_vs_target_only"], verify)
    if not args.json or show:
        out.write("\n" + "\n".join(lines) + "\n")
    if args.plot is not None:
        plot_acceptance(
            totals.per_position,
            args.plot,
            f"dspark demo: τ {totals.acceptance_length:.2f}, {len(prompts)} prompts, "
            f"{totals.new_tokens} tokens ({mode})",
        )
        if show:
            out.write(f"plot: {args.plot}\n")
    if args.json:
        out.write(json.dumps(summary) + "\n")
    out.flush()
    return summary
