"""``dspark generate``: speculative decoding with your own target + DSpark drafter pair.

``--target DIR`` is any HF transformers causal-LM directory (``config.json``, weights and a
fast-tokenizer ``tokenizer.json``); ``--drafter DIR`` is a DSpark drafter checkpoint for it. The
pair is checked first, before anything is loaded, with the same rules as ``dspark inspect``
(problems are reported with their codes), then loaded through the Python API
(``AutoModelForCausalLM.from_pretrained`` → :meth:`dspark.Drafter.from_pretrained` →
:class:`dspark.Speculator`). The continuation streams to stdout (on a terminal the accepted
drafts are coloured); acceptance length τ and tokens/s go to stderr, and ``--json`` adds one JSON
object as the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dspark._errors import raise_error, raise_report_errors
from dspark._native import BackendError, CheckpointError, ConfigError, InputError
from dspark._native import inspect as engine_inspect
from dspark._stream import Style, TokenPrinter, is_tty

__all__ = [
    "ModelPair",
    "add_arguments",
    "check_pair_dirs",
    "load_model_pair",
    "read_prompt",
    "run",
]

_DTYPES = ("float32", "bfloat16", "float16")


# -- argument types (argparse turns ArgumentTypeError into a usage error, exit 2) ------------


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def seed_int(text: str) -> int:
    """A seed in ``[0, 2**63)``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63), got {value}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def temperature(text: str) -> float:
    """A finite temperature >= 0 (0 = greedy)."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def top_p(text: str) -> float:
    """A nucleus mass in ``(0, 1]``."""
    value = _float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def verify_mode(text: str) -> str | float:
    """``full``, ``scheduled``, or a confidence threshold in ``[0, 1]``."""
    if text in ("full", "scheduled"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'full', 'scheduled' or a confidence threshold in [0, 1], got {text!r}"
        ) from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a threshold must be in [0, 1], got {value}")
    return value


def threshold(text: str) -> float:
    """A confidence threshold in ``[0, 1]``."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a threshold must be in [0, 1], got {value}")
    return value


def prompt_text(text: str) -> str:
    """A non-empty prompt that is valid UTF-8 (argv bytes that are not arrive as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("the prompt is not valid UTF-8") from None
    if not text:
        raise argparse.ArgumentTypeError("the prompt is empty")
    return text


def existing_file(text: str) -> Path:
    """A path to an existing regular file."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return path


# -- loading -------------------------------------------------------------------------------


#: The largest prompt file read (a prompt, not a corpus).
MAX_PROMPT_BYTES = 16 * 2**20


