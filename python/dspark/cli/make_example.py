"""``dspark make-example``: write a small random, loadable target + DSpark drafter pair, or
(``--memory-bound``) the bundled pair's function at a 0.6 B model's cost.

The small pair (:func:`dspark.example.write_example`) is ``DIR/target`` (an HF
``Qwen3ForCausalLM`` with weights, ``tokenizer.json`` and generation config) and ``DIR/drafter``
(a DSpark checkpoint in the chosen vocabulary layout). Its weights are random: it loads and
decodes losslessly, and its acceptance length is about 1. The memory-bound pair
(:mod:`dspark.memory_bound`) is what speed is measured on.

To add an option: declare it in :func:`add_arguments` and act on it in :func:`main`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dspark.cli.errors import EXIT_OK, EXIT_USAGE, fail
from dspark.cli.options import seed_int
from dspark.cli.terminal import Stage

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "main"]

HELP = (
    "write a small random, loadable target + DSpark drafter pair to a directory (or, with"
    " --memory-bound, the bundled pair's function at a 0.6 B model's cost)"
)
DESCRIPTION: str | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark make-example`` options."""
    p.add_argument("dir", type=Path, help="output directory (created)")
    p.add_argument(
        "--layout",
        choices=["padded", "full", "reduced"],
        default=None,
        help="draft vocabulary layout (default: padded)",
    )
    p.add_argument(
        "--seed", type=seed_int, default=None, metavar="S", help="weight seed (default: 0)"
    )
    from dspark.memory_bound import MAX_JITTER, jitter_arg

    p.add_argument(
        "--memory-bound",
        action="store_true",
        help="instead, the bundled pair's exact function at a 0.6 B model's cost (a Qwen3 target"
        " with Qwen3-0.6B's widths, 0.62 B parameters, and its DSpark drafter; a few GB)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="with --memory-bound: weight dtype (default: float32)",
    )
    p.add_argument(
        "--jitter",
        type=jitter_arg,
        default=None,
        metavar="EPS",
        help="with --memory-bound: replace every zero weight by a value of size EPS in "
        f"(0, {MAX_JITTER:g}] (same speed, same greedy tokens)",
    )


def main(args: argparse.Namespace) -> int:
    """Write the pair and say how to try it."""
    if args.memory_bound:
        from dspark import memory_bound

        if args.layout is not None or args.seed is not None:
            return fail("usage", "--layout and --seed do not apply to --memory-bound", EXIT_USAGE)
        memory_bound.check_output_dir(args.dir)
        with Stage(f"writing the memory-bound pair to {args.dir}", sys.stderr):
            pair = memory_bound.write_memory_bound(
                args.dir, dtype=args.dtype or "float32", jitter=args.jitter
            )
        print(memory_bound.describe(pair))
        return EXIT_OK
    from dspark.example import write_example

    if args.dtype is not None or args.jitter is not None:
        return fail("usage", "--dtype and --jitter need --memory-bound", EXIT_USAGE)
    args.layout = args.layout or "padded"
    root = write_example(args.dir, args.layout, 0 if args.seed is None else args.seed)
    print(
        f"wrote {root / 'drafter'} and {root / 'target'} ({args.layout} vocabulary, random "
        f"weights; try: dspark generate --target {root / 'target'} --drafter "
        f"{root / 'drafter'} --prompt 'def f(x):')"
    )
    return EXIT_OK