def read_prompt(path: Path) -> str:
    """The UTF-8 text of ``path`` (``InputError`` ``invalid-argument`` if it is not UTF-8,
    ``too-large`` above :data:`MAX_PROMPT_BYTES`; nothing larger is read)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPT_BYTES + 1)
    except OSError as exc:
        raise_error(InputError, "invalid-argument", f"{path}: cannot read the prompt: {exc}")
    if len(data) > MAX_PROMPT_BYTES:
        raise_error(
            InputError, "too-large", f"{path}: the prompt file is over {MAX_PROMPT_BYTES} bytes"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise_error(
            InputError,
            "invalid-argument",
            f"{path}: the prompt is not valid UTF-8 (byte {exc.start}: {exc.reason})",
        )
    if not text:
        raise_error(InputError, "invalid-argument", f"{path}: the prompt file is empty")
    return text


def check_pair_dirs(target: Path, drafter: Path) -> dict[str, Any]:
    """Check the pair before loading anything; returns the target's ``config.json`` as a dict.

    Raises the typed error of the first problem: a missing directory, config or
    ``tokenizer.json`` (``missing-file``), or what ``dspark inspect`` finds (its codes; several
    problems raise code ``multiple`` and list them all).
    """
    for what, path in (("target", target), ("drafter", drafter)):
        if not path.is_dir():
            why = "not a directory" if path.exists() else "no such directory"
            raise_error(CheckpointError, "missing-file", f"{what} {path}: {why}")
    config_path = target / "config.json"
    if not config_path.is_file():
        raise_error(
            CheckpointError, "missing-file", f"{config_path}: missing (the target's HF config)"
        )
    report = engine_inspect(drafter, target).to_dict()
    raise_report_errors(report["errors"])
    if not (target / "tokenizer.json").is_file():
        raise_error(
            CheckpointError,
            "missing-file",
            f"{target / 'tokenizer.json'}: missing (dspark generate reads the target's "
            "fast-tokenizer file; save one with tokenizer.save_pretrained(DIR))",
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise_error(ConfigError, "bad-config", f"{config_path}: {exc}")
    if not isinstance(config, dict):
        raise_error(ConfigError, "bad-config", f"{config_path}: not a JSON object")
    return config


@dataclass
class ModelPair:
    """A loaded target + drafter pair with its tokenizer and stop tokens."""

    tokenizer: Any
    target: Any
    drafter: Any
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
        if self.max_positions is not None and len(prompt) + max_new_tokens > self.max_positions:
            raise_error(
                InputError,
                "invalid-argument",
                f"prompt ({len(prompt)} tokens) + --max-new-tokens {max_new_tokens} exceeds "
                f"the target's max_position_embeddings {self.max_positions}",
            )


def _stop_ids(model: Any, config: dict[str, Any], vocab: int) -> list[int]:
    gen = getattr(model, "generation_config", None)
    raw = getattr(gen, "eos_token_id", None) if gen is not None else None
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
    config = check_pair_dirs(target, drafter)
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    from dspark.drafter import Drafter

    if dtype not in _DTYPES:
        raise_error(InputError, "invalid-argument", f"dtype {dtype!r}: one of {_DTYPES}")
    if threads is not None:
        if int(threads) < 1:
            raise_error(InputError, "invalid-argument", f"threads {threads}: must be >= 1")
        torch.set_num_threads(int(threads))
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    tok_path = target / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(tok_path))
    except Exception as exc:  # tokenizers raises plain Exception on a bad file
        raise_error(ConfigError, "bad-config", f"{tok_path}: {str(exc).splitlines()[0]}")
    try:
        model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype)).eval()
    except Exception as exc:  # transformers raises many types; one typed error for all
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise_error(
            BackendError, "backend", f"{target}: transformers could not load the target: {first}"
        )
    pair = ModelPair(tokenizer, model, Drafter.from_pretrained(drafter, model))
    pair.stop_ids = _stop_ids(model, config, pair.vocab_size)
    limit = config.get("max_position_embeddings")
    pair.max_positions = limit if isinstance(limit, int) and limit > 0 else None
    return pair


# -- the command ---------------------------------------------------------------------------


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """``--temperature``, ``--top-p`` and ``--seed``: shared by ``generate`` and ``demo``."""
    p.add_argument(
        "--temperature", type=temperature, default=0.0, metavar="T", help="0 = greedy (default)"
    )
    p.add_argument("--top-p", type=top_p, default=None, metavar="P", help="nucleus sampling mass")
    p.add_argument("--seed", type=seed_int, default=0, metavar="S", help="random seed (default 0)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark generate`` options."""
    p.add_argument("--target", type=Path, required=True, metavar="DIR", help="HF causal-LM dir")
    p.add_argument(
        "--drafter", type=Path, required=True, metavar="DIR", help="DSpark drafter checkpoint dir"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", type=prompt_text, metavar="TEXT", help="text to continue (UTF-8)")
    src.add_argument("--prompt-file", type=existing_file, metavar="F", help="UTF-8 text file")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, metavar="N")
    add_sampling_arguments(p)
    p.add_argument(
        "--verify",
        type=verify_mode,
        default="full",
        metavar="{full,scheduled,THRESHOLD}",
        help="verify the whole block (default), the paper's scheduler, or the prefix whose "
        "confidence is at least THRESHOLD in [0, 1]",
    )
    p.add_argument("--threads", type=positive_int, default=None, metavar="N", help="torch threads")
    p.add_argument("--dtype", choices=_DTYPES, default="float32", help="target dtype")
    p.add_argument("--json", action="store_true", help="one JSON object as the last stdout line")
    p.add_argument("--quiet", action="store_true", help="do not stream the text")
    p.add_argument("--no-color", action="store_true", help="never colour the accepted drafts")


def make_speculator(pair: Any, prompt: list[int], **kw: Any) -> Any:
    """A :class:`dspark.Speculator` over ``pair``; measures the steps/s table for scheduling."""
    from dspark.demo import steps_per_second
    from dspark.speculator import Speculator

    table = None
    if kw.get("verify") == "scheduled":
        table = steps_per_second(pair.target, prompt, pair.drafter.block_size + 1)
    return Speculator(pair.target, pair.drafter, steps_per_second=table, **kw)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> dict:
    """Run ``dspark generate``; returns the summary (also printed)."""
    import torch

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    text = args.prompt if args.prompt is not None else read_prompt(args.prompt_file)
    pair = load_model_pair(args.target, args.drafter, dtype=args.dtype, threads=args.threads)
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
        "threads": torch.get_num_threads(),
    }
    err.write(
        f"acceptance length τ   {stats.acceptance_length:.2f} tokens/round "
        f"(max {k + 1}, {stats.rounds} rounds)\n"
        "per-position accept   "
        + " ".join("-" if math.isnan(a) else f"{a:.2f}" for a in stats.per_position_acceptance)
        + "\n"
        f"speculative           {tps:.1f} tok/s ({len(tokens)} new tokens in {secs:.2f} s, "
        f"prefill included; stopped at {stopped}; {summary['threads']} torch threads)\n"
    )
    err.flush()
    if args.json:
        out.write(json.dumps(summary) + "\n")
    out.flush()
    return summary
